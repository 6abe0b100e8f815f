"""The ``rayfleet`` command. Each command parses, calls one library function, prints.

Command modules live beside the code they drive (``rayfleet/<area>/command.py``)
and import nothing heavy (Ray, vLLM, torch) at module level, so ``--help`` is fast.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from rayfleet.bench.command import app as bench_app
from rayfleet.control.command import apply, down, scale, status, top, up
from rayfleet.control.gateway_command import gateway
from rayfleet.doctor.command import doctor
from rayfleet.errors import RayfleetError
from rayfleet.gateway.command import app as keys_app
from rayfleet.k8s.command import app as k8s_app
from rayfleet.models.command import app as models_app
from rayfleet.planner.command import plan
from rayfleet.sim.command import app as sim_app

app = typer.Typer(
    help="Plan, check, deploy, route and benchmark fleets of vLLM servers on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(up)
app.command()(status)
app.command()(top)
app.command()(down)
app.command()(apply)
app.command()(scale)
app.command()(gateway)
app.command()(plan)
app.command()(doctor)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")
app.add_typer(keys_app, name="keys")
app.add_typer(sim_app, name="sim")
app.add_typer(k8s_app, name="k8s")


def main() -> None:
    try:
        app()
    except RayfleetError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
