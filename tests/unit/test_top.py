"""`rayfleet top` without a fleet: rates, quantiles and the merge of status and metrics on
exposition text the gateway's own metrics class writes, and the table a fixed-width
console shows (the terminal and the command: test_top_terminal.py)."""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from rich.console import Console

from rayfleet.control import top
from rayfleet.control.top import Scrape, Scrapes, build_frame
from rayfleet.control.top_metrics import (
    bucket_increase,
    increase,
    parse_metrics,
    quantile,
    step_rate,
)
from rayfleet.control.top_view import render
from rayfleet.gateway.metrics import GatewayMetrics


class FleetMetrics:
    """The gateway's metrics, plus the per-replica vLLM series it republishes."""

    def __init__(self) -> None:
        self.gateway = GatewayMetrics()
        self.replicas = CollectorRegistry()
        labels = ["model", "replica"]
        self.running = Gauge(top.RUNNING, "r", labels, registry=self.replicas)
        self.waiting = Gauge(top.WAITING, "w", labels, registry=self.replicas)
        self.kv = Gauge(top.KV_USAGE, "kv", labels, registry=self.replicas)
        self.hit = Gauge(top.HIT_RATE, "hit", labels, registry=self.replicas)
        self.tokens = Counter(top.TOKENS, "tokens", labels, registry=self.replicas)

    def answer(self, model: str, replica: str, ttfb_s: float, num: int = 1) -> None:
        for _ in range(num):
            self.gateway.requests.labels(model, replica, "200").inc()
            self.gateway.ttfb.labels(model, replica).observe(ttfb_s)

    def text(self) -> str:
        return (self.gateway.render() + generate_latest(self.replicas)).decode()


def replica(rid: str, model: str, **fields: Any) -> dict[str, Any]:
    return {
        "replica_id": rid,
        "model": model,
        "url": f"http://127.0.0.1:1/{rid}",
        "pid": 4242,
        "healthy": True,
        "draining": False,
        "inflight": 0,
        **fields,
    }


def status_report(**overrides: Any) -> dict[str, Any]:
    report = {
        "phase": "ready",
        "gateway_url": "http://127.0.0.1:8000",
        "models": {"tiny": 1, "big": 0},
        "replicas": [
            replica("tiny#a", "tiny", inflight=2),
            replica("tiny#b", "tiny", draining=True, inflight=1, pid=4343),
        ],
        "scaling": {
            "tiny": {
                "target": 1,
                "window": None,
                "states": {"serving": 1, "draining": 1, "cooling_down": 0, "starting": 0},
            },
            "big": {
                "target": 1,
                "window": "00:00-06:00",
                "states": {"serving": 0, "draining": 0, "cooling_down": 0, "starting": 1},
            },
        },
    }
    report.update(overrides)
    return report


def two_scrapes() -> tuple[Scrape, Scrape]:
    """tiny#a answers 6 requests (3 at 20 ms, 3 at 200 ms) and generates 200 tokens in
    2 s; tiny#b answers 2 at 3 s; a fallback provider answers 1."""
    metrics = FleetMetrics()
    metrics.answer("tiny", "tiny#a", 0.02, num=10)
    metrics.tokens.labels("tiny", "tiny#a").inc(100)
    before = Scrape(100.0, status_report(), parse_metrics(metrics.text()))
    metrics.answer("tiny", "tiny#a", 0.02, num=3)
    metrics.answer("tiny", "tiny#a", 0.2, num=3)
    metrics.answer("tiny", "tiny#b", 3.0, num=2)
    metrics.answer("tiny", "fallback:openai", 0.5)
    metrics.tokens.labels("tiny", "tiny#a").inc(200)
    metrics.running.labels("tiny", "tiny#a").set(2)
    metrics.waiting.labels("tiny", "tiny#a").set(3)
    metrics.kv.labels("tiny", "tiny#a").set(0.5)
    metrics.kv.labels("tiny", "tiny#b").set(0.3)
    metrics.hit.labels("tiny", "tiny#a").set(0.75)
    return before, Scrape(102.0, status_report(), parse_metrics(metrics.text()))


