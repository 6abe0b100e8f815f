"""The data of ``rayfleet top``: scrapes of the running fleet, and what changed between two.

Two sources, both the gateway's, no endpoint of its own::

    scrape(state) -> Scrape(at_s, status, samples)
        GET /rayfleet/status   replicas (model, state, pid, in flight) and ``scaling``
                               (per model: target, window, replica states)
        GET /metrics           parsed with prometheus_client's own text parser
    build_frame(before, after) -> Frame: one ModelView per model, one Row per replica

A Row measures one label match ({model} for a model, {model, replica} for a replica), so
the two levels are computed by the same code:

    in flight        the gateway's count (status), summed over a model's replicas
    requests, req/s  rayfleet_requests_total: its value, and its increase / interval
    tokens/s         rayfleet_replica_generation_tokens_total increase / interval
    TTFT p50, p99    rayfleet_time_to_first_byte_seconds: quantiles of the buckets'
                     increase, so only the interval's requests count; interpolated
                     inside a bucket as Prometheus' histogram_quantile does
    run, wait        rayfleet_replica_requests_{running,waiting} (vLLM's, republished)
    KV, hit          rayfleet_replica_kv_cache_usage, _prefix_cache_hit_rate (a model:
                     the mean of its replicas)

A value the scrapes cannot give (no earlier scrape, a series the gateway does not
publish, no request in the interval) is None, shown as "-".
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from rayfleet.errors import RayfleetError

if TYPE_CHECKING:
    from rayfleet.control.state import RunState

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]  # sample name -> its series' values

REQUESTS = "rayfleet_requests_total"
TTFT = "rayfleet_time_to_first_byte_seconds"
RUNNING = "rayfleet_replica_requests_running"
WAITING = "rayfleet_replica_requests_waiting"
KV_USAGE = "rayfleet_replica_kv_cache_usage"
HIT_RATE = "rayfleet_replica_prefix_cache_hit_rate"
TOKENS = "rayfleet_replica_generation_tokens_total"
FALLBACK_PREFIX = "fallback:"  # the replica label of a request a provider answered
METRICS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Scrape:
    at_s: float  # monotonic time of the scrape
    status: dict[str, Any]
    samples: Samples


@dataclass(frozen=True)
class Row:
    """One line of the view: a model's totals or one replica's."""

    name: str
    state: str
    pid: int | None = None
    inflight: float | None = None
    requests: float | None = None  # answered since the gateway started
    req_s: float | None = None
    tokens_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    hit_rate: float | None = None


@dataclass(frozen=True)
class ModelView:
    row: Row
    target: int | None = None
    window: str | None = None
    replicas: list[Row] = field(default_factory=list)


@dataclass(frozen=True)
class Frame:
    gateway_url: str
    phase: str
    interval_s: float | None  # None: the first scrape, no rates yet
    models: list[ModelView]


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus exposition, by sample name and label set."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def scrape(state: RunState, timeout_s: float = METRICS_TIMEOUT_S) -> Scrape:
    """The running fleet's status and metrics now; a RayfleetError when it does not answer."""
    from rayfleet.control.lifecycle import fetch_status

    status = fetch_status(state)
    try:
        with urllib.request.urlopen(state.gateway_url + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise RayfleetError(
            f"the fleet's gateway at {state.gateway_url} does not serve /metrics ({exc}); "
            f"see logs in {state.log_dir}"
        ) from None
    return Scrape(time.monotonic(), status, parse_metrics(text))


def _matching(
    samples: Samples, name: str, match: Mapping[str, str]
) -> Iterable[tuple[dict[str, str], float]]:
    for labels, value in samples.get(name, {}).items():
        as_dict = dict(labels)
        if all(as_dict.get(k) == v for k, v in match.items()):
            yield as_dict, value


def gauge_sum(samples: Samples, name: str, match: Mapping[str, str]) -> float | None:
    values = [v for _, v in _matching(samples, name, match)]
    return sum(values) if values else None


def gauge_mean(samples: Samples, name: str, match: Mapping[str, str]) -> float | None:
    values = [v for _, v in _matching(samples, name, match)]
    return sum(values) / len(values) if values else None


def increase(before: Samples, after: Samples, name: str, match: Mapping[str, str]) -> float | None:
    """How much the matching counters grew between two scrapes; None when none exists.

    A series new since ``before`` grew from 0 (prometheus_client creates a series at its
    first use); one that went down was reset, so all of its value is new."""
    found = False
    total = 0.0
    earlier = before.get(name, {})
    for labels, value in after.get(name, {}).items():
        if all(dict(labels).get(k) == v for k, v in match.items()):
            found = True
            previous = earlier.get(labels, 0.0)
            total += value - previous if value >= previous else value
    return total if found else None


def bucket_increase(
    before: Samples, after: Samples, histogram: str, match: Mapping[str, str]
) -> list[tuple[float, float]]:
    """A histogram's cumulative bucket counts gained between two scrapes, summed over
    the matching series: ``[(upper bound, count), ...]`` by bound, +Inf last."""
    bounds = {
        labels["le"]
        for labels, _ in _matching(after, histogram + "_bucket", match)
        if "le" in labels
    }
    gained = []
    for le in bounds:
        grown = increase(before, after, histogram + "_bucket", {**match, "le": le})
        gained.append((float(le), grown or 0.0))
    return sorted(gained)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets``, as Prometheus' histogram_quantile
    computes it: linear inside the bucket the rank falls in, the lowest bucket starting
    at 0, a rank in the +Inf bucket answered with the highest finite bound. None when
    the buckets hold nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def measure(before: Scrape | None, after: Scrape, match: Mapping[str, str]) -> dict[str, Any]:
    """The metrics columns of a Row for the series matching ``match``."""
    samples = after.samples
    columns: dict[str, Any] = {
        "requests": gauge_sum(samples, REQUESTS, match),
        "running": gauge_sum(samples, RUNNING, match),
        "waiting": gauge_sum(samples, WAITING, match),
        "kv_usage": gauge_mean(samples, KV_USAGE, match),
        "hit_rate": gauge_mean(samples, HIT_RATE, match),
    }
    interval_s = after.at_s - before.at_s if before is not None else 0.0
    if before is None or interval_s <= 0:
        return columns
    for column, counter in (("req_s", REQUESTS), ("tokens_s", TOKENS)):
        grown = increase(before.samples, samples, counter, match)
        columns[column] = None if grown is None else grown / interval_s
    buckets = bucket_increase(before.samples, samples, TTFT, match)
    columns["ttft_p50_s"] = quantile(0.5, buckets)
    columns["ttft_p99_s"] = quantile(0.99, buckets)
    return columns


def replica_state(replica: Mapping[str, Any]) -> str:
    if replica.get("draining"):
        return "draining"
    return "serving" if replica.get("healthy") else "cooling down"


def model_state(states: Mapping[str, int]) -> str:
    """'2 serving, 1 starting': the scaler's replica counts that are not zero."""
    shown = [f"{n} {state.replace('_', ' ')}" for state, n in states.items() if n]
    return ", ".join(shown) or "no replica"


def _replica_rows(before: Scrape | None, after: Scrape, model: str, starting: int) -> list[Row]:
    rows = []
    for replica in after.status.get("replicas", []):
        if replica.get("model") != model:
            continue
        rid = replica["replica_id"]
        rows.append(
            Row(
                name=rid,
                state=replica_state(replica),
                pid=replica.get("pid"),
                inflight=replica.get("inflight"),
                **measure(before, after, {"model": model, "replica": rid}),
            )
        )
    providers = {
        labels["replica"]
        for labels, _ in _matching(after.samples, REQUESTS, {"model": model})
        if labels.get("replica", "").startswith(FALLBACK_PREFIX)
    }
    for label in sorted(providers):
        match = {"model": model, "replica": label}
        rows.append(Row(name=label, state="fallback", **measure(before, after, match)))
    rows.extend(Row(name="-", state="starting") for _ in range(starting))
    return rows


def build_frame(before: Scrape | None, after: Scrape) -> Frame:
    """The view of ``after``, with rates over the time since ``before``."""
    status = after.status
    scaling: dict[str, Any] = status.get("scaling", {})
    names = list(dict.fromkeys([*status.get("models", {}), *scaling]))
    views = []
    for name in names:
        scaled = scaling.get(name, {})
        states = scaled.get("states") or _count_states(status, name)
        replicas = _replica_rows(before, after, name, states.get("starting", 0))
        inflight = [r.inflight for r in replicas if r.inflight is not None]
        row = Row(
            name=name,
            state=model_state(states),
            inflight=sum(inflight) if inflight else None,
            **measure(before, after, {"model": name}),
        )
        views.append(ModelView(row, scaled.get("target"), scaled.get("window"), replicas))
    interval_s = None if before is None else after.at_s - before.at_s
    return Frame(status.get("gateway_url", ""), status.get("phase", "?"), interval_s, views)


def _count_states(status: Mapping[str, Any], model: str) -> dict[str, int]:
    """Replica states from the replicas alone, for a fleet whose report has no scaling."""
    counts = {"serving": 0, "draining": 0, "cooling_down": 0}
    for replica in status.get("replicas", []):
        if replica.get("model") == model:
            counts[replica_state(replica).replace(" ", "_")] += 1
    return counts
