"""Calibration: the fit itself, and recovering a simulated replica's known a, b, c."""

from __future__ import annotations

import pytest

from rayfleet.errors import RayfleetError
from rayfleet.sim import EngineSpec, SimFleet
from rayfleet.sim.calibrate import CalibrationPlan, Observation, calibrate, fit_coefficients


def test_fit_recovers_exact_coefficients_from_exact_rows() -> None:
    a, b, c, overhead = 0.004, 2e-5, 3e-4, 0.002
    rows = [Observation("prefill", n, 0, a + b * n + overhead) for n in (64, 512, 1024, 2000)]
    rows += [Observation("decode", 0, n, a + c * n) for n in (1, 4, 16)]
    fit = fit_coefficients(rows)
    assert fit.step_s == pytest.approx(a) and fit.prefill_token_s == pytest.approx(b)
    assert fit.decode_seq_s == pytest.approx(c)
    assert fit.request_overhead_s == pytest.approx(overhead)
    assert fit.mean_abs_rel_error == pytest.approx(0, abs=1e-9)


def test_fit_needs_enough_rows() -> None:
    with pytest.raises(RayfleetError, match="at least 4 measurements"):
        fit_coefficients([Observation("prefill", 10, 0, 0.01)])


def test_calibration_recovers_a_simulated_replicas_latency_model() -> None:
    # Steps of tens of milliseconds: a busy machine's scheduling delays (a few ms) stay
    # small beside them.
    spec = EngineSpec(step_s=0.018, prefill_token_s=1.2e-4, decode_seq_s=3e-3)
    plan = CalibrationPlan(prompt_lens=(64, 400, 800, 1400), concurrencies=(1, 4, 8), num_repeats=2)
    with SimFleet(spec, num_replicas=1) as fleet:
        fit = calibrate(fleet.urls[0], "sim", plan)
    # Real time on a shared machine: a step is never early but may be late.
    assert fit.prefill_token_s == pytest.approx(spec.prefill_token_s, rel=0.25)
    assert fit.decode_seq_s == pytest.approx(spec.decode_seq_s, rel=0.3)
    assert fit.step_s == pytest.approx(spec.step_s, rel=0.3)
    assert fit.mean_abs_rel_error < 0.15
