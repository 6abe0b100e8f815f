"""``rayfleet doctor`` on real multi-node Ray clusters started on this machine.

Faults are put where they happen in life: in one node's environment (a stray copy of a
package on its PYTHONPATH, a wrong NCCL_SOCKET_IFNAME, a HOME without the model, Ray
started with GPUs the node does not have), in a busy port, in a node that freezes, and in
a node killed while the doctor runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from rayfleet.cluster import connected, niced_warning, niced_workers
from rayfleet.config import load_fleet
from rayfleet.doctor.result import Status
from rayfleet.doctor.runner import DoctorOptions, run_doctor

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SMALL_LINKS = dict(net_max_s=0.5, net_max_bytes=64 * 1024**2)


UNNICED = {"RAY_worker_niceness": "0"}  # as the doctor's fix says; Ray's default is 15


def start_cluster(workers: list[dict], head_env: dict | None = None) -> tuple[Cluster, list]:
    """A head and one raylet per entry of ``workers`` (keyword arguments of ``add_node``),
    each with its Ray workers at niceness 0 unless its ``env_vars`` say otherwise."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "env_vars": {**UNNICED, **(head_env or {})},
        },
    )
    try:
        nodes = [
            cluster.add_node(
                **{"num_cpus": 1, **args, "env_vars": {**UNNICED, **args.get("env_vars", {})}}
            )
            for args in workers
        ]
        cluster.wait_for_nodes()
    except Exception:
        cluster.shutdown()
        raise
    return cluster, nodes


def stray_vllm(root: Path, version: str = "0.0.1") -> Path:
    """A directory laid out like `pip install --target` of another vLLM release."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


def write_fleet(path: Path, source: str, gateway_port: int, **model) -> Path:
    extra = "".join(f"    {k}: {v}\n" for k, v in model.items())
    path.write_text(
        "cluster:\n  address: auto\n"
        f"gateway:\n  host: 127.0.0.1\n  port: {gateway_port}\n"
        f"models:\n  - name: tiny\n    source: {source}\n{extra}"
    )
    return path


def rows(report, check: str, node_id: str | None = None):
    return [
        r for r in report.results if r.check == check and (node_id is None or r.node_id == node_id)
    ]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """Head with the model in its HOME; 'stray' sees vLLM 0.0.1 and a bogus NCCL interface;
    'bare' has a HOME without the model, was started with a GPU it does not have, and runs
    its Ray workers at Ray's default niceness."""
    base = tmp_path_factory.mktemp("faulty")
    head_home, bare_home = base / "head-home", base / "bare-home"
    model = head_home / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    bare_home.mkdir()
    stray = stray_vllm(base / "stray-site")
    cluster, (stray_node, bare_node) = start_cluster(
        head_env={"HOME": str(head_home)},
        workers=[
            {
                "env_vars": {
                    "HOME": str(head_home),
                    "PYTHONPATH": str(stray),
                    "NCCL_SOCKET_IFNAME": "bogus0",
                }
            },
            {"env_vars": {"HOME": str(bare_home), "RAY_worker_niceness": "15"}, "num_gpus": 1},
        ],
    )
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    try:
        yield {
            "cluster": cluster,
            "base": base,
            "busy_port": busy.getsockname()[1],
            "head": cluster.head_node.node_id,
            "stray": stray_node.node_id,
            "bare": bare_node.node_id,
        }
    finally:
        busy.close()
        cluster.shutdown()


@pytest.fixture(scope="module")
def faulty_report(faulty, tmp_path_factory):
    home = tmp_path_factory.mktemp("rayfleet-home")
    fleet_yaml = write_fleet(
        faulty["base"] / "fleet.yaml",
        "~/models/tiny",
        faulty["busy_port"],
        engine_args="{tensor_parallel_size: 2}",
    )
    old = os.environ.get("RAYFLEET_HOME")
    os.environ["RAYFLEET_HOME"] = str(home)
    try:
        report = run_doctor(
            DoctorOptions(address=faulty["cluster"].address, **SMALL_LINKS), load_fleet(fleet_yaml)
        )
    finally:
        if old is None:
            os.environ.pop("RAYFLEET_HOME")
        else:
            os.environ["RAYFLEET_HOME"] = old
    return report


