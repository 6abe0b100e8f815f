"""Process groups of engines: stopping them, and records of the ones a fleet spawned.

    kill_process_group(pgid, grace_s)    SIGTERM the group, SIGKILL what is left after
                                         ``grace_s``; zombies count as gone
    record_engine(pid_dir, pid)          ``pid_dir/<pid>.pid``: "<pid> <start ticks>",
                                         written by EngineProcess the moment it spawns
    kill_recorded_engines(pid_dir)       stop every recorded group still there; remove
                                         the records
    stop_leaderless_engines(pid_dir)     the same for the groups whose server is gone,
                                         while the fleet runs (a replica on the node
                                         calls it when it starts and at each health check)

Why records: a replica stopped while its vLLM server is still starting has registered
the server nowhere (it registers once healthy), and its actor may be killed before it
can stop the server itself. A server killed while its engine core loads weights leaves
the engine core and its worker running, re-parented to init (seen: 2.5 GB resident,
after `rayfleet down` during the demo model's start). They stay in the server's
process group, so stopping the recorded group stops them too. A record's start time
guards against a pid reused since: a group whose leader is gone is stopped only while
a process started after the record is still in it.

The start time is the kernel's, in clock ticks since boot (``/proc/<pid>/stat``), not a
time of day: psutil's ``create_time()`` adds the boot time as the wall clock has it now,
so a clock stepped after a server started (NTP, a virtual machine resumed) made every
running server look like a pid reused: its record was dropped, and what it left when
killed later was never stopped. Records are written whole (a file renamed into place),
so a replica starting never reads half of one. A replica killed between the write and the
rename leaves ``<pid>.pid.partial``; one ``ABANDONED_AFTER_S`` old is taken as the record
it was to become (a writer renames at once).

The same leftovers come while a fleet runs: a replica actor killed (or its node's Ray
worker lost) takes its server with it (the server dies with its parent, engine.py), but
not the server's engine core and workers, which hold the model's memory, and on a GPU
the memory the replacement's server needs to start. So every replica stops the groups of
its node whose server is gone, before it starts its own server and at each health check.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

PARTIAL = ".partial"
ABANDONED_AFTER_S = 60.0


def kill_process_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies still count for killpg(0); reap ours, then look for a member that runs
    # (another parent's zombie is gone for good: only that parent can reap it).
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    import psutil

    for proc in _group_members(pgid):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def _group_members(pgid: int) -> list[psutil.Process]:
    import psutil

    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members


def record_engine(pid_dir: Path, pid: int) -> None:
    """Write ``pid_dir/<pid>.pid``: the server's pid and start ticks (nothing when the
    server has already gone)."""
    stat = _stat(pid)
    if stat is None:
        return
    pid_dir.mkdir(parents=True, exist_ok=True)
    partial = pid_dir / f"{pid}.pid{PARTIAL}"
    partial.write_text(f"{pid} {stat[1]}\n")
    partial.replace(pid_dir / f"{pid}.pid")


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and its start in clock ticks since boot; None when it
    is gone. The command name may hold spaces and parentheses: fields start after the
    last ")"."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def kill_recorded_engines(pid_dir: Path, grace_s: float = 5.0) -> list[int]:
    """Stop the process group of every server recorded in ``pid_dir`` and still there;
    remove the records. Returns the groups signalled."""
    stopped = []
    for record in _records(pid_dir):
        read = _read(record)
        if read is not None and _still_ours(*read):
            kill_process_group(read[0], grace_s=grace_s)
            stopped.append(read[0])
        record.unlink(missing_ok=True)
    return stopped


def stop_leaderless_engines(pid_dir: Path, grace_s: float = 5.0) -> list[int]:
    """Stop the process group of every server recorded in ``pid_dir`` whose server (the
    group's leader) has exited but whose engine core or workers still run; remove the
    records of servers gone. A running server's record stays. Returns the groups
    signalled."""
    stopped = []
    for record in _records(pid_dir):
        read = _read(record)
        if read is None or _server_runs(*read):
            continue  # being written, or its replica looks after it
        if _still_ours(*read):
            kill_process_group(read[0], grace_s=grace_s)
            stopped.append(read[0])
        record.unlink(missing_ok=True)
    return stopped


def _records(pid_dir: Path) -> list[Path]:
    if not pid_dir.is_dir():
        return []
    _adopt_abandoned(pid_dir)
    return sorted(pid_dir.glob("*.pid"))


def _adopt_abandoned(pid_dir: Path) -> None:
    """Rename into place each record whose writer died between writing and renaming it."""
    now = time.time()
    for partial in pid_dir.glob(f"*.pid{PARTIAL}"):
        with contextlib.suppress(OSError):  # renamed or removed meanwhile
            if now - partial.stat().st_mtime >= ABANDONED_AFTER_S:
                partial.replace(partial.with_suffix(""))


def _read(record: Path) -> tuple[int, int] | None:
    """A record's (server pid, its start ticks); None when unreadable. A record of an
    older rayfleet holds psutil's start time (seconds since the epoch): read back with
    the boot time of now, as it was written."""
    try:
        pid_text, started_text = record.read_text().split()
        if "." in started_text:
            import psutil

            since_boot = float(started_text) - psutil.boot_time()
            return int(pid_text), round(since_boot * os.sysconf("SC_CLK_TCK"))
        return int(pid_text), int(started_text)
    except (OSError, ValueError):
        return None


def _server_runs(pid: int, started: int) -> bool:
    """Whether the server recorded as ``pid``, started at tick ``started``, still runs."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[1] == started


def _still_ours(pgid: int, started: int) -> bool:
    """Whether group ``pgid`` is still the recorded server's: its leader, started at
    tick ``started``, is there (running or a zombie); or the leader is gone and a
    process of the group started since is left.

    A group's id is its leader's pid, and a process joins a group by being spawned into
    it (or by setpgid, which nothing here does): with the leader gone, the members are
    what the server spawned (engine core, workers, vLLM's resource tracker), and a pid
    reused since leads a group of its own and fails the first test. Members are not told
    by their names: vLLM titles its processes (VLLM::EngineCore) only where setproctitle
    works, and a fresh install's engine core was seen left as "python"."""
    leader = _stat(pgid)
    if leader is not None:
        return leader[1] == started
    for proc in _group_members(pgid):
        stat = _stat(proc.pid)
        if stat is not None and stat[0] != "Z" and stat[1] >= started:
            return True
    return False
