"""One replica's load as its vLLM server reports it on ``/metrics``.

    parse_engine_load(text) -> EngineLoad(running, waiting, kv_cache_usage)
    await fetch_load(session, url, timeout_s) -> EngineLoad     GET url + "/metrics"
    LoadUnavailable                                             no answer, or no gauges

Three of vLLM's own gauges (vllm/v1/metrics/loggers.py, vLLM 0.32):
``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` are summed over their
label sets (one per engine of a data-parallel server); ``vllm:kv_cache_usage_perc``
(a fraction, 1 = full) is their mean. The autoscaler (control/autoscaler.py) reads
running + waiting against ``target_load_per_replica`` and the KV fraction against
``kv_cache_high``; a draining replica (control/drain.py) waits for running + waiting
to reach zero.

Only the lines of those three families go through prometheus_client's parser: a whole
``/metrics`` of the tiny model is 48 KB of mostly histograms, 5.5 ms to parse whole
against 0.23 ms for the filtered lines (this machine, tests/unit/data/vllm_metrics.txt),
and the scaler reads every replica every second.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
_GAUGES = (RUNNING, WAITING, KV_CACHE_USAGE)


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


def parse_engine_load(text: str) -> EngineLoad:
    """The load in a vLLM ``/metrics`` text; LoadUnavailable if a gauge is missing."""
    samples: dict[str, list[float]] = {name: [] for name in _GAUGES}
    try:
        for family in text_string_to_metric_families(_gauge_lines(text)):
            if family.name in samples:
                samples[family.name] += [s.value for s in family.samples if s.name == family.name]
    except ValueError as exc:
        raise LoadUnavailable(f"unreadable /metrics text: {exc}") from None
    missing = [name for name, values in samples.items() if not values]
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
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url + "/metrics", timeout=timeout) as response:
            if response.status != 200:
                raise LoadUnavailable(f"{url}/metrics answered HTTP {response.status}")
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise LoadUnavailable(f"{url}/metrics: {type(exc).__name__} {exc}".rstrip()) from None
    return parse_engine_load(text)


def _gauge_lines(text: str) -> str:
    """The lines of the three gauges (samples, HELP and TYPE), with nothing else."""
    kept = [line for line in text.splitlines() if _metric_of(line) in _GAUGES]
    return "\n".join(kept) + "\n"


def _metric_of(line: str) -> str:
    if line.startswith("#"):
        words = line.split(maxsplit=3)
        return words[2] if len(words) > 2 and words[1] in ("HELP", "TYPE") else ""
    return line.split("{", 1)[0].split(" ", 1)[0]
