"""Where a real vLLM server's processes run once `EngineProcess` has started it.

Both placements were measured to matter on small machines (see rayfleet/control/engine.py):
a server in a session of its own starved every other session's processes, and an engine
core on its worker's pinned core delivered streams in bursts.
"""

from __future__ import annotations

import os

import psutil
import pytest

from rayfleet.control.engine import vllm_processes

pytestmark = pytest.mark.integration


def test_server_runs_in_the_callers_session_in_its_own_process_group(vllm_tiny):
    assert os.getsid(vllm_tiny.pid) == os.getsid(0)
    assert os.getpgid(vllm_tiny.pid) == vllm_tiny.pid
    family = psutil.Process(vllm_tiny.pid).children(recursive=True)
    assert family, "vLLM's engine processes are children of its server"
    assert {os.getpgid(p.pid) for p in family} == {vllm_tiny.pid}


def test_engine_core_threads_stay_off_the_workers_cores(vllm_tiny):
    workers, cores = vllm_processes(vllm_tiny.pid)
    assert workers and cores, [p.name() for p in psutil.Process(vllm_tiny.pid).children()]
    worker_cpus = {cpu for w in workers for cpu in w.cpu_affinity()}
    if set(psutil.Process(vllm_tiny.pid).cpu_affinity()) <= worker_cpus:
        pytest.fail("the worker owns every core this machine gives the server; nothing to test")
    for core in cores:
        for thread in core.threads():
            assert not set(os.sched_getaffinity(thread.id)) & worker_cpus, thread.id
