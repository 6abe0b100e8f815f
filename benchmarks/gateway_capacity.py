"""How many requests a second the gateway relays, in front of 64 simulated replicas.

    .venv/bin/python benchmarks/gateway_capacity.py [--rates 200,400,800] [--duration-s 10]
    python benchmarks/gateway_capacity.py --rates 1000,2000,3000,4000,5000   # 16 cores
    python benchmarks/gateway_capacity.py --workers 4 --sim-processes 6 --rates 8000,12000

The replicas are ``rayfleet sim`` with every step cost 0, spread over ``--sim-processes``
processes (one simulator process on one core carries about 2,000 req/s, measured on a
16-core machine, so a gateway faster than that needs several); the gateway (least_load,
the default policy) runs in a process of its own (sim_gateway.py); the load client is
``rayfleet bench``'s runner with ``--client-processes`` processes, sending Poisson
arrivals of streamed completions of 16 tokens. On a machine of more than 2 cores each gets
cores of its own: the gateway core 0, the simulator processes one core each after it, the
client the rest (``os.sched_setaffinity``; where cores run two hardware threads, a gateway
process's sibling thread is left idle: ``placement``); on 2 cores they share, and the numbers are
indicative only. ``--workers N`` serves the port with gateway.workers' N processes
(rayfleet/gateway/workers.py), cores 0 to N-1, one each; the CPU columns then add up
every gateway process.

For each rate, a simulator process's share of it (rate / ``--sim-processes``) goes first
straight to one simulated replica (the simulator's own TTFT at the load each of its
processes carries through the gateway), and then the whole rate through the gateway.
Printed per rate: achieved req/s, TTFT p50 and p99 direct and through the gateway, p99's
difference (the goal: under 5 ms at 5,000 req/s per gateway core), and the gateway's
CPU per request (user + system from psutil, over the run) and read system calls per
request (Linux's /proc io counters: a stream read a token at a time would take about 18,
one whose tokens wait in the socket fewer; the writes are in the JSON rows). The
saturation rate is the first at which the gateway achieves less than 95% of the offered
rate.

``--max-in-flight none,128`` starts one gateway per value of gateway.max_in_flight (none:
the default) and sends each rate through each of them by turns, the order reversed every
other rate; requests refused with its 503 are counted apart from failures.

``--max-connections N`` caps the open loop's client at N connections (``rayfleet bench
--max-connections``), as an application's HTTP pool does: past the gateway's capacity,
requests then wait in the client, not in the kernel's accept queue.

``--replicas-from canned`` (here, in gateway_scaling.py and gateway_versions.py) puts
canned_replica.py's replicas in the simulator's place: the same bytes for about half the
simulator's CPU a request, and no engine model at all; for measuring the gateway where
the simulator would be the ceiling, never for anything about the replicas.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_gateway import GatewayProcess, shares, sim_fleets

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.drive import RunOutput
from rayfleet.bench.load import LoadShape
from rayfleet.bench.runner import run_load
from rayfleet.sim.spec import EngineSpec

MODEL = "sim"
OUTPUT_TOKENS = 16
ZERO_COST = EngineSpec(
    model=MODEL, step_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, request_overhead_s=0.0
)


class Placement(NamedTuple):
    """A core per gateway process, a core per replica process, the client's cores; Nones
    where there are not cores enough for each to have its own."""

    gateway: list[int] | None
    replicas: list[int] | None
    client: set[int] | None

    def roles(self) -> dict[str, set[int]]:
        """The replicas' and the client's cores by role (for ``busy_cores``); none where
        they share cores with the rest."""
        if self.replicas is None or self.client is None:
            return {}
        return {"replicas": set(self.replicas), "client": self.client}


def placement(num_sims: int, num_workers: int = 1) -> Placement:
    """(a core per gateway process, a core per simulator process, client cores), or Nones
    when there are not cores enough for each to have its own and the client two.

    Where a physical core runs two hardware threads (SMT), each gateway process gets a
    thread of a physical core of its own, and the other thread of that core is left idle:
    two busy threads of one core each run well below one core's speed, and the gateway's
    scaling over N processes would measure that."""
    cores = sorted(os.sched_getaffinity(0))
    gateway: list[int] = []
    idle: set[int] = set()
    for core in cores:
        if len(gateway) == num_workers:
            break
        if core not in idle:
            gateway.append(core)
            idle |= thread_siblings(core) & set(cores)
    rest = [core for core in cores if core not in idle]
    if len(gateway) < num_workers or len(rest) < num_sims + 2:
        return Placement(None, None, None)
    return Placement(gateway, rest[:num_sims], set(rest[num_sims:]))


def busy_cores(roles: dict[str, set[int]]) -> Callable[[], dict[str, float]]:
    """Starts counting each role's cores (psutil's per-core times): the function returned
    gives, per role, how many of its cores were busy on average since (user, system, irq
    and the rest; not idle, iowait or steal), as ``{role}_cores_busy``."""
    import psutil

    def busy_and_all() -> list[tuple[float, float]]:
        return [
            (sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0), sum(t))
            for t in psutil.cpu_times(percpu=True)
        ]

    before = busy_and_all()

    def since() -> dict[str, float]:
        after = busy_and_all()

        def share(core: int) -> float:
            elapsed = after[core][1] - before[core][1]
            return (after[core][0] - before[core][0]) / elapsed if elapsed > 0 else 0.0

        return {f"{role}_cores_busy": sum(map(share, cores)) for role, cores in roles.items()}

    return since


def syscall_columns(before: tuple[int, int], after: tuple[int, int], num_requests: int) -> dict:
    """The gateway's read and write system calls a request, between two readings of
    ``GatewayProcess.syscalls`` (a stream read a token at a time takes about 18 of each)."""
    num = max(num_requests, 1)
    return {
        "gateway_reads_per_request": (after[0] - before[0]) / num,
        "gateway_writes_per_request": (after[1] - before[1]) / num,
    }


def thread_siblings(core: int) -> set[int]:
    """The hardware threads of ``core``'s physical core, itself included (Linux sysfs)."""
    path = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list")
    try:
        text = path.read_text().strip()
    except OSError:
        return {core}
    threads: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        threads.update(range(int(first), int(last or first) + 1))
    return threads


