"""The doctor's checks on facts as nodes report them (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfleet.config import load_fleet
from rayfleet.doctor import checks, gpus
from rayfleet.doctor.checks import judge_nccl, judge_niceness, judge_shm, match_interfaces
from rayfleet.doctor.context import Context
from rayfleet.doctor.gpus import judge_gpus
from rayfleet.doctor.needs import FleetNeeds, ModelNeed, fleet_needs
from rayfleet.doctor.probe import parse_nvidia_smi
from rayfleet.doctor.result import Node, Status

GIB = 1024**3
# What `nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader,nounits`
# printed on a lent H200 machine.
H200_SMI = "0, NVIDIA H200, GPU-f04ba111-8335-6cdd-a8a7-2dcb67e5edb1, 143771\n"


def make_node(node_id: str = "a" * 56, is_head: bool = True, num_gpus: float = 0) -> Node:
    return Node(node_id=node_id, ip="10.0.0.1", is_head=is_head, num_gpus=num_gpus, num_cpus=8)


def make_facts(vllm: str | None = "0.32.0", location: str = "/site/vllm", **parts) -> dict:
    facts = {
        "versions": {
            "python": {"version": "3.11.7", "location": "/usr/bin/python"},
            "ray": {"version": "2.60.0", "location": "/site/ray"},
            "vllm": {"version": vllm, "location": location if vllm else None},
            "torch": {"version": "2.13.0", "location": "/site/torch"},
            "rayfleet": {"version": "0.1.0", "location": "/site/rayfleet"},
        },
        "gpus": {
            "nvidia_smi": {"found": False, "gpus": [], "error": None},
            "driver_gpus": 0,
            "device_files": 0,
            "cuda_visible_devices": None,
        },
        "shm": {"path": "/dev/shm", "total_bytes": 16 * GIB, "free_bytes": 16 * GIB},
        "nccl": {"env": {}, "interfaces": ["eth0", "lo"], "ib_devices": []},
        "disk": [{"path": "/hf", "free_bytes": 100 * GIB, "total_bytes": 200 * GIB}],
        "models": [],
        "ports": [],
        "workers": {"niceness": 0},
    }
    facts.update(parts)
    return facts


def h200(count: int = 1) -> dict:
    return {"found": True, "gpus": parse_nvidia_smi(H200_SMI * count), "error": None}


def test_parse_real_nvidia_smi_line():
    assert parse_nvidia_smi(H200_SMI + "garbage line\n") == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-f04ba111-8335-6cdd-a8a7-2dcb67e5edb1",
            "memory_mib": 143771,
        }
    ]


@pytest.mark.parametrize(
    "ray_gpus, cuda_visible, status, fix_part",
    [
        (1, None, Status.OK, ""),
        (1, "0", Status.OK, ""),
        (0, None, Status.FAIL, "--gpus all"),
        (0, "", Status.FAIL, "CUDA_VISIBLE_DEVICES hides every GPU"),
        (2, None, Status.FAIL, "--num-gpus 1"),
        (1, "", Status.FAIL, "CUDA_VISIBLE_DEVICES=''"),
    ],
)
def test_gpus_seen_by_os_against_ray(ray_gpus, cuda_visible, status, fix_part):
    got, value, fix = judge_gpus(
        h200(), driver_gpus=1, cuda_visible=cuda_visible, ray_gpus=ray_gpus
    )
    assert got is status
    assert "OS 1 (NVIDIA H200)" in value and f"Ray {ray_gpus}" in value
    assert fix_part in fix


def test_ray_using_fewer_gpus_than_visible_is_a_warning():
    status, _, fix = judge_gpus(h200(8), driver_gpus=8, cuda_visible=None, ray_gpus=4)
    assert status is Status.WARN and "--num-gpus 8" in fix


def test_container_without_gpus_fails_with_the_container_hint():
    no_smi = {"found": False, "gpus": [], "error": None}
    status, value, fix = judge_gpus(no_smi, driver_gpus=4, cuda_visible=None, ray_gpus=0)
    assert status is Status.FAIL and "host driver has 4 GPUs" in value
    assert "--gpus all" in fix and "NVIDIA container runtime" in fix
    broken = {"found": True, "gpus": [], "error": "NVIDIA-SMI has failed"}
    assert judge_gpus(broken, 4, None, 0)[0] is Status.FAIL


def test_cpu_node_is_fine_and_cpu_cluster_is_an_info_line():
    assert judge_gpus({"found": False, "gpus": []}, 0, None, 0) == (
        Status.OK,
        "no GPU (CPU node)",
        "",
    )
    ctx = Context(nodes=[make_node()], facts={"a" * 56: make_facts()})
    [line] = gpus.check_gpus_cluster(ctx)
    assert (line.node, line.status) == ("cluster", Status.INFO)
    gpu_fleet = FleetNeeds(models=[ModelNeed("big", "/m", True, 2, False)], given=True)
    [line] = gpus.check_gpus_cluster(Context([make_node()], {}, gpu_fleet))
    assert line.status is Status.FAIL and "big" in line.value


def test_ray_claiming_gpus_on_a_gpu_less_node_fails():
    status, value, fix = judge_gpus({"found": False, "gpus": []}, 0, None, 2)
    assert status is Status.FAIL and "--num-gpus" in fix and "Ray 2" in value


@pytest.mark.parametrize(
    "total, parallel, status",
    [
        (64 * 1024**2, ["tp2"], Status.FAIL),
        (64 * 1024**2, [], Status.WARN),
        (4 * GIB, ["tp2"], Status.WARN),
        (16 * GIB, ["tp2"], Status.OK),
        (None, ["tp2"], Status.FAIL),
    ],
)
def test_shm(total, parallel, status):
    got, value, fix = judge_shm(total, parallel)
    assert got is status
    if status is not Status.OK:
        assert "--ipc host" in fix and "--shm-size" in fix
    if total == 64 * 1024**2:
        assert value.startswith("/dev/shm 64 MiB")


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("eth", ["eth0", "eth1"]),
        ("=eth0", ["eth0"]),
        ("=eth", []),
        ("^lo,docker", ["eth0", "eth1", "ib0"]),
        ("^=eth0", ["docker0", "eth1", "ib0", "lo"]),
        ("ib,eth1", ["eth1", "ib0"]),
        ("bogus0", []),
    ],
)
def test_nccl_socket_ifname_matching(spec, expected):
    assert match_interfaces(spec, ["docker0", "eth0", "eth1", "ib0", "lo"]) == expected


def test_nccl_verdicts():
    ok = judge_nccl(
        {"env": {"NCCL_SOCKET_IFNAME": "eth"}, "interfaces": ["eth0", "lo"], "ib_devices": []}, 0
    )
    assert ok[0] is Status.OK and "NCCL_SOCKET_IFNAME=eth" in ok[1]
    bad = judge_nccl(
        {"env": {"GLOO_SOCKET_IFNAME": "ens5"}, "interfaces": ["eth0", "lo"], "ib_devices": []}, 0
    )
    assert bad[0] is Status.FAIL and "eth0" in bad[2]
    ib_off = judge_nccl(
        {"env": {"NCCL_IB_DISABLE": "1"}, "interfaces": ["ib0"], "ib_devices": ["mlx5_0"]}, 8
    )
    assert ib_off[0] is Status.WARN and "IB: mlx5_0" in ib_off[1]
    p2p_off = judge_nccl({"env": {"NCCL_P2P_DISABLE": "1"}, "interfaces": [], "ib_devices": []}, 8)
    assert p2p_off[0] is Status.WARN


def test_versions_against_the_head():
    head, worker = make_node("h" * 56), make_node("w" * 56, is_head=False)
    ctx = Context(
        [head, worker],
        {head.node_id: make_facts(), worker.node_id: make_facts("0.0.1", "/opt/stray/vllm")},
    )
    [same] = checks.check_versions(head, ctx.facts[head.node_id], ctx)
    assert same.status is Status.OK and "vllm 0.32.0" in same.value
    [differs] = checks.check_versions(worker, ctx.facts[worker.node_id], ctx)
    assert differs.status is Status.FAIL
    assert differs.value == "vllm 0.0.1 (head 0.32.0)"
    assert "/opt/stray/vllm" in differs.fix and "vllm==0.32.0" in differs.fix
    ctx.facts[worker.node_id] = make_facts(None)
    [missing] = checks.check_versions(worker, ctx.facts[worker.node_id], ctx)
    assert missing.status is Status.FAIL and missing.value == "vllm missing (head 0.32.0)"


def test_python_patch_difference_is_a_warning_minor_a_failure():
    assert checks.compare_versions("python", "3.11.9", "3.11.7", needed=True) is Status.WARN
    assert checks.compare_versions("python", "3.12.1", "3.11.7", needed=True) is Status.FAIL
    assert checks.compare_versions("vllm", None, None, needed=False) is Status.WARN
    assert checks.compare_versions("vllm", None, None, needed=True) is Status.FAIL


def test_a_broken_probe_part_becomes_a_failed_line_not_a_crash():
    node = make_node()
    facts = make_facts(shm={"error": "PermissionError: /dev/shm"}, disk={"error": "boom"})
    ctx = Context([node], {node.node_id: facts})
    by_check = {r.check: r for r in checks.run_node_checks(node, facts, ctx)}
    assert by_check["shm"].status is Status.FAIL
    assert by_check["shm"].value == "could not check: PermissionError: /dev/shm"
    assert by_check["disk"].status is Status.FAIL
    assert by_check["versions"].status is Status.OK


def test_disk_thresholds():
    node = make_node()
    for free, status in ((1 * GIB, Status.FAIL), (10 * GIB, Status.WARN), (50 * GIB, Status.OK)):
        facts = make_facts(disk=[{"path": "/hf", "free_bytes": free, "total_bytes": 100 * GIB}])
        [line] = checks.check_disk(node, facts, Context([node], {}))
        assert line.status is status


def write_fleet(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(body)
    return path


def test_fleet_needs_from_a_real_fleet_yaml(tmp_path):
    fleet = load_fleet(
        write_fleet(
            tmp_path,
            """
