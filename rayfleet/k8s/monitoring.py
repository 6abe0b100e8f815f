"""The fleet's Prometheus alert rules and Grafana dashboard, shipped as package data.

    alert_rules() -> {"groups": [...]}     monitoring/alerts.yaml: the ``spec`` of a
                                           PrometheusRule, or a Prometheus rule file as is
    dashboard() -> {...}                   monitoring/grafana-dashboard.json: one Grafana
                                           dashboard, datasource, model and replica variables
    expressions(rules, board) -> [expr]    every PromQL expression of both
    metric_names(expr) -> {name}           the metric names one expression reads

Every ``rayfleet_*`` name they use is on the gateway's ``/metrics`` (one scrape target
tells the whole story: gateway/replica_gauges.py republishes each replica's vLLM gauges
there); the ``vllm:*`` names are on each replica's own ``/metrics``, for a Prometheus that
can reach the replicas; the GPU names are NVIDIA's DCGM exporter's (``DCGM_METRICS``),
present only on GPU nodes that run it. tests/integration/test_metrics_names.py checks the
first two kinds against a live fleet.

``metric_names`` is a small reading of PromQL, enough for the expressions here: label
matchers, range and subquery brackets, strings, numbers, keywords and the label lists of
``by``/``on``/``without``/``ignoring``/``group_left``/``group_right`` are skipped, and a
name followed by ``(`` is a function (``FUNCTIONS`` lists those allowed).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import yaml

# dcgm-exporter's default counters (etc/default-counters.csv) that the rules and the
# dashboard read; labels gpu, UUID, device, modelName, Hostname (pod, namespace, container
# when the exporter maps GPUs to Kubernetes pods).
DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization, percent (0-100)",
    "DCGM_FI_DEV_FB_USED": "GPU framebuffer memory used, MiB",
}

FUNCTIONS = frozenset(
    {
        "abs", "absent", "avg", "avg_over_time", "ceil", "clamp", "clamp_max", "clamp_min",
        "count", "count_over_time", "delta", "deriv", "floor", "histogram_quantile",
        "idelta", "increase", "irate", "label_replace", "max", "max_over_time", "min",
        "min_over_time", "quantile", "quantile_over_time", "rate", "round", "scalar",
        "sort", "sort_desc", "sum", "sum_over_time", "time", "topk", "bottomk", "vector",
    }
)  # fmt: skip
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_TOKEN = re.compile(
    _STRING
    + rf"|\{{(?:{_STRING}|[^}}\"'])*\}}"  # label matchers, strings in them included
    + r"|\[[^\]]*\]"  # ranges and subqueries
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?:\d+(?:ms|[smhdwy]))+\b"  # durations (offset 5m)
    r"|\d+(?:\.\d+)?(?:e[+-]?\d+)?"
    r"|\S"
)
_OPEN = {"(": ")", "[": "]", "{": "}"}


class ExpressionError(ValueError):
    """An expression that is not well formed, or calls an unknown function."""


def alert_rules() -> dict[str, Any]:
    """The alerting rules: ``{"groups": [{"name", "rules": [...]}, ...]}``."""
    text = _data("alerts.yaml")
    rules: dict[str, Any] = yaml.safe_load(text)
    return rules


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard JSON (``uid`` rayfleet; datasource is a variable)."""
    board: dict[str, Any] = json.loads(_data("grafana-dashboard.json"))
    return board


def expressions(rules: dict[str, Any], board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the alert rules and of the dashboard's panels."""
    found = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    for panel in _panels(board["panels"]):
        found += [target["expr"] for target in panel.get("targets", [])]
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads; ExpressionError when its brackets do not balance
    or it calls a function outside ``FUNCTIONS``."""
    _check_brackets(expr)
    names: set[str] = set()
    tokens = list(_TOKEN.finditer(expr))
    skip_list = False
    for i, token in enumerate(tokens):
        name = token.group("name")
        following = tokens[i + 1].group() if i + 1 < len(tokens) else ""
        if skip_list:
            skip_list = token.group() != ")"
            continue
        if name is None or name in _KEYWORDS:
            continue
        if name in _LABEL_LIST_KEYWORDS:
            skip_list = following == "("
            continue
        if name in FUNCTIONS and following in _LABEL_LIST_KEYWORDS:
            continue  # an aggregation with its grouping first: sum by (model) (...)
        if following == "(":
            if name not in FUNCTIONS:
                raise ExpressionError(f"unknown function {name}() in: {expr}")
            continue
        names.add(name)
    return names


def _check_brackets(expr: str) -> None:
    stack: list[str] = []
    in_string = ""
    for char in expr:
        if in_string:
            in_string = "" if char == in_string else in_string
        elif char in "\"'":
            in_string = char
        elif char in _OPEN:
            stack.append(_OPEN[char])
        elif char in ")]}" and (not stack or stack.pop() != char):
            raise ExpressionError(f"unbalanced {char!r} in: {expr}")
    if stack or in_string:
        raise ExpressionError(f"unclosed {''.join(stack) or in_string!r} in: {expr}")


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Panels with those nested in collapsed rows."""
    flat: list[dict[str, Any]] = []
    for panel in panels:
        flat.append(panel)
        flat += _panels(panel.get("panels", []))
    return flat


def _data(name: str) -> str:
    return resources.files("rayfleet.k8s").joinpath("monitoring", name).read_text()
