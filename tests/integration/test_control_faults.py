"""Faults of the control plane, and clients that leave, against a real fleet.

- `rayfleet up` on a port in use, and a fleet with one model that cannot start: one
  line of error, and nothing left running (no Ray, no vLLM, no state file);
- the replica registry's process or the Serve controller's killed (Ray restarts both):
  a steady client sees no failure, and the registry fills again from the replicas'
  health checks;
- a client that disconnects while its request streams: vLLM drops the request within
  1 s of the disconnect;
- a client that disconnects while its request waits in vLLM's queue: vLLM drops it
  before it runs.

The module's fleet serves one replica of the tiny model with ``max_num_seqs: 1``, so
requests run one at a time and the others wait in vLLM's queue.

The queued case. Twenty long requests (not streamed) of 1,024 tokens each queue up:
about 80 s of work at the 270 tokens a second the tiny model decodes one request at a
time here (3.8 s for 1,024; in CI the whole test once took 45 s). Once the gateway's
/metrics counts them all in flight to the replica, the one that leaves is sent, and its
client leaves as soon as the response's head reaches it (vLLM starts a stream as it
queues the request), with at least two requests ahead still unanswered. Nothing waits on
vLLM's own /metrics before the client leaves: while the engine runs it answers slowly
(its API server shares two cores with the engine's busy loop; two reads outlasted a 23 s
queue here), and three such reads let the queue drain first in CI. The engine is waited
on to go idle for as long as it keeps finishing requests, not for a fixed time. Then
vLLM's histogram of tokens generated per finished request (``ignore_eos``: exactly
max_tokens) has twenty more of over 1,000 and none more of the 16 the one that left
asked for, and every token generated since the start belongs to a finished request (the
histogram's sum): the one that left never ran a step. Any other request the engine may
have taken meanwhile is told apart by its size.

The 1 s bound is not measured in the queued case: vLLM's /metrics is too slow while the
engine runs to time a disconnect to the second. An earlier version, one request of about
2 s ahead and the waiting gauge polled, failed in 2 of 4 runs for that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import threading
import time
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.control.engine import free_port
from tests.integration.fleet import (
    RAYFLEET,
    TINY_ARGS,
    RunningFleet,
    engine_gauge,
    engine_gauges,
    model_entry,
    wait_until,
    write_config,
)
from tests.integration.processes import describe, fleet_processes

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 2048
NUM_AHEAD = 20  # requests queued ahead of the one that leaves
NUM_TOKENS_AHEAD = MAX_MODEL_LEN - 64  # the stream that leaves mid-way: 8-12 s here
NUM_TOKENS_QUEUED = 1024  # each request queued ahead: about 6 s here
NUM_TOKENS_LEAVING = 16  # the one that leaves (a shape no other request of the test has)
# The engine has stalled when no request ahead finished for this long (about 20 of them).
STALL_S = 120.0
ENGINE_LOAD = ("vllm:num_requests_running", "vllm:num_requests_waiting")
GENERATED = "vllm:generation_tokens_total"
ABORT_DEADLINE_S = 1.0  # from the client's disconnect to vLLM's gauge dropping
RESTART_TIMEOUT_S = 120
GONE_TIMEOUT_S = 10
REGISTRY_WARMUP_S = 8.0  # FleetRegistry's warmup_s
REQUESTS_AFTER = 20  # requests a steady client must see answered once recovered


@pytest.fixture(scope="module")
def fleet_models(tiny_model) -> list[dict[str, Any]]:
    args = {**TINY_ARGS, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 1}
    return [model_entry("tiny", tiny_model, args)]


def up_detached(
    home: Path, models: list[dict[str, Any]], port: int
) -> subprocess.CompletedProcess[str]:
    config = write_config(home, models, port)
    return subprocess.run(
        [*RAYFLEET, "up", "-c", str(config), "--detach"],
        env={**os.environ, "RAYFLEET_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=900,
    )


def assert_one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    after = stderr[stderr.index(errors[0]) + len(errors[0]) :]
    assert not after.strip(), f"more than one line of error:\n{stderr}"
    return errors[0]


def assert_nothing_left(home: Path) -> None:
    assert wait_until(lambda: not fleet_processes(home), GONE_TIMEOUT_S), describe(
        fleet_processes(home)
    )
    assert not (home / "run" / "fleet.json").exists()


def test_up_on_a_port_in_use_refuses_in_one_line_and_starts_nothing(tmp_path, tiny_model):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = up_detached(tmp_path, [model_entry("tiny", tiny_model)], port)
    assert result.returncode != 0
    line = assert_one_error_line(result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line, line
    assert_nothing_left(tmp_path)


def test_a_model_that_cannot_start_fails_up_in_one_line_and_leaves_nothing(tmp_path, tiny_model):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "README.md").write_text("no weights here\n")
    models = [model_entry("tiny", tiny_model), model_entry("broken", not_a_model)]
    result = up_detached(tmp_path, models, free_port())
    assert result.returncode != 0
    line = assert_one_error_line(result.stderr)
    assert "model 'broken' failed to deploy" in line and "broken" in line, line
    assert "log" in line, line
    assert_nothing_left(tmp_path)


class SteadyClient:
    """One small request after another on a thread, counting answers and failures."""

    def __init__(self, client: openai.OpenAI):
        self.client = client
        self.answered = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.completions.create(model="tiny", prompt="hi", max_tokens=2)
                self.answered += 1
            except Exception as exc:  # any failure is what the test looks for
                self.failures.append(repr(exc))
            self.stop.wait(0.1)

    def answered_more(self, num: int) -> bool:
        target = self.answered + num
        return bool(wait_until(lambda: self.answered >= target or self.failures, 120))

    def __enter__(self) -> SteadyClient:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def ray_process(fleet: RunningFleet, actor: str) -> psutil.Process | None:
    """The process of a Ray actor of the fleet (Ray titles it ``ray::<class>``)."""
    for proc in fleet_processes(fleet.home):
        with contextlib.suppress(psutil.Error):
            if f"ray::{actor}" in " ".join(proc.cmdline()):
                return proc
    return None


def serving_replicas(fleet: RunningFleet) -> list[dict[str, Any]]:
    return [r for r in fleet.status()["replicas"] if r["healthy"] and not r["draining"]]


@pytest.mark.parametrize("actor", ["FleetRegistry", "ServeController"])
def test_a_restarted_control_actor_costs_no_request(fleet, client, actor):
    assert wait_until(lambda: serving_replicas(fleet), RESTART_TIMEOUT_S)
    old = ray_process(fleet, actor)
    assert old is not None, describe(fleet_processes(fleet.home))
    with SteadyClient(client) as load:
        assert load.answered_more(5), load.failures
        old.kill()
        killed_at = time.monotonic()
        new = wait_until(
            lambda: (p := ray_process(fleet, actor)) and p.pid != old.pid and p, RESTART_TIMEOUT_S
        )
        assert new, f"Ray did not restart {actor}"
        # The registry refuses to list for its warm-up, then lists what re-registered.
        assert wait_until(lambda: time.monotonic() - killed_at > REGISTRY_WARMUP_S + 2, 30)
        assert wait_until(lambda: serving_replicas(fleet), RESTART_TIMEOUT_S)
        assert load.answered_more(REQUESTS_AFTER), load.failures
    assert not load.failures, f"{len(load.failures)} failed: {load.failures[:3]}"
    (replica,) = serving_replicas(fleet)
    assert replica["model"] == "tiny"


def open_stream(fleet: RunningFleet, max_tokens: int, stream: bool = True) -> socket.socket:
    """A completion (streamed unless told) sent on a raw connection, left unread."""
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": "Once upon a time",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", fleet.port), timeout=10)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def seconds_until(predicate: Any, deadline_s: float) -> float | None:
    """Seconds until ``predicate()`` held, polled every 20 ms; None past ``deadline_s``."""
    started = time.monotonic()
    while time.monotonic() - started <= deadline_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def test_a_client_that_leaves_mid_stream_is_dropped_by_vllm_within_a_second(fleet):
    (replica,) = wait_until(lambda: serving_replicas(fleet), RESTART_TIMEOUT_S) or [None]
    assert replica is not None
    url = replica["url"]
    running = lambda: engine_gauge(url, "vllm:num_requests_running")  # noqa: E731
    idle = lambda: engine_gauges(url, *ENGINE_LOAD) == [0.0, 0.0]  # noqa: E731
    assert wait_until(idle, 60), "the engine is busy"
    generated_before = engine_gauge(url, GENERATED)

    stream = open_stream(fleet, NUM_TOKENS_AHEAD)
    try:
        # Its first token is on the wire: it runs. (Polling vLLM's gauge for it instead
        # missed whole 1.5 s requests here: /metrics answers slowly while the engine runs.)
        stream.settimeout(60)
        first = stream.recv(4096)
        assert b" 200 " in first.split(b"\r\n", 1)[0], first[:300]
        stream.close()
        took = seconds_until(lambda: running() == 0, ABORT_DEADLINE_S)
        print(f"vLLM dropped the request {took} s after the disconnect")
        assert took is not None, f"vLLM still had the request {ABORT_DEADLINE_S} s after"
    finally:
        stream.close()
    assert wait_until(idle, 30)
    # Cut short, not finished: fewer tokens than asked for (ignore_eos) were generated.
    assert engine_gauge(url, GENERATED) - generated_before < NUM_TOKENS_AHEAD


def test_a_client_that_leaves_while_queued_is_dropped_before_it_runs(fleet):
    (replica,) = wait_until(lambda: serving_replicas(fleet), RESTART_TIMEOUT_S) or [None]
    assert replica is not None
    url = replica["url"]
    idle = lambda: engine_gauges(url, *ENGINE_LOAD) == [0.0, 0.0]  # noqa: E731
    assert wait_until(idle, 60), "the engine is busy"
    before = QueueCounts.read(url)
    relayed_before = gateway_relayed(fleet)

    sent_at = time.monotonic()
    ahead = [open_stream(fleet, NUM_TOKENS_QUEUED, stream=False) for _ in range(NUM_AHEAD)]
    leaving: socket.socket | None = None
    try:
        # The one that leaves goes once the gateway relays every request ahead, so that
        # it reaches vLLM behind them (sent at once, it overtook some: CI, 13 finished
        # where 12 should have). The gateway answers its /metrics at once; vLLM's own,
        # read here before (slow while the engine runs), let the queue drain before the
        # client left (CI, 21 finished where 20 should have). Relayed, not in flight: on
        # a busy machine the first request ahead finished before a read saw all 20 in
        # flight at once.
        relayed = lambda: gateway_relayed(fleet) - relayed_before  # noqa: E731
        assert wait_until(lambda: relayed() >= NUM_AHEAD, 60), f"{relayed()} relayed"
        leaving, head = send_queued(fleet)  # vLLM started the stream: queued
        assert b" 200 " in head.split(b"\r\n", 1)[0], head
        pending = [sock for sock in ahead if not answered(sock)]
        leaving.close()  # it waits behind the others (max_num_seqs 1, first come first served)
        # At least the one running and one waiting were still ahead of it.
        assert len(pending) >= 2, (
            f"the queue had drained: {len(pending)} left; the first answers ahead began "
            f"{[first_line(sock) for sock in ahead[:3]]}; {time.monotonic() - sent_at:.0f} s "
            f"since the first was sent; the access log ends {access_log_tail(fleet, 5)}"
        )
        assert idle_while_finishing(url, before.finished + NUM_AHEAD), "the engine stalled"
    finally:
        for sock in ahead:
            sock.close()
        if leaving is not None:
            leaving.close()
    after = QueueCounts.read(url)
    seen = f"since the start: {after.minus(before)}"
    # By the tokens each generated (ignore_eos: exactly max_tokens), the requests ahead
    # finished and the one that left did not; other requests, if any, are told apart.
    assert after.long - before.long == NUM_AHEAD, f"a request ahead did not finish; {seen}"
    assert after.short == before.short, f"the one that left finished; {seen}"
    # Every token generated was one of a finished request's: the one that left was
    # dropped before its first step.
    assert after.unfinished == before.unfinished, f"the one that left ran; {seen}"


def send_queued(fleet: RunningFleet) -> tuple[socket.socket, bytes]:
    """Send the request that will leave, and read its response's head: vLLM starts a
    stream as it queues the request.

    Once, in CI, the gateway closed such a connection without a byte, about 70 s after it
    came, and neither its access log nor vLLM's shows the request: not explained yet, and
    not seen again in runs of this module here. Then one more is sent, with a warning
    holding what the gateway reported; the counts at the end still catch any request of
    this shape that ran."""
    sent = time.monotonic()
    sock = open_stream(fleet, NUM_TOKENS_LEAVING)
    head = response_head(sock, timeout_s=60, closed_ok=True)
    if head:
        return sock, head
    sock.close()
    warnings.warn(
        f"the gateway closed a streamed completion without a byte "
        f"{time.monotonic() - sent:.1f} s after it was sent; its in-flight count "
        f"{gateway_inflight(fleet):g}; its access log ends: {access_log_tail(fleet)}",
        stacklevel=1,
    )
    sock = open_stream(fleet, NUM_TOKENS_LEAVING)
    return sock, response_head(sock, timeout_s=60)


def access_log_tail(fleet: RunningFleet, lines: int = 3) -> list[str]:
    logs = sorted((fleet.home / "logs").glob("*/access.log"))
    return logs[-1].read_text().splitlines()[-lines:] if logs else []


def gateway_inflight(fleet: RunningFleet) -> float:
    """Requests the gateway has in flight to replicas, from its own /metrics."""
    return gateway_sums(fleet, "rayfleet_inflight_requests")


def gateway_relayed(fleet: RunningFleet) -> float:
    """Requests the gateway has sent to a replica and not lost to a client that left:
    those in flight and those answered (a request is counted answered before it leaves
    the in-flight count, with no wait between, so a read never sees it in both or in
    neither)."""
    return gateway_sums(fleet, "rayfleet_inflight_requests", "rayfleet_requests_total")


def gateway_sums(fleet: RunningFleet, *names: str) -> float:
    """The sum of the gateway's samples named ``names``, all labels, from its /metrics."""
    with urllib.request.urlopen(fleet.url + "/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        return sum(
            sample.value for family in families for sample in family.samples if sample.name in names
        )


