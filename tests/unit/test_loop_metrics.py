"""loop_metrics' lock-free families render what prometheus_client's own types render for
the same updates (less the ``_created`` series), and refuse wrong label counts."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.gateway.loop_metrics import LoopCounter, LoopGauge, LoopHistogram

BUCKETS = (0.005, 0.1, 1.0, 30.0)


def exposition(registry: CollectorRegistry) -> dict[tuple[str, tuple], tuple[str, float]]:
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = (family.type, sample.value)
    return samples


def updated(counter, gauge, histogram) -> None:
    counter.labels("tiny", "200").inc()
    counter.labels("tiny", "200").inc(2)
    counter.labels("tiny", "503").inc()
    gauge.labels("tiny", "a").inc()
    gauge.labels("tiny", "a").inc()
    gauge.labels("tiny", "a").dec()
    gauge.labels("tiny", "b").inc()
    gauge.labels("tiny", "b").dec()
    for value in (0.001, 0.005, 0.0051, 0.7, 1.0, 29.0, 31.0, 1e9):  # on a bound, past all
        histogram.labels("tiny").observe(value)


def test_the_same_updates_render_the_same_exposition_as_prometheus_clients_types():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    updated(
        Counter("rf_requests_total", "Requests.", ["model", "status"], registry=theirs),
        Gauge("rf_inflight", "In flight.", ["model", "replica"], registry=theirs),
        Histogram("rf_ttfb_seconds", "TTFB.", ["model"], buckets=BUCKETS, registry=theirs),
    )
    updated(
        LoopCounter("rf_requests_total", "Requests.", ["model", "status"], ours),
        LoopGauge("rf_inflight", "In flight.", ["model", "replica"], ours),
        LoopHistogram("rf_ttfb_seconds", "TTFB.", ["model"], ours, BUCKETS),
    )
    expected = exposition(theirs)
    assert exposition(ours) == expected
    assert expected[("rf_ttfb_seconds_bucket", (("le", "0.005"), ("model", "tiny")))][1] == 2
    assert expected[("rf_ttfb_seconds_bucket", (("le", "+Inf"), ("model", "tiny")))][1] == 8


def test_a_wrong_number_of_label_values_is_refused():
    counter = LoopCounter("rf_total", "Requests.", ["model", "status"], CollectorRegistry())
    with pytest.raises(ValueError, match="labels"):
        counter.labels("tiny")
