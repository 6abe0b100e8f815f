"""The gateway of this tree against another checkout's, in alternating rounds, as ratios.

    git worktree add /tmp/before <commit>     # or any copy of another version's rayfleet/
    python benchmarks/gateway_versions.py --against /tmp/before --rounds 4 \\
        --sim-processes 6 --client-processes 8 --in-flight 64 --duration-s 6   # 16 cores

A change to the data path is judged by the gateway's CPU per request and its throughput
at saturation; one core's speed drifts from minute to minute on a shared machine, so the
two versions run by turns (the order reversed every other round) against the same
simulated replicas (64, zero cost, over ``--sim-processes`` processes) and client. Each
round starts a fresh one-process gateway of each version, pinned to core 0, with
``PYTHONPATH`` putting that version's ``rayfleet`` first (the other's directory holds a
``rayfleet/`` package; the simulator and the client are this tree's), warms it, and drives
it with a closed loop of ``--in-flight`` streamed completions of 16 tokens (or, with
``--rate``, an open loop of Poisson arrivals). Printed per version: req/s, CPU per request
and TTFT p99 each round, and the median of this tree's per-round ratios to the other's.

``--access-log`` has each gateway write its request log, as ``rayfleet up`` does (to a
temporary file); without it they keep none.

``--control`` adds a third gateway: a copy of this tree's ``rayfleet/`` in a directory of
its own, run in the same rotation. Its ratio to this tree is what the rig reads between two
identical versions (on 2 cores an A/A pair read 1.10x and 0.92x CPU per request), the floor
under which the ratio to ``--against`` says nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_capacity import (
    MODEL,
    add_access_log_argument,
    add_fleet_arguments,
    pinned_fleet,
    request_log,
    run,
    summary,
    write_rows,
)
from sim_gateway import GatewayProcess

from rayfleet.bench.client import Target

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def importing_from(root: Path) -> Iterator[None]:
    """Processes started inside import ``rayfleet`` from ``root`` first."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), before]))
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def one_round(urls: list[str], root: Path, cpu: int | None, args: argparse.Namespace) -> dict:
    with (
        importing_from(root),
        contextlib.ExitStack() as stack,
        GatewayProcess(
            urls, MODEL, "least_load", cpu=cpu, access_log=request_log(stack, args.access_log)
        ) as gateway,
    ):
        target = Target(gateway.url, "/v1/completions", MODEL)
        run(target, 200, 1, args.client_processes, args.seed)  # connections made, code warm
        before = gateway.cpu_s()
        if args.rate:  # open loop: Poisson arrivals, however many end up in flight
            output = run(target, args.rate, args.duration_s, args.client_processes, 0)
        else:
            output = run(
                target, args.max_rps, args.duration_s, args.client_processes, 0, args.in_flight
            )
        used_s = gateway.cpu_s() - before
    return {
        **summary(output),
        "gateway_cpu_us_per_request": 1e6 * used_s / max(len(output.results), 1),
        "gateway_cores_busy": used_s / output.duration_s,
    }


@contextlib.contextmanager
def copy_of_this_tree() -> Iterator[Path]:
    """A directory holding a copy of this tree's ``rayfleet/`` (removed on exit)."""
    with tempfile.TemporaryDirectory(prefix="rayfleet-control-") as tmp:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "rayfleet", Path(tmp) / "rayfleet", ignore=ignore)
        yield Path(tmp)


def measure(args: argparse.Namespace) -> list[dict]:
    versions = {"this tree": ROOT, "against": args.against.resolve()}
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        if args.control:
            versions["control"] = stack.enter_context(copy_of_this_tree())
        fleet = pinned_fleet(args.replicas, args.sim_processes, 1, args.replicas_from)
        urls, where = stack.enter_context(fleet)
        cpu = where.gateway[0] if where.gateway else None
        names = list(versions)
        for round_no in range(args.rounds):
            turn = round_no % len(names)  # each version takes each place in the order
            for name in names[turn:] + names[:turn]:
                row = {"round": round_no, "version": name, "root": str(versions[name])}
                row["access_log"] = args.access_log
                row.update(one_round(urls, versions[name], cpu, args))
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    by = {(row["version"], row["round"]): row for row in rows}
    rounds = sorted({row["round"] for row in rows})
    print(
        f"\n{'version':>10s} {'req/s per round':>36s} {'CPU/req per round':>28s} "
        f"{'TTFT p99 ms per round':>30s}"
    )
    for name in ("this tree", "against", "control"):
        mine = [by[name, r] for r in rounds if (name, r) in by]
        if not mine:
            continue
        rps = ", ".join(f"{row['achieved_rps']:,.0f}" for row in mine)
        cpu = ", ".join(f"{row['gateway_cpu_us_per_request']:.0f}" for row in mine)
        p99 = ", ".join(f"{row['ttft_p99_ms']:,.1f}" for row in mine)
        print(f"{name:>10s} {rps:>36s} {cpu:>28s} {p99:>30s}")
    for other, meaning in (("against", ""), ("control", " (the same code: the rig's floor)")):
        pairs = [(by["this tree", r], by[other, r]) for r in rounds if (other, r) in by]
        if pairs:
            rps = statistics.median(a["achieved_rps"] / b["achieved_rps"] for a, b in pairs)
            cpu = statistics.median(
                a["gateway_cpu_us_per_request"] / b["gateway_cpu_us_per_request"] for a, b in pairs
            )
            print(
                f"this tree / {other}{meaning}, median of rounds: "
                f"req/s {rps:.2f}x, CPU/req {cpu:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--against", type=Path, required=True, help="a directory holding the other rayfleet/"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="best a multiple of the versions run (2, or 3 with --control): each then takes "
        "each place in the order as often",
    )
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="an open loop instead: Poisson arrivals at this many req/s (past saturation, "
        "what a version does with the requests it cannot keep up with)",
    )
    parser.add_argument(
        "--max-rps",
        type=float,
        default=8000.0,
        help="sizes the closed loop's request count: this x duration",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="a third gateway, a copy of this tree, by turns with the two: the ratio two "
        "identical versions read on this rig",
    )
    add_fleet_arguments(parser)
    add_access_log_argument(parser)
    parser.add_argument("--out", type=Path, default=Path("results/gateway_versions.json"))
    args = parser.parse_args()
    if not (args.against / "rayfleet" / "__init__.py").exists():
        parser.error(f"--against: {args.against} holds no rayfleet/ package")
    num_versions = 3 if args.control else 2
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.rounds % num_versions:
        print(
            f"note: --rounds {args.rounds} is not a multiple of {num_versions} (the versions "
            "run): some version goes first more often than another",
            file=sys.stderr,
        )
    rows = measure(args)
    print_table(rows)
    write_rows(args.out, rows)


if __name__ == "__main__":
    main()
