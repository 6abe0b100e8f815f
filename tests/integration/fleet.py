"""Start a real fleet for a test module: `rayfleet up --detach` in a private RAYFLEET_HOME.

with running_fleet(tmp_dir, models=[...]) as fleet:
    fleet.base_url        # http://127.0.0.1:PORT/v1
    fleet.status()        # `rayfleet status --json`, parsed
    fleet.cli("down")     # any rayfleet command with this fleet's environment
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from rayfleet.control.engine import free_port

RAYFLEET = [sys.executable, "-m", "rayfleet.cli"]


@dataclass
class RunningFleet:
    home: Path
    port: int
    config_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def env(self) -> dict:
        return {**os.environ, "RAYFLEET_HOME": str(self.home)}

    def cli(self, *args: str, timeout_s: float = 300, check: bool = True):
        result = subprocess.run(
            [*RAYFLEET, *args], env=self.env(), capture_output=True, text=True, timeout=timeout_s
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"rayfleet {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result

    def status(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def state(self) -> dict:
        return json.loads((self.home / "run" / "fleet.json").read_text())


@contextlib.contextmanager
def running_fleet(home: Path, models: list[dict]):
    port = free_port()
    config_path = home / "fleet.yaml"
    config_path.write_text(yaml.safe_dump({"gateway": {"port": port}, "models": models}))
    fleet = RunningFleet(home=home, port=port, config_path=config_path)
    fleet.cli("up", "-c", str(config_path), "--detach", timeout_s=900)
    try:
        yield fleet
    finally:
        if (home / "run" / "fleet.json").exists():
            pid = fleet.state()["pid"]
            fleet.cli("down", check=False)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
