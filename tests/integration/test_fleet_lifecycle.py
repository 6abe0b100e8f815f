"""Replicas die and come back, requests keep succeeding, `rayfleet down` leaves nothing."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import openai
import psutil
import pytest

from tests.integration.fleet import running_fleet

pytestmark = pytest.mark.integration

TINY_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
EMBED_ARGS = {**TINY_ARGS, "runner": "pooling", "convert": "embed"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model):
    models = [
        {"name": "tiny", "source": str(tiny_model), "engine_args": TINY_ARGS, "replicas": 2},
        {"name": "tiny-embed", "source": str(tiny_model), "engine_args": EMBED_ARGS},
    ]
    with running_fleet(tmp_path_factory.mktemp("fleet-life"), models) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet):
    return openai.OpenAI(base_url=fleet.base_url, api_key="unused", max_retries=0)


def test_embeddings(client):
    result = client.embeddings.create(model="tiny-embed", input=["hello", "a fleet of servers"])
    assert len(result.data) == 2
    assert len(result.data[0].embedding) == 128  # the tiny model's hidden size
    assert result.data[0].embedding != result.data[1].embedding


def test_requests_spread_over_both_replicas(client):
    seen = set()
    for _ in range(6):
        raw = client.completions.with_raw_response.create(model="tiny", prompt="hi", max_tokens=2)
        seen.add(raw.headers["x-rayfleet-replica"])
    assert len(seen) == 2


def test_killed_server_is_replaced_while_requests_keep_succeeding(fleet, client):
    before = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
    assert len(before) == 2
    victim = before[0]
    os.kill(victim["pid"], signal.SIGKILL)

    failures: list[Exception] = []
    served: list[str] = []
    stop = threading.Event()

    def load() -> None:
        # Gentle on purpose: a busy engine's OpenMP threads spin and would starve the
        # replacement's start on a 2-core machine.
        while not stop.is_set():
            try:
                raw = client.completions.with_raw_response.create(
                    model="tiny", prompt="hi", max_tokens=4
                )
                served.append(raw.headers["x-rayfleet-replica"])
            except Exception as exc:  # any failure is what the test looks for
                failures.append(exc)
            time.sleep(0.5)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        replaced = None
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            now = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
            fresh = [r for r in now if r["replica_id"] not in {b["replica_id"] for b in before}]
            if fresh and len(now) == 2 and all(r["healthy"] for r in now):
                replaced = fresh[0]
                break
            time.sleep(1)
    finally:
        stop.set()
        worker.join()

    assert replaced is not None, "Ray Serve did not replace the replica whose server died"
    assert replaced["pid"] != victim["pid"]
    assert not failures, f"{len(failures)} of {len(failures) + len(served)} requests failed"
    assert len(served) > 10
    # The new replica takes traffic.
    seen = set()
    for _ in range(6):
        raw = client.completions.with_raw_response.create(model="tiny", prompt="hi", max_tokens=2)
        seen.add(raw.headers["x-rayfleet-replica"])
    assert replaced["replica_id"] in seen


def test_down_leaves_no_process_and_frees_the_port(fleet):
    state = fleet.state()
    root = psutil.Process(state["pid"])
    tree = [root, *root.children(recursive=True)]
    engines = [psutil.Process(pid) for pid in state["engine_pids"] if psutil.pid_exists(pid)]
    assert any("vllm" in " ".join(p.cmdline()) for p in tree + engines)

    result = fleet.cli("down")
    assert "fleet stopped" in result.stderr

    gone, alive = psutil.wait_procs(tree + engines, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    with socket.socket() as s:
        # As a new server would: TIME_WAIT leftovers allowed, a listener still there not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", fleet.port))
        s.listen()
    assert not (fleet.home / "run" / "fleet.json").exists()
    status = fleet.cli("status", check=False)
    assert status.returncode == 2 and "no fleet is running" in status.stderr


def test_ctrl_c_in_the_foreground_stops_everything(tmp_path, tiny_model):
    """Ctrl-C reaches the whole foreground process group, as a terminal sends it."""
    import json
    import subprocess
    import sys

    import yaml

    from rayfleet.control.engine import free_port

    port = free_port()
    config = tmp_path / "fleet.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {"port": port},
                "models": [{"name": "tiny", "source": str(tiny_model), "engine_args": TINY_ARGS}],
            }
        )
    )
    env = {**os.environ, "RAYFLEET_HOME": str(tmp_path)}
    up = subprocess.Popen(
        [sys.executable, "-m", "rayfleet.cli", "up", "-c", str(config)],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    state_file = tmp_path / "run" / "fleet.json"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and up.poll() is None:
            if state_file.exists() and json.loads(state_file.read_text())["phase"] == "ready":
                break
            time.sleep(0.5)
        assert json.loads(state_file.read_text())["phase"] == "ready"
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
        engines = [psutil.Process(p) for p in json.loads(state_file.read_text())["engine_pids"]]
        tree = [psutil.Process(up.pid), *psutil.Process(up.pid).children(recursive=True)]

        os.killpg(up.pid, signal.SIGINT)
        output, _ = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
    assert up.returncode == 0, output
    assert "fleet stopped" in output
    assert "Traceback" not in output, output
    gone, alive = psutil.wait_procs(tree + engines, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    assert not state_file.exists()
