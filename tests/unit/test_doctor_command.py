"""The CLI around the doctor: errors, JSON shape, the command to run again (no Ray)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from rayfleet.doctor.report import rerun_command, summary, to_json
from rayfleet.doctor.result import CheckResult, Node, Status
from rayfleet.doctor.runner import DoctorReport


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rayfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_no_cluster_at_the_address_is_one_line_in_seconds():
    port = free_port()
    started = time.monotonic()
    done = rayfleet("doctor", "--address", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 20
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"no Ray cluster at '127.0.0.1:{port}'" in lines[0] and "ray start --head" in lines[0]


def test_bad_fleet_file_is_one_line(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("models:\n  - name: x\n    source: /m\n    replica: 2\n")
    done = rayfleet("doctor", "-c", str(bad))
    assert done.returncode == 2
    assert "did you mean 'replicas'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_help_does_not_import_ray():
    code = (
        "import sys; from rayfleet.cli import app; from typer.testing import CliRunner; "
        "CliRunner().invoke(app, ['doctor', '--help']); "
        "print(sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.check_output([sys.executable, "-c", code], text=True)
    assert out.strip() == "[]"


def test_json_report_and_rerun():
    node = Node("f" * 56, "10.0.0.1", True, 0, 4)
    report = DoctorReport(
        "auto",
        [node],
        [
            CheckResult(node.label, "shm", Status.OK, "/dev/shm 16.0 GiB", "", node.node_id),
            CheckResult(
                node.label,
                "nccl",
                Status.FAIL,
                "NCCL_SOCKET_IFNAME=x matches no interface",
                "set it",
                node.node_id,
            ),
        ],
    )
    rerun = rerun_command("ray://head:10001", "my fleet.yaml")
    assert rerun == "rayfleet doctor --address ray://head:10001 -c 'my fleet.yaml'"
    data = to_json(report, rerun)
    assert data["ok"] is False and report.failed
    assert data["summary"] == summary(report) == "1 node: 1 failed, 0 warnings, 1 ok"
    assert data["results"][1] == {
        "node": "10.0.0.1 ffffff (head)",
        "check": "nccl",
        "status": "fail",
        "value": report.results[1].value,
        "fix": "set it",
        "node_id": node.node_id,
    }
