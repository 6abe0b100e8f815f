"""gateway.workers' scaling: 1 and N gateway processes in alternating rounds, as ratios.

    python benchmarks/gateway_scaling.py --workers 1,2,4 --rounds 3 --sim-processes 6 \\
        --client-processes 6 --in-flight-per-worker 64 --duration-s 6   # 16 cores

A machine whose cores change speed from one minute to the next (a shared virtual machine
does: benchmarks/cpu_scaling.py measured one core's speed for fixed work vary 2x within a
minute on the lent 16-core one) makes one worker's throughput measured in one run and N
workers' in another a poor ratio. So here the simulated replicas (64, zero cost, over
``--sim-processes`` processes) stay up, and each round starts a fresh gateway for every
value of ``--workers`` in turn (the order reversed every other round), drives it with a
closed loop of ``--in-flight-per-worker`` x N streamed completions of 16 tokens for
``--duration-s``, and reads its throughput and CPU per request. Per round, each N's
throughput is divided by the one-worker throughput of the same round; the table prints
those ratios, their mean and N-scaling (ratio / N; the issue's goal is at least 0.9).
Cores: the gateway processes get the first max(N) cores (one each; with two hardware
threads a core, a physical core each, its other thread idle), the simulator processes the
next ones, the client the rest, as in gateway_capacity.py's ``placement``.

``--independent`` is the control that tells the gateway's scaling from the machine's: N
single-process gateways, each on a port and a core of its own and sharing nothing, each
driven by its own share of the client processes at once. If their CPU per request also
grows with N, the cause is the machine (caches, memory, the hypervisor), not what
gateway.workers' processes share. Each row also splits the gateway CPU into user and
system time, and a gateway.workers row counts the gateway's read and write system calls
a request (``gateway_reads_per_request``: a read takes one token or several, as many as
wait in the socket, so this tells how much a busy rig batches the stream). Where every
role has cores of its own, each row also says how many of the replicas' and the client's
cores were busy while it ran (``replicas_cores_busy``, ``client_cores_busy``, psutil's
per-core times; the table's last two columns): a rig whose cores are all busy is the
ceiling, not the gateway.

``--kinds rayfleet,bare`` runs, in the same rounds, N copies of bare_relay.py beside the
gateway (always independent: the bare relay has no workers): what a Python process that
only passes the bytes between the sockets costs per request, and how that grows with N.
``--client raw`` drives the closed loop with raw_client.py, a client on httptools that
needs a fraction of the bench runner's CPU a request, so that ``--sim-processes`` can take
the cores the client gives up (``--sim-processes 10 --client-processes 2`` beside 4
gateways on 16 cores). ``--rate-per-gateway R`` drives each gateway (or each of the N
processes) with Poisson arrivals at R req/s instead of a closed loop, so that every N is
measured at the same load a process: there the CPU per request, against N = 1 of the same
kind and round, is the reading, not the throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bare_relay import BareRelayProcess
from gateway_capacity import (
    MODEL,
    Placement,
    add_fleet_arguments,
    busy_cores,
    pinned_fleet,
    run,
    summary,
    syscall_columns,
    write_rows,
)
from raw_client import run_raw
from sim_gateway import GatewayProcess

from rayfleet.bench.client import Target
from rayfleet.bench.drive import RunOutput


def one_round(urls: list[str], workers: int, where: Placement, args: argparse.Namespace) -> dict:
    """A fresh gateway of ``workers`` processes, warmed, then driven (``drive``)."""
    cpus = where.gateway
    in_flight = args.in_flight_per_worker * workers
    with GatewayProcess(
        urls,
        MODEL,
        "least_load",
        cpu=cpus[0] if cpus else None,
        workers=workers,
        worker_cpus=cpus[:workers] if cpus else None,
        pool=workers > 1,
    ) as gateway:
        target = Target(gateway.url, "/v1/completions", MODEL)
        run(target, 200, 1, args.client_processes, args.seed)  # connections made, code warm
        before, calls_before = gateway.cpu_times(), gateway.syscalls()
        rig_busy = busy_cores(where.roles())
        output = drive(target, workers, args.client_processes, args)
        rig_columns = rig_busy()
        used = [b - a for a, b in zip(before, gateway.cpu_times(), strict=True)]
        calls = syscall_columns(calls_before, gateway.syscalls(), len(output.results))
    result = summary(output)
    if args.rate_per_gateway:
        in_flight = None
    return (
        {"kind": "rayfleet", "workers": workers, "in_flight": in_flight, **result}
        | cpu_columns(used, len(output.results), output.duration_s)
        | calls
        | rig_columns
    )


def drive(target: Target, count: int, processes: int, args: argparse.Namespace) -> RunOutput:
    """The load for ``count`` gateway processes behind ``target``: Poisson arrivals at
    ``--rate-per-gateway`` each, else a closed loop of ``--in-flight-per-worker`` each."""
    if args.rate_per_gateway:
        return run(target, args.rate_per_gateway * count, args.duration_s, processes, 0)
    in_flight = args.in_flight_per_worker * count
    num_per_s = args.max_rps_per_worker * count
    if args.client == "raw":
        return run_raw(target, int(num_per_s * args.duration_s), in_flight, processes)
    return run(target, num_per_s, args.duration_s, processes, 0, in_flight)


def independent_round(
    urls: list[str], count: int, where: Placement, args: argparse.Namespace, kind: str
) -> dict:
    """``count`` single-process gateways (``kind`` rayfleet) or bare relays (bare) sharing
    nothing, each driven by its own share of the client processes at the same time: the
    control for one_round."""
    cpus = where.gateway
    with contextlib.ExitStack() as stack:
        gateways: list[GatewayProcess | BareRelayProcess] = [
            stack.enter_context(
                GatewayProcess(urls, MODEL, "least_load", cpu=cpus[n] if cpus else None)
                if kind == "rayfleet"
                else BareRelayProcess(urls, cpu=cpus[n] if cpus else None)
            )
            for n in range(count)
        ]
        processes = max(1, args.client_processes // count)
        for gateway in gateways:
            run(Target(gateway.url, "/v1/completions", MODEL), 200, 1, processes, args.seed)
        before = [gateway.cpu_times() for gateway in gateways]
        rig_busy = busy_cores(where.roles())
        context = mp.get_context("spawn")
        queue: Any = context.Queue()
        clients = [
            context.Process(target=client_share, args=(gateway.url, processes, args, queue))
            for gateway in gateways
        ]
        for client in clients:
            client.start()
        shares = [queue.get() for _ in clients]
        rig_columns = rig_busy()
        for client in clients:
            client.join()
        after = [gateway.cpu_times() for gateway in gateways]
    used = [sum(b[i] - a[i] for a, b in zip(before, after, strict=True)) for i in range(2)]
    num = sum(share["num_results"] for share in shares)
    duration_s = max(share["duration_s"] for share in shares)
    return (
        {
            "kind": kind,
            "workers": count,
            "independent": True,
            "in_flight": None if args.rate_per_gateway else args.in_flight_per_worker * count,
            "achieved_rps": sum(share["achieved_rps"] for share in shares),
            "num_failed": sum(share["num_failed"] for share in shares),
            "num_refused": sum(share["num_refused"] for share in shares),
            "ttft_p50_ms": max(share["ttft_p50_ms"] for share in shares),
            "ttft_p99_ms": max(share["ttft_p99_ms"] for share in shares),
            "per_gateway_rps": [share["achieved_rps"] for share in shares],
        }
        | cpu_columns(used, num, duration_s)
        | rig_columns
    )


def client_share(url: str, processes: int, args: argparse.Namespace, queue: Any) -> None:
    """One gateway's load, in a process of its own (run_load's workers need their
    parent's main thread): its summary, request count and duration on ``queue``."""
    output = drive(Target(url, "/v1/completions", MODEL), 1, processes, args)
    queue.put(
        summary(output) | {"num_results": len(output.results), "duration_s": output.duration_s}
    )


