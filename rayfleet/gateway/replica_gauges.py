"""Each replica's vLLM gauges, republished on the gateway's ``/metrics`` under its labels.

One scrape target then tells the whole story when Prometheus cannot reach the replicas
(a Kubernetes gateway in front of Ray workers, a laptop in front of a cluster)::

    gauges = ReplicaGauges(replica_set, metrics.registry)
    task: await gauges.run()          every period_s:
        scrape_once(spread_s=period_s)
                                      GET each registered replica's /metrics
                                      (load_signal.fetch_stats), the reads' starts
                                      spread evenly over spread_s, at most
                                      max_concurrent at a time, each within timeout_s;
                                      each reading to on_stats (the gateway sizes its
                                      prefix index)
    GET /metrics -> collect()         the last readings of the replicas registered now

Series (labels ``model``, ``replica``: the replica id, as the gateway's other
per-replica metrics), read by ``rayfleet top`` and the dashboard
(k8s/monitoring/grafana-dashboard.json):

    rayfleet_replica_up                       1 when the last read succeeded, else 0
    rayfleet_replica_requests_running         vllm:num_requests_running
    rayfleet_replica_requests_waiting         vllm:num_requests_waiting
    rayfleet_replica_kv_cache_usage           vllm:kv_cache_usage_perc (0..1)
    rayfleet_replica_prefix_cache_hit_rate    prefix cache hits / queries since start (0..1)
    rayfleet_replica_generation_tokens_total  vllm:generation_tokens_total (a counter)

A replica that left the gateway's membership leaves every series at once; one that
joined appears at the next read; one whose read failed keeps only
``rayfleet_replica_up 0`` (no stale values).

Reads run in a task of their own, never in a request's path: the fetch is asynchronous
and parsing finds only the samples read (control/load_signal.py: 0.29 ms a replica on
this machine, a seventh of the way before it), so a 5 s period over even 100 replicas
takes under 1% of the event loop. They are spread over the period, not read at once: a
round of 64 simulated replicas read together took 30-66 ms of the loop, requests waited
behind it, and a gateway at 2,000 req/s had a TTFT p99 of 10.1 ms with it, 4.1 ms
without (benchmarks/loop_stalls.py; README, "Gateway capacity").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rayfleet.control.load_signal import EngineStats, LoadUnavailable, fetch_stats, read_spread
from rayfleet.gateway.replicas import Replica, ReplicaSet

log = logging.getLogger("rayfleet.gateway")

PERIOD_S = 5.0
TIMEOUT_S = 2.0
MAX_CONCURRENT = 8
_LABELS = ("model", "replica")

Key = tuple[str, str]  # (model, replica id)
StatsObserver = Callable[[Replica, EngineStats], None]


class ReplicaGauges:
    """A prometheus_client collector of each registered replica's last vLLM reading."""

    def __init__(
        self,
        replica_set: ReplicaSet,
        registry: CollectorRegistry,
        *,
        period_s: float = PERIOD_S,
        timeout_s: float = TIMEOUT_S,
        max_concurrent: int = MAX_CONCURRENT,
        on_stats: StatsObserver | None = None,
    ):
        self.replica_set = replica_set
        self.on_stats = on_stats  # told each successful reading (the prefix index's sizes)
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self.readings: dict[Key, EngineStats | None] = {}  # None: the last read failed
        self._logged: set[Key] = set()  # replicas whose failure is logged, until they answer
        registry.register(self)

    async def run(self) -> None:
        """Read every replica once a ``period_s``, the reads spread over it, until
        cancelled; the first round starts now."""
        connector = aiohttp.TCPConnector(limit=self.max_concurrent)
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                started = loop.time()
                try:
                    await self.scrape_once(session, spread_s=self.period_s)
                except Exception:  # the next period tries again
                    log.exception("reading the replicas' /metrics failed")
                await asyncio.sleep(max(0.0, started + self.period_s - loop.time()))

    async def scrape_once(self, session: aiohttp.ClientSession, spread_s: float = 0.0) -> None:
        """Read every registered replica's ``/metrics`` once, the ``n``-th of ``count``
        starting ``n / count * spread_s`` after the first, its reading shown as it comes;
        forget those that left."""
        replicas = self.replica_set.replicas()
        gate = asyncio.Semaphore(self.max_concurrent)

        async def read(replica: Replica) -> EngineStats | None:
            async with gate:
                reading = await self._read(session, replica)
            self.readings[(replica.model, replica.replica_id)] = reading  # shown at once
            if reading is not None and self.on_stats is not None:
                self.on_stats(replica, reading)
            return reading

        stats = await read_spread(replicas, read, spread_s)
        self.readings = {(r.model, r.replica_id): s for r, s in zip(replicas, stats, strict=True)}
        self._logged &= set(self.readings)

    async def _read(self, session: aiohttp.ClientSession, replica: Replica) -> EngineStats | None:
        key = (replica.model, replica.replica_id)
        try:
            stats = await fetch_stats(session, replica.url, self.timeout_s)
        except LoadUnavailable as exc:
            if key not in self._logged:  # once per outage, not every period
                self._logged.add(key)
                log.warning("replica %s: %s", replica.replica_id, exc)
            return None
        self._logged.discard(key)
        return stats

    def describe(self) -> Iterator[Metric]:
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        up, running, waiting, kv, hit_rate, tokens = families = _families()
        registered = {(r.model, r.replica_id) for r in self.replica_set.replicas()}
        for key, stats in list(self.readings.items()):
            if key not in registered:  # left since the last read
                continue
            labels = list(key)
            up.add_metric(labels, 0.0 if stats is None else 1.0)
            if stats is None:
                continue
            running.add_metric(labels, stats.load.running)
            waiting.add_metric(labels, stats.load.waiting)
            kv.add_metric(labels, stats.load.kv_cache_usage)
            if stats.prefix_cache_hit_rate is not None:
                hit_rate.add_metric(labels, stats.prefix_cache_hit_rate)
            if stats.generation_tokens is not None:
                tokens.add_metric(labels, stats.generation_tokens)
        return iter(families)


def _families() -> tuple[
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    CounterMetricFamily,
]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=_LABELS)

    return (
        gauge("rayfleet_replica_up", "1 when the gateway's last read of the replica's /metrics "
              "succeeded, 0 when it failed."),
        gauge("rayfleet_replica_requests_running", "Requests the replica's vLLM is running "
              "(vllm:num_requests_running, summed over engines)."),
        gauge("rayfleet_replica_requests_waiting", "Requests waiting in the replica's vLLM "
              "(vllm:num_requests_waiting, summed over engines)."),
        gauge("rayfleet_replica_kv_cache_usage", "Fraction of the replica's KV cache in use "
              "(vllm:kv_cache_usage_perc, 1 = full)."),
        gauge("rayfleet_replica_prefix_cache_hit_rate", "Prompt tokens found in the replica's "
              "prefix cache over tokens looked up since it started (0..1)."),
        CounterMetricFamily("rayfleet_replica_generation_tokens", "Tokens the replica "
                            "generated since it started (vllm:generation_tokens_total).",
                            labels=_LABELS),
    )  # fmt: skip
