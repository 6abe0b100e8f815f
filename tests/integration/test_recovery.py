"""Unplanned losses under load: a replica's vLLM server killed, then a replica actor
killed. Requests not yet answered are retried on the other replica (no non-streamed
request fails), a stream already started on the lost replica ends with an error at
most, capacity comes back by itself, and nothing of the lost server is left running (a
replica actor killed takes its server with it, not the server's engine core and worker)."""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil
import pytest

from tests.integration.fleet import RunningFleet, model_entry, wait_until
from tests.integration.load import StreamLoad
from tests.integration.processes import describe, running

pytestmark = pytest.mark.integration

RECOVERY_TIMEOUT_S = 600
LEFTOVER_TIMEOUT_S = 60  # a replica's health check stops them, every few seconds
NUM_STREAMS = 4


@pytest.fixture(scope="module")
def fleet_models(tiny_model) -> list[dict[str, Any]]:
    return [model_entry("tiny", tiny_model, replicas=2)]


def serving(fleet: RunningFleet) -> list[dict[str, Any]] | None:
    now = fleet.status()["replicas"]
    ok = [r for r in now if r["healthy"] and not r["draining"]]
    return now if len(now) == len(ok) == 2 else None


def replaced(fleet: RunningFleet, gone_pid: int) -> list[dict[str, Any]] | None:
    now = serving(fleet)
    return now if now and gone_pid not in {r["pid"] for r in now} else None


@pytest.mark.parametrize("what", ["vllm server", "replica actor"])
def test_a_lost_replica_costs_no_unanswered_request(fleet, what):
    before = wait_until(lambda: serving(fleet), RECOVERY_TIMEOUT_S, poll_s=1.0)
    assert before is not None
    victim = before[0]["pid"]
    with StreamLoad(fleet.client(), "tiny", num_streams=NUM_STREAMS, max_tokens=96) as load:
        wait_until(lambda: load.completed >= 4, 120)
        pid = victim if what == "vllm server" else psutil.Process(victim).parent().pid
        os.kill(pid, signal.SIGKILL)
        after = wait_until(lambda: replaced(fleet, victim), RECOVERY_TIMEOUT_S, poll_s=1.0)
        assert after is not None, f"the {what}'s replica was not replaced"
        done = load.completed
        wait_until(lambda: load.completed >= done + 4, 120)  # served again after recovery
    assert load.plain_failures == [], load.plain_failures
    left = wait_until(lambda: not group(victim), LEFTOVER_TIMEOUT_S)
    assert left, f"the lost server's group still runs: {describe(group(victim))}"
    # Only streams in flight on the lost replica may end early.
    assert len(load.stream_failures) + load.unfinished <= NUM_STREAMS


def group(pgid: int) -> list[psutil.Process]:
    """The running processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and running(proc):
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members
