"""One replica's load as its vLLM server reports it on ``/metrics``.

    parse_engine_load(text) -> EngineLoad(running, waiting, kv_cache_usage)
    await fetch_load(session, url, timeout_s) -> EngineLoad     GET url + "/metrics"
    parse_engine_stats(text) -> EngineStats(load, prefix cache hits and queries,
                                            generation tokens)
    await fetch_stats(session, url, timeout_s) -> EngineStats   the same, for the gateway's
                                                                republished gauges
    LoadUnavailable                                             no answer, or no gauges
    await read_spread(items, read, over_s) -> [read(item), ...]  many replicas read without
                                                                 a burst on the event loop

Three of vLLM's own gauges (vllm/v1/metrics/loggers.py, vLLM 0.32):
``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` are summed over their
label sets (one per engine of a data-parallel server); ``vllm:kv_cache_usage_perc``
(a fraction, 1 = full) is their mean. The autoscaler (control/autoscaler.py) reads
running + waiting against ``target_load_per_replica`` and the KV fraction against
``kv_cache_high``; a draining replica (control/drain.py) waits for running + waiting
to reach zero. ``EngineStats`` adds three counters, summed over engines, each None when
the server does not export it: ``vllm:prefix_cache_hits_total`` and
``vllm:prefix_cache_queries_total`` (tokens) and ``vllm:generation_tokens_total``; the
gateway republishes them per replica (gateway/replica_gauges.py).

The samples read are found by name with ``str.find``, not by a Prometheus parser: a
whole ``/metrics`` of the tiny model is 48 KB of mostly histograms
(tests/unit/data/vllm_metrics.txt), and the gateway reads every replica's every 5 s, the
scaler every autoscaled replica's every second, in the process that relays requests.
prometheus_client's parser took 5.5 ms for the whole text here. Picking out the lines
of the families read for that parser (the way before this one) took 2.1 ms for
``parse_engine_stats``, and this way 0.29 ms, side by side on this 2-core machine, with
the same result. A sample whose value is not a number is LoadUnavailable.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
_GAUGES = (RUNNING, WAITING, KV_CACHE_USAGE)
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
CACHE_CONFIG = "vllm:cache_config_info"  # an info gauge: the KV cache's size in its labels
PROCESS_START = "process_start_time_seconds"  # the API server's, from prometheus_client
_STATS = (*_GAUGES, PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, GENERATION_TOKENS, PROCESS_START)

T = TypeVar("T")
R = TypeVar("R")


class LoadUnavailable(Exception):
    """The replica's load cannot be read: no answer, an error status, or gauges missing."""


@dataclass(frozen=True)
class EngineLoad:
    """Requests a vLLM server is running and holding, and how full its KV cache is."""

    running: float
    waiting: float
    kv_cache_usage: float

    @property
    def requests(self) -> float:
        """Running + waiting: the load the autoscaler targets per replica."""
        return self.running + self.waiting


