"""Every metric name the dashboard and the alert rules read, against a live fleet: the
gateway's /metrics and the vLLM replica's own, after a few requests. The DCGM exporter's
names (GPU nodes only, rayfleet.k8s.monitoring.DCGM_METRICS) are the one exception.

Also, end to end: the gateway republishes the replica's vLLM counters as vLLM reports
them, under the same replica label as its own series, and writes one access log line per
request with the request id it returned.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.k8s.monitoring import DCGM_METRICS, alert_rules, dashboard, expressions, metric_names
from tests.integration.fleet import RunningFleet, demo_and_tiny, wait_until

pytestmark = pytest.mark.integration

SHARED_FLEET = "demo-and-tiny"  # test_fleet_api.py's fleet: counters are read as differences
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
REPUBLISH_TIMEOUT_S = 60  # the gateway reads each replica every 5 s


@pytest.fixture(scope="module")
def fleet_models(tiny_model, demo_model) -> list[dict[str, Any]]:
    return demo_and_tiny(tiny_model, demo_model)


def scrape(url: str) -> tuple[set[str], set[str], dict[tuple[str, frozenset[Any]], float]]:
    """(names declared, names with samples, {(sample name, labels): value}) of /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    declared: set[str] = set()
    values: dict[tuple[str, frozenset[Any]], float] = {}
    for family in text_string_to_metric_families(text):
        declared |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return declared | {name for name, _ in values}, {name for name, _ in values}, values


def value(values: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and wanted <= ls)


def send_requests(fleet: RunningFleet) -> list[str]:
    """A few requests, whole and streamed; the request ids the gateway returned."""
    client = fleet.client()
    ids = []
    for i in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"count to {i}"}],
            max_tokens=16,
        )
        ids.append(raw.headers["x-request-id"])
    raw_stream = client.completions.with_raw_response.create(
        model="tiny",
        prompt="a stream",
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": "stream-1"},
    )
    assert raw_stream.headers["x-request-id"] == "stream-1"
    assert list(raw_stream.parse())[-1].usage.completion_tokens > 0
    return [*ids, "stream-1"]


def test_every_name_in_the_dashboard_and_the_rules_is_exported(fleet):
    [replica] = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
    labels = {"model": "tiny", "replica": replica["replica_id"]}
    before = scrape(fleet.url)[2]
    ids = send_requests(fleet)
    used: set[str] = set()
    for expr in expressions(alert_rules(), dashboard()):
        used |= metric_names(expr)
    gpu_only = {name for name in used if name.startswith("DCGM_")}
    assert gpu_only <= set(DCGM_METRICS)

    tokens_before = value(before, "rayfleet_replica_generation_tokens_total", **labels)

    def republished() -> tuple[set[str], set[str], dict[Any, float]] | None:
        scraped = scrape(fleet.url)
        tokens = value(scraped[2], "rayfleet_replica_generation_tokens_total", **labels)
        return scraped if tokens > tokens_before else None

    gateway = wait_until(republished, REPUBLISH_TIMEOUT_S, 1.0)
    assert gateway is not None, "the gateway never republished the replica's gauges"
    engine = scrape(replica["url"])
    exported = gateway[0] | engine[0]
    assert used - gpu_only - exported == set()
    # Series that must have samples by now, not just be declared.
    must_show = {n for n in used if n.startswith(("rayfleet_replica", "vllm:"))} | {
        "rayfleet_requests_total",
        "rayfleet_time_to_first_byte_seconds_bucket",
        "rayfleet_request_duration_seconds_bucket",
        "rayfleet_replicas",
        "rayfleet_target_replicas",
    }
    assert must_show - gateway[1] - engine[1] == set()

    values = gateway[2]
    assert value(values, "rayfleet_replica_up", **labels) == 1.0
    answered = value(values, "rayfleet_requests_total", status="200", **labels)
    assert answered - value(before, "rayfleet_requests_total", status="200", **labels) == len(ids)
    assert 0.0 <= value(values, "rayfleet_replica_kv_cache_usage", **labels) <= 1.0
    assert 0.0 <= value(values, "rayfleet_replica_prefix_cache_hit_rate", **labels) <= 1.0
    assert_counters_match_vllm(fleet, replica)
    assert_access_log(fleet, ids, replica["replica_id"])


def assert_counters_match_vllm(fleet: RunningFleet, replica: dict[str, Any]) -> None:
    """The republished counters equal vLLM's own once both are read after the load."""

    def same() -> tuple[float, float] | None:
        engine = scrape(replica["url"])[2]
        gateway = scrape(fleet.url)[2]
        mine = {"replica": replica["replica_id"]}
        ours = value(gateway, "rayfleet_replica_generation_tokens_total", **mine)
        theirs = value(engine, "vllm:generation_tokens_total")
        return (ours, theirs) if ours == theirs else None

    assert wait_until(same, REPUBLISH_TIMEOUT_S, 1.0), "republished tokens never matched vLLM's"


def assert_access_log(fleet: RunningFleet, ids: list[str], replica_id: str) -> None:
    path = Path(fleet.state()["log_dir"]) / "access.log"

    def logged() -> dict[str, dict[str, Any]] | None:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        by_id = {line["request_id"]: line for line in lines}
        return by_id if set(ids) <= by_id.keys() else None

    by_id = wait_until(logged, 30)
    assert by_id is not None, f"no access log lines for {ids} in {path}"
    for request_id in ids:
        line = by_id[request_id]
        assert (line["model"], line["replica"], line["status"]) == ("tiny", replica_id, 200)
        assert line["completion_tokens"] > 0 and line["prompt_tokens"] > 0
        assert 0 < line["ttft_s"] <= line["duration_s"]
