"""Run one load: send every prompt on its schedule, in one process or several.

One process drives the requests from one event loop (``drive.py``; uvloop when
installed). When one core is not enough, ``num_processes`` worker processes each take
every N-th request of the same global schedule and a share of the concurrency; their
results are merged and timed on the machine's one monotonic clock.

Ctrl-C (SIGINT) stops sending, cancels requests in flight (they are counted as
cancelled, not failed) and still returns what finished, so results are written.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfleet.bench.client import RequestResult, Target
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.drive import Counts, RunOutput, drive, use_uvloop
from rayfleet.bench.load import LoadShape, arrival_offsets_s, split_for_processes

OnProgress = Callable[["Counts"], None]
# A worker process as the parent holds it: the process, its result pipe, its counts.
Worker = tuple[Any, Any, Any]


def run_load(
    target: Target,
    prompts: Sequence[Prompt],
    shape: LoadShape,
    *,
    num_processes: int = 1,
    on_progress: Callable[[Counts], None] | None = None,
) -> RunOutput:
    """Send ``prompts`` to ``target`` with ``shape``; blocks until done or Ctrl-C."""
    offsets_s = arrival_offsets_s(shape, len(prompts))
    if num_processes <= 1:
        use_uvloop()
        return asyncio.run(_run_here(target, prompts, offsets_s, shape, on_progress))
    return _run_in_processes(target, prompts, offsets_s, shape, num_processes, on_progress)


async def _run_here(
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    shape: LoadShape,
    on_progress: OnProgress | None,
) -> RunOutput:
    counts = Counts()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    reporter = asyncio.create_task(_report_every(counts, on_progress)) if on_progress else None
    try:
        return await drive(
            target,
            prompts,
            offsets_s,
            shape.max_concurrency,
            counts,
            stop,
            max_connections=shape.max_connections,
        )
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if reporter and on_progress:
            reporter.cancel()
            on_progress(counts)


async def _report_every(counts: Counts, on_progress: OnProgress, period_s: float = 0.25) -> None:
    while True:
        await asyncio.sleep(period_s)
        on_progress(counts)


def _run_in_processes(
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    shape: LoadShape,
    num_processes: int,
    on_progress: OnProgress | None,
) -> RunOutput:
    ctx = mp.get_context("spawn")
    sync = _WorkerSync(
        ctx.Barrier(num_processes + 1), ctx.Event(), ctx.Value("d", 0.0, lock=False), ctx.Event()
    )
    # Workers start with Ctrl-C ignored (inherited), so one pressed while they boot cannot
    # kill them half-way; from then on the parent forwards it as the ``stop`` event.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        workers = [
            _start_worker(ctx, target, prompts, offsets_s, shape, num_processes, index, sync)
            for index in range(num_processes)
        ]
        signal.signal(signal.SIGINT, lambda *_: sync.stop.set())
        # One schedule for all: every worker starts its clock at the same instant.
        sync.ready.wait(timeout=120)
        sync.start_at.value = time.perf_counter() + 0.05
        sync.go.set()
        outputs = _collect(workers, on_progress)
    finally:
        signal.signal(signal.SIGINT, previous)
    return merge_outputs(outputs)


@dataclass
class _WorkerSync:
    ready: Any
    go: Any
    start_at: Any
    stop: Any


def _start_worker(
    ctx: Any,
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    shape: LoadShape,
    num_processes: int,
    index: int,
    sync: _WorkerSync,
) -> Worker:
    share = split_for_processes(shape, num_processes, index)
    mine = [i for i, prompt in enumerate(prompts) if process_of(prompt, i, num_processes) == index]
    counts = ctx.Array("q", 3, lock=False)
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_worker_main,
        args=(
            target,
            [prompts[i] for i in mine],
            offsets_s[mine],
            share,
            counts,
            sync,
            sender,
        ),
        daemon=True,
    )
    process.start()
    sender.close()
    return process, receiver, counts


def process_of(prompt: Prompt, position: int, num_processes: int) -> int:
    """Which of ``num_processes`` sends the prompt at ``position``: every turn of a chat
    session goes from one process (each waits for the one before), other prompts by turns."""
    key = position if prompt.session is None else prompt.session
    return key % num_processes


def _collect(workers: list[Worker], on_progress: OnProgress | None) -> list[RunOutput]:
    outputs: dict[int, RunOutput] = {}
    while len(outputs) < len(workers):
        for index, (process, receiver, _) in enumerate(workers):
            if index not in outputs and receiver.poll(0.05):
                try:
                    outputs[index] = receiver.recv()
                except EOFError:
                    process.join()
                    raise RuntimeError(
                        f"bench worker process {index} exited with code {process.exitcode} "
                        "before sending its results"
                    ) from None
                process.join()
        if on_progress:
            on_progress(_sum_counts(workers))
    return list(outputs.values())


def _sum_counts(workers: list[Worker]) -> Counts:
    total = Counts()
    for _, _, counts in workers:
        total.num_done += counts[0]
        total.num_failed += counts[1]
        total.num_output_tokens += counts[2]
    return total


def merge_outputs(outputs: Sequence[RunOutput]) -> RunOutput:
    """One run from the runs of several processes, spanning them all."""
    merged = RunOutput(
        start_s=min(o.start_s for o in outputs),
        end_s=max(o.end_s for o in outputs),
        num_cancelled=sum(o.num_cancelled for o in outputs),
        interrupted=any(o.interrupted for o in outputs),
    )
    for output in outputs:
        merged.results.extend(output.results)
    merged.results.sort(key=lambda r: r.scheduled_s)
    return merged


class _SharedCounts(Counts):
    """Counts mirrored into shared memory that the parent reads for the progress bar."""

    def __init__(self, shared: Any) -> None:
        super().__init__()
        self.shared = shared

    def add(self, result: RequestResult) -> None:
        super().add(result)
        self.shared[0], self.shared[1], self.shared[2] = (
            self.num_done,
            self.num_failed,
            self.num_output_tokens,
        )


def _worker_main(
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    share: LoadShape,
    shared: Any,
    sync: _WorkerSync,
    sender: Any,
) -> None:
    use_uvloop()
    sync.ready.wait()
    sync.go.wait()
    output = asyncio.run(_worker_run(target, prompts, offsets_s, share, shared, sync))
    sender.send(output)
    sender.close()


async def _worker_run(
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    share: LoadShape,
    shared: Any,
    sync: _WorkerSync,
) -> RunOutput:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    watcher = asyncio.create_task(_watch_parent_stop(sync.stop, stop))
    try:
        return await drive(
            target,
            prompts,
            offsets_s,
            share.max_concurrency,
            _SharedCounts(shared),
            stop,
            start_s=sync.start_at.value,
            max_connections=share.max_connections,
        )
    finally:
        watcher.cancel()


async def _watch_parent_stop(parent_stop: Any, stop: asyncio.Event, period_s: float = 0.1) -> None:
    while not parent_stop.is_set():
        await asyncio.sleep(period_s)
    stop.set()