def response_head(sock: socket.socket, timeout_s: float, closed_ok: bool = False) -> bytes:
    """The status line and headers of the response on ``sock``, read as they come; b""
    when ``closed_ok`` and the connection closed before its first byte."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        if not piece and not data and closed_ok:
            return b""
        assert piece, f"the connection closed before the head: {data!r}"
        data += piece
    return data


def first_line(sock: socket.socket) -> bytes:
    """The first line waiting on ``sock``, left unread (b"" when the peer closed, the error
    when the read fails)."""
    sock.settimeout(1)
    try:
        return sock.recv(200, socket.MSG_PEEK).split(b"\r\n", 1)[0]
    except OSError as error:
        return repr(error).encode()


def answered(sock: socket.socket) -> bool:
    """Whether a response (or the connection's end) is waiting on ``sock``, unread."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


@dataclass(frozen=True)
class QueueCounts:
    """One read of a vLLM server's /metrics: its queue, and its finished requests by the
    number of tokens each generated (vLLM's histogram buckets)."""

    running: float
    waiting: float
    finished: float  # every finish reason
    long: float  # finished after more than 1,000 tokens: the requests ahead
    short: float  # finished after 11 to 20 tokens: the shape of the one that leaves
    generated: float  # every token generated
    unfinished: float  # tokens generated by requests that did not finish (aborted)

    @classmethod
    def read(cls, url: str) -> QueueCounts:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            samples = list(text_string_to_metric_families(response.read().decode()))
        values: dict[tuple[str, str], float] = {}
        for family in samples:
            for sample in family.samples:
                key = (sample.name, sample.labels.get("le", ""))
                values[key] = values.get(key, 0.0) + sample.value
        tokens = "vllm:request_generation_tokens"
        return cls(
            running=values.get(("vllm:num_requests_running", ""), 0.0),
            waiting=values.get(("vllm:num_requests_waiting", ""), 0.0),
            finished=values.get(("vllm:request_success_total", ""), 0.0),
            long=values[(tokens + "_count", "")] - values[(tokens + "_bucket", "1000.0")],
            short=values[(tokens + "_bucket", "20.0")] - values[(tokens + "_bucket", "10.0")],
            generated=values.get((GENERATED, ""), 0.0),
            unfinished=values.get((GENERATED, ""), 0.0) - values[(tokens + "_sum", "")],
        )

    def minus(self, other: QueueCounts) -> dict[str, float]:
        return {
            name: getattr(self, name) - getattr(other, name)
            for name in ("finished", "long", "short", "generated", "unfinished")
        }


def idle_while_finishing(url: str, done_at_least: float) -> bool:
    """Wait until the engine has finished ``done_at_least`` requests in all and gone idle,
    for as long as it keeps finishing requests: how long the queue takes is the machine's
    speed (20 requests of 1,984 tokens took 234 s here one day and 243 s, past a fixed wait
    of 240 s, the next), so only a stall of ``STALL_S`` fails. (Idle alone is not enough:
    on a loaded machine vLLM's gauges still read 0 running, 0 waiting before its first step
    with the new requests, and the test read its counts with 19 of them still waiting.)"""
    last_done, last_change = -1.0, time.monotonic()
    while True:
        counts = QueueCounts.read(url)
        running, waiting, done = counts.running, counts.waiting, counts.finished
        if running == waiting == 0 and done >= done_at_least:
            return True
        if done > last_done:
            last_done, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > STALL_S:
            return False
        time.sleep(0.5)
