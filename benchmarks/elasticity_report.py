"""The elasticity benchmark's report (elasticity.py): the timeline, the scale-up times
against a bare vLLM start, errors per phase, a plot, and the raw run as JSON.

``report(run, out, plot)`` takes the run as elasticity.py's ``measure`` returns it, with
``bare_start_s`` added: ``marks`` [(phase, perf_counter s)], ``samples`` (one
``/rayfleet/status`` reading a second: ``t_s``, ``target``, ``serving``, ``draining``,
``starting``, ``apps``), ``records`` (one request each: ``phase``, ``start_s``,
``end_s``, ``ok``, ``finished``, ``ttft_s``, ``replica``). Times in the timeline are
seconds from the first phase's start.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

TTFT_WINDOW_S = 5.0
PRINT_EVERY_S = 5.0
GOAL_RATIO = 1.2
# (label, the mark whose instant is the load step, replicas wanted after it)
# (step, the marks that start it: this version's, then older runs', replicas after it)
SCALE_UPS = (("1 -> 2", ("scale-up",), 2), ("2 -> 3", ("scale-up to 3", "8 in flight"), 3))


def percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase_at(marks: list[tuple[str, float]], t_s: float) -> str:
    phases = [p for p, start in marks if start <= t_s and p != "8 in flight"]
    return phases[-1] if phases else "start"


def timeline(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per status sample: load, replicas, TTFT p50 over the last 5 s, errors."""
    marks, records = run["marks"], run["records"]
    t0 = marks[0][1] if marks else 0.0
    rows = []
    for sample in run["samples"]:
        t = sample["t_s"]
        recent = [
            r for r in records if r["ok"] and t - TTFT_WINDOW_S < r["start_s"] + r["ttft_s"] <= t
        ]
        ended = [r for r in records if t - TTFT_WINDOW_S < r["end_s"] <= t]
        rows.append(
            {
                "t_s": round(t - t0, 2),
                "phase": phase_at(marks, t),
                "load": sum(r["start_s"] <= t < r["end_s"] for r in records),
                "target": sample.get("target"),
                "serving": sample.get("serving"),
                "draining": sample.get("draining"),
                "starting": sample.get("starting"),
                "ttft_p50_ms": percentile_ms([r["ttft_s"] for r in recent], 0.5),
                "errors": sum(not r["finished"] and r["end_s"] <= t for r in records),
                "fallback_share": (
                    sum(r["replica"].startswith("fallback:") for r in ended) / len(ended)
                    if ended
                    else 0.0
                ),
            }
        )
    return rows


