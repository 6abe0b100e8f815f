"""gateway.workers: 2 under `rayfleet up` (real Ray, Serve, registry; simulated engines,
named so): both workers serve the one port, and what must hold across them holds. A
key's quota is one quota, the prefix index sends a group's requests to one replica
whichever worker takes them, the fleet's status and /metrics count every worker's
requests in flight, the admin endpoints answer through a worker, a killed worker is
replaced, and `rayfleet down` leaves no worker behind."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from rayfleet.gateway.auth import hash_key
from tests.integration.fleet import RunningFleet, model_entry, running_fleet, wait_until

pytestmark = pytest.mark.integration

LIMITED, OPEN = "k-limited", "k-open"
RPM = 6
TIMEOUT_S = 120
WORKER = "x-rayfleet-worker"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    gateway = {
        "workers": 2,
        "api_keys": [
            {"name": "limited", "key_sha256": hash_key(LIMITED), "requests_per_minute": RPM},
            {"name": "open", "key_sha256": hash_key(OPEN)},
        ],
    }
    models = [
        model_entry("sim-a", "sim", {}, engine="sim", replicas=2, routing={"policy": "prefix"})
    ]
    with running_fleet(tmp_path_factory.mktemp("workers"), models, gateway=gateway) as running:
        yield running


def post(
    fleet: RunningFleet, body: dict[str, Any], key: str = OPEN, path: str = "/v1/completions"
) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: the kernel picks the worker for each."""
    connection = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=60)
    try:
        connection.request(
            "POST",
            path,
            json.dumps({"model": "sim-a", "max_tokens": 2, **body}),
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    finally:
        connection.close()


def test_both_workers_serve_and_a_keys_quota_is_one_quota(fleet: RunningFleet):
    started = time.monotonic()
    answers = [post(fleet, {"prompt": f"hello {i}"}, key=LIMITED) for i in range(2 * RPM)]
    refilled = int((time.monotonic() - started) * RPM / 60)  # the bucket refills meanwhile
    statuses = [status for status, _, _ in answers]
    # Two quotas of their own would have let both workers take RPM each.
    assert RPM <= statuses.count(200) <= RPM + refilled, statuses
    assert statuses.count(200) + statuses.count(429) == 2 * RPM, statuses
    assert all(headers.get("retry-after") for status, headers, _ in answers if status == 429)
    # Until both workers have answered (the kernel spreads connections by their ports).
    workers = {headers[WORKER] for _, headers, _ in answers}
    more = wait_until(
        lambda: workers.add(post(fleet, {"prompt": "x"})[1][WORKER]) or len(workers) == 2,
        TIMEOUT_S,
        poll_s=0.0,
    )
    assert more and workers == {"0", "1"}


def test_a_groups_requests_go_to_one_replica_whichever_worker_takes_them(fleet: RunningFleet):
    for group in range(3):
        seen = _replicas_by_worker(fleet, f"group {group}: answer as a ship's log. " * 30)
        assert set(seen) == {"0", "1"}
        assert len(set().union(*seen.values())) == 1, seen


def _replicas_by_worker(fleet: RunningFleet, system: str) -> dict[str, set[str]]:
    """Turns of chats under one system prompt, each on a new connection, until both
    workers have taken some: which replicas each worker sent them to."""
    seen: dict[str, set[str]] = {}
    turns = itertools.count()

    def one_more() -> bool:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {next(turns)}"},
        ]
        status, headers, _ = post(fleet, {"messages": messages}, path=CHAT)
        assert status == 200
        seen.setdefault(headers[WORKER], set()).add(headers["x-rayfleet-replica"])
        return len(seen) == 2

    wait_until(one_more, TIMEOUT_S, poll_s=0.0)
    return seen


def test_the_fleet_counts_every_workers_requests_in_flight(fleet: RunningFleet):
    streams: list[tuple[http.client.HTTPConnection, str]] = []
    try:
        # Streams until each worker carries two (the kernel picks a worker per connection).
        while len(streams) < 12 and not all(
            sum(worker == w for _, worker in streams) >= 2 for w in ("0", "1")
        ):
            streams.append(_open_stream(fleet))
        assert {worker for _, worker in streams} == {"0", "1"}
        expected = len(streams)
        assert wait_until(lambda: _in_flight(fleet) == expected, TIMEOUT_S), _in_flight(fleet)
        assert _metric_sum(fleet, "rayfleet_inflight_requests") == expected
    finally:
        for connection, _ in streams:
            connection.close()
    assert wait_until(lambda: _in_flight(fleet) == 0, TIMEOUT_S)