def test_stray_package_version_fails_only_on_its_node(faulty, faulty_report):
    [stray] = rows(faulty_report, "versions", faulty["stray"])
    assert stray.status is Status.FAIL
    assert "vllm 0.0.1 (head 0.32.0)" in stray.value
    assert str(faulty["base"] / "stray-site" / "vllm") in stray.fix
    for other in (faulty["head"], faulty["bare"]):
        [row] = rows(faulty_report, "versions", other)
        assert row.status is Status.OK and "vllm 0.32.0" in row.value


def test_wrong_socket_ifname_fails_on_its_node(faulty, faulty_report):
    [bad] = rows(faulty_report, "nccl", faulty["stray"])
    assert bad.status is Status.FAIL
    assert "NCCL_SOCKET_IFNAME=bogus0 matches no interface" in bad.value
    assert "lo" in bad.value
    assert {r.status for r in rows(faulty_report, "nccl") if r.node_id != faulty["stray"]} == {
        Status.OK
    }


def test_model_missing_on_one_node(faulty, faulty_report):
    for node in (faulty["head"], faulty["stray"]):
        [row] = rows(faulty_report, "model tiny", node)
        assert row.status is Status.OK
        assert row.value == str(faulty["base"] / "head-home" / "models" / "tiny")
    [missing] = rows(faulty_report, "model tiny", faulty["bare"])
    assert missing.status is Status.FAIL
    assert missing.value == f"{faulty['base'] / 'bare-home' / 'models' / 'tiny'} does not exist"


def test_gpu_claimed_by_ray_but_absent(faulty, faulty_report):
    [bare] = rows(faulty_report, "gpus", faulty["bare"])
    assert bare.status is Status.FAIL and "Ray 1" in bare.value
    [head] = rows(faulty_report, "gpus", faulty["head"])
    assert head.status is Status.OK and head.value == "no GPU (CPU node)"


def test_niced_ray_workers_warn_on_their_node_only(faulty, faulty_report):
    [niced] = rows(faulty_report, "worker niceness", faulty["bare"])
    assert niced.status is Status.WARN
    assert niced.value.startswith("Ray workers run at niceness 15: ")
    assert "RAY_worker_niceness=0 ray start" in niced.fix
    for node in (faulty["head"], faulty["stray"]):
        [row] = rows(faulty_report, "worker niceness", node)
        assert (row.status, row.value) == (Status.OK, "Ray workers run at niceness 0")


def test_up_names_the_nodes_whose_ray_workers_run_niced(faulty, faulty_report):
    """What ``rayfleet up`` says on joining this cluster (rayfleet.cluster.niced_warning)."""
    with connected(faulty["cluster"].address, hint="test"):
        niced = niced_workers()
        assert {node: value for node, (_ip, value) in niced.items()} == {faulty["bare"]: 15}
        line = niced_warning()
    assert line is not None
    assert f"(node {faulty['bare'][:8]}) at 15" in line
    assert "RAY_worker_niceness=0 ray start" in line
    assert faulty["head"][:8] not in line and faulty["stray"][:8] not in line


def test_busy_gateway_port_fails_on_the_head_only(faulty, faulty_report):
    port_rows = rows(faulty_report, f"port {faulty['busy_port']}")
    assert [(r.node_id, r.status) for r in port_rows] == [(faulty["head"], Status.FAIL)]
    assert f"pid {os.getpid()}" in port_rows[0].value


def test_shm_and_disk_measured_on_every_node(faulty, faulty_report):
    for check in ("shm", "disk"):
        assert {r.node_id for r in rows(faulty_report, check)} == {
            faulty["head"],
            faulty["stray"],
            faulty["bare"],
        }
    shm = os.statvfs("/dev/shm")
    expected = f"/dev/shm {shm.f_blocks * shm.f_frsize / 1024**3:.1f} GiB"
    assert {r.value.split(";")[0] for r in rows(faulty_report, "shm")} == {expected}


def test_links_measured_between_every_pair_and_saved(faulty, faulty_report):
    links = rows(faulty_report, "network")
    assert len(links) == 3
    assert all(r.status in (Status.OK, Status.WARN) for r in links)
    assert all(link.gbps > 0.05 and 0 < link.rtt_ms < 50 for link in faulty_report.links)
    saved = json.loads(Path(faulty_report.network_file).read_text())
    assert set(saved) == {"measured_at", "pairs"}
    pairs = {frozenset((p["src_node"], p["dst_node"])) for p in saved["pairs"]}
    ids = [faulty["head"], faulty["stray"], faulty["bare"]]
    assert pairs == {frozenset((a, b)) for i, a in enumerate(ids) for b in ids[i + 1 :]}
    for pair in saved["pairs"]:
        assert set(pair) == {"src_node", "dst_node", "src_ip", "dst_ip", "gbps", "rtt_ms"}
        assert pair["gbps"] > 0.05
    assert faulty_report.failed


