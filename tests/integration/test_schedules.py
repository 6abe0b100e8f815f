"""A schedule window opening on a running fleet, with the fleet's clock moved by a file
(RAYFLEET_SCHEDULE_CLOCK=@file): a two-replica model is capped at one while the window
is open, the extra replica drains without cutting a stream, overflow goes to a stand-in
provider (a simulated engine, rayfleet.sim: OpenAI-compatible, streams end as vLLM's
do), and the second
replica comes back when the window closes. No client sees an error."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rayfleet.control.scaling import CLOCK_ENV
from rayfleet.sim.fleet import SimFleet
from tests.integration.fleet import RunningFleet, model_entry, running_fleet, wait_until
from tests.integration.load import StreamLoad

pytestmark = pytest.mark.integration

SCALE_TIMEOUT_S = 600
BEFORE, DURING, AFTER = (
    "2026-01-05T00:59:00+00:00",  # a Monday, a minute before the window
    "2026-01-05T01:00:30+00:00",
    "2026-01-05T02:00:30+00:00",
)
NIGHT = {"name": "night", "timezone": "UTC", "start": "01:00", "end": "02:00"}


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    with SimFleet() as sim:
        yield sim.urls[0]


@pytest.fixture(scope="module")
def night_fleet(tiny_model, provider, tmp_path_factory) -> Iterator[tuple[RunningFleet, Any]]:
    home = tmp_path_factory.mktemp("schedules")
    clock = home / "now.txt"
    clock.write_text(BEFORE)
    model = model_entry(
        "tiny", tiny_model, replicas=2, schedules=[{**NIGHT, "min_replicas": 0, "max_replicas": 1}]
    )
    gateway = {
        "fallback": {
            "providers": [{"name": "backup", "base_url": provider + "/v1", "default_model": "sim"}],
            "max_queue_depth": 2,
        }
    }
    os.environ[CLOCK_ENV] = f"@{clock}"
    try:
        with running_fleet(home, [model], gateway=gateway) as fleet:
            yield fleet, clock
    finally:
        del os.environ[CLOCK_ENV]


def serving(fleet: RunningFleet, count: int) -> list[dict[str, Any]] | None:
    now = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
    ok = [r for r in now if r["healthy"] and not r["draining"]]
    return now if len(now) == len(ok) == count else None


def fallback_count(fleet: RunningFleet) -> float:
    with urllib.request.urlopen(fleet.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rayfleet_fallback_requests_total{") and 'reason="queue_depth"' in line
    )


def test_a_window_caps_the_model_and_overflow_goes_to_the_provider(night_fleet):
    fleet, clock = night_fleet
    two = wait_until(lambda: serving(fleet, 2), SCALE_TIMEOUT_S, poll_s=1.0)
    assert two is not None
    with StreamLoad(fleet.client(), "tiny", num_streams=4, max_tokens=128) as load:
        wait_until(lambda: load.completed >= 4, 120)
        clock.write_text(DURING)
        one = wait_until(lambda: serving(fleet, 1), SCALE_TIMEOUT_S, poll_s=1.0)
        assert one is not None and one[0]["pid"] in {r["pid"] for r in two}
        assert fleet.status()["scaling"]["tiny"]["window"] == "night"
        assert wait_until(lambda: fallback_count(fleet) > 0, 120), "no overflow reached backup"
        clock.write_text(AFTER)
        back = wait_until(lambda: serving(fleet, 2), SCALE_TIMEOUT_S, poll_s=1.0)
        assert back is not None
    assert load.failures == [] and load.unfinished == 0
    assert fleet.status()["scaling"]["tiny"]["window"] is None
