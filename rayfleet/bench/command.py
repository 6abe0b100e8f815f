"""``rayfleet bench`` (being built)."""

import typer

app = typer.Typer(help="Load-test an OpenAI-compatible endpoint.")
