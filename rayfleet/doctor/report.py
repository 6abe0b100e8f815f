"""The doctor's report: a table for people, JSON for machines, and the command to run again."""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from rayfleet.doctor.result import Status
from rayfleet.doctor.runner import DoctorReport

STYLE = {Status.OK: "green", Status.INFO: "cyan", Status.WARN: "yellow", Status.FAIL: "bold red"}


def rerun_command(address: str, config: str | None) -> str:
    words = ["rayfleet", "doctor", "--address", address]
    if config:
        words += ["-c", config]
    return shlex.join(words)


def summary(report: DoctorReport) -> str:
    counts = Counter(r.status for r in report.results)
    num_nodes = len(report.nodes)
    return (
        f"{num_nodes} node{'' if num_nodes == 1 else 's'}: {counts[Status.FAIL]} failed, "
        f"{counts[Status.WARN]} warnings, {counts[Status.OK]} ok"
    )


def print_table(report: DoctorReport, rerun: str, console: Console) -> None:
    table = Table(show_lines=False, header_style="bold")
    for column in ("node", "check", "status", "value", "fix"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        table.add_row(r.node, r.check, f"[{STYLE[r.status]}]{r.status.value}[/]", r.value, r.fix)
    console.print(table)
    if report.network_file:
        console.print(f"link measurements saved to {report.network_file}", highlight=False)
    console.print(summary(report), highlight=False)
    console.print(f"run again: {rerun}", highlight=False)


def to_json(report: DoctorReport, rerun: str) -> dict[str, Any]:
    return {
        "address": report.address,
        "ok": not report.failed,
        "summary": summary(report),
        "nodes": [
            {
                "node_id": n.node_id,
                "ip": n.ip,
                "is_head": n.is_head,
                "label": n.label,
                "num_gpus": n.num_gpus,
                "num_cpus": n.num_cpus,
            }
            for n in report.nodes
        ],
        "results": [r.to_dict() for r in report.results],
        "network_file": report.network_file,
        "rerun": rerun,
    }