def capacity_prompt(n: int) -> Prompt:
    """Request ``n`` of a capacity run: a short prompt of its own, 16 tokens asked for."""
    return Prompt(f"request {n} " + "word " * 12, 16, OUTPUT_TOKENS)


def run(
    target: Target,
    rate: float,
    duration_s: float,
    processes: int,
    seed: int,
    concurrency: int | None = None,
    connections: int | None = None,
) -> RunOutput:
    """Poisson arrivals at ``rate`` for ``duration_s``; with ``concurrency``, a closed
    loop instead: as many requests, ``concurrency`` of them in flight at all times.
    ``connections`` caps the client's connections (all its processes together)."""
    num = max(int(rate * duration_s), 1)
    prompts = [capacity_prompt(i) for i in range(num)]
    if concurrency is not None:
        shape = LoadShape(max_concurrency=concurrency, seed=seed)
    else:
        shape = LoadShape(request_rate=rate, max_connections=connections, seed=seed)
    return run_load(target, prompts, shape, num_processes=processes)


def summary(output: RunOutput) -> dict[str, float]:
    ok = [r for r in output.results if r.ok]
    refused = sum(r.status == 503 for r in output.results)  # over gateway.max_in_flight
    ttft_ms = np.array([r.ttft_s for r in ok] or [np.nan]) * 1e3
    return {
        "achieved_rps": len(ok) / output.duration_s if output.duration_s else 0.0,
        "num_failed": len(output.results) - len(ok) - refused,
        "num_refused": refused,
        "ttft_p50_ms": float(np.percentile(ttft_ms, 50)),
        "ttft_p99_ms": float(np.percentile(ttft_ms, 99)),
    }


@contextlib.contextmanager
def pinned_fleet(
    num_replicas: int, num_sims: int, num_workers: int, kind: str = "sim"
) -> Iterator[tuple[list[str], Placement]]:
    """Zero-cost simulated replicas (or, with ``kind`` "canned", canned_replica.py's) over
    ``num_sims`` processes, each of them and this process (the client) pinned as
    ``placement`` says: (the replicas' urls, that placement). Cores are placed before this
    process is pinned: a placement made after it would see the client's cores only."""
    where = placement(num_sims, num_workers)
    with replica_processes(kind, num_replicas, num_sims) as fleets:
        for n, fleet in enumerate(fleets):
            if where.replicas is not None and fleet.proc is not None:
                os.sched_setaffinity(fleet.proc.pid, {where.replicas[n]})
        if where.client is not None:
            os.sched_setaffinity(0, where.client)  # the client's worker processes inherit it
        yield [url for fleet in fleets for url in fleet.urls], where


