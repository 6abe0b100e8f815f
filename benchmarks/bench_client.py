"""How many requests per second can one `rayfleet bench` process drive?

The target is the simulator (``rayfleet.bench.simulator``): an aiohttp server that
streams canned SSE chunks shaped like vLLM's, with no model behind it, run in its own
processes on 127.0.0.1. The bench offers rising Poisson request rates; a rate counts as
sustained when the bench achieved at least 95% of it and sent 99% of its requests
within 10 ms of their scheduled time (the client kept up with its own schedule).
The same ladder is then run with ``--num-processes N`` to show the load spreading over
several client processes.

    python benchmarks/bench_client.py --rates 500,1000,2000,4000 --num-processes 1,2,4 \\
        --simulator-processes 4 --output-len 16 --duration-s 4 --out results/bench_client.json

Load is bounded: each step sends ``rate * duration_s`` requests (at most
``--max-requests``) to loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.load import LoadShape
from rayfleet.bench.metrics import summarize
from rayfleet.bench.runner import run_load
from rayfleet.bench.simulator import SimulatorProcess

SUSTAINED_SHARE = 0.95
LAG_LIMIT_S = 0.010


def measure_step(
    url: str, rate: float, num_processes: int, args: argparse.Namespace
) -> dict[str, Any]:
    num_requests = int(min(rate * args.duration_s, args.max_requests))
    prompts = [Prompt("hello " * 8, 8, args.output_len)] * num_requests
    cpu_before_s = time.process_time()
    output = run_load(
        Target(url, model="sim"),
        prompts,
        LoadShape(request_rate=rate, seed=1),
        num_processes=num_processes,
    )
    cpu_s = time.process_time() - cpu_before_s
    summary = summarize(output.results, output.duration_s)
    lag_s = np.array([r.start_s - r.scheduled_s for r in output.results])
    achieved = summary["request_throughput"]
    p99_lag_s = float(np.percentile(lag_s, 99)) if len(lag_s) else float("inf")
    return {
        "offered_rps": rate,
        "num_processes": num_processes,
        "num_requests": num_requests,
        "achieved_rps": achieved,
        "output_tokens_per_s": summary["output_throughput"],
        "failed": summary["failed"],
        "p99_send_lag_ms": p99_lag_s * 1000,
        "median_ttft_ms": summary["median_ttft_ms"],
        "p99_ttft_ms": summary["p99_ttft_ms"],
        "parent_cpu_s": cpu_s,
        "sustained": achieved >= SUSTAINED_SHARE * rate
        and p99_lag_s <= LAG_LIMIT_S
        and summary["failed"] == 0,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| bench processes | offered req/s | achieved req/s | output tok/s | p99 send lag ms "
        "| TTFT p50 ms | TTFT p99 ms | sustained |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {r['num_processes']} | {r['offered_rps']:g} | {r['achieved_rps']:.0f} "
        f"| {r['output_tokens_per_s']:.0f} | {r['p99_send_lag_ms']:.1f} "
        f"| {r['median_ttft_ms']:.1f} "
        f"| {r['p99_ttft_ms']:.1f} | {'yes' if r['sustained'] else 'no'} |"
        for r in rows
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="250,500,1000,2000")
    parser.add_argument("--num-processes", default="1,2")
    parser.add_argument("--simulator-processes", type=int, default=1)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--max-requests", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    process_counts = [int(n) for n in args.num_processes.split(",")]
    rows = []
    with SimulatorProcess(num_processes=args.simulator_processes) as simulator:
        for num_processes in process_counts:
            for rate in rates:
                simulator.reset()  # the log of every request it streamed: not needed here
                row = measure_step(simulator.url, rate, num_processes, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if not row["sustained"]:
                    break
    print(markdown(rows))
    best = {
        n: max(
            (r["achieved_rps"] for r in rows if r["num_processes"] == n and r["sustained"]),
            default=0,
        )
        for n in process_counts
    }
    print("highest sustained req/s by bench processes:", best)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "cpu_count": os.cpu_count(),
                    "args": vars(args) | {"out": str(args.out)},
                    "rows": rows,
                    "highest_sustained_rps": best,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
