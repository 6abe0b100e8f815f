"""`rayfleet top` on a pseudo-terminal (keys one at a time, the terminal given back on
every way out) and the command's answers: no fleet, a gateway that does not answer, and
one frame from a stand-in gateway."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rayfleet.control.state import RunState
from rayfleet.control.top import Scrape
from rayfleet.control.top_view import Keys, watch
from rayfleet.errors import RayfleetError
from tests.unit.test_top import FleetMetrics, status_report, table_rows, two_scrapes


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal: (the keyboard's end, the program's end)."""
    keyboard, program = os.openpty()
    yield keyboard, program
    os.close(keyboard)
    os.close(program)


def test_keys_read_one_key_at_a_time_and_restore_the_terminal(terminal):
    keyboard, program = terminal
    saved = termios.tcgetattr(program)
    with Keys(program) as keys:
        lflag = termios.tcgetattr(program)[3]
        assert not lflag & termios.ICANON and not lflag & termios.ECHO
        os.write(keyboard, b"x")
        assert not keys.quit_within(0.05)
        os.write(keyboard, b"q")
        assert keys.quit_within(5.0)
    assert termios.tcgetattr(program) == saved


class TtyStdin:
    def __init__(self, fd: int):
        self.fd = fd

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd


def watched(program: int, fetches: list[Any], monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``watch`` wrote, fed ``fetches``: a Scrape, a function returning one, or an
    exception to raise."""
    monkeypatch.setattr(sys, "stdin", TtyStdin(program))
    calls = iter(fetches)

    def fetch() -> Scrape:
        answer = next(calls)
        if isinstance(answer, BaseException):
            raise answer
        return answer() if callable(answer) else answer

    console = Console(width=200, file=io.StringIO(), force_terminal=True, color_system=None)
    watch(fetch, 0.01, console)
    return console.file.getvalue()


def test_watch_quits_on_q_and_leaves_the_screen_and_terminal_as_they_were(terminal, monkeypatch):
    keyboard, program = terminal
    saved = termios.tcgetattr(program)
    before, after = two_scrapes()

    def press_q() -> Scrape:  # once the view is up: a key typed earlier is flushed
        os.write(keyboard, b"q")
        return after

    out = watched(program, [before, press_q], monkeypatch)
    assert termios.tcgetattr(program) == saved
    assert "\x1b[?1049h" in out and out.rstrip().endswith("\x1b[?1049l")  # alternate screen
    assert "tiny#a" in out


def test_ctrl_c_and_a_fleet_gone_quiet_leave_the_terminal_restored(terminal, monkeypatch):
    _, program = terminal
    saved = termios.tcgetattr(program)
    before, after = two_scrapes()
    gone = RayfleetError("the gateway does not answer")
    out = watched(program, [before, after, gone, KeyboardInterrupt()], monkeypatch)
    assert termios.tcgetattr(program) == saved
    assert "the gateway does not answer (showing the last answer; retrying)" in out
    assert out.rstrip().endswith("\x1b[?1049l")


def _rayfleet(*args: str, home: Path, columns: str = "200") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"RAYFLEET_HOME": str(home), "PATH": "", "COLUMNS": columns},
    )


def test_top_without_a_fleet_says_how_to_start_one(tmp_path):
    result = _rayfleet("top", home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "no fleet is running" in result.stderr and "`rayfleet up`" in result.stderr


@pytest.fixture
def gateway(tmp_path) -> Iterator[tuple[str, FleetMetrics]]:
    """A stand-in gateway serving a status report and the metrics' exposition."""
    metrics = FleetMetrics()
    metrics.answer("tiny", "tiny#a", 0.02, num=4)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                json.dumps(status_report()).encode()
                if self.path == "/rayfleet/status"
                else metrics.text().encode()
            )
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", metrics
    finally:
        server.shutdown()
        server.server_close()


def test_top_once_prints_one_frame_from_the_gateway(tmp_path, gateway):
    url, _ = gateway
    RunState(pid=os.getpid(), gateway_url=url, phase="ready").save(tmp_path / "run" / "fleet.json")
    result = _rayfleet("top", "--once", "--interval", "0.2", home=tmp_path, columns="80")
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert rows["tiny"][0] == "1 serving, 1 draining"
    assert rows["tiny#a"][:6] == ["serving", "4242", "2", "-", "-", "4"]
    assert f"fleet ready at {url}/v1" in result.stdout


def test_top_on_a_gateway_that_does_not_answer_says_so_in_one_line(tmp_path):
    dead = "http://127.0.0.1:1"
    RunState(pid=os.getpid(), gateway_url=dead, log_dir="/tmp/x").save(
        tmp_path / "run" / "fleet.json"
    )
    result = _rayfleet("top", "--once", home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and f"gateway at {dead} does not answer" in result.stderr
