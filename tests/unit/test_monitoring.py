"""The alert rules and the Grafana dashboard: their shape, and that every metric name
they read is one the gateway exports (its real registry), one vLLM exports (a real
/metrics text, tests/unit/data/vllm_metrics.txt) or a documented DCGM exporter name.

No promtool here: expressions are read by ``metric_names`` (balanced brackets, known
functions). tests/integration/test_metrics_names.py checks the same names against a
live fleet's scrapes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.config import parse_fleet
from rayfleet.control.scaling import Clock, FleetScaler
from rayfleet.gateway.app import Gateway
from rayfleet.k8s.monitoring import (
    DCGM_METRICS,
    ExpressionError,
    alert_rules,
    dashboard,
    expressions,
    metric_names,
)

VLLM_METRICS = (Path(__file__).parent / "data" / "vllm_metrics.txt").read_text()
DURATION = re.compile(r"\d+[smhdwy]")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def gateway_names(tmp_path) -> set[str]:
    """Every sample name the fleet's gateway can show: its registry, with the scaler's."""
    config = parse_fleet({"models": [{"name": "m", "source": "/models/m", "replicas": 1}]})
    gateway = Gateway(["m"])
    clock_file = tmp_path / "now.txt"
    clock_file.write_text("2026-01-05T00:30:00+00:00")

    async def set_target(model: str, count: int) -> None:
        pass

    FleetScaler(config, gateway, set_target, Clock(path=clock_file))
    names = set()
    for family in gateway.metrics.registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    assert gateway.replica_gauges is not None
    for family in gateway.replica_gauges.describe():
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def vllm_names() -> set[str]:
    return {s.name for f in text_string_to_metric_families(VLLM_METRICS) for s in f.samples}


def test_rules_have_the_prometheus_rule_shape():
    rules = alert_rules()
    names = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    assert len(names) == len(set(names))
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert rule.keys() == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert DURATION.fullmatch(rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            assert rule["annotations"].keys() == {"summary", "description"}
            assert rule["alert"].startswith("Rayfleet")


def test_rules_cover_what_the_issue_asks():
    by_name = {r["alert"]: r["expr"] for g in alert_rules()["groups"] for r in g["rules"]}
    assert "rayfleet_replica_up == 0" in by_name["RayfleetReplicaDown"]
    assert "rayfleet_requests_total" in by_name["RayfleetHighErrorRatio"]
    assert "rayfleet_time_to_first_byte_seconds_bucket" in by_name["RayfleetTTFTHigh"]
    assert "rayfleet_replica_requests_waiting" in by_name["RayfleetQueueBacklog"]
    assert "rayfleet_replica_kv_cache_usage > 0.95" in by_name["RayfleetKVCacheFull"]
    assert "rayfleet_fallback_requests_total" in by_name["RayfleetFallbackShareHigh"]
    # The 85-95% band the seed recommends, on DCGM's utilization in percent.
    assert by_name["RayfleetGPUUtilizationHigh"].endswith("DCGM_FI_DEV_GPU_UTIL[15m])) > 95")
    assert by_name["RayfleetGPUUtilizationLow"].endswith("DCGM_FI_DEV_GPU_UTIL[15m])) < 85")


def test_every_metric_name_is_exported_or_documented(tmp_path):
    known = gateway_names(tmp_path) | vllm_names() | set(DCGM_METRICS)
    used: set[str] = set()
    for expr in expressions(alert_rules(), dashboard()):
        used |= metric_names(expr)
    assert used - known == set()
    # what the dashboard must show, by the names that carry it
    for name in (
        "rayfleet_requests_total",
        "rayfleet_request_errors_total",
        "rayfleet_time_to_first_byte_seconds_bucket",
        "rayfleet_request_duration_seconds_bucket",
        "rayfleet_replica_requests_running",
        "rayfleet_replica_requests_waiting",
        "rayfleet_replica_kv_cache_usage",
        "rayfleet_replica_prefix_cache_hit_rate",
        "rayfleet_replica_generation_tokens_total",
        "rayfleet_replicas",
        "rayfleet_target_replicas",
        "rayfleet_fallback_requests_total",
        "vllm:time_to_first_token_seconds_bucket",
        "DCGM_FI_DEV_GPU_UTIL",
    ):
        assert name in used, name


def test_dashboard_has_a_datasource_variable_and_model_and_replica_filters():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"model", "replica"} <= variables.keys()
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    quota = next(p for p in panels if p["title"] == "Quota refusals")
    assert 'reason=~"rate_limited_.*"' in quota["targets"][0]["expr"]


def test_metric_names_reads_promql():
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(x_bucket{model=~"$model"}[5m])))'
        " / on (model) group_left sum without (replica) (y_total offset 5m) > bool 2"
    )
    assert metric_names(expr) == {"x_bucket", "y_total"}
    assert metric_names('sum(rate(a{l="}"}[1m])) by (l)') == {"a"}
    assert metric_names("vllm:num_requests_running and DCGM_FI_DEV_GPU_UTIL") == {
        "vllm:num_requests_running",
        "DCGM_FI_DEV_GPU_UTIL",
    }


@pytest.mark.parametrize(
    "expr",
    ["sum(rate(x[5m])", "sum(rate(x[5m)))", 'x{a="b}', "summ(x)", "rate(x[5m]))"],
)
def test_metric_names_refuses_what_promql_would(expr):
    with pytest.raises(ExpressionError):
        metric_names(expr)
