"""The processes of one fleet, found by the RAYFLEET_HOME in their environment.

Every process a fleet starts (Ray's, the replicas' vLLM servers, the engine cores and
workers vLLM spawns) inherits the fleet process's environment, so a process that was
re-parented to init is found as well as one still in the fleet's process tree.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def fleet_processes(home: Path) -> list[psutil.Process]:
    """Every running process whose environment names ``home`` as RAYFLEET_HOME."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAYFLEET_HOME") == str(home) and running(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_vllm(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("VLLM") or any("vllm" in a for a in proc.cmdline())
    except psutil.Error:
        return False


def describe(procs: list[psutil.Process]) -> list[str]:
    shown = []
    for proc in procs:
        try:
            shown.append(f"{proc.pid} ppid={proc.ppid()} {proc.name()} {proc.cmdline()[:4]}")
        except psutil.Error:
            shown.append(f"{proc.pid} (gone)")
    return shown
