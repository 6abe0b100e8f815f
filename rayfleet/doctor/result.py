"""What a check returns, and the nodes it is about."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """``fail`` makes ``rayfleet doctor`` exit 1; ``info`` is a fact, not a problem."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Node:
    """A Ray node as the doctor sees it when the run starts."""

    node_id: str
    ip: str
    is_head: bool
    num_gpus: float = 0.0
    num_cpus: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.ip} {self.node_id[:6]}" + (" (head)" if self.is_head else "")


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: what was checked where, what was measured, and the fix."""

    node: str
    check: str
    status: Status
    value: str
    fix: str = ""
    node_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


def result_for(node: Node, check: str, status: Status, value: str, fix: str = "") -> CheckResult:
    return CheckResult(node.label, check, status, value, fix, node.node_id)


def cluster_result(check: str, status: Status, value: str, fix: str = "") -> CheckResult:
    return CheckResult("cluster", check, status, value, fix)
