"""``rayfleet plan``: parse the option groups (``planner.options``), plan, print.

Nothing heavy at import time: the planner is pure Python, and Ray is imported only when
``--from-cluster`` reads a running cluster.
"""

from __future__ import annotations

import shlex
import sys
from typing import Annotated

import typer

from rayfleet.option_groups import option_groups
from rayfleet.planner.options import EngineOptions, HardwareOptions, OutputOptions, WorkloadOptions

EXIT_DOES_NOT_FIT = 3


@option_groups
def plan(
    model: Annotated[
        str,
        typer.Argument(
            help="The model: a config.json, a model directory, or a hub id (org/name) whose "
            "config is in the local Hugging Face cache. Nothing is downloaded.",
            show_default=False,
        ),
    ],
    hardware: HardwareOptions,
    workload: WorkloadOptions,
    engine: EngineOptions,
    output: OutputOptions,
) -> None:
    """Plan how to split a model over GPUs and nodes: does it fit, TP x PP x DP, whether
    Ray is needed, KV cache capacity, replicas for a target load.

    Exit code 0 when the model fits, 3 when it does not.
    """
    from rich.console import Console

    from rayfleet.planner.fleet_entry import write_fleet_entry
    from rayfleet.planner.options import plan_model
    from rayfleet.planner.report import plan_json, print_plan

    result = plan_model(model, hardware, workload, engine)
    if output.json:
        typer.echo(plan_json(result))
    else:
        print_plan(result, Console())
    if output.emit is not None and result.fits:
        command = shlex.join(["rayfleet", *sys.argv[1:]])
        write_fleet_entry(result, output.emit, output.name, command)
        if not output.json:
            Console().print(f"wrote a fleet.yaml model entry to {output.emit}", highlight=False)
    if not result.fits:
        raise typer.Exit(EXIT_DOES_NOT_FIT)
