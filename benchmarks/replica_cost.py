"""What the benchmarks' replicas cost a request: the zero-cost simulator against canned
replicas (canned_replica.py), driven directly, without a gateway.

    .venv/bin/python benchmarks/replica_cost.py --requests 20000 --in-flight 32

For each kind in turn (the order reversed every other round): one process of
``--replicas`` replicas on a core of its own, raw_client.py's closed loop from one process
on another core to the first replica, and the replica process's CPU time (user and
system) over the requests the loop carried. The client's CPU a request is printed too (its
processes' times as this process reaps them). Streamed completions of 16 tokens with
usage, as gateway_capacity.py sends. Needs two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from gateway_capacity import MODEL, replica_processes
from raw_client import run_raw

from rayfleet.bench.client import Target


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(kind: str, args: argparse.Namespace, cores: list[int]) -> dict:
    with replica_processes(kind, args.replicas, 1) as processes:
        replica = processes[0]
        os.sched_setaffinity(replica.proc.pid, {cores[0]})
        target = Target(replica.urls[0], "/v1/completions", MODEL)
        run_raw(target, 500, args.in_flight, 1)  # connections made, code warm
        process = psutil.Process(replica.proc.pid)
        before, client_before = sum(process.cpu_times()[:2]), children_cpu_s()
        output = run_raw(target, args.requests, args.in_flight, 1)
        used, client_used = sum(process.cpu_times()[:2]) - before, children_cpu_s() - client_before
    done = sum(result.ok for result in output.results)
    return {
        "kind": kind,
        "requests_ok": done,
        "requests": len(output.results),
        "req_per_s": done / output.duration_s if output.duration_s else 0.0,
        "replica_cpu_us_per_request": 1e6 * used / max(done, 1),
        "client_cpu_us_per_request": 1e6 * client_used / max(done, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8, help="replicas in the one process")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/replica_cost.json"))
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        parser.error("needs two cores: one for the replicas, one for the client")
    os.sched_setaffinity(0, {cores[1]})  # the client's process inherits it
    rows = []
    for round_no in range(args.rounds):
        kinds = ["sim", "canned"] if round_no % 2 == 0 else ["canned", "sim"]
        for kind in kinds:
            row = {"round": round_no, **one_round(kind, args, cores)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'kind':>7s} {'req/s':>8s} {'replica CPU/req':>16s} {'client CPU/req':>15s}")
    for row in rows:
        replica, client = row["replica_cpu_us_per_request"], row["client_cpu_us_per_request"]
        print(f"{row['kind']:>7s} {row['req_per_s']:8.0f} {replica:14.0f}us {client:13.0f}us")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}))


if __name__ == "__main__":
    main()
