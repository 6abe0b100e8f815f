"""The data of ``rayfleet top``: scrapes of the running fleet, and what changed between two.

Two sources, both the gateway's, no endpoint of its own::

    scrape(state) -> Scrape(at_s, status, samples)
        GET /rayfleet/status   replicas (model, state, pid, in flight) and ``scaling``
                               (per model: target, window, replica states)
        GET /metrics           parsed with prometheus_client's own text parser
    Scrapes(window_s).add(scrape) -> Frame: the scrapes of the last window_s seconds;
    build_frame(scrapes) -> Frame    one ModelView per model, one Row per replica; the
                                     last two scrapes are "before" and "after"

A Row measures one label match ({model} for a model, {model, replica} for a replica), so
the two levels are computed by the same code:

    in flight        the gateway's count (status), summed over a model's replicas
    requests, req/s  rayfleet_requests_total: its value, and its increase / interval
    tokens/s         rayfleet_replica_generation_tokens_total: the gateway reads it from
                     vLLM every few seconds, so it moves in steps; its rate is taken
                     between the first and the last step seen in the window (step_rate)
    TTFT p50, p99    rayfleet_time_to_first_byte_seconds: quantiles of the buckets'
                     increase, so only the interval's requests count; interpolated
                     inside a bucket as Prometheus' histogram_quantile does
    run, wait        rayfleet_replica_requests_{running,waiting} (vLLM's, republished)
    KV, hit          rayfleet_replica_kv_cache_usage, _prefix_cache_hit_rate (a model:
                     the mean of its replicas)

The arithmetic on expositions (counters' increase, bucket quantiles, step rates) is in
control/top_metrics.py; the rendering in control/top_view.py.

A value the scrapes cannot give (no earlier scrape, a series the gateway does not
publish, no request in the interval) is None, shown as "-".
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayfleet.control.top_metrics import (
    Samples,
    bucket_increase,
    gauge_mean,
    gauge_sum,
    increase,
    matching,
    parse_metrics,
    quantile,
    step_rate,
)
from rayfleet.errors import RayfleetError

if TYPE_CHECKING:
    from rayfleet.control.state import RunState

REQUESTS = "rayfleet_requests_total"
TTFT = "rayfleet_time_to_first_byte_seconds"
RUNNING = "rayfleet_replica_requests_running"
WAITING = "rayfleet_replica_requests_waiting"
KV_USAGE = "rayfleet_replica_kv_cache_usage"
HIT_RATE = "rayfleet_replica_prefix_cache_hit_rate"
TOKENS = "rayfleet_replica_generation_tokens_total"
FALLBACK_PREFIX = "fallback:"  # the replica label of a request a provider answered
METRICS_TIMEOUT_S = 5.0
# The gateway reads each replica's vLLM metrics every 5 s (gateway/replica_gauges.py), so
# its tokens counter moves in 5 s steps: over a 2 s interval the plain rate reads 0 or
# 2.5x the truth. Between the first and last of the 3-4 steps of a 20 s window, scraped
# every 2 s, it reads within 8% (tests/unit/test_top.py); the cost: it takes the window
# to fall to 0 after the load stops.
STEP_WINDOW_S = 20.0


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


def measure(scrapes: Sequence[Scrape], match: Mapping[str, str]) -> dict[str, Any]:
    """The metrics columns of a Row for the series matching ``match``; rates over the
    last two of ``scrapes`` (oldest first), tokens/s over all of them."""
    after = scrapes[-1]
    before = scrapes[-2] if len(scrapes) > 1 else None
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
    grown = increase(before.samples, samples, REQUESTS, match)
    columns["req_s"] = None if grown is None else grown / interval_s
    columns["tokens_s"] = step_rate([(s.at_s, s.samples) for s in scrapes], TOKENS, match)
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


def _replica_rows(scrapes: Sequence[Scrape], model: str, starting: int) -> list[Row]:
    after = scrapes[-1]
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
                **measure(scrapes, {"model": model, "replica": rid}),
            )
        )
    providers = {
        labels["replica"]
        for labels, _ in matching(after.samples, REQUESTS, {"model": model})
        if labels.get("replica", "").startswith(FALLBACK_PREFIX)
    }
    for label in sorted(providers):
        match = {"model": model, "replica": label}
        rows.append(Row(name=label, state="fallback", **measure(scrapes, match)))
    rows.extend(Row(name="-", state="starting") for _ in range(starting))
    return rows


def build_frame(scrapes: Sequence[Scrape]) -> Frame:
    """The view of the last of ``scrapes`` (oldest first), with rates over the time since
    the one before it (none with one scrape) and tokens/s over all of them."""
    after = scrapes[-1]
    status = after.status
    scaling: dict[str, Any] = status.get("scaling", {})
    names = list(dict.fromkeys([*status.get("models", {}), *scaling]))
    views = []
    for name in names:
        scaled = scaling.get(name, {})
        states = scaled.get("states") or _count_states(status, name)
        replicas = _replica_rows(scrapes, name, states.get("starting", 0))
        inflight = [r.inflight for r in replicas if r.inflight is not None]
        row = Row(
            name=name,
            state=model_state(states),
            inflight=sum(inflight) if inflight else None,
            **measure(scrapes, {"model": name}),
        )
        views.append(ModelView(row, scaled.get("target"), scaled.get("window"), replicas))
    interval_s = after.at_s - scrapes[-2].at_s if len(scrapes) > 1 else None
    return Frame(status.get("gateway_url", ""), status.get("phase", "?"), interval_s, views)


def _count_states(status: Mapping[str, Any], model: str) -> dict[str, int]:
    """Replica states from the replicas alone, for a fleet whose report has no scaling."""
    counts = {"serving": 0, "draining": 0, "cooling_down": 0}
    for replica in status.get("replicas", []):
        if replica.get("model") == model:
            counts[replica_state(replica).replace(" ", "_")] += 1
    return counts


class Scrapes:
    """The scrapes of the last ``window_s`` seconds (the latest two at least), oldest
    first, and the frame of the latest."""

    def __init__(self, window_s: float = STEP_WINDOW_S):
        self.window_s = window_s
        self.history: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> Frame:
        self.history.append(scrape)
        while len(self.history) > 2 and self.history[0].at_s < scrape.at_s - self.window_s:
            self.history.popleft()
        return build_frame(self.history)
