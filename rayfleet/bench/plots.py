"""PNG plots of a run or a sweep (matplotlib, imported only when plotting)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayfleet.bench.benchmark import BenchRun
from rayfleet.bench.metrics import Summary, latencies


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run: BenchRun, out_dir: Path, prefix: str = "bench") -> list[Path]:
    """TTFT and ITL distributions and throughput over time of one run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lat = latencies(run.output.results)
    return [
        plot_distribution(np.asarray(lat.ttft) * 1000, "TTFT", out_dir / f"{prefix}-ttft.png"),
        plot_distribution(np.asarray(lat.itl) * 1000, "ITL", out_dir / f"{prefix}-itl.png"),
        plot_throughput(run, out_dir / f"{prefix}-throughput.png"),
    ]


def plot_distribution(values_ms: np.ndarray, name: str, path: Path) -> Path:
    """A histogram with the median and p99 marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(values_ms):
        ax.hist(values_ms, bins=60, color="tab:blue", alpha=0.8)
        for q, style in ((50, "--"), (99, ":")):
            value = float(np.percentile(values_ms, q))
            ax.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.1f} ms")
        ax.legend()
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("count")
    ax.set_title(f"{name} distribution ({len(values_ms)} samples)")
    return _save(fig, path)


def plot_throughput(run: BenchRun, path: Path) -> Path:
    """Output tokens per second and requests finished per second over the run."""
    plt = _pyplot()
    tokens = run.result.get("output_tokens_per_s_timeline") or []
    ends = [r.start_s + r.e2e_s - run.output.start_s for r in run.output.results if r.ok]
    finished = np.bincount(np.floor(ends).astype(int)) if ends else np.array([])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(len(tokens)), tokens, color="tab:blue", label="output tokens/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s")
    other = ax.twinx()
    other.plot(np.arange(len(finished)), finished, color="tab:orange", label="requests/s")
    other.set_ylabel("requests finished/s")
    ax.set_title(f"Throughput over time ({run.result.get('load')})")
    fig.legend(loc="lower center", ncol=2)
    return _save(fig, path)


def plot_sweep(
    variable: str, steps: Sequence[Summary], out_dir: Path, prefix: str = "bench"
) -> list[Path]:
    """Latency percentiles against load, and throughput against load."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    loads = [step["sweep_value"] for step in steps]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, name in zip(axes, ("ttft", "tpot", "itl"), strict=True):
        for stat, style in (("median", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(loads, [step.get(f"{stat}_{name}_ms") for step in steps], style, label=stat)
        _load_axis(ax, variable, loads)
        ax.set_ylabel(f"{name.upper()} (ms)")
        ax.set_title(f"{name.upper()} against load")
        ax.legend()
    latency_path = _save(fig, out_dir / f"{prefix}-sweep-latency.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(loads, [step["output_throughput"] for step in steps], "o-", label="output tokens/s")
    _load_axis(ax, variable, loads)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput against load")
    return [latency_path, _save(fig, out_dir / f"{prefix}-sweep-throughput.png")]


def _load_axis(ax: Any, variable: str, loads: Sequence[float]) -> None:
    """Label the load axis; doubling loads (1, 2, 4, ...) read best on a log2 scale."""
    ax.set_xlabel(variable)
    if loads and min(loads) > 0 and max(loads) / min(loads) >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{v:g}" for v in loads])


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
