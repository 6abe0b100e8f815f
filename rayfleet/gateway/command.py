"""``rayfleet keys``: API keys for fleet.yaml's ``gateway.api_keys``.

``rayfleet keys hash`` reads a key (stdin, or a prompt that does not echo it) and prints
the ``sha256:<hex>`` form ``key_sha256`` accepts, so the key itself never lands in a file,
an argument list or the shell's history.
"""

from __future__ import annotations

import sys

import typer

from rayfleet.errors import RayfleetError

app = typer.Typer(help="API keys for fleet.yaml's gateway.api_keys.", no_args_is_help=True)


@app.command("hash")
def hash_command() -> None:
    """Print the key_sha256 of an API key: `rayfleet keys hash < my.key`, or type it at
    the prompt (not echoed)."""
    from rayfleet.gateway.auth import hash_key

    if stdin_is_terminal():
        key: str = typer.prompt("API key", hide_input=True, err=True)
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        raise RayfleetError("no key given: pipe it in (`rayfleet keys hash < my.key`) or type it")
    typer.echo(hash_key(key))


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()
