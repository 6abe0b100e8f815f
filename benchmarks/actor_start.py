"""How long a replica actor takes to start beside busy engines, by Ray worker niceness.

    .venv/bin/python benchmarks/actor_start.py [--rounds 3] [--niceness 15,0] [--busy 2]

Ray runs its worker processes at niceness 15 unless told otherwise (``worker_niceness``),
and a replica actor is such a worker: a new process that imports Ray, Serve and
rayfleet.control.replica before it can start its vLLM server. vLLM's processes run at
niceness 0 (rayfleet starts them so, as they would run by hand). This benchmark stands
``--busy`` CPU-bound processes at niceness 0 in for engines serving (one per core by
default: what two replicas of the tiny model under load do to this 2-core machine), starts
a local Ray with each ``worker_niceness`` in turn, and times ``--starts`` actors from
creation to the answer of their first call; their ``__init__`` imports the replica module,
as Serve's replica does. The niceness order is reversed every other round. Printed: each
niceness's start times, their median, and the median's ratio to the first niceness's.

rayfleet's local Ray uses niceness 0 (rayfleet/cluster.py); ``rayfleet doctor`` warns about
a cluster's node whose workers run niced.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

import ray


@ray.remote(num_cpus=0)
class ReplicaLike:
    """A worker that imports what Serve's replica of a rayfleet model imports."""

    def __init__(self) -> None:
        import rayfleet.control.replica  # noqa: F401

    def niceness(self) -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)


def busy() -> None:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    while True:
        pass


def time_starts(worker_niceness: int, num_busy: int, starts: int) -> dict[str, Any]:
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"worker_niceness": worker_niceness},
    )
    load = [multiprocessing.Process(target=busy, daemon=True) for _ in range(num_busy)]
    for process in load:
        process.start()
    try:
        times, seen = [], set()
        for _ in range(starts):
            started = time.monotonic()
            actor = ReplicaLike.remote()  # type: ignore[attr-defined]
            seen.add(ray.get(actor.niceness.remote()))
            times.append(time.monotonic() - started)
            ray.kill(actor)
        return {"worker_niceness": worker_niceness, "seen_niceness": sorted(seen), "start_s": times}
    finally:
        for process in load:
            process.kill()
            process.join()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--niceness", default="15,0", help="worker niceness values, by turns")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes")
    parser.add_argument("--starts", type=int, default=3, help="actors started per round")
    parser.add_argument("--out", type=Path, help="write the rounds as JSON here")
    args = parser.parse_args()
    values = [int(v) for v in args.niceness.split(",")]

    rounds = []
    for number in range(args.rounds):
        order = values if number % 2 == 0 else values[::-1]
        for niceness in order:
            row = time_starts(niceness, args.busy, args.starts)
            row["round"] = number
            rounds.append(row)
            print(json.dumps(row), flush=True)

    print(f"\nactor start beside {args.busy} busy niceness-0 processes, {os.cpu_count()} cores")
    print(f"{'niceness':>8}  {'median s':>8}  {'ratio':>6}  starts (s)")
    medians = {}
    for niceness in values:
        times = [t for row in rounds if row["worker_niceness"] == niceness for t in row["start_s"]]
        medians[niceness] = statistics.median(times)
        ratio = medians[niceness] / medians[values[0]]
        listed = ", ".join(f"{t:.1f}" for t in times)
        print(f"{niceness:>8}  {medians[niceness]:>8.1f}  {ratio:>5.2f}x  {listed}")
    if args.out:
        args.out.write_text(json.dumps({"busy": args.busy, "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