def scale_ups(run: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each scale-up: the load step, the target's rise and N serving, in timeline s."""
    marks = dict(run["marks"])
    t0 = run["marks"][0][1] if run["marks"] else 0.0
    bare_s = statistics.fmean(run["bare_start_s"])
    out = []
    for label, names, count in SCALE_UPS:
        mark = next((name for name in names if name in marks), None)
        if mark is None:
            continue
        loaded_s = loaded_bare_s(run, label)
        step = marks[mark] - t0
        rise = next(
            (r["t_s"] for r in rows if r["t_s"] >= step and (r["target"] or 0) >= count), None
        )
        serve = next(
            (
                r["t_s"]
                for r in rows
                if rise is not None and r["t_s"] >= rise and (r["serving"] or 0) >= count
            ),
            None,
        )
        to_serve = None if rise is None or serve is None else serve - rise
        out.append(
            {
                "scale": label,
                "load_step_s": round(step, 1),
                "target_rise_s": rise,
                "serving_s": serve,
                "rise_to_serving_s": to_serve,
                "step_to_serving_s": None if serve is None else round(serve - step, 1),
                "ratio_to_bare": None if to_serve is None else to_serve / bare_s,
                "ratio_to_loaded_bare": (
                    None if to_serve is None or not loaded_s else to_serve / loaded_s
                ),
            }
        )
    return out


def loaded_bare_s(run: dict[str, Any], step: str) -> float | None:
    """The bare start under ``step``'s load; older runs timed one, under 1 -> 2's."""
    loaded = run.get("bare_loaded_s")
    return loaded.get(step) if isinstance(loaded, dict) else loaded


def phase_rows(run: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: requests started in it, failed ones, unfinished streams, TTFT, replicas."""
    out = []
    names = [p for p, _ in run["marks"] if p not in ("8 in flight", "end")]
    for name in names:
        records = [r for r in run["records"] if r["phase"] == name]
        during = [r for r in rows if r["phase"] == name]
        serving = [r["serving"] for r in during if r["serving"] is not None]
        ttfts = [r["ttft_s"] for r in records if r["ok"]]
        out.append(
            {
                "phase": name,
                "duration_s": round(during[-1]["t_s"] - during[0]["t_s"], 1) if during else 0.0,
                "requests": len(records),
                "failed": sum(not r["ok"] for r in records),
                "unfinished": sum(r["ok"] and not r["finished"] for r in records),
                "ttft_p50_ms": percentile_ms(ttfts, 0.5),
                "ttft_p99_ms": percentile_ms(ttfts, 0.99),
                "serving": f"{min(serving)}-{max(serving)}" if serving else "-",
            }
        )
    return out


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(run: dict[str, Any], ups: list[dict[str, Any]], phases: list[dict[str, Any]]) -> str:
    bare = ", ".join(f"{s:.1f}" for s in run["bare_start_s"])
    lines = [
        f"Bare vLLM server start (tiny model, start to /health): under the 1 -> 2 step's "
        f"load {fmt(loaded_bare_s(run, '1 -> 2'))} s, the 2 -> 3 step's "
        f"{fmt(loaded_bare_s(run, '2 -> 3'))} s; on the idle machine {bare} s "
        f"(mean {statistics.fmean(run['bare_start_s']):.1f} s)",
        "",
        "| scale-up | target rise to N serving (s) | load step to N serving (s) "
        "| ÷ bare start under load | ÷ bare start idle | goal ≤ 1.2x (under load) |",
        "|---|---|---|---|---|---|",
    ]
    for u in ups:
        ratio = u["ratio_to_loaded_bare"]
        verdict = "-" if ratio is None else ("PASS" if ratio <= GOAL_RATIO else "FAIL")
        lines.append(
            f"| {u['scale']} | {fmt(u['rise_to_serving_s'])} | {fmt(u['step_to_serving_s'])} "
            f"| {fmt(ratio, '.2f')}x | {fmt(u['ratio_to_bare'], '.2f')}x | {verdict} |"
        )
    lines += [
        "",
        "| phase | s | requests | failed | streams cut | TTFT p50 ms | TTFT p99 ms | serving |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        lines.append(
            f"| {p['phase']} | {p['duration_s']:.0f} | {p['requests']} | {p['failed']} "
            f"| {p['unfinished']} | {fmt(p['ttft_p50_ms'], '.0f')} "
            f"| {fmt(p['ttft_p99_ms'], '.0f')} | {p['serving']} |"
        )
    return "\n".join(lines)


def print_timeline(rows: list[dict[str, Any]]) -> None:
    print(
        "\n    t  phase         load target serving draining starting TTFT p50 ms errors fallback"
    )
    next_t = -1e9
    for r in rows:
        if r["t_s"] < next_t:
            continue
        next_t = r["t_s"] + PRINT_EVERY_S
        print(
            f"{r['t_s']:5.0f}  {r['phase']:13s} {r['load']:4d} {fmt(r['target'], 'd'):>6s} "
            f"{fmt(r['serving'], 'd'):>7s} {fmt(r['draining'], 'd'):>8s} "
            f"{fmt(r['starting'], 'd'):>8s} {fmt(r['ttft_p50_ms'], '.0f'):>11s} "
            f"{r['errors']:6d} {r['fallback_share']:8.0%}"
        )


def column(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [math.nan if r[key] is None else r[key] for r in rows]


def save_plot(rows: list[dict[str, Any]], marks: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = marks[0][1] if marks else 0.0
    t = [r["t_s"] for r in rows]
    fig, (ax_load, ax_replicas, ax_ttft) = plt.subplots(3, 1, sharex=True, figsize=(10, 7))
    ax_load.step(t, column(rows, "load"), where="post", color="tab:gray")
    ax_load.set_ylabel("requests in flight")
    ax_replicas.step(t, column(rows, "target"), where="post", label="target", color="tab:orange")
    ax_replicas.step(t, column(rows, "serving"), where="post", label="serving", color="tab:blue")
    ax_replicas.step(
        t, column(rows, "draining"), where="post", label="draining", color="tab:red", alpha=0.6
    )
    ax_replicas.set_ylabel("replicas")
    ax_replicas.legend(loc="upper right")
    ax_ttft.plot(t, column(rows, "ttft_p50_ms"), color="tab:green")
    ax_ttft.set_ylabel(f"TTFT p50, last {TTFT_WINDOW_S:.0f} s (ms)")
    ax_ttft.set_xlabel("seconds")
    for name, start in marks:
        if name in ("end", "8 in flight"):
            continue
        for ax in (ax_load, ax_replicas, ax_ttft):
            ax.axvline(start - t0, color="black", linewidth=0.5, linestyle=":")
        ax_load.annotate(
            name, (start - t0, 1), xycoords=("data", "axes fraction"), fontsize=8, va="top"
        )
    fig.suptitle("tiny model, autoscaling 1..3, target load 3 per replica")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def report(run: dict[str, Any], out: Path, plot: Path) -> None:
    rows = timeline(run)
    ups = scale_ups(run, rows)
    phases = phase_rows(run, rows)
    print_timeline(rows)
    print()
    print(markdown(run, ups, phases))
    errors = Counter(f"{r['phase']}: {r['error'][:160]}" for r in run["records"] if not r["ok"])
    for error, count in errors.most_common(8):
        print(f"{count} x {error}")
    if run.get("incomplete"):
        print(f"\nincomplete: {run['incomplete']}")
    save_plot(rows, run["marks"], plot)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"scale_ups": ups, "phases": phases, "timeline": rows}
    out.write_text(json.dumps({**summary, **run}, indent=1, default=str))
    print(f"\nwrote {out} and {plot}")
