"""Metrics of a run, with vLLM's serving-benchmark definitions and JSON keys.

- TPOT of a request: (E2E latency - TTFT) / (output tokens - 1), for requests with more
  than one output token; a request with one token counts as TPOT 0 for goodput only.
- ITL: every gap between streamed chunks, all requests pooled.
- Throughputs divide by the run's wall-clock duration; failed requests count apart and
  stay out of every latency and token total.
- Goodput: completed requests per second that met every SLO given (``ttft``, ``tpot``,
  ``e2el`` in ms).
- Statistics: mean, median, std and percentiles (numpy's linear interpolation, as vLLM).

Ours beside vLLM's keys: the error breakdown by status code, the replicas that served
requests (the gateway's ``x-rayfleet-replica`` header), the fallback share, and the cost
per million tokens from the fleet's hourly price.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from rayfleet.bench.client import RequestResult
from rayfleet.errors import RayfleetError

SLO_METRICS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (90.0, 99.0)
FALLBACK_PREFIX = "fallback:"

# A run's metrics under vLLM's JSON keys (numbers), then ours (numbers, dicts, lists).
Summary = dict[str, Any]


@dataclass(frozen=True)
class Latencies:
    """Per-request latency samples of the successful requests, in seconds."""

    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    e2el: list[float]
    tpot_for_goodput: list[float]


def parse_goodput(pairs: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` as ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs:
        for item in pair.split():
            name, _, value = item.partition(":")
            try:
                slos[name] = float(value)
            except ValueError:
                raise RayfleetError(
                    f"--goodput {item!r} is not NAME:MS; write e.g. --goodput ttft:500 tpot:50"
                ) from None
            if name not in SLO_METRICS:
                raise RayfleetError(
                    f"--goodput {item!r}: the SLO name must be one of {', '.join(SLO_METRICS)}"
                )
            if slos[name] < 0:
                raise RayfleetError(
                    f"--goodput {item!r}: the SLO must be a non-negative number of ms"
                )
    return slos


def latencies(results: Sequence[RequestResult]) -> Latencies:
    ok = [r for r in results if r.ok]
    tpot_all = [request_tpot_s(r) for r in ok]
    return Latencies(
        ttft=[r.ttft_s for r in ok],
        tpot=[t for r, t in zip(ok, tpot_all, strict=True) if r.num_output_tokens > 1],
        itl=[gap for r in ok for gap in r.itl_s],
        e2el=[r.e2e_s for r in ok],
        tpot_for_goodput=tpot_all,
    )


def request_tpot_s(result: RequestResult) -> float:
    if result.num_output_tokens <= 1:
        return 0.0
    return (result.e2e_s - result.ttft_s) / (result.num_output_tokens - 1)


def count_good(lat: Latencies, slos_ms: dict[str, float]) -> int:
    """How many successful requests met every SLO."""
    if not slos_ms:
        return 0
    columns = {"ttft": lat.ttft, "tpot": lat.tpot_for_goodput, "e2el": lat.e2el}
    checks = [(columns[name], limit_ms / 1000.0) for name, limit_ms in slos_ms.items()]
    return sum(
        all(values[i] <= limit_s for values, limit_s in checks) for i in range(len(lat.ttft))
    )


def stats_ms(
    name: str, values_s: Sequence[float], percentiles: Sequence[float]
) -> dict[str, float]:
    """``mean_<name>_ms``, ``median_``, ``std_`` and ``p<P>_`` keys, as vLLM writes them."""
    values = np.asarray(values_s or [0.0]) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(values)),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(np.std(values)),
    }
    for p in percentiles:
        out[f"p{percentile_label(p)}_{name}_ms"] = float(np.percentile(values, p))
    return out


def percentile_label(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def output_tokens_per_second(results: Sequence[RequestResult]) -> list[int]:
    """Output tokens in each one-second bucket from the first successful request's start
    (one token per streamed chunk), as vLLM buckets them."""
    ok = [r for r in results if r.ok]
    if not ok:
        return []
    origin_s = min(r.start_s for r in ok)
    times = []
    for r in ok:
        first = r.start_s + r.ttft_s
        times.append(first)
        times.extend(first + np.cumsum(r.itl_s))
    buckets = np.floor(np.asarray(times) - origin_s).astype(int)
    return [int(n) for n in np.bincount(buckets[buckets >= 0])]


def max_requests_per_second_bucket(results: Sequence[RequestResult]) -> int:
    """vLLM's ``max_concurrent_requests``: the most successful requests active during any
    one-second bucket (a request counts in every bucket it touches)."""
    ok = [r for r in results if r.ok]
    if not ok:
        return 0
    origin_s = min(r.start_s for r in ok)
    active: Counter[int] = Counter()
    for r in ok:
        first, last = int(r.start_s - origin_s), int(r.start_s + r.e2e_s - origin_s)
        active.update(range(first, last + 1))
    return max(active.values())


def peak_in_flight(results: Sequence[RequestResult]) -> int:
    """The most successful requests in flight at the same instant."""
    events = sorted(
        [(r.start_s, 1) for r in results if r.ok]
        + [(r.start_s + r.e2e_s, -1) for r in results if r.ok]
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def replica_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Requests per serving replica, from the gateway's header (absent: not counted)."""
    return dict(Counter(r.replica for r in results if r.replica).most_common())


