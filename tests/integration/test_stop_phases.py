"""Stopping a fleet at each phase of a replica's start leaves no vLLM process behind.

A fleet is started in the foreground (`rayfleet up`, as a user would in another
terminal) and stopped with `rayfleet down` (and once with Ctrl-C, which has no list of
the fleet's processes to fall back on) as soon as its one replica reaches a phase,
read from the process tree and the replica's vLLM log, never from a timer:

    server spawned     vLLM's API server process runs (still importing)
    loading weights    its worker logged "Starting to load model" (engine core and
                       worker exist, the server does not answer yet)
    ready              the fleet's state says ready

Every process of the fleet carries its RAYFLEET_HOME in its environment (Ray's
processes and vLLM's inherit the fleet process's), so a process re-parented to init
(an engine core whose API server died) is still found. Once stopped, none may run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from rayfleet.control.engine import SERVER_MODULE, free_port
from tests.integration.fleet import (
    RAYFLEET,
    model_entry,
    start_foreground_up,
    wait_until,
    write_config,
)
from tests.integration.processes import describe, fleet_processes, is_vllm, running

pytestmark = pytest.mark.integration

PHASE_TIMEOUT_S = 600
DOWN_TIMEOUT_S = 180
# Processes SIGKILLed just before `down` returned need a moment to be gone.
GONE_TIMEOUT_S = 10


def api_servers(home: Path) -> list[psutil.Process]:
    return [p for p in fleet_processes(home) if SERVER_MODULE in " ".join(p.cmdline())]


def state(home: Path) -> dict[str, str]:
    try:
        data: dict[str, str] = json.loads((home / "run" / "fleet.json").read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def loading_weights(home: Path) -> bool:
    log_dir = state(home).get("log_dir")
    if not log_dir or not Path(log_dir).is_dir():
        return False
    return any(
        "Starting to load model" in log.read_text(errors="replace")
        for log in Path(log_dir).glob("tiny-*.log")
    )


PHASES: dict[str, Callable[[Path], object]] = {
    "server spawned": api_servers,
    "loading weights": loading_weights,
    "ready": lambda home: state(home).get("phase") == "ready",
}


@pytest.fixture
def foreground_up(tmp_path: Path, tiny_model: Path) -> Iterator[subprocess.Popen[str]]:
    """`rayfleet up` of one tiny replica in the foreground of a session of its own."""
    config = write_config(tmp_path, [model_entry("tiny", tiny_model)], free_port())
    up = start_foreground_up(tmp_path, config)
    try:
        yield up
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        up.communicate()
        for proc in fleet_processes(tmp_path):  # never leave a failure's processes
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


CASES = [("down", phase) for phase in PHASES] + [("ctrl-c", "loading weights")]


def stop(how: str, home: Path, up: subprocess.Popen[str]) -> None:
    """`rayfleet down` from another process, or Ctrl-C to the foreground `up` (its
    process group, as a terminal sends it); returns once it has finished."""
    if how == "ctrl-c":
        os.killpg(up.pid, signal.SIGINT)
        output, _ = up.communicate(timeout=DOWN_TIMEOUT_S)
        assert up.returncode == 0 and "Traceback" not in output, output
        assert "fleet stopped" in output, output
        return
    down = subprocess.run(
        [*RAYFLEET, "down"],
        env={**os.environ, "RAYFLEET_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=DOWN_TIMEOUT_S,
    )
    assert down.returncode == 0, down.stderr
    assert "Traceback" not in down.stderr, down.stderr


@pytest.mark.parametrize(("how", "phase"), CASES)
def test_stop_at_each_start_phase_leaves_no_vllm_process(tmp_path, foreground_up, how, phase):
    def reached() -> object:
        assert foreground_up.poll() is None, f"`rayfleet up` exited {foreground_up.returncode}"
        return PHASES[phase](tmp_path)

    assert wait_until(reached, PHASE_TIMEOUT_S, poll_s=0.1), f"never reached {phase!r}"
    before = fleet_processes(tmp_path)
    servers = [p for p in before if is_vllm(p)]
    assert servers, f"no vLLM process at {phase!r}: {describe(before)}"

    stop(how, tmp_path, foreground_up)

    def leftovers() -> list[psutil.Process]:
        return [p for p in {*before, *fleet_processes(tmp_path)} if running(p)]

    assert wait_until(lambda: not leftovers(), GONE_TIMEOUT_S), (
        f"left running after {how} at {phase!r}: {describe(leftovers())}"
    )
    assert not (tmp_path / "run" / "fleet.json").exists()
    foreground_up.wait(timeout=30)