def test_counter_increase_counts_new_series_from_zero_and_survives_a_reset():
    before = parse_metrics('x_total{a="1"} 5\nx_total{a="2"} 9\n')
    after = parse_metrics('x_total{a="1"} 8\nx_total{a="2"} 4\nx_total{a="3"} 2\n')
    assert increase(before, after, "x_total", {}) == 3 + 4 + 2
    assert increase(before, after, "x_total", {"a": "1"}) == 3
    assert increase(before, after, "y_total", {}) is None


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does():
    buckets = [(0.1, 0.0), (0.25, 3.0), (0.5, 6.0), (float("inf"), 6.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.25)  # rank 3: the top of (0.1, 0.25]
    assert quantile(0.99, buckets) == pytest.approx(0.25 + 0.25 * 2.94 / 3)
    assert quantile(0.1, [(1.0, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.1)  # from 0
    assert quantile(0.99, [(1.0, 1.0), (float("inf"), 4.0)]) == 1.0  # in +Inf: highest bound
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_quantile_of_bucket_deltas_falls_in_the_bucket_of_the_true_quantile():
    rng = random.Random(7)
    metrics = FleetMetrics()
    for _ in range(200):  # before the interval: all slow, and they must not count
        metrics.answer("m", "r", 20.0)
    before = parse_metrics(metrics.text())
    observed = [rng.lognormvariate(-2.5, 1.0) for _ in range(500)]
    for value in observed:
        metrics.answer("m", "r", value)
    buckets = bucket_increase(before, parse_metrics(metrics.text()), top.TTFT, {"model": "m"})
    assert buckets[-1] == (float("inf"), 500.0)
    bounds = [0.0] + [bound for bound, _ in buckets]
    for q in (0.5, 0.9, 0.99):
        truth = float(np.quantile(observed, q))
        i = next(i for i, bound in enumerate(bounds) if truth <= bound)
        assert bounds[i - 1] <= quantile(q, buckets) <= bounds[i]


def test_tokens_per_second_of_a_counter_read_in_steps_is_the_rate_between_steps():
    """The gateway reads vLLM every 5 s: 50 tokens a step is 10 tokens/s. Scraped every
    2 s, the plain rate reads 0 or 25; the step rate over the window reads 10, and falls
    to 0 once the steps stop."""
    metrics = FleetMetrics()
    tokens = metrics.tokens.labels("tiny", "tiny#a")
    scrapes = Scrapes()  # a 20 s window
    seen: dict[int, float | None] = {}
    plain: set[float] = set()
    for now in range(0, 60, 2):
        if now < 32 and now // 5 > (now - 2) // 5:  # a step at each multiple of 5 s
            tokens.inc(50)
        frame = scrapes.add(Scrape(float(now), status_report(), parse_metrics(metrics.text())))
        seen[now] = frame.models[0].replicas[0].tokens_s
        if now > 0:
            plain.add(
                increase(*(s.samples for s in list(scrapes.history)[-2:]), top.TOKENS, {}) / 2
            )
    assert plain == {0.0, 25.0}
    assert all(seen[now] == pytest.approx(10.0, rel=0.08) for now in range(16, 38, 2)), seen
    assert all(0 < seen[now] < 10 for now in range(38, 50, 2)), seen  # the last steps leave
    assert all(seen[now] == 0.0 for now in range(50, 60, 2)), seen
    assert seen[0] is None  # one reading: no rate yet


def test_step_rate_sums_series_and_ignores_a_series_seen_once():
    one = parse_metrics('t_total{replica="a"} 0\n')
    two = parse_metrics('t_total{replica="a"} 10\nt_total{replica="b"} 99\n')
    assert step_rate([(0.0, one), (2.0, two)], "t_total", {}) == 5.0
    assert step_rate([(2.0, two)], "t_total", {}) is None


def test_frame_merges_status_and_metrics_per_model_and_replica():
    before, after = two_scrapes()
    frame = build_frame([before, after])
    assert frame.interval_s == 2.0 and frame.phase == "ready"
    tiny, big = frame.models
    assert (tiny.row.name, tiny.target, tiny.window) == ("tiny", 1, None)
    assert tiny.row.state == "1 serving, 1 draining"
    assert tiny.row.inflight == 3
    assert tiny.row.requests == 10 + 6 + 2 + 1
    assert tiny.row.req_s == pytest.approx(9 / 2)
    assert tiny.row.kv_usage == pytest.approx(0.4)  # the mean of 0.5 and 0.3
    a, b, fallback = tiny.replicas
    assert (a.name, a.state, a.pid, a.inflight) == ("tiny#a", "serving", 4242, 2)
    assert a.req_s == pytest.approx(3.0) and a.tokens_s == pytest.approx(100.0)
    # the interval's 3 at 20 ms and 3 at 200 ms; the 10 earlier ones do not count
    assert a.ttft_p50_s == pytest.approx(0.025)
    assert a.ttft_p99_s == pytest.approx(0.1 + 0.15 * 2.94 / 3)
    assert (a.running, a.waiting, a.kv_usage, a.hit_rate) == (2, 3, 0.5, 0.75)
    assert (b.state, b.pid, b.tokens_s, b.running, b.hit_rate) == (
        "draining",
        4343,
        None,
        None,
        None,
    )
    assert 2.5 <= b.ttft_p50_s <= 5.0
    assert (fallback.name, fallback.state, fallback.requests) == ("fallback:openai", "fallback", 1)
    assert (big.row.state, big.target, big.window) == ("1 starting", 1, "00:00-06:00")
    assert [(r.name, r.state) for r in big.replicas] == [("-", "starting")]
    assert big.row.requests is None and big.row.ttft_p50_s is None


def test_first_frame_has_counts_but_no_rates():
    _, after = two_scrapes()
    (a, *_) = build_frame([after]).models[0].replicas
    assert a.requests == 16 and a.kv_usage == 0.5
    assert a.req_s is a.tokens_s is a.ttft_p50_s is None


def test_states_come_from_the_replicas_when_the_report_has_no_scaling():
    _, after = two_scrapes()
    report = status_report(scaling={})
    (tiny, big) = build_frame([Scrape(1.0, report, after.samples)]).models
    assert tiny.row.state == "1 serving, 1 draining" and tiny.target is None
    assert big.row.state == "no replica"


def table_rows(text: str) -> dict[str, list[str]]:
    """Each table line's cells, by its first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_render_shows_every_cell_on_a_fixed_width_console():
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(render(build_frame(two_scrapes()), every_s=2.0))
    text = console.file.getvalue()
    assert "rayfleet top: fleet ready at http://127.0.0.1:8000/v1" in text
    assert "every 2 s, q quits" in text
    assert "over the last 2.0 s" in text and "first-byte histogram" in text
    rows = table_rows(text)
    header = rows["model / replica"]
    assert header[:4] == ["state", "pid", "in flight", "run"] and header[-2:] == [
        "target",
        "window",
    ]
    # tiny's interval: 3 at 20 ms, 3 at 200 ms, 1 at 500 ms, 2 at 3 s. p50: rank 4.5 in
    # (0.1, 0.25] above 3, 0.1 + 0.15 * 1.5 / 3; p99: rank 8.91 in (2.5, 5] above 7.
    assert rows["tiny"] == [
        "1 serving, 1 draining", "", "3", "2", "3", "19", "4.5", "100.0",
        "175 ms", "4.89 s", "40%", "75%", "1", "-",
    ]  # fmt: skip
    assert rows["tiny#a"] == [
        "serving", "4242", "2", "2", "3", "16", "3.0", "100.0",
        "25 ms", "247 ms", "50%", "75%", "", "",
    ]  # fmt: skip
    assert rows["tiny#b"][:8] == ["draining", "4343", "1", "-", "-", "2", "1.0", "-"]
    assert rows["fallback:openai"][:2] == ["fallback", ""]
    assert rows["big"][0] == "1 starting" and rows["big"][-2:] == ["1", "00:00-06:00"]
    assert rows["-"][0] == "starting"