def test_cli_json_and_exit_code(faulty, tmp_path):
    fleet_yaml = write_fleet(tmp_path / "fleet.yaml", "~/models/tiny", faulty["busy_port"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayfleet.cli",
            "doctor",
            "--address",
            faulty["cluster"].address,
            "-c",
            str(fleet_yaml),
            "--json",
            "--net-max-s",
            "0.5",
            "--net-max-mib",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "RAYFLEET_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert len(report["nodes"]) == 3
    failed = {(r["node_id"], r["check"]) for r in report["results"] if r["status"] == "fail"}
    assert (faulty["stray"], "versions") in failed
    assert (faulty["bare"], "model tiny") in failed
    assert report["rerun"].startswith(f"rayfleet doctor --address {faulty['cluster'].address}")
    assert (tmp_path / "home" / "doctor" / "network.json").is_file()


def test_frozen_node_is_a_failure_not_a_hang(tmp_path):
    cluster, [worker] = start_cluster(workers=[{}])
    raylet = worker.all_processes["raylet"][0].process
    head_id = cluster.head_node.node_id
    try:
        os.kill(raylet.pid, signal.SIGSTOP)
        started = time.monotonic()
        report = run_doctor(DoctorOptions(address=cluster.address, timeout_s=5, **SMALL_LINKS))
        elapsed_s = time.monotonic() - started
    finally:
        os.kill(raylet.pid, signal.SIGCONT)
        cluster.shutdown()
    assert elapsed_s < 30
    [frozen] = rows(report, "node", worker.node_id)
    assert frozen.status is Status.FAIL and frozen.value == "did not answer within 5 s"
    assert {r.status for r in report.results if r.node_id == head_id} == {Status.OK}
    [cpu_only] = [r for r in rows(report, "gpus") if r.node == "cluster"]
    assert cpu_only.status is Status.INFO and cpu_only.value.startswith("CPU-only cluster")
    assert rows(report, "network") == []  # nothing to pair the head with


def test_node_killed_during_the_run(tmp_path):
    cluster, (victim, _) = start_cluster(workers=[{}, {}])
    victim_id = victim.node_id
    doctor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayfleet.cli",
            "doctor",
            "--address",
            cluster.address,
            "--json",
            "--net-max-s",
            "2",
            "--net-max-mib",
            "100000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "RAYFLEET_HOME": str(tmp_path / "home")},
    )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        wait_for_link_peer(victim_id, timeout_s=120)
        cluster.remove_node(victim, allow_graceful=False)
        started = time.monotonic()
        out, err = doctor.communicate(timeout=120)
        after_kill_s = time.monotonic() - started
    finally:
        if doctor.poll() is None:
            doctor.kill()
            doctor.wait()
        ray.shutdown()
        cluster.shutdown()
    assert doctor.returncode == 1, err[-2000:]
    assert after_kill_s < 60
    report = json.loads(out)
    victim_fails = [
        r
        for r in report["results"]
        if r["status"] == "fail" and (r["node_id"] == victim_id or victim_id[:6] in r["node"])
    ]
    assert victim_fails, report["results"]
    assert any(r["check"] in ("network", "node") for r in victim_fails)
    survivors = [n["node_id"] for n in report["nodes"] if n["node_id"] != victim_id]
    for node_id in survivors:
        assert {r["status"] for r in report["results"] if r["node_id"] == node_id} <= {"ok"}


def wait_for_link_peer(node_id: str, timeout_s: float) -> None:
    """Until the doctor's link-test actor runs on ``node_id`` (read from Ray's actor table)."""
    from ray._private import state

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for actor in state.actors().values():
            if (
                actor.get("ActorClassName", "").endswith("LinkPeer")
                and actor.get("State") == "ALIVE"
                and actor.get("Address", {}).get("NodeID") == node_id
            ):
                return
        time.sleep(0.05)
    raise AssertionError(f"no LinkPeer actor came up on {node_id} within {timeout_s} s")