def _open_stream(fleet: RunningFleet) -> tuple[http.client.HTTPConnection, str]:
    """A long stream, begun and left unread: in flight until its connection closes."""
    connection = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=60)
    body = {"model": "sim-a", "prompt": "a long one", "max_tokens": 8000, "stream": True}
    connection.request(
        "POST",
        "/v1/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {OPEN}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    response.read(1)
    return connection, response.headers[WORKER]


def _in_flight(fleet: RunningFleet) -> int:
    status = _status(fleet)
    return sum(r["inflight"] for r in status["replicas"])


def _status(fleet: RunningFleet) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=30)
    try:
        connection.request("GET", "/rayfleet/status")
        body: dict[str, Any] = json.loads(connection.getresponse().read())
        return body
    finally:
        connection.close()


def _metric_sum(fleet: RunningFleet, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_only_the_fleet_process_reads_the_replicas_metrics(fleet: RunningFleet):
    """N workers reading every vLLM's /metrics would multiply that load by N: the fleet
    process reads them, and its page has both replicas; a worker's own page has none."""
    assert wait_until(lambda: _metric_sum(fleet, "rayfleet_replica_up") == 2, TIMEOUT_S)
    for worker, pid in enumerate(fleet.status()["gateway_workers"]["pids"]):
        page = _worker_page(pid, f"worker-{worker}.sock", "/metrics")
        assert "rayfleet_requests_total" in page  # a worker's page, read from it
        assert "rayfleet_replica_up" not in page


def _worker_page(pid: int, socket_name: str, path: str) -> str:
    """GET ``path`` from a worker over its own Unix socket (found among its sockets)."""
    paths = [c.laddr for c in psutil.Process(pid).net_connections(kind="unix")]
    # A set: a connection the worker accepted on it has the same local path.
    (address,) = {p for p in paths if isinstance(p, str) and p.endswith(socket_name)}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(address)
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: worker\r\n\r\n".encode())
        chunks = iter(lambda: sock.recv(65536), b"")
        response = b"".join(chunks).decode()
    head, _, body = response.partition("\r\n\r\n")
    assert head.split(" ", 2)[1] == "200", head
    return body


def test_admin_endpoints_answer_through_a_worker(fleet: RunningFleet):
    result = fleet.cli("scale", "sim-a", "2")
    assert "sim-a" in result.stdout + result.stderr
    assert fleet.status()["gateway_workers"]["workers"] == 2


def test_a_killed_worker_is_replaced(fleet: RunningFleet):
    before = _status(fleet)["gateway_workers"]
    victim = before["pids"][0]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> dict[str, Any] | None:
        try:
            now = _status(fleet)["gateway_workers"]
        except ConnectionError:  # a connection the kernel gave the dead worker's socket
            return None
        fresh = now["pids"][0]
        return now if fresh and fresh != victim and now["restarts"] > before["restarts"] else None

    now = wait_until(replaced, TIMEOUT_S, poll_s=0.5)
    assert now is not None
    # The new worker serves: until one answer comes from it.
    assert wait_until(lambda: _answered_by(fleet) == "0", TIMEOUT_S, 0.0)
    assert _status(fleet)["gateway_workers"]["restarts"] == before["restarts"] + 1


def _answered_by(fleet: RunningFleet) -> str | None:
    try:
        status, headers, _ = post(fleet, {"prompt": "back"})
    except ConnectionError:
        return None
    assert status == 200
    return headers[WORKER]


def test_down_leaves_no_worker(fleet: RunningFleet):
    pids = [pid for pid in _status(fleet)["gateway_workers"]["pids"] if pid]
    assert len(pids) == 2
    fleet.cli("down")
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), TIMEOUT_S)
    assert not fleet.state_file.exists()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
