"""Real fleets and real vLLM servers for integration tests, and waiting on them.

- ``running_fleet(home, models)``: `rayfleet up --detach` in a private RAYFLEET_HOME,
  `rayfleet down` (and a kill) on exit. The one fleet factory: tests/conftest.py's
  module-scoped ``fleet`` and ``client`` fixtures are built on it (a test module says
  which models with a ``fleet_models`` fixture), and a test that stops its fleet starts
  one of its own with it.
- ``model_entry(name, source, ...)``: one model of fleet.yaml, with keyword defaults.
- ``serving_engine(model, name, ...)``: one vLLM OpenAI server, started, healthy, and
  stopped (with every process of its group) on exit.
- ``wait_until(predicate, timeout_s)``: poll a condition until a deadline.
- ``engine_gauges(url, *names)``: series of a vLLM server's /metrics, summed over labels.
- ``start_foreground_up(home, config_path)``: `rayfleet up` in the foreground of a session of
  its own, so a test can send its whole group Ctrl-C as a terminal does.
- ``one_cpu_raylets(num_workers)``: a Ray cluster of a head and workers of one CPU each
  on this machine (Ray's cluster utilities), shut down on exit.

    with running_fleet(tmp_path, [model_entry("tiny", tiny_model)]) as fleet:
        fleet.base_url        # http://127.0.0.1:PORT/v1
        fleet.client()        # the official openai client on it
        fleet.status()        # `rayfleet status --json`, parsed
        fleet.cli("down")     # any rayfleet command with this fleet's environment
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import openai
import psutil
import yaml

from rayfleet.control.engine import EngineProcess, free_port

RAYFLEET = [sys.executable, "-m", "rayfleet.cli"]
TINY_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
DEMO_ARGS = {"enforce_eager": True, "max_model_len": 2048, "dtype": "float32"}
ENGINE_START_TIMEOUT_S = 600

T = TypeVar("T")


def engine_gauges(url: str, *names: str) -> list[float]:
    """Each named series of a vLLM server's /metrics (summed over label sets), one read."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return [
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith(name + "{") or line.startswith(name + " ")
        )
        for name in names
    ]


def engine_gauge(url: str, name: str) -> float:
    return engine_gauges(url, name)[0]


def wait_until(predicate: Callable[[], T], timeout_s: float, poll_s: float = 0.2) -> T | None:
    """The first truthy value of ``predicate()``, polled until ``timeout_s``; None after."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value or None
        time.sleep(poll_s)


def model_entry(
    name: str,
    source: Path | str,
    engine_args: Mapping[str, Any] = TINY_ARGS,
    **fields: Any,
) -> dict[str, Any]:
    """One model of fleet.yaml (``replicas=2`` and any other field as keywords)."""
    return {"name": name, "source": str(source), "engine_args": dict(engine_args), **fields}


def demo_and_tiny(tiny_model: Path, demo_model: Path) -> list[dict[str, Any]]:
    """The fleet of the modules sharing ``SHARED_FLEET = "demo-and-tiny"``: the demo model
    and the tiny one, a replica each."""
    return [model_entry("smollm2-135m", demo_model, DEMO_ARGS), model_entry("tiny", tiny_model)]


def write_config(
    home: Path,
    models: list[dict[str, Any]],
    port: int,
    cluster: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
) -> Path:
    config_path = home / "fleet.yaml"
    data: dict[str, Any] = {"gateway": {**(gateway or {}), "port": port}, "models": models}
    if cluster is not None:
        data["cluster"] = dict(cluster)
    config_path.write_text(yaml.safe_dump(data))
    return config_path


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

    @property
    def state_file(self) -> Path:
        return self.home / "run" / "fleet.json"

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAYFLEET_HOME": str(self.home)}

    def cli(
        self, *args: str, timeout_s: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*RAYFLEET, *args], env=self.env(), capture_output=True, text=True, timeout=timeout_s
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"rayfleet {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def client(self) -> openai.OpenAI:
        """The official openai client on the gateway, no retries (a failure is a failure)."""
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)

    def status(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self.cli("status", "--json").stdout)
        return report

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        return state

    def serve_events(self, last: int = 40) -> str:
        """What Serve did to replicas and what they warned of, from the logs of the latest
        Ray session (the fleet's own on the embedded Ray): for a failure's message."""
        logs = Path("/tmp/ray/session_latest/logs")
        serve = [
            line
            for path in sorted(logs.glob("serve/*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if any(word in line for word in SERVE_EVENT_WORDS)
        ]
        ours = [  # rayfleet's own warnings go to the replica's worker's stderr
            f"{path.name}: {line}"
            for path in sorted(logs.glob("worker-*.err"))
            for line in path.read_text(errors="replace").splitlines()
            if "rayfleet" in line
        ]
        return "\n".join([*sorted(serve, key=_log_time)[-last:], *ours[-last:]])


SERVE_EVENT_WORDS = ("Adding", "Removing", "Stopping", "health", "died", "WARNING", "ERROR")


def _log_time(line: str) -> str:
    """Serve's log lines start "LEVEL yyyy-mm-dd hh:mm:ss,mmm"."""
    return " ".join(line.split()[1:3])


@contextlib.contextmanager
def running_fleet(
    home: Path,
    models: list[dict[str, Any]],
    cluster: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
) -> Iterator[RunningFleet]:
    """A fleet of ``models`` started detached in ``home`` (on the embedded Ray, or on
    ``cluster``: fleet.yaml's cluster section; ``gateway``: its gateway section, the port
    chosen here); stopped on exit if still up."""
    port = free_port()
    config_path = write_config(home, models, port, cluster, gateway)
    fleet = RunningFleet(home=home, port=port, config_path=config_path)
    fleet.cli("up", "-c", str(fleet.config_path), "--detach", timeout_s=900)
    try:
        yield fleet
    finally:
        if fleet.state_file.exists():
            pid = fleet.state()["pid"]
            fleet.cli("down", check=False)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


@contextlib.contextmanager
def serving_engine(
    model: Path | str,
    served_name: str,
    engine_args: Mapping[str, Any] = TINY_ARGS,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = ENGINE_START_TIMEOUT_S,
) -> Iterator[EngineProcess]:
    """A real vLLM OpenAI server on ``model``, healthy on entry, stopped on exit."""
    with EngineProcess(str(model), served_name, engine_args, env=env) as engine:
        engine.wait_healthy(timeout_s=timeout_s)
        yield engine


def start_foreground_up(home: Path, config_path: Path) -> subprocess.Popen[str]:
    """`rayfleet up -c config_path` in ``home``, in the foreground of a session of its own
    (its process group is the one a terminal's Ctrl-C reaches), output on a pipe."""
    return subprocess.Popen(
        [*RAYFLEET, "up", "-c", str(config_path)],
        env={**os.environ, "RAYFLEET_HOME": str(home)},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextlib.contextmanager
def one_cpu_raylets(num_workers: int = 1) -> Iterator[Any]:
    """A head raylet and ``num_workers`` worker raylets of one CPU each: a replica of one
    CPU per node. Each node runs its Ray workers at niceness 0, as ``rayfleet doctor``
    asks of a cluster. Yields ray.cluster_utils.Cluster."""
    from ray.cluster_utils import Cluster

    unniced = {"RAY_worker_niceness": "0"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "env_vars": unniced})
    try:
        for _ in range(num_workers):
            cluster.add_node(num_cpus=1, env_vars=unniced)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
