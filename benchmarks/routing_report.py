"""The routing benchmarks' report: tables per fleet, the issue's goals as PASS/FAIL lines,
and a plot of hit rate and TTFT p50 per policy (routing.py and routing_vllm.py).

A report is ``{"fleets": {size: {scenario: {policy: [round, ...]}}}, "restart": [...]}``;
a round is a dict of ``hit_rate``, ``throughput_rps``, ``ttft_p50_ms``, ``ttft_p99_ms``,
``busy_max_over_mean`` (means over rounds are shown).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

COLUMNS = ("hit_rate", "throughput_rps", "ttft_p50_ms", "ttft_p99_ms", "busy_max_over_mean")
BASE = "least_load"


def mean_row(rounds: list[dict]) -> dict[str, float]:
    return {c: statistics.fmean(r[c] for r in rounds) for c in COLUMNS if c in rounds[0]}


def print_table(label: object, scenarios: dict[str, dict[str, list[dict]]]) -> None:
    print(f"\n{label} replicas: mean of rounds; (x) = ratio to least_load")
    print(
        f"{'scenario':14s} {'policy':22s} {'hit':>11s} {'req/s':>13s} "
        f"{'TTFT p50 ms':>16s} {'TTFT p99 ms':>16s} {'busy max/mean':>13s}"
    )
    for scenario, per_policy in scenarios.items():
        base = mean_row(per_policy[BASE])
        for policy, rounds in per_policy.items():
            row = mean_row(rounds)
            cells = [
                f"{row[c]:{'.2f' if c in ('hit_rate', 'busy_max_over_mean') else '.1f'}}"
                + (f" ({row[c] / base[c]:.2f}x)" if c != "busy_max_over_mean" and base[c] else "")
                for c in COLUMNS
                if c in row
            ]
            print(f"{scenario:14s} {policy:22s} " + " ".join(f"{c:>15s}" for c in cells))


def _ratio(scenarios: dict, scenario: str, column: str, policy: str = "prefix") -> float:
    rows = scenarios.get(scenario)
    if not rows:
        return math.nan
    base = mean_row(rows[BASE])[column]
    return mean_row(rows[policy])[column] / base if base else math.inf


def _line(ok: bool, text: str) -> str:
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def goal_lines(report: dict) -> list[str]:
    """The issue's simulated goals for every fleet size, and the restart case."""
    lines = []
    for size, scenarios in report["fleets"].items():
        ran = {
            name for name, per_policy in scenarios.items() if {"prefix", BASE} <= per_policy.keys()
        }
        if not ran:
            lines.append(f"(no goals at {size} replicas: they set policy prefix against {BASE})")
            continue
        if "shared-prefix" in ran:
            hit = mean_row(scenarios["shared-prefix"]["prefix"])["hit_rate"]
            hit_x = _ratio(scenarios, "shared-prefix", "hit_rate")
            lines.append(_line(hit >= 0.7, f"{size} replicas: prefix hit rate {hit:.2f} >= 0.70"))
            lines.append(_line(hit_x >= 3, f"{size} replicas: prefix hit rate {hit_x:.2f}x >= 3x"))
        if "saturation" in ran:
            sat = _ratio(scenarios, "saturation", "throughput_rps")
            lines.append(
                _line(sat >= 1.5, f"{size} replicas: saturation throughput {sat:.2f}x >= 1.5x")
            )
        if "zipf-dominant" in ran:
            busy = mean_row(scenarios["zipf-dominant"]["prefix"])["busy_max_over_mean"]
            lines.append(
                _line(
                    busy <= 1.25, f"{size} replicas: zipf-dominant busy max/mean {busy:.2f} <= 1.25"
                )
            )
            p99 = _ratio(scenarios, "zipf-dominant", "ttft_p99_ms")
            lines.append(
                _line(p99 <= 1.1, f"{size} replicas: zipf-dominant TTFT p99 {p99:.2f}x <= 1.1x")
            )
    windows = report.get("restart") or []
    if windows:
        lines.append(_restart_line(windows))
    return lines


def _restart_line(windows: list[dict]) -> str:
    before = [w["hit_rate"] for w in windows if not w["restarted"]][1:]  # past the cold start
    after = [w for w in windows if w["restarted"]]
    if not after:
        return _line(False, "restart: the run ended before the restart")
    if not before:  # a level of 0 would pass at once: nothing was measured
        return _line(False, "restart: no window past the cold start came before the restart")
    level = statistics.fmean(before)
    start = after[0]["t_s"] - 5.0
    recovered = next((w for w in after[1:] if w["hit_rate"] >= 0.9 * level), None)
    if recovered is None:
        return _line(False, f"restart: hit rate did not return to 90% of {level:.2f}")
    took = recovered["t_s"] - start
    return _line(
        took <= 30, f"restart: hit rate back to >= 90% of {level:.2f} within {took:.0f} s <= 30 s"
    )


def save_plot(report: dict, path: Path) -> None:
    """Bars of hit rate and TTFT p50 per policy, one group per (fleet size, scenario)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        (size, scenario, per_policy)
        for size, scenarios in report["fleets"].items()
        for scenario, per_policy in scenarios.items()
        if scenario != "saturation"
    ]
    policies = list(dict.fromkeys(policy for group in groups for policy in group[2]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(policies)
    missing = {"hit_rate": math.nan, "ttft_p50_ms": math.nan}  # a policy a fleet did not run
    for k, policy in enumerate(policies):
        xs = [i + k * width for i in range(len(groups))]
        rows = [mean_row(g[2][policy]) if policy in g[2] else missing for g in groups]
        axes[0].bar(xs, [r["hit_rate"] for r in rows], width, label=policy)
        axes[1].bar(xs, [r["ttft_p50_ms"] for r in rows], width, label=policy)
    labels = [f"{size}\n{scenario}" for size, scenario, _ in groups]
    for ax, title in zip(axes, ("realised prefix-cache hit rate", "TTFT p50 (ms)"), strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], labels, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
