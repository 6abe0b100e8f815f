"""The live progress bar: requests done, throughput so far, errors."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rayfleet.bench.drive import Counts


class LiveProgress:
    """A rich progress bar fed with ``Counts``; use as a context manager."""

    def __init__(self, num_requests: int, description: str, console: Console | None = None):
        self.num_requests = num_requests
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rates]}"),
            TextColumn("[red]{task.fields[errors]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(description, total=num_requests, rates="", errors="")
        self.start_s = time.perf_counter()

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        self.start_s = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, counts: Counts) -> None:
        elapsed_s = max(time.perf_counter() - self.start_s, 1e-9)
        ok = counts.num_done - counts.num_failed
        self.progress.update(
            self.task,
            completed=counts.num_done,
            rates=f"{ok / elapsed_s:.1f} req/s {counts.num_output_tokens / elapsed_s:.0f} tok/s",
            errors=f"{counts.num_failed} errors" if counts.num_failed else "",
        )
