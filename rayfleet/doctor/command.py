"""``rayfleet doctor`` (being built)."""

import typer


def doctor() -> None:
    """Check every node of a Ray cluster."""
    raise typer.Exit(1)
