"""The machine's own ceiling for N processes: how fast one core runs while N run at once.

    python benchmarks/cpu_scaling.py [--processes 1,2,3,4,8,16] [--rounds 3] [--work 400]
        [--out docs/results/cpu-scaling]

``gateway.workers: N`` is asked to scale at least 0.9 N. Whether any N processes can, on a
given machine, is a property of the machine: a virtual machine's cores may be hyperthreads
of the host, or share its memory bandwidth and turbo budget with its neighbours. This
measures that ceiling with work that shares nothing: N processes, each pinned to a core of
its own, each doing the same fixed amount of pure-Python work (dict inserts and lookups,
string building, bytes scans: the kind of work a gateway does per request) with no
communication. Per N: each process's wall time and CPU time for the work, and the
aggregate speed ``N * t1 / mean(tN)`` where t1 is the N = 1 run of the same round. Rounds
alternate the order of N (ascending, then descending) so drift over the run falls on every
N alike; the spread over rounds is printed too, since a shared machine's core speed
drifts within a minute. A perfect machine prints N; the gateway's scaling is read against
this.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path


def _work(amount: int) -> None:
    table: dict[int, str] = {}
    page = b"data: " + b"x" * 2048 + b"\n\n"
    for _ in range(amount):
        for i in range(4000):
            table[(i * 2654435761) & 0x3FFF] = f"r{i}"
        total = 0
        for key in range(0, 4000, 3):
            total += len(table.get(key, ""))
        for _ in range(40):
            page.find(b"\n\n")
            page.split(b"\n")


def _timed(cpu: int, amount: int, start: object, results: object) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()  # type: ignore[attr-defined]
    wall, cpu_time = time.perf_counter(), time.process_time()
    _work(amount)
    results.put((time.perf_counter() - wall, time.process_time() - cpu_time))  # type: ignore[attr-defined]


def run_together(n: int, amount: int, cpus: list[int]) -> list[tuple[float, float]]:
    """(wall s, CPU s) of each of ``n`` pinned processes doing ``amount`` at once."""
    context = mp.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    procs = [
        context.Process(target=_timed, args=(cpus[i], amount, start, results)) for i in range(n)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # let every process reach the start line; the work is timed inside
    start.set()
    out = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2,3,4,8,16", help="values of N")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=int, default=400, help="units of work per process")
    parser.add_argument("--out", default="", help="write <out>.json")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    counts = [n for n in (int(x) for x in args.processes.split(",")) if n <= len(cpus)]
    if 1 not in counts:
        parser.error("--processes must include 1: every ratio is to one process")
    rows: list[dict[str, float]] = []
    for round_no in range(args.rounds):
        for n in counts if round_no % 2 == 0 else counts[::-1]:
            times = run_together(n, args.work, cpus)
            wall = statistics.mean(w for w, _ in times)
            cpu = statistics.mean(c for _, c in times)
            rows.append({"round": round_no, "n": n, "wall_s": wall, "cpu_s": cpu})
            print(f"round {round_no}  N={n:2d}  per process {wall:.2f} s wall, {cpu:.2f} s CPU")
    print("\nN   aggregate speed against N = 1 of the same round: mean (range over rounds)")
    for n in counts:
        speeds = []
        for round_no in range(args.rounds):
            (one,) = [r for r in rows if r["round"] == round_no and r["n"] == 1]
            (mine,) = [r for r in rows if r["round"] == round_no and r["n"] == n]
            speeds.append(n * one["wall_s"] / mine["wall_s"])
        mean = statistics.mean(speeds)
        print(
            f"{n:2d}  {mean:5.2f} = {mean / n:.2f} N"
            f"  ({min(speeds) / n:.2f}-{max(speeds) / n:.2f} N)"
        )
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps({"cpus": len(cpus), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
