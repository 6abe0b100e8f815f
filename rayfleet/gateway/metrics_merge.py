"""One ``/metrics`` for a gateway of several worker processes (``gateway.workers``).

The fleet process answers ``/metrics`` (a worker that is asked passes the scrape on to
it) with its own series and the workers', read over their local sockets::

    await read_metrics([socket_path, ...])  each worker's text, from those that answer
    merge(own, [worker_1, worker_2, ...])   Prometheus text in, Prometheus text out

- counters and histograms (requests, errors, latencies, picks) are summed over the
  processes, series by series; their ``_created`` times are the earliest;
- gauges that count work (requests in flight, asyncio tasks) are summed too;
- any other gauge (replicas by state, targets, each replica's vLLM gauges, the prefix
  index's size, which every worker holds whole) is the fleet process's where it has
  the series, else the largest a worker reports.

So a dashboard reads the same series with one process or eight, and the workers
need no label of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SUMMED_GAUGES = frozenset({"rayfleet_inflight_requests", "rayfleet_gateway_asyncio_tasks"})
_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def merge(own: bytes, others: Iterable[bytes]) -> bytes:
    """``own`` exposition with the ``others`` folded in, as the module says."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, tuple[float, bool]]] = {}  # (value, the fleet's own)
    for position, text in enumerate([own, *others]):
        for family in text_string_to_metric_families(text.decode()):
            known = families.setdefault(family.name, family)
            merged = values.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = merged.get(key)
                value = sample.value
                if before is not None:
                    value = _combine(known.type, family.name, sample, *before)
                merged[key] = (value, position == 0 or (before is not None and before[1]))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(_rebuilt(families, values)))
    return generate_latest(registry)


def _combine(kind: str, family: str, sample: Sample, before: float, own: bool) -> float:
    if sample.name.endswith("_created"):
        return min(before, sample.value)
    if kind in _SUMMED_TYPES or family in SUMMED_GAUGES:
        return before + sample.value
    return before if own else max(before, sample.value)


def _rebuilt(
    families: dict[str, Metric], values: dict[str, dict[SampleKey, tuple[float, bool]]]
) -> list[Metric]:
    rebuilt = []
    for name, family in families.items():
        metric = Metric(name, family.documentation, family.type, family.unit)
        metric.samples = [
            Sample(sample_name, dict(labels), value)
            for (sample_name, labels), (value, _) in values[name].items()
        ]
        rebuilt.append(metric)
    return rebuilt


class _Families:
    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)

    def describe(self) -> list[Metric]:
        return []


async def read_metrics(socket_paths: list[str]) -> list[bytes]:
    """``GET /metrics`` of each process serving on one of ``socket_paths`` (Unix sockets),
    at once, 5 s at most each; the texts of those that answered, in order."""

    async def one(path: str) -> bytes | None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            connector = aiohttp.UnixConnector(path=path)
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.get("http://worker/metrics", timeout=aiohttp.ClientTimeout(5)) as r,
            ):
                if r.status == 200:
                    return await r.read()
        return None

    texts = await asyncio.gather(*(one(path) for path in socket_paths))
    return [text for text in texts if text is not None]
