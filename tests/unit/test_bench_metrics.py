"""Metric definitions, checked by hand on small runs whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from rayfleet.bench.client import RequestResult
from rayfleet.bench.metrics import (
    cost_per_million,
    count_good,
    latencies,
    max_requests_per_second_bucket,
    output_tokens_per_second,
    parse_goodput,
    peak_in_flight,
    summarize,
)
from rayfleet.errors import RayfleetError


def ok(
    start_s=0.0,
    ttft_s=0.1,
    itl_s=(0.01, 0.01, 0.01),
    num_output_tokens=None,
    replica="",
    num_input_tokens=10,
):
    itl = list(itl_s)
    return RequestResult(
        ok=True,
        status=200,
        start_s=start_s,
        scheduled_s=start_s,
        ttft_s=ttft_s,
        itl_s=itl,
        e2e_s=ttft_s + sum(itl),
        num_output_tokens=num_output_tokens or len(itl) + 1,
        num_input_tokens=num_input_tokens,
        replica=replica,
    )


def failed(status=503, error="HTTP 503: busy", replica=""):
    return RequestResult(ok=False, status=status, error=error, replica=replica, num_input_tokens=10)


def test_tpot_excludes_the_first_token_and_single_token_requests():
    lat = latencies([ok(ttft_s=0.2, itl_s=(0.02, 0.04)), ok(ttft_s=0.3, itl_s=())])
    assert lat.tpot == pytest.approx([0.03])  # (0.26 - 0.2) / (3 - 1)
    assert lat.tpot_for_goodput == pytest.approx([0.03, 0.0])
    assert lat.itl == pytest.approx([0.02, 0.04])
    assert lat.e2el == pytest.approx([0.26, 0.3])


def test_tpot_uses_the_server_token_count_when_chunks_carry_several_tokens():
    lat = latencies([ok(ttft_s=0.1, itl_s=(0.05,), num_output_tokens=11)])
    assert lat.tpot == pytest.approx([0.005])


def test_summary_keeps_failures_out_of_latencies_and_totals():
    results = [ok(ttft_s=0.1), ok(ttft_s=0.3), failed(), failed(status=0, error="timeout: slow")]
    s = summarize(results, 2.0)
    assert (s["completed"], s["failed"]) == (2, 2)
    assert s["total_input_tokens"] == 20 and s["total_output_tokens"] == 8
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 4.0
    assert s["total_token_throughput"] == 14.0
    assert s["mean_ttft_ms"] == pytest.approx(200) and s["median_ttft_ms"] == pytest.approx(200)
    assert s["p90_ttft_ms"] == pytest.approx(np.percentile([100, 300], 90))
    assert s["p99_ttft_ms"] == pytest.approx(298)
    assert s["errors_by_status"] == {"503": 1, "timeout": 1}
    assert s["request_goodput"] is None


def test_goodput_counts_requests_meeting_every_slo():
    results = [
        ok(ttft_s=0.1, itl_s=(0.01,) * 4),
        ok(ttft_s=0.6, itl_s=(0.01,) * 4),
        ok(ttft_s=0.1, itl_s=(0.09,) * 4),
        failed(),
    ]
    slos = parse_goodput(["ttft:500 tpot:50"])
    assert slos == {"ttft": 500.0, "tpot": 50.0}
    assert count_good(latencies(results), slos) == 1
    assert summarize(results, 2.0, goodput_ms=slos)["request_goodput"] == 0.5
    assert count_good(latencies(results), {"e2el": 500}) == 2  # e2el 0.14, 0.64, 0.46 s


@pytest.mark.parametrize(
    "pairs, message",
    [
        (["ttft=5"], "NAME:MS"),
        (["itl:5"], "one of ttft, tpot, e2el"),
        (["ttft:-1"], "non-negative"),
    ],
)
def test_goodput_errors_name_the_flag(pairs, message):
    with pytest.raises(RayfleetError, match=message):
        parse_goodput(pairs)


def test_cost_per_million_output_tokens_from_an_hourly_price():
    assert cost_per_million(12.40, 3600.0, 1_000_000) == pytest.approx(12.40)
    assert cost_per_million(12.40, 1800.0, 2_000_000) == pytest.approx(3.10)
    assert cost_per_million(None, 10.0, 100) is None and cost_per_million(1.0, 10.0, 0) is None
    s = summarize([ok(num_output_tokens=1000)], 36.0, price_per_hour=100.0)
    assert s["cost_per_million_output_tokens"] == pytest.approx(1000.0)  # 1 $ for 1000 tokens


def test_replicas_and_fallback_share_come_from_the_gateway_header():
    results = [
        ok(replica="tiny-0"),
        ok(replica="tiny-0"),
        ok(replica="tiny-1"),
        ok(replica="fallback:openai"),
        failed(replica="tiny-1"),
        ok(),
    ]
    s = summarize(results, 1.0)
    assert s["replicas"] == {"tiny-0": 2, "tiny-1": 2, "fallback:openai": 1}
    assert s["fallback_share"] == pytest.approx(1 / 5)
    assert summarize([ok()], 1.0)["fallback_share"] is None


def test_throughput_timeline_and_concurrency_as_vllm_buckets_them():
    results = [
        ok(start_s=0.0, ttft_s=0.5, itl_s=(0.2, 0.2, 0.2)),  # tokens at 0.5 0.7 0.9 1.1
        ok(start_s=0.6, ttft_s=0.1, itl_s=(0.1,)),  # tokens at 0.7 0.8
        ok(start_s=2.0, ttft_s=0.1, itl_s=()),
    ]  # token at 2.1
    assert output_tokens_per_second(results) == [5, 1, 1]
    assert peak_in_flight(results) == 2
    # vLLM counts a request in every one-second bucket it touches: both touch second 0.
    assert max_requests_per_second_bucket(results) == 2
    assert (
        max_requests_per_second_bucket([*results[:1], ok(start_s=0.95, ttft_s=0.01, itl_s=())]) == 2
    )
    summary = summarize(results, 3.0)
    assert summary["max_output_tokens_per_s"] == 5.0 and summary["max_in_flight_requests"] == 2
