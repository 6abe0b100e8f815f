"""Sweeps: the same benchmark at rising request rates or concurrencies.

A sweep stops at the first step that breaks the SLO (fewer than ``min_slo_attainment``
of the completed requests met ``--goodput``) or fails too often (more than
``max_error_share`` of requests failed); that step is kept, so the report shows where
the knee is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rayfleet.bench.benchmark import BenchConfig, BenchRun, run_benchmark
from rayfleet.bench.datasets import Tokenizer, make_prompts
from rayfleet.bench.drive import Counts
from rayfleet.bench.metrics import Summary, error_share, slo_attainment
from rayfleet.errors import RayfleetError

SWEEP_VARIABLES = ("request_rate", "max_concurrency")


@dataclass(frozen=True)
class SweepPlan:
    """Which load variable to raise, through which values, and when to stop."""

    variable: str
    values: tuple[float, ...]
    min_slo_attainment: float = 0.9
    max_error_share: float = 0.05


@dataclass
class SweepRun:
    steps: list[BenchRun]
    stop_reason: str

    def result(self, plan: SweepPlan) -> Summary:
        """The saved sweep: one vLLM-style result per step, and why it stopped."""
        return {
            "sweep": {
                "variable": plan.variable,
                "values": list(plan.values),
                "min_slo_attainment": plan.min_slo_attainment,
                "max_error_share": plan.max_error_share,
                "stop_reason": self.stop_reason,
            },
            "steps": [step.result for step in self.steps],
        }


def parse_values(text: str, flag: str) -> tuple[float, ...]:
    """``"1,2,4"`` as ``(1.0, 2.0, 4.0)``, rising, or a RayfleetError naming ``flag``."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise RayfleetError(f"{flag} takes comma-separated numbers, e.g. {flag} 1,2,4,8") from None
    if not values or any(v <= 0 for v in values) or list(values) != sorted(values):
        raise RayfleetError(f"{flag} needs positive rising numbers, e.g. {flag} 1,2,4,8")
    return values


def step_config(config: BenchConfig, variable: str, value: float) -> BenchConfig:
    if variable == "request_rate":
        return replace(config, shape=replace(config.shape, request_rate=value))
    return replace(config, shape=replace(config.shape, max_concurrency=int(value)))


def stop_reason(result: Summary, plan: SweepPlan) -> str | None:
    """Why the sweep ends after this step, or None to go on."""
    if result.get("interrupted"):
        return "interrupted"
    share = error_share(result)
    if share > plan.max_error_share:
        return f"errors {share:.0%} > {plan.max_error_share:.0%}"
    attainment = slo_attainment(result)
    if attainment is not None and attainment < plan.min_slo_attainment:
        return f"SLO met by {attainment:.0%} < {plan.min_slo_attainment:.0%} of requests"
    return None


def run_sweep(
    config: BenchConfig,
    plan: SweepPlan,
    tokenizer: Tokenizer | None,
    *,
    on_step: Callable[[float], Callable[[Counts], None] | None] | None = None,
) -> SweepRun:
    """Run each step of ``plan`` in turn until one breaks the SLO or the error limit."""
    if plan.variable not in SWEEP_VARIABLES:
        raise RayfleetError(f"sweep variable must be one of {', '.join(SWEEP_VARIABLES)}")
    prompts = make_prompts(config.dataset, tokenizer)
    steps: list[BenchRun] = []
    for value in plan.values:
        progress = on_step(value) if on_step else None
        run = run_benchmark(
            step_config(config, plan.variable, value),
            tokenizer,
            prompts=prompts,
            on_progress=progress,
        )
        run.result["sweep_value"] = value
        steps.append(run)
        if reason := stop_reason(run.result, plan):
            return SweepRun(steps, f"stopped at {plan.variable}={value:g}: {reason}")
    return SweepRun(steps, "completed every step")
