"""Tables for people and JSON files for machines: one run, a sweep, a comparison."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from rayfleet.bench.metrics import LATENCY_METRICS, Summary, is_number
from rayfleet.errors import RayfleetError

LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}

# (key, label, higher is better) for the side-by-side comparison.
COMPARED = (
    ("completed", "completed requests", True),
    ("failed", "failed requests", False),
    ("request_throughput", "requests/s", True),
    ("request_goodput", "goodput requests/s", True),
    ("output_throughput", "output tokens/s", True),
    ("total_token_throughput", "total tokens/s", True),
    *(
        (f"{stat}_{name}_ms", f"{LATENCY_NAMES[name]} {stat} ms", False)
        for name in LATENCY_METRICS
        for stat in ("mean", "median", "p90", "p99")
    ),
    ("cost_per_million_output_tokens", "cost per 1M output tokens", False),
    ("fallback_share", "fallback share", False),
)


def save_result(result: Summary, path: Path) -> Path:
    """Write ``result`` as JSON, making parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=_json_default))
    return path


def _json_default(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def load_runs(path: Path) -> list[tuple[str, Summary]]:
    """The runs in a result file: one for a run, one per step for a sweep."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RayfleetError(
            f"cannot read result file {path} ({exc.strerror}); pass a --save-result file"
        ) from None
    except json.JSONDecodeError:
        raise RayfleetError(f"{path} is not JSON; pass a file written by --save-result") from None
    if isinstance(data, dict) and "steps" in data:
        variable = data["sweep"]["variable"]
        return [
            (f"{Path(path).stem}@{variable}={step['sweep_value']:g}", step)
            for step in data["steps"]
        ]
    if not isinstance(data, dict) or "request_throughput" not in data:
        raise RayfleetError(f"{path} has no benchmark result; pass a file written by --save-result")
    return [(data.get("label") or Path(path).stem, data)]


def format_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isinf(value):
        return "inf"
    return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.4f}"


def run_table(result: Summary, title: str = "Benchmark result") -> Table:
    """The end-of-run table: requests, throughput, cost, latencies, errors, replicas."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for label, value in summary_rows(result):
        table.add_row(label, format_value(value))
    return table


def summary_rows(result: Summary) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = [
        ("load", result.get("load")),
        ("duration s", result["duration"]),
        ("completed requests", result["completed"]),
        ("failed requests", result["failed"]),
        ("requests/s", result["request_throughput"]),
        ("output tokens/s", result["output_throughput"]),
        ("total tokens/s", result["total_token_throughput"]),
        ("peak output tokens/s", result.get("max_output_tokens_per_s")),
    ]
    if result.get("request_goodput") is not None:
        rows.append(("goodput requests/s", result["request_goodput"]))
    if result.get("cost_per_million_output_tokens") is not None:
        rows.append(
            (
                f"cost per 1M output tokens at {result['price_per_hour']:g}/h",
                result["cost_per_million_output_tokens"],
            )
        )
    if result.get("num_cancelled"):
        rows.append(("cancelled by Ctrl-C", result["num_cancelled"]))
    for status, count in (result.get("errors_by_status") or {}).items():
        rows.append((f"errors: {status}", count))
    for replica, count in (result.get("replicas") or {}).items():
        rows.append((f"served by {replica}", count))
    if result.get("fallback_share") is not None:
        rows.append(("fallback share", result["fallback_share"]))
    return rows


def latency_table(result: Summary) -> Table:
    """Mean, median and each saved percentile of TTFT, TPOT, ITL and E2E latency, in ms."""
    percentiles = saved_percentiles(result)
    table = Table(title="Latency (ms)", title_justify="left")
    table.add_column("metric", style="bold")
    for header in ("mean", "median", *(f"p{p}" for p in percentiles)):
        table.add_column(header, justify="right")
    for name in LATENCY_METRICS:
        keys = ["mean", "median", *(f"p{p}" for p in percentiles)]
        table.add_row(
            LATENCY_NAMES[name], *(format_value(result.get(f"{k}_{name}_ms")) for k in keys)
        )
    return table


def saved_percentiles(result: Summary) -> list[str]:
    """The percentile labels present in ``result`` (``["90", "99"]`` by default)."""
    labels = [
        key[1 : -len("_ttft_ms")]
        for key in result
        if key.startswith("p") and key.endswith("_ttft_ms")
    ]
    return sorted(labels, key=float)


def sweep_table(variable: str, steps: Sequence[Summary]) -> Table:
    """One row per sweep step: load, throughput, goodput, failures, latency p50 and p99 (ms)."""
    table = Table(title=f"Sweep over {variable} (latencies in ms)", title_justify="left")
    columns = (
        ("req/s", "request_throughput"),
        ("out tok/s", "output_throughput"),
        ("goodput", "request_goodput"),
        ("failed", "failed"),
        ("TTFT p50", "median_ttft_ms"),
        ("TTFT p99", "p99_ttft_ms"),
        ("TPOT p50", "median_tpot_ms"),
        ("TPOT p99", "p99_tpot_ms"),
        ("ITL p99", "p99_itl_ms"),
    )
    table.add_column(variable.replace("_", " "), justify="right")
    for header, _ in columns:
        table.add_column(header, justify="right")
    for step in steps:
        cells = [_short(step.get(key)) for _, key in columns]
        table.add_row(f"{step['sweep_value']:g}", *cells)
    return table


def _short(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def compare_table(runs: Sequence[tuple[str, Summary]]) -> Table:
    """Runs side by side; each run after the first also shows its ratio to the first."""
    if len(runs) < 2:
        raise RayfleetError("bench compare needs at least two runs, e.g. compare A.json B.json")
    table = Table(title="Comparison (ratio: run / first run)", title_justify="left")
    table.add_column("metric", style="bold")
    base_name = runs[0][0]
    table.add_column(base_name, justify="right")
    for name, _ in runs[1:]:
        table.add_column(name, justify="right")
        table.add_column("ratio", justify="right")
    base = runs[0][1]
    for key, label, higher_is_better in COMPARED:
        if all(run.get(key) is None for _, run in runs):
            continue
        cells = [format_value(base.get(key))]
        for _, run in runs[1:]:
            cells += [
                format_value(run.get(key)),
                ratio_cell(base.get(key), run.get(key), higher_is_better),
            ]
        table.add_row(label, *cells)
    return table


def ratio(base: object, value: object) -> float | None:
    if not (is_number(base) and is_number(value)) or base == 0:
        return None
    return value / base


def ratio_cell(base: object, value: object, higher_is_better: bool) -> str:
    """``1.23x`` coloured green when better than the first run, red when worse (>2% off)."""
    r = ratio(base, value)
    if r is None:
        return "-"
    better = r > 1.02 if higher_is_better else r < 0.98
    worse = r < 0.98 if higher_is_better else r > 1.02
    colour = "green" if better else "red" if worse else ""
    return f"[{colour}]{r:.2f}x[/]" if colour else f"{r:.2f}x"
