"""Load shapes become arrival schedules with the promised rates and groupings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayfleet.bench.load import LoadShape, arrival_offsets_s, ramp_rates, split_for_processes
from rayfleet.errors import RayfleetError


def test_all_at_once_by_default():
    assert arrival_offsets_s(LoadShape(), 5).tolist() == [0.0] * 5


def test_poisson_arrivals_last_exactly_n_over_rate_with_exponential_gaps():
    offsets = arrival_offsets_s(LoadShape(request_rate=50.0, seed=1), 2000)
    assert offsets[-1] == pytest.approx(2000 / 50.0)
    gaps = np.diff(offsets)
    assert np.all(gaps >= 0)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.1)  # exponential: CV 1


def test_burstiness_below_one_is_burstier_and_infinite_is_even():
    bursty = np.diff(arrival_offsets_s(LoadShape(request_rate=10, burstiness=0.25), 2000))
    even = np.diff(arrival_offsets_s(LoadShape(request_rate=10, burstiness=math.inf), 100))
    assert np.std(bursty) / np.mean(bursty) == pytest.approx(2.0, rel=0.15)  # gamma: CV 1/sqrt(k)
    assert np.allclose(even, 0.1)


def test_bursts_send_groups_at_intervals():
    offsets = arrival_offsets_s(LoadShape(burst_size=3, burst_interval_s=2.0), 7)
    assert offsets.tolist() == [0, 0, 0, 2, 2, 2, 4]


def test_linear_ramp_rises_from_start_to_end_rate():
    shape = LoadShape(
        ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=20, burstiness=math.inf
    )
    rates = ramp_rates(shape, 39)
    assert rates[0] == 1 and rates[-1] == 20 and rates[19] == pytest.approx(10.5)
    gaps = np.diff(arrival_offsets_s(shape, 39))
    assert gaps[0] == pytest.approx(1.0) and gaps[-1] == pytest.approx(1 / rates[-2])


def test_exponential_ramp_is_geometric():
    shape = LoadShape(ramp_up_strategy="exponential", ramp_up_start_rps=1, ramp_up_end_rps=16)
    assert ramp_rates(shape, 5).tolist() == pytest.approx([1, 2, 4, 8, 16])


@pytest.mark.parametrize(
    "shape, flag",
    [
        (LoadShape(max_concurrency=0), "--max-concurrency"),
        (LoadShape(max_connections=0), "--max-connections"),
        (LoadShape(request_rate=0), "--request-rate"),
        (LoadShape(burstiness=0), "--burstiness"),
        (
            LoadShape(ramp_up_strategy="cubic", ramp_up_start_rps=1, ramp_up_end_rps=2),
            "--ramp-up-strategy",
        ),
        (LoadShape(ramp_up_strategy="linear"), "--ramp-up-start-rps"),
        (
            LoadShape(
                ramp_up_strategy="linear", request_rate=3, ramp_up_start_rps=1, ramp_up_end_rps=2
            ),
            "drop --request-rate",
        ),
        (LoadShape(ramp_up_strategy="linear", ramp_up_start_rps=5, ramp_up_end_rps=2), "at most"),
        (LoadShape(burst_size=4, request_rate=3), "--burst-size"),
    ],
)
def test_impossible_shapes_name_the_flag(shape, flag):
    with pytest.raises(RayfleetError, match=flag):
        arrival_offsets_s(shape, 10)


def test_concurrency_splits_over_processes_without_losing_any():
    shape = LoadShape(max_concurrency=10)
    shares = [split_for_processes(shape, 3, i).max_concurrency for i in range(3)]
    assert shares == [4, 3, 3]
    assert split_for_processes(LoadShape(), 3, 0).max_concurrency is None


def test_connections_split_over_processes_at_least_one_each():
    shape = LoadShape(max_concurrency=64, max_connections=5)
    shares = [split_for_processes(shape, 3, i) for i in range(3)]
    assert [s.max_connections for s in shares] == [2, 2, 1]
    assert [s.max_concurrency for s in shares] == [22, 21, 21]
    assert split_for_processes(LoadShape(max_connections=2), 3, 2).max_connections == 1
    assert split_for_processes(LoadShape(), 3, 0).max_connections is None