@contextlib.contextmanager
def replica_processes(kind: str, num_replicas: int, num_processes: int) -> Iterator[list[Any]]:
    """``num_replicas`` replicas of ``kind`` over ``num_processes`` processes, each with
    ``urls`` and ``proc``: the zero-cost simulator ("sim") or canned_replica.py ("canned")."""
    if kind == "sim":
        with sim_fleets(ZERO_COST, num_replicas, num_processes) as fleets:
            yield fleets
        return
    from canned_replica import CannedReplicasProcess

    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(CannedReplicasProcess(n))
            for n in shares(num_replicas, num_processes)
        ]


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the simulated fleet and the client, shared with gateway_scaling.py."""
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument(
        "--sim-processes",
        type=int,
        default=1,
        help="simulator processes (or canned-replica ones, --replicas-from), a core each",
    )
    parser.add_argument(
        "--replicas-from",
        choices=["sim", "canned"],
        default="sim",
        help="sim: zero-cost simulated replicas (rayfleet sim); canned: canned_replica.py, "
        "a server that streams the same bytes for a fraction of the simulator's CPU and "
        "models nothing (for gateway.workers' scaling, where the simulator is the ceiling)",
    )
    parser.add_argument("--client-processes", type=int, default=max(1, (os.cpu_count() or 1) - 2))
    parser.add_argument("--seed", type=int, default=0)


def add_access_log_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="the gateway writes its request log (to a temporary file) as rayfleet up "
        "does; without it, none",
    )


def request_log(stack: contextlib.ExitStack, wanted: bool) -> Path | None:
    """A request log's path in a directory removed when ``stack`` closes; None unless
    ``wanted``."""
    if not wanted:
        return None
    return Path(
        stack.enter_context(tempfile.TemporaryDirectory(prefix="rayfleet-log-")), "access.log"
    )


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    fleet = pinned_fleet(args.replicas, args.sim_processes, args.workers, args.replicas_from)
    with fleet as (urls, where), contextlib.ExitStack() as stack:
        gateway_cpus = where.gateway
        gateways = {
            limit: stack.enter_context(
                GatewayProcess(
                    urls,
                    MODEL,
                    "least_load",
                    cpu=gateway_cpus[0] if gateway_cpus else None,
                    workers=args.workers,
                    worker_cpus=gateway_cpus,
                    pool=args.pool,
                    max_in_flight=limit,
                    access_log=request_log(stack, args.access_log),
                )
            )
            for limit in args.max_in_flight
        }
        direct_target = Target(urls[0], "/v1/completions", MODEL)
        for target in [
            direct_target,
            *(Target(g.url, "/v1/completions", MODEL) for g in gateways.values()),
        ]:
            run(target, 100, 2, args.client_processes, args.seed)  # connections made, code warm
        first = gateways[args.max_in_flight[0]]
        rows += [
            closed_loop(first, Target(first.url, "/v1/completions", MODEL), c, args)
            for c in args.concurrency
        ]
        for n, rate in enumerate(args.rates):
            share = rate / args.sim_processes
            direct = summary(
                run(direct_target, share, args.duration_s, args.client_processes, args.seed)
            )
            limits = args.max_in_flight if n % 2 == 0 else args.max_in_flight[::-1]
            for limit in limits:  # the limits by turns, the order reversed every other rate
                row = open_loop(gateways[limit], rate, args) | {"direct": direct}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def open_loop(gateway: GatewayProcess, rate: float, args: argparse.Namespace) -> dict:
    """Poisson arrivals at ``rate`` through ``gateway``: one row of the table."""
    target = Target(gateway.url, "/v1/completions", MODEL)
    row = {
        "rate": rate,
        "max_in_flight": gateway.max_in_flight,
        "max_connections": args.max_connections,
    }
    return row | measured(
        gateway,
        args,
        lambda: run(
            target,
            rate,
            args.duration_s,
            args.client_processes,
            args.seed,
            connections=args.max_connections,
        ),
    )


def closed_loop(
    gateway: GatewayProcess, target: Target, concurrency: int, args: argparse.Namespace
) -> dict:
    """The gateway's throughput with ``concurrency`` requests always in flight: its
    capacity, which an open loop past saturation does not show (throughput collapses)."""
    num = int(args.closed_loop_rps * args.duration_s)
    row = {"concurrency": concurrency} | measured(
        gateway,
        args,
        lambda: run(
            target, num / args.duration_s, args.duration_s, args.client_processes, 0, concurrency
        ),
    )
    print(json.dumps(row), flush=True)
    return row


def measured(
    gateway: GatewayProcess, args: argparse.Namespace, send: Callable[[], RunOutput]
) -> dict:
    """What ``send`` got through ``gateway``, the gateway CPU it cost, and the gateway's
    read and write system calls a request (a token a read would be about 18 of each)."""
    before, calls_before = gateway.cpu_s(), gateway.syscalls()
    output = send()
    used_s = gateway.cpu_s() - before
    return {
        "workers": args.workers,
        "pool": args.pool or args.workers > 1,
        "access_log": args.access_log,
        "gateway": summary(output),
        "gateway_cpu_us_per_request": 1e6 * used_s / max(len(output.results), 1),
        "gateway_cpu_share": used_s / output.duration_s,
    } | syscall_columns(calls_before, gateway.syscalls(), len(output.results))


def print_table(rows: list[dict]) -> None:
    closed = [row for row in rows if "concurrency" in row]
    rows = [row for row in rows if "rate" in row]
    if closed:
        print(
            f"\n{'in flight':>9s} {'req/s':>8s} {'TTFT p50':>9s} {'p99':>8s} "
            f"{'CPU/req':>9s} {'gw cores':>8s}"
        )
        for row in closed:
            gw = row["gateway"]
            print(
                f"{row['concurrency']:9d} {gw['achieved_rps']:8.0f} {gw['ttft_p50_ms']:8.2f}m "
                f"{gw['ttft_p99_ms']:7.2f}m {row['gateway_cpu_us_per_request']:7.0f}us "
                f"{row['gateway_cpu_share']:7.0%}"
            )
    if not rows:
        return
    print(
        f"\n{'offered':>8s} {'limit':>6s} {'achieved':>9s} {'refused':>8s} {'TTFT p50':>9s} "
        f"{'p99':>8s} {'sim p99':>8s} {'p99 extra':>9s} {'CPU/req':>9s} {'gw cores':>8s} "
        f"{'reads/req':>9s}"
    )
    saturation: dict[object, float] = {}  # per limit: the first rate under 95% achieved
    for row in rows:
        gw, direct = row["gateway"], row["direct"]
        extra = gw["ttft_p99_ms"] - direct["ttft_p99_ms"]
        limit = row.get("max_in_flight") or "-"
        print(
            f"{row['rate']:8.0f} {limit:>6} {gw['achieved_rps']:9.0f} "
            f"{gw.get('num_refused', 0):8d} {gw['ttft_p50_ms']:8.2f}m "
            f"{gw['ttft_p99_ms']:7.2f}m {direct['ttft_p99_ms']:7.2f}m {extra:8.2f}m "
            f"{row['gateway_cpu_us_per_request']:7.0f}us {row['gateway_cpu_share']:7.0%} "
            f"{row.get('gateway_reads_per_request', float('nan')):9.1f}"
        )
        if limit not in saturation and gw["achieved_rps"] < 0.95 * row["rate"]:
            saturation[limit] = row["rate"]
    where = ", ".join(f"{v:g} req/s (limit {k})" for k, v in saturation.items())
    print(
        f"saturation (achieved < 95% of offered): {where or 'not reached at these rates'}; "
        f"cores here: {os.cpu_count()}"
    )


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rates",
        default="200,400,800",
        type=lambda text: [float(r) for r in text.split(",") if r],
    )
    parser.add_argument("--duration-s", type=float, default=10.0)
    add_fleet_arguments(parser)
    add_access_log_argument(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway.workers: gateway processes on the port, a core each",
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="serve through gateway.workers' pool even with one worker (its cost alone)",
    )
    parser.add_argument(
        "--concurrency",
        default="",
        type=lambda text: [int(c) for c in text.split(",") if c],
        help="closed-loop rounds first, at these numbers of requests in flight",
    )
    parser.add_argument(
        "--closed-loop-rps",
        type=float,
        default=5000.0,
        help="a closed-loop round sends this many requests per --duration-s second",
    )
    parser.add_argument(
        "--max-in-flight",
        default=[None],
        type=lambda text: [None if v == "none" else int(v) for v in text.split(",")],
        help="gateway.max_in_flight of each gateway process (requests over it get a 503); "
        "several ('none,512'): a gateway each, every rate run through each by turns",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="the open loop's client opens at most this many connections to the gateway (all "
        "its processes together), as applications' pools do; a request waits for one, and "
        "its TTFT counts the wait. Default: a connection per request in flight",
    )
    parser.add_argument("--out", type=Path, default=Path("results/gateway_capacity.json"))
    args = parser.parse_args()
    rows = measure(args)
    print_table(rows)
    write_rows(args.out, rows)


if __name__ == "__main__":
    main()