gateway: {port: 8123}
models:
  - name: small
    source: /models/small
  - name: tp-cpu
    source: /models/tp
    engine_args: {tensor_parallel_size: 2}
  - name: big
    source: org/big-model
    num_gpus: 8
    nodes_per_replica: 2
    engine_args: {tensor_parallel_size: 8, pipeline_parallel_size: 2}
""",
        )
    )
    gpu_nodes = [
        make_node("a" * 56, num_gpus=8),
        make_node("b" * 56, False, num_gpus=8),
        make_node("c" * 56, False),
    ]
    needs = fleet_needs(fleet, gpu_nodes)
    assert needs.gateway_port == 8123
    assert needs.parallel_models == ["tp-cpu", "big"]
    assert needs.cross_node_models == ["big"]  # 16 GPUs, 8 per node; CPU TP stays on one node
    assert needs.gpu_models == ["big"]
    big = needs.models[2]
    assert [n.node_id[0] for n in needs.hosts_for(big, gpu_nodes)] == ["a", "b"]
    assert len(needs.hosts_for(needs.models[0], gpu_nodes)) == 3


def test_model_presence_and_ports_lines(tmp_path):
    fleet = load_fleet(write_fleet(tmp_path, "models:\n  - {name: m, source: ~/m}\n"))
    node = make_node()
    needs = fleet_needs(fleet, [node])
    facts = make_facts(
        models=[
            {
                "name": "m",
                "source": "~/m",
                "kind": "path",
                "present": False,
                "detail": "/home/x/m does not exist",
            }
        ],
        ports=[
            {"port": 8000, "free": False, "detail": "Address in use", "holder": "pid 7 (nginx)"}
        ],
    )
    ctx = Context([node], {node.node_id: facts}, needs)
    [model] = checks.check_models(node, facts, ctx)
    assert model.status is Status.FAIL and "copy the model to ~/m" in model.fix
    [port] = checks.check_ports(node, facts, ctx)
    assert port.status is Status.FAIL and port.value == "in use, held by pid 7 (nginx)"


@pytest.mark.parametrize(
    ("niceness", "status"), [(0, Status.OK), (-5, Status.OK), (15, Status.WARN)]
)
def test_niced_ray_workers_are_a_warning_with_the_start_flag(niceness, status):
    got, value, fix = judge_niceness(niceness)
    assert got is status
    assert value.startswith(f"Ray workers run at niceness {niceness}")
    assert ("RAY_worker_niceness=0" in fix) == (status is Status.WARN)
