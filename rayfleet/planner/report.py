"""A Plan for people (rich tables) and for machines (JSON)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from rayfleet.planner.layout import Layout
from rayfleet.planner.plan import Plan

MAX_TABLE_ROWS = 6


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)


def print_plan(plan: Plan, console: Console) -> None:
    """The readable report: verdict, model, layouts, reasons."""
    console.print(_verdict(plan))
    console.print(_model_table(plan))
    layouts = ([plan.chosen] if plan.chosen else []) + plan.alternatives[: MAX_TABLE_ROWS - 1]
    if layouts:
        console.print(_layout_table(layouts, chosen=plan.chosen))
    for note in plan.hardware.notes:
        console.print(f"[dim]cluster:[/] {note}", highlight=False)
    console.print("[bold]Why[/]")
    for reason in plan.reasons:
        console.print(f"  - {reason}", highlight=False, soft_wrap=True)


def _verdict(plan: Plan) -> str:
    return f"[bold {'green' if plan.fits else 'red'}]{plan.verdict}[/]"


def _model_table(plan: Plan) -> Table:
    model = plan.to_dict()["model"]
    table = Table(title=f"Model {model['name']}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("parameters", f"{model['parameters'] / 1e9:.3f}B"),
        ("layers / hidden", f"{model['layers']} / {model['hidden_size']}"),
        (
            "attention",
            f"{model['attention']}: {model['attention_heads']} heads, "
            f"{model['kv_heads']} KV heads, head_dim {model['head_dim']}",
        ),
        (
            "weights",
            f"{model['weight_format']} ({model['dtype']} activations), "
            f"{model['weights_gib']:.2f} GiB",
        ),
        ("KV cache per token", f"{model['kv_bytes_per_token'] / 1024:.1f} KiB"),
        ("max context", f"{model['max_context']:,}"),
    ]
    if model["experts"]:
        rows.append(("experts", f"{model['experts']} ({model['experts_per_token']} per token)"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _layout_table(layouts: list[Layout], chosen: Layout | None) -> Table:
    table = Table(
        title="Layouts (first is chosen; GPUs, nodes, KV tokens and seqs per replica; "
        "GiB per GPU; comm us per token)",
        title_justify="left",
    )
    for header in (
        "TP",
        "PP",
        "GPUs",
        "nodes",
        "replicas",
        "weights GiB",
        "KV GiB",
        "KV tokens",
        "seqs",
        "comm us",
        "Ray",
    ):
        table.add_column(header, justify="right")
    for layout in layouts:
        style = "bold green" if layout is chosen else None
        table.add_row(
            str(layout.tensor_parallel),
            str(layout.pipeline_parallel),
            str(layout.gpus_per_replica),
            str(layout.nodes_per_replica),
            str(layout.replicas),
            f"{layout.weights_gib_per_gpu:.2f}",
            f"{layout.kv_cache_gib_per_gpu:.2f}",
            f"{layout.kv_tokens_per_replica:,}",
            str(layout.max_concurrent_seqs),
            f"{layout.comm_us_per_token:.2f}",
            "needed" if layout.needs_ray else "optional",
            style=style,
        )
    return table
