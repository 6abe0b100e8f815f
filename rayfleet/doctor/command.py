"""``rayfleet doctor``: check every node of a Ray cluster before deploying on it."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rich.progress import TaskID


def doctor(
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster: auto, local, host:port or ray://host:port "
        "[default: the fleet's cluster.address, else auto]",
    ),
    config: Path | None = typer.Option(
        None, "-c", "--config", help="fleet.yaml: also check what this fleet needs."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    timeout_s: float = typer.Option(
        30.0, "--timeout-s", min=1, help="How long a node may take to answer."
    ),
    network: bool = typer.Option(
        True,
        "--network/--no-network",
        help="Measure bandwidth and RTT between every pair of nodes.",
    ),
    net_max_s: float = typer.Option(
        2.0, "--net-max-s", min=0.1, help="Longest one bandwidth stream runs (seconds)."
    ),
    net_max_mib: int = typer.Option(
        256, "--net-max-mib", min=1, help="Most data one bandwidth stream sends (MiB)."
    ),
) -> None:
    """Check every node of a Ray cluster: versions, GPUs, /dev/shm, NCCL, links, disk, ports."""
    from rayfleet.doctor.report import print_table, rerun_command, to_json
    from rayfleet.doctor.runner import DoctorOptions, run_doctor

    fleet = None
    if config is not None:
        from rayfleet.config import load_fleet

        fleet = load_fleet(config)
    if address is None:
        fleet_address = fleet.cluster.address if fleet else "auto"
        address = "auto" if fleet_address == "local" else fleet_address
    options = DoctorOptions(
        address=address,
        timeout_s=timeout_s,
        network=network,
        net_max_s=net_max_s,
        net_max_bytes=net_max_mib * 1024**2,
    )
    stderr = Console(stderr=True)
    # Ray's driver prints cluster events (a raylet dying) on stdout; keep --json parseable.
    quiet = _stdout_to_stderr() if as_json else contextlib.nullcontext()
    with quiet, _progress(stderr) as progress:
        report = run_doctor(options, fleet, progress)
    rerun = rerun_command(address, str(config) if config else None)
    if as_json:
        typer.echo(json.dumps(to_json(report, rerun), indent=2))
    else:
        print_table(report, rerun, Console())
    if report.failed:
        raise typer.Exit(1)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class _progress:
    """A live line per phase on stderr ("probing nodes 3/4"), gone when the run ends."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Callable[[str, int, int], None]:
        self._bar.start()
        return self.update

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def update(self, phase: str, done: int, total: int) -> None:
        if phase not in self._tasks:
            self._tasks[phase] = self._bar.add_task(phase, total=total)
        self._bar.update(self._tasks[phase], completed=done, total=total)
