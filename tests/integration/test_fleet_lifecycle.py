"""Replicas die and come back, requests keep succeeding, `rayfleet down` leaves nothing.

The module's shared fleet (tests/conftest.py's ``fleet``) is stopped by the module's last
test only (`rayfleet down` of a detached fleet); a test run alone still finds it up.
Ctrl-C to a foreground `up`, and `down` at each phase of a replica's start, are in
test_stop_phases.py.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

import openai
import psutil
import pytest

from tests.integration.fleet import (
    TINY_ARGS,
    model_entry,
    wait_until,
)

pytestmark = pytest.mark.integration

EMBED_ARGS = {**TINY_ARGS, "runner": "pooling", "convert": "embed"}
REPLACE_TIMEOUT_S = 480
STOP_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def fleet_models(tiny_model):
    return [
        model_entry("tiny", tiny_model, replicas=2),
        model_entry("tiny-embed", tiny_model, EMBED_ARGS),
    ]


def replicas_serving(client, num_requests: int = 6) -> set[str]:
    served = set()
    for _ in range(num_requests):
        raw = client.completions.with_raw_response.create(model="tiny", prompt="hi", max_tokens=2)
        served.add(raw.headers["x-rayfleet-replica"])
    return served


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=STOP_TIMEOUT_S)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive


def test_embeddings(client):
    result = client.embeddings.create(model="tiny-embed", input=["hello", "a fleet of servers"])
    assert len(result.data) == 2
    assert len(result.data[0].embedding) == 128  # the tiny model's hidden size
    assert result.data[0].embedding != result.data[1].embedding


def test_requests_spread_over_both_replicas(client):
    assert len(replicas_serving(client)) == 2


class GentleLoad:
    """Requests one after another on a thread, 0.5 s apart, until stopped: gentle on
    purpose, since a busy engine's OpenMP threads spin and would starve a replacement's
    start on a 2-core machine."""

    def __init__(self, client: openai.OpenAI):
        self.client = client
        self.served: list[str] = []
        self.failures: list[Exception] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                raw = self.client.completions.with_raw_response.create(
                    model="tiny", prompt="hi", max_tokens=4
                )
                self.served.append(raw.headers["x-rayfleet-replica"])
            except Exception as exc:  # any failure is what the test looks for
                self.failures.append(exc)
            self.stop.wait(0.5)

    def __enter__(self) -> GentleLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def tiny_replicas(fleet) -> list[dict]:
    return [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]


def test_replica_actors_and_their_servers_run_unniced(fleet):
    """A local fleet's Ray runs its workers at niceness 0 (rayfleet/cluster.py): a replica
    actor at Ray's default of 15 starts starved beside busy engines."""
    replicas = [r for r in fleet.status()["replicas"] if r.get("pid")]
    assert replicas, fleet.status()
    for replica in replicas:
        server = psutil.Process(replica["pid"])
        actor = server.parent()
        assert actor is not None and "ServeReplica" in " ".join(actor.cmdline()), actor
        assert (actor.nice(), server.nice()) == (0, 0), replica


def test_killed_server_is_replaced_while_requests_keep_succeeding(fleet, client):
    def both_healthy():
        now = tiny_replicas(fleet)
        return now if len(now) == 2 and all(r["healthy"] for r in now) else None

    before = wait_until(both_healthy, REPLACE_TIMEOUT_S, poll_s=1.0)
    assert before is not None, "the fleet never had both tiny replicas healthy"
    victim = before[0]
    os.kill(victim["pid"], signal.SIGKILL)

    def replacement():
        now = both_healthy() or []
        fresh = [r for r in now if r["replica_id"] not in {b["replica_id"] for b in before}]
        return fresh[0] if fresh else None

    with GentleLoad(client) as load:
        replaced = wait_until(replacement, REPLACE_TIMEOUT_S, poll_s=1.0)

    assert replaced is not None, "Ray Serve did not replace the replica whose server died"
    assert replaced["pid"] != victim["pid"]
    num_sent = len(load.failures) + len(load.served)
    assert not load.failures, f"{len(load.failures)} of {num_sent} requests failed"
    assert len(load.served) > 10
    assert replaced["replica_id"] in replicas_serving(client)


def test_down_at_the_end_leaves_no_process_and_frees_the_port(fleet):
    """Last in the module: `rayfleet down` stops its detached fleet (two replicas, one of
    them a replacement by now, and the embedding model) and leaves nothing behind."""
    state = fleet.state()
    root = psutil.Process(state["pid"])
    tree = [root, *root.children(recursive=True)]
    engines = [psutil.Process(pid) for pid in state["engine_pids"] if psutil.pid_exists(pid)]
    assert any("vllm" in " ".join(p.cmdline()) for p in tree + engines)

    result = fleet.cli("down")
    assert "fleet stopped" in result.stderr

    assert_all_gone(tree + engines)
    with socket.socket() as s:
        # As a new server would: TIME_WAIT leftovers allowed, a listener still there not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", fleet.port))
        s.listen()
    assert not fleet.state_file.exists()
    status = fleet.cli("status", check=False)
    assert status.returncode == 2 and "no fleet is running" in status.stderr
