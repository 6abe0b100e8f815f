"""``rayfleet plan`` (being built)."""

import typer


def plan() -> None:
    """Plan how to split a model over GPUs and nodes."""
    raise typer.Exit(1)
