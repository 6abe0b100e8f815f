"""`rayfleet keys hash`: the key from stdin or a prompt, printed as fleet.yaml's key_sha256."""

from __future__ import annotations

import hashlib

from typer.testing import CliRunner

from rayfleet.cli import app
from rayfleet.config import parse_fleet
from rayfleet.gateway import command
from rayfleet.gateway.auth import KeyTable

KEY = "sk-test-0123"
HASHED = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()


def keys_hash(stdin: str):
    return CliRunner().invoke(app, ["keys", "hash"], input=stdin)


def test_key_from_stdin_is_hashed_as_the_gateway_looks_it_up():
    result = keys_hash(f"{KEY}\nsecond line is ignored\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == HASHED
    fleet = parse_fleet(
        {
            "gateway": {"api_keys": [{"name": "k", "key_sha256": result.stdout.strip()}]},
            "models": [{"name": "m", "source": "/models/m"}],
        },
        origin="fleet.yaml",
    )
    table = KeyTable.from_config(fleet.gateway.api_keys)
    assert table.authenticate(f"Bearer {KEY}").name == "k"


def test_key_typed_at_the_prompt_is_not_echoed(monkeypatch):
    monkeypatch.setattr(command, "stdin_is_terminal", lambda: True)
    result = keys_hash(f"{KEY}\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == HASHED
    assert "API key" in result.stderr and KEY not in result.output


def test_no_key_is_an_error_that_says_how_to_give_one():
    result = keys_hash("\n")
    assert result.exit_code != 0
    assert "rayfleet keys hash < my.key" in str(result.exception)