def error_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Failed requests per HTTP status code (or failure kind when no status came back)."""
    return dict(Counter(r.error_kind for r in results if not r.ok).most_common())


def cost_per_million(
    price_per_hour: float | None, duration_s: float, num_tokens: int
) -> float | None:
    """What a million tokens cost at this throughput, for a fleet costing ``price_per_hour``."""
    if price_per_hour is None or num_tokens == 0:
        return None
    return price_per_hour * duration_s / 3600.0 / num_tokens * 1e6


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    *,
    goodput_ms: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    price_per_hour: float | None = None,
) -> Summary:
    """Every metric of a run as one flat dict: vLLM's keys first, then ours."""
    ok = [r for r in results if r.ok]
    lat = latencies(results)
    num_input = sum(r.num_input_tokens for r in ok)
    num_output = sum(r.num_output_tokens for r in ok)
    per_second = output_tokens_per_second(results)
    duration_s = max(duration_s, 1e-9)
    summary: Summary = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": num_input,
        "total_output_tokens": num_output,
        "request_throughput": len(ok) / duration_s,
        "request_goodput": count_good(lat, goodput_ms) / duration_s if goodput_ms else None,
        "output_throughput": num_output / duration_s,
        "total_token_throughput": (num_input + num_output) / duration_s,
        "max_output_tokens_per_s": float(max(per_second, default=0)),
        "max_concurrent_requests": max_requests_per_second_bucket(results),
    }
    for name in LATENCY_METRICS:
        summary.update(stats_ms(name, getattr(lat, name), percentiles))
    summary.update(_ours(results, duration_s, num_output, num_input, price_per_hour, per_second))
    return summary


def _ours(
    results: Sequence[RequestResult],
    duration_s: float,
    num_output: int,
    num_input: int,
    price_per_hour: float | None,
    per_second: list[int],
) -> dict[str, Any]:
    replicas = replica_counts(results)
    num_served = sum(replicas.values())
    num_fallback = sum(n for name, n in replicas.items() if name.startswith(FALLBACK_PREFIX))
    return {
        "errors_by_status": error_counts(results),
        "replicas": replicas,
        "fallback_share": num_fallback / num_served if num_served else None,
        "price_per_hour": price_per_hour,
        "cost_per_million_output_tokens": cost_per_million(price_per_hour, duration_s, num_output),
        "cost_per_million_total_tokens": cost_per_million(
            price_per_hour, duration_s, num_output + num_input
        ),
        "max_in_flight_requests": peak_in_flight(results),
        "output_tokens_per_s_timeline": per_second,
    }


def slo_attainment(summary: Summary) -> float | None:
    """The share of completed requests that met the SLOs, or None without SLOs."""
    goodput = summary.get("request_goodput")
    if goodput is None or not summary["completed"]:
        return None
    return float(goodput / summary["request_throughput"])


def error_share(summary: Summary) -> float:
    total = summary["completed"] + summary["failed"]
    return float(summary["failed"] / total) if total else 0.0


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
