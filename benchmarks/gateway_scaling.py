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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_capacity import (
    MODEL,
    add_fleet_arguments,
    pinned_fleet,
    run,
    summary,
    write_rows,
)
from sim_gateway import GatewayProcess

from rayfleet.bench.client import Target


def one_round(
    urls: list[str], workers: int, cpus: list[int] | None, args: argparse.Namespace
) -> dict:
    """A fresh gateway of ``workers`` processes, warmed, then driven by a closed loop."""
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
        num_per_s = args.max_rps_per_worker * workers
        before = gateway.cpu_s()
        output = run(target, num_per_s, args.duration_s, args.client_processes, 0, in_flight)
        used_s = gateway.cpu_s() - before
    result = summary(output)
    return {
        "workers": workers,
        "in_flight": in_flight,
        **result,
        "gateway_cpu_us_per_request": 1e6 * used_s / max(len(output.results), 1),
        "gateway_cores_busy": used_s / output.duration_s,
    }


def measure(args: argparse.Namespace) -> list[dict]:
    counts = sorted(set(args.workers))
    rows: list[dict] = []
    with pinned_fleet(args.replicas, args.sim_processes, max(counts)) as (urls, gateway_cpus):
        for round_no in range(args.rounds):
            for workers in counts if round_no % 2 == 0 else counts[::-1]:
                row = {"round": round_no, **one_round(urls, workers, gateway_cpus, args)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"\n{'workers':>7s} {'req/s per round':>32s} {'vs 1 worker':>24s} {'mean':>6s} "
        f"{'scaling':>7s} {'CPU/req':>8s}"
    )
    rounds = sorted({row["round"] for row in rows})
    one = {row["round"]: row["achieved_rps"] for row in rows if row["workers"] == 1}
    for workers in sorted({row["workers"] for row in rows}):
        mine = {row["round"]: row for row in rows if row["workers"] == workers}
        rps = [mine[r]["achieved_rps"] for r in rounds if r in mine]
        ratios = [mine[r]["achieved_rps"] / one[r] for r in rounds if r in mine and one.get(r)]
        mean = statistics.mean(ratios) if ratios else float("nan")
        cpu = statistics.mean(mine[r]["gateway_cpu_us_per_request"] for r in mine)
        print(
            f"{workers:7d} {', '.join(f'{x:,.0f}' for x in rps):>32s} "
            f"{', '.join(f'{x:.2f}' for x in ratios):>24s} {mean:6.2f} {mean / workers:6.2f}N "
            f"{cpu:6.0f}us"
        )


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
    parser.add_argument("--out", type=Path, default=Path("results/gateway_scaling.json"))
    args = parser.parse_args()
    if 1 not in args.workers:
        parser.error("--workers must include 1: every ratio is to one worker's round")
    rows = measure(args)
    print_table(rows)
    write_rows(args.out, rows)


if __name__ == "__main__":
    main()