@dataclass(frozen=True)
class EngineStats:
    """An engine's load and its counters since it started (None: not exported)."""

    load: EngineLoad
    prefix_cache_hits: float | None
    prefix_cache_queries: float | None
    generation_tokens: float | None
    kv_cache_tokens: int | None = None  # tokens the KV cache holds (all engines), if exported
    start_time: float | None = None  # when the server started (unix seconds), if exported

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found cached over tokens looked up since start (0 before any)."""
        if self.prefix_cache_hits is None or self.prefix_cache_queries is None:
            return None
        if self.prefix_cache_queries <= 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries


def parse_engine_load(text: str) -> EngineLoad:
    """The load in a vLLM ``/metrics`` text; LoadUnavailable if a gauge is missing."""
    return _load_of(_samples(text, _GAUGES))


def parse_engine_stats(text: str) -> EngineStats:
    """The load and counters in a vLLM ``/metrics`` text; LoadUnavailable if a gauge of
    the load is missing (a missing counter is None)."""
    samples = _samples(text, _STATS)

    def total(name: str) -> float | None:
        return sum(samples[name]) if samples[name] else None

    return EngineStats(
        load=_load_of(samples),
        prefix_cache_hits=total(PREFIX_CACHE_HITS),
        prefix_cache_queries=total(PREFIX_CACHE_QUERIES),
        generation_tokens=total(GENERATION_TOKENS),
        kv_cache_tokens=_kv_cache_tokens(text),
        start_time=max(samples[PROCESS_START]) if samples[PROCESS_START] else None,
    )


def _kv_cache_tokens(text: str) -> int | None:
    """The KV cache's size in tokens, from ``vllm:cache_config_info``'s labels
    (``kv_cache_size_tokens``, else ``num_gpu_blocks`` x ``block_size``), summed over
    engines; None when a server does not say."""
    total = 0
    for match in _sample_lines(text, CACHE_CONFIG):
        labels = dict(_LABEL.findall(match[1] or ""))
        tokens = _int_label(labels, "kv_cache_size_tokens")
        if tokens is None:
            blocks = _int_label(labels, "num_gpu_blocks")
            size = _int_label(labels, "block_size")
            tokens = blocks * size if blocks is not None and size is not None else None
        if tokens is None:
            return None
        total += tokens
    return total or None


def _int_label(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


# After a sample's name: its labels in braces (a quoted value may hold any character,
# escaped quotes included), blanks, its value (a timestamp may follow).
_REST = re.compile(r'(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _sample_lines(text: str, name: str) -> Iterator[re.Match[str]]:
    """The sample lines of the metric ``name`` exactly (not of a longer name it begins),
    each as a match of its labels (group 1, with braces, or None) and its value (group 2).
    Found with ``str.find``: a sample line starts with its name, a comment with ``#``."""
    at = 0 if text.startswith(name) else _line_starting(text, "\n" + name, 0)
    while at >= 0:
        match = _REST.match(text, at + len(name))
        if match is not None:
            yield match
        at = _line_starting(text, "\n" + name, at + len(name))


def _line_starting(text: str, newline_name: str, start: int) -> int:
    """Where the next line that begins with the name in ``newline_name`` starts, or -1."""
    found = text.find(newline_name, start)
    return found + 1 if found >= 0 else -1


def _samples(text: str, names: tuple[str, ...]) -> dict[str, list[float]]:
    """The values of the samples named ``names``."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        for match in _sample_lines(text, name):
            try:
                samples[name].append(float(match[2]))
            except ValueError:
                raise LoadUnavailable(f"unreadable /metrics text: {name}{match[0]!r}") from None
    return samples


def _load_of(samples: dict[str, list[float]]) -> EngineLoad:
    missing = [name for name in _GAUGES if not samples[name]]
    if missing:
        raise LoadUnavailable(
            f"/metrics has no {', '.join(missing)}; is this a vLLM server (0.32 or later)?"
        )
    kv = samples[KV_CACHE_USAGE]
    return EngineLoad(
        running=sum(samples[RUNNING]),
        waiting=sum(samples[WAITING]),
        kv_cache_usage=sum(kv) / len(kv),
    )


async def fetch_load(session: aiohttp.ClientSession, url: str, timeout_s: float) -> EngineLoad:
    """The load of the vLLM server at ``url`` (http://host:port), within ``timeout_s``."""
    return parse_engine_load(await _metrics_text(session, url, timeout_s))


async def fetch_stats(session: aiohttp.ClientSession, url: str, timeout_s: float) -> EngineStats:
    """The load and counters of the vLLM server at ``url``, within ``timeout_s``."""
    return parse_engine_stats(await _metrics_text(session, url, timeout_s))


async def _metrics_text(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url + "/metrics", timeout=timeout) as response:
            if response.status != 200:
                raise LoadUnavailable(f"{url}/metrics answered HTTP {response.status}")
            return await response.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise LoadUnavailable(f"{url}/metrics: {type(exc).__name__} {exc}".rstrip()) from None


async def read_spread(
    items: Sequence[T], read: Callable[[T], Awaitable[R]], over_s: float
) -> list[R]:
    """``read`` each of ``items`` concurrently, the ``n``-th of ``N`` started
    ``n / N * over_s`` after the first; the results in order. Reading and parsing a
    replica's /metrics holds the event loop a fraction of a millisecond: 64 replicas read
    at once held a gateway's loop for 30-66 ms, and the requests behind it waited
    (benchmarks/loop_stalls.py)."""
    step_s = over_s / max(len(items), 1)

    async def started(n: int, item: T) -> R:
        if n:
            await asyncio.sleep(n * step_s)
        return await read(item)

    return await asyncio.gather(*(started(n, item) for n, item in enumerate(items)))