def cpu_columns(used: list[float], num_requests: int, duration_s: float) -> dict:
    """Gateway CPU per request and cores busy from (user, system) seconds, and the
    system time's share."""
    total_s = sum(used)
    return {
        "gateway_cpu_us_per_request": 1e6 * total_s / max(num_requests, 1),
        "gateway_cores_busy": total_s / duration_s if duration_s else 0.0,
        "gateway_system_share": used[1] / total_s if total_s else 0.0,
    }


def measure(args: argparse.Namespace) -> list[dict]:
    counts = sorted(set(args.workers))
    rows: list[dict] = []
    fleet = pinned_fleet(args.replicas, args.sim_processes, max(counts), args.replicas_from)
    with fleet as (urls, where):
        for round_no in range(args.rounds):
            for workers in counts if round_no % 2 == 0 else counts[::-1]:
                for kind in args.kinds if round_no % 2 == 0 else args.kinds[::-1]:
                    if kind == "rayfleet" and not args.independent:
                        result = one_round(urls, workers, where, args)
                    else:
                        result = independent_round(urls, workers, where, args, kind)
                    row = {"round": round_no, **result}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """Per kind and N: throughput and CPU per request, each against N = 1 of the same kind
    in the same round."""
    print(
        f"\n{'kind':>8s} {'N':>2s} {'req/s per round':>32s} {'vs N = 1':>18s} {'mean':>5s} "
        f"{'scaling':>7s} {'CPU/req':>8s} {'vs N = 1':>8s} {'system':>6s} "
        f"{'replicas':>8s} {'client':>6s}"
    )
    rounds = sorted({row["round"] for row in rows})
    for kind in dict.fromkeys(row.get("kind", "rayfleet") for row in rows):
        of_kind = [row for row in rows if row.get("kind", "rayfleet") == kind]
        one = {row["round"]: row for row in of_kind if row["workers"] == 1}
        for workers in sorted({row["workers"] for row in of_kind}):
            mine = {row["round"]: row for row in of_kind if row["workers"] == workers}
            paired = [r for r in rounds if r in mine and r in one]
            rps = [mine[r]["achieved_rps"] for r in rounds if r in mine]
            ratios = [mine[r]["achieved_rps"] / one[r]["achieved_rps"] for r in paired]
            cpu_ratios = [
                mine[r]["gateway_cpu_us_per_request"] / one[r]["gateway_cpu_us_per_request"]
                for r in paired
            ]
            mean = statistics.mean(ratios) if ratios else float("nan")
            cpu = statistics.mean(mine[r]["gateway_cpu_us_per_request"] for r in mine)
            cpu_ratio = statistics.mean(cpu_ratios) if cpu_ratios else float("nan")
            system = statistics.mean(mine[r]["gateway_system_share"] for r in mine)
            rig = [_mean_of(mine.values(), f"{role}_cores_busy") for role in ("replicas", "client")]
            print(
                f"{kind:>8s} {workers:2d} {', '.join(f'{x:,.0f}' for x in rps):>32s} "
                f"{', '.join(f'{x:.2f}' for x in ratios):>18s} {mean:5.2f} "
                f"{mean / workers:6.2f}N {cpu:6.0f}us {cpu_ratio:7.2f}x {system:6.0%} "
                f"{_cores(rig[0]):>8s} {_cores(rig[1]):>6s}"
            )


