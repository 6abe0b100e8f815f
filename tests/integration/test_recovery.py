"""Unplanned losses under load: a replica's vLLM server killed, then a replica actor
killed. Requests not yet answered are retried on the other replica (no non-streamed
request fails), a stream already started on the lost replica ends with an error at
most, and capacity comes back by itself."""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil
import pytest

from tests.integration.fleet import RunningFleet, model_entry, wait_until
from tests.integration.load import StreamLoad

pytestmark = pytest.mark.integration

RECOVERY_TIMEOUT_S = 600
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
    # Only streams in flight on the lost replica may end early.
    assert len(load.stream_failures) + load.unfinished <= NUM_STREAMS
