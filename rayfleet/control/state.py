"""The run-state file that connects ``rayfleet up`` with ``status`` and ``down``.

``$RAYFLEET_HOME/run/fleet.json`` holds the fleet process's pid, its gateway URL,
its phase and the pids of the vLLM servers it has seen, so that ``down`` can stop
everything even when the fleet process is gone. Phases: ``starting`` (Ray and the
replicas coming up), ``ready`` (every model has all its replicas), ``failed`` (a
deployment failed; ``error`` says why), ``stopping`` (shutting down). Written by the
fleet process (rayfleet/control/fleet.py) atomically at each change; removed when the
fleet stops.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from rayfleet._home import rayfleet_home


def state_path() -> Path:
    return rayfleet_home() / "run" / "fleet.json"


@dataclass
class RunState:
    pid: int
    gateway_url: str
    phase: str = "starting"
    ray_address: str = "local"
    models: list[str] = field(default_factory=list)
    log_dir: str = ""
    engine_pids: list[int] = field(default_factory=list)
    started_at: float = 0.0
    error: str = ""

    def save(self, path: Path | None = None) -> None:
        path = path or state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fleet-")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=2)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path | None = None) -> RunState | None:
        path = path or state_path()
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def process_alive(self) -> bool:
        """True while the fleet process runs (an exited, unreaped one does not)."""
        try:
            return process_running(psutil.Process(self.pid))
        except psutil.NoSuchProcess:
            return False


def process_running(proc: psutil.Process) -> bool:
    """True while ``proc`` runs. A zombie (exited, not yet reaped by its parent) and a
    process whose pid now belongs to another process do not."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def clear_state(path: Path | None = None) -> None:
    (path or state_path()).unlink(missing_ok=True)