def _mean_of(rows: Iterable[dict], column: str) -> float:
    values = [row[column] for row in rows if column in row]
    return statistics.mean(values) if values else float("nan")


def _cores(busy: float) -> str:
    return "-" if math.isnan(busy) else f"{busy:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=6.0)
    add_fleet_arguments(parser)
    parser.add_argument("--in-flight-per-worker", type=int, default=64)
    parser.add_argument(
        "--max-rps-per-worker",
        type=float,
        default=4000.0,
        help="sizes the closed loop's request count: this x workers x duration",
    )
    parser.add_argument(
        "--independent",
        action="store_true",
        help="N single-process gateways sharing nothing, each with its own port, core and "
        "client share, instead of gateway.workers' N processes on one port (the control)",
    )
    parser.add_argument(
        "--kinds",
        type=lambda t: t.split(","),
        default=["rayfleet"],
        help="comma-separated: rayfleet (the gateway), bare (bare_relay.py, N independent "
        "copies: the floor any Python relay pays here)",
    )
    parser.add_argument(
        "--rate-per-gateway",
        type=float,
        default=0.0,
        help="Poisson arrivals at this many req/s for each of the N processes, instead of "
        "the closed loop: every N at the same load a process",
    )
    parser.add_argument(
        "--client",
        choices=["bench", "raw"],
        default="bench",
        help="the closed loop's client: rayfleet bench's runner, or raw_client.py (httptools, "
        "a fraction of the CPU a request, so the simulator can have more of the cores)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/gateway_scaling.json"))
    args = parser.parse_args()
    if args.client == "raw" and args.rate_per_gateway:
        parser.error("--client raw runs a closed loop only: leave out --rate-per-gateway")
    if set(args.kinds) - {"rayfleet", "bare"}:
        parser.error("--kinds takes rayfleet and bare")
    if 1 not in args.workers:
        parser.error("--workers must include 1: every ratio is to one worker's round")
    rows = measure(args)
    print_table(rows)
    write_rows(args.out, rows)


if __name__ == "__main__":
    main()
