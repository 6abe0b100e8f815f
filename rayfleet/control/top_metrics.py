"""The arithmetic of ``rayfleet top`` on Prometheus expositions (control/top.py reads it).

Samples are a scrape's series by sample name and label set (``parse_metrics``, with
prometheus_client's own parser). A ``match`` is a dict of labels a series must carry:
``{"model": m}`` sums a model's replicas, ``{"model": m, "replica": r}`` is one replica::

    gauge_sum, gauge_mean (samples, name, match)    a gauge now
    increase(before, after, name, match)            a counter's growth between two scrapes
    bucket_increase(before, after, histogram, match) -> [(le, count)]   the same, per bucket
    quantile(q, buckets)                             Prometheus' histogram_quantile
    step_rate(readings, name, match)                 the rate of a counter updated in steps
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]  # sample name -> its series' values


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus exposition, by sample name and label set."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def matching(
    samples: Samples, name: str, match: Mapping[str, str]
) -> Iterable[tuple[dict[str, str], float]]:
    for labels, value in samples.get(name, {}).items():
        as_dict = dict(labels)
        if all(as_dict.get(k) == v for k, v in match.items()):
            yield as_dict, value


def gauge_sum(samples: Samples, name: str, match: Mapping[str, str]) -> float | None:
    values = [v for _, v in matching(samples, name, match)]
    return sum(values) if values else None


def gauge_mean(samples: Samples, name: str, match: Mapping[str, str]) -> float | None:
    values = [v for _, v in matching(samples, name, match)]
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
        for labels, _ in matching(after, histogram + "_bucket", match)
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


def step_rate(
    readings: Sequence[tuple[float, Samples]], name: str, match: Mapping[str, str]
) -> float | None:
    """The per-second rate of counters that their source updates in steps, summed over the
    matching series of ``readings`` ((time, samples), oldest first): each one's increase
    between the first and the last change seen, over the time between them, while it
    keeps changing at its pace; else (one change, or none for longer than its steps'
    spacing: the load stopped) its increase over the whole span. None when no series
    has two readings."""
    rates = []
    for labels, _ in matching(readings[-1][1], name, match):
        key = tuple(sorted(labels.items()))
        points = [(at_s, seen[name][key]) for at_s, seen in readings if key in seen.get(name, {})]
        if len(points) < 2:
            continue
        rates.append(_series_step_rate(points))
    return sum(rates) if rates else None


def _series_step_rate(points: list[tuple[float, float]]) -> float:
    changes = [now for was, now in pairwise(points) if now[1] != was[1]]
    (t0, v0), (t1, v1) = points[0], points[-1]
    if len(changes) >= 2:
        spacing_s = (changes[-1][0] - changes[0][0]) / (len(changes) - 1)
        if t1 - changes[-1][0] <= 1.5 * spacing_s:  # still stepping: measure between steps
            (t0, v0), (t1, v1) = changes[0], changes[-1]
    return max(0.0, v1 - v0) / (t1 - t0) if t1 > t0 else 0.0
