"""`rayfleet top` in a real terminal (tmux) against a real fleet: the screen shows the model,
its replica and the requests it answered, `q` quits with exit status 0, and the terminal
is given back as it was (settings, main screen, cursor)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fleet import RunningFleet, demo_and_tiny, wait_until
from tests.integration.load import StreamLoad
from tests.unit.test_top import table_rows

pytestmark = pytest.mark.integration

SHARED_FLEET = "demo-and-tiny"  # test_fleet_api.py's fleet
SCREEN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def fleet_models(tiny_model, demo_model) -> list[dict[str, Any]]:
    return demo_and_tiny(tiny_model, demo_model)


class Tmux:
    """A tmux server of its own (a private socket), one 200x50 session in it."""

    def __init__(self) -> None:
        self.socket = f"rayfleet-top-{uuid.uuid4().hex[:8]}"
        self.session = "top"

    def __call__(self, *args: str) -> str:
        command = ["tmux", "-L", self.socket, "-f", "/dev/null", *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    def start(self, script: Path) -> None:
        self("new-session", "-d", "-s", self.session, "-x", "200", "-y", "50", f"bash {script}")

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.session)

    def pane(self, variable: str) -> str:
        return self("display-message", "-p", "-t", self.session, f"#{{{variable}}}").strip()

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    terminal = Tmux()
    try:
        yield terminal
    finally:
        terminal.close()


def top_script(fleet: RunningFleet, path: Path) -> Path:
    """Runs `rayfleet top`, then says how it exited and whether the terminal's settings
    are what they were before; then holds the pane open for the test to read."""
    top = shlex.join([sys.executable, "-m", "rayfleet.cli", "top", "--interval", "1"])
    path.write_text(
        f"export RAYFLEET_HOME={shlex.quote(str(fleet.home))}\n"
        "unset COLUMNS LINES\n"  # the pane's size, not the test runner's
        "before=$(stty -g)\n"
        f"{top}\n"
        "status=$?\n"
        '[ "$before" = "$(stty -g)" ] && same=restored || same=changed\n'
        'echo "top exited $status; terminal $same"\n'
        "read -r _\n"
    )
    return path


def replica_row(screen: str, replica_id: str) -> list[str] | None:
    """The replica's cells once the screen shows the model, the replica, and a request
    answered and a non-zero request rate on it."""
    rows = table_rows(screen)
    cells = rows.get(replica_id)
    if "tiny" not in rows or cells is None:
        return None
    requests, req_s = cells[5], cells[6]
    return cells if requests not in ("-", "0") and req_s not in ("-", "0.0") else None


def test_top_shows_the_fleet_and_q_gives_the_terminal_back(fleet, tmux, tmp_path):
    (replica,) = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
    tmux.start(top_script(fleet, tmp_path / "top.sh"))
    with StreamLoad(fleet.client(), "tiny", num_streams=2, max_tokens=16) as load:
        cells = wait_until(
            lambda: replica_row(tmux.screen(), replica["replica_id"]), SCREEN_TIMEOUT_S
        )
    assert cells is not None, tmux.screen()
    assert load.failures == []
    assert cells[0] == "serving" and cells[1] == str(replica["pid"])
    assert tmux.pane("alternate_on") == "1"  # the view has a screen of its own
    tmux("send-keys", "-t", tmux.session, "q")
    done = wait_until(lambda: "top exited" in tmux.screen(), SCREEN_TIMEOUT_S)
    assert done, tmux.screen()
    assert "top exited 0; terminal restored" in tmux.screen()
    assert tmux.pane("alternate_on") == "0"  # back on the shell's screen
    assert tmux.pane("cursor_flag") == "1"  # the cursor shown again
