"""Stopping engines' process groups, and the records a fleet keeps of what it spawned,
with real processes standing in for a vLLM server and the engine core it spawns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rayfleet.control.engine import SERVER_MODULE
from rayfleet.control.process_groups import (
    ABANDONED_AFTER_S,
    kill_process_group,
    kill_recorded_engines,
    record_engine,
    stop_leaderless_engines,
)
from tests.integration.fleet import wait_until

# A "server" that spawns an "engine core" into its own group, prints its pid, then
# either waits or exits at once (leaving the engine core re-parented, as vLLM's is
# when its API server is killed while the engine loads weights).
SERVER = """
import subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
print(core.pid, flush=True)
if sys.argv[2] == "wait":
    time.sleep(600)
"""


def start_server(
    then: str, core_argv: str = SERVER_MODULE
) -> tuple[subprocess.Popen[str], psutil.Process]:
    """The stand-in server and its engine core (``core_argv``: a word in its command line;
    vLLM titles its processes VLLM::... only where setproctitle works)."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, core_argv, then],
        stdout=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    assert server.stdout is not None
    core = psutil.Process(int(server.stdout.readline()))
    return server, core


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("server_state", ["running", "exited"])
def test_a_recorded_server_group_is_stopped_with_its_engine_core(tmp_path, server_state):
    server, core = start_server("wait" if server_state == "running" else "exit")
    try:
        record_engine(tmp_path, server.pid)
        if server_state == "exited":
            server.wait(timeout=30)  # the engine core is an orphan now
        assert running(core)
        assert kill_recorded_engines(tmp_path, grace_s=5) == [server.pid]
        assert wait_until(lambda: not running(core), 10)
        assert list(tmp_path.iterdir()) == []
    finally:
        for proc in (core, psutil.Process(server.pid) if server.poll() is None else None):
            if proc is not None and running(proc):
                proc.kill()
        server.wait(timeout=10)


def test_while_the_fleet_runs_only_the_groups_whose_server_is_gone_are_stopped(tmp_path):
    """A replica killed takes its server with it, not the engine core: that one is
    stopped; a server that runs keeps its group and its record."""
    gone, orphan = start_server("exit", core_argv="untitled")  # named like nothing of vLLM's
    alive, its_core = start_server("wait")
    try:
        record_engine(tmp_path, gone.pid)
        record_engine(tmp_path, alive.pid)
        gone.wait(timeout=30)  # the engine core is an orphan now
        assert running(orphan) and running(its_core)
        assert stop_leaderless_engines(tmp_path, grace_s=5) == [gone.pid]
        assert wait_until(lambda: not running(orphan), 10)
        assert running(its_core) and alive.poll() is None
        assert [p.name for p in tmp_path.iterdir()] == [f"{alive.pid}.pid"]
        assert stop_leaderless_engines(tmp_path) == []  # nothing more to stop
    finally:
        for proc in (orphan, its_core, psutil.Process(alive.pid)):
            if running(proc):
                proc.kill()
        alive.wait(timeout=10)


def test_a_record_whose_pid_now_belongs_to_another_program_stops_nothing(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / f"{other.pid}.pid").write_text(f"{other.pid} 1\n")  # started at tick 1
        assert kill_recorded_engines(tmp_path) == []
        assert other.poll() is None
        assert not (tmp_path / f"{other.pid}.pid").exists()
    finally:
        other.kill()
        other.wait()


def test_a_record_its_writer_never_renamed_is_taken_once_abandoned(tmp_path):
    """A replica killed between writing its server's record and renaming it into place:
    the record is taken once old enough, and a fresh one (being written) is left."""
    gone, orphan = start_server("exit")
    try:
        record_engine(tmp_path, gone.pid)
        record = tmp_path / f"{gone.pid}.pid"
        partial = record.rename(tmp_path / f"{gone.pid}.pid.partial")
        gone.wait(timeout=30)  # the engine core is an orphan now
        assert stop_leaderless_engines(tmp_path) == []  # just written: not yet abandoned
        assert partial.exists() and running(orphan)
        old = time.time() - ABANDONED_AFTER_S - 1
        os.utime(partial, (old, old))
        assert stop_leaderless_engines(tmp_path, grace_s=5) == [gone.pid]
        assert wait_until(lambda: not running(orphan), 10)
        assert list(tmp_path.iterdir()) == []
    finally:
        if running(orphan):
            orphan.kill()


def test_an_unreadable_record_is_dropped(tmp_path):
    (tmp_path / "12.pid").write_text("not a record")
    assert kill_recorded_engines(tmp_path) == []
    assert kill_recorded_engines(tmp_path / "missing") == []
    assert list(tmp_path.iterdir()) == []


def test_a_group_left_with_only_another_parents_zombie_counts_as_stopped():
    """The group's leader exited; its parent (not this process) never reaps it."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'pass'], process_group=0)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        leader = psutil.Process(int(parent.stdout.readline()))
        assert wait_until(lambda: leader.status() == psutil.STATUS_ZOMBIE, 30)
        started = time.monotonic()
        kill_process_group(leader.pid, grace_s=30)
        assert time.monotonic() - started < 5
        assert os.getpgid(leader.pid) == leader.pid  # still there, and no longer running
    finally:
        parent.kill()
        parent.wait()


def test_record_engine_writes_the_pid_and_its_start_in_ticks_since_boot(tmp_path: Path):
    record_engine(tmp_path / "pids", os.getpid())
    pid, started = (tmp_path / "pids" / f"{os.getpid()}.pid").read_text().split()
    assert int(pid) == os.getpid()
    since_boot = int(started) / os.sysconf("SC_CLK_TCK")
    assert since_boot + psutil.boot_time() == pytest.approx(psutil.Process().create_time())
    assert [p.name for p in (tmp_path / "pids").iterdir()] == [f"{os.getpid()}.pid"]


def test_a_clock_stepped_after_a_server_started_leaves_the_server_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """NTP, or a virtual machine resumed, moves the boot time as the wall clock reads it;
    psutil's create_time() moves with it. A running server must still be one that runs."""
    server, core = start_server("wait")
    try:
        record_engine(tmp_path, server.pid)
        before = psutil.Process(server.pid).create_time()
        stepped = psutil.boot_time() + 3.0
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)
        assert psutil.Process(server.pid).create_time() == pytest.approx(before + 3.0)
        assert stop_leaderless_engines(tmp_path, grace_s=5) == []
        assert server.poll() is None and running(core)
        assert [p.name for p in tmp_path.iterdir()] == [f"{server.pid}.pid"]
    finally:
        kill_process_group(server.pid, grace_s=5)
        server.wait(timeout=10)


def test_a_record_of_an_older_rayfleet_still_stops_its_group(tmp_path: Path):
    """Before ticks, a record held psutil's create_time(), seconds since the epoch."""
    server, core = start_server("wait")
    try:
        created = psutil.Process(server.pid).create_time()
        (tmp_path / f"{server.pid}.pid").write_text(f"{server.pid} {created}\n")
        assert stop_leaderless_engines(tmp_path) == []  # its server runs: left alone
        assert kill_recorded_engines(tmp_path, grace_s=5) == [server.pid]
        assert wait_until(lambda: not running(core), 10)
    finally:
        kill_process_group(server.pid, grace_s=5)
        server.wait(timeout=10)
