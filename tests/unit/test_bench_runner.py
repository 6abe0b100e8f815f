"""Running a load: schedules kept, concurrency capped, several processes, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.load import LoadShape
from rayfleet.bench.metrics import peak_in_flight
from rayfleet.bench.runner import run_load
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread

PROMPTS = [Prompt(f"prompt {i}", 2, 4) for i in range(60)]


def test_max_concurrency_caps_requests_in_flight():
    with SimulatorThread(SimulatorSpec(token_delay_s=0.005)) as sim:
        output = run_load(Target(sim.url, model="sim"), PROMPTS, LoadShape(max_concurrency=4))
    assert len(output.results) == 60 and all(r.ok for r in output.results)
    assert peak_in_flight(output.results) == 4
    assert not output.interrupted and output.num_cancelled == 0


def test_max_connections_caps_the_connections_and_the_wait_counts_in_ttft():
    spec = SimulatorSpec(token_delay_s=0.005)
    with SimulatorThread(spec) as sim:
        target = Target(sim.url, model="sim")
        capped = run_load(target, PROMPTS, LoadShape(max_connections=2))
        served_capped = simulator_requests(sim.url)
        run_load(target, PROMPTS, LoadShape())  # all at once, a connection each
        served_free = simulator_requests(sim.url)
    assert len(capped.results) == 60 and all(r.ok for r in capped.results)
    # HTTP/1.1: one request at a time a connection, so the simulator served two at most.
    assert peak_served(served_capped) == 2
    assert peak_served(served_free) > 2
    # Each request is timed from when it was sent, before it had a connection: the last
    # of the 30 in line waited for 29 others of at least 3 token delays each.
    assert max(r.ttft_s for r in capped.results) >= 29 * 3 * spec.token_delay_s


def simulator_requests(url: str) -> list[list[float]]:
    """The simulator's [arrival, first token, last token, tokens] of each request since
    the last call, which resets them."""
    with urllib.request.urlopen(url + "/simulator/stats") as response:
        seen: list[list[float]] = json.load(response)["requests"]
    urllib.request.urlopen(urllib.request.Request(url + "/simulator/reset", method="POST"))
    return seen


def peak_served(requests: list[list[float]]) -> int:
    """Most requests the simulator held at once, from arrival to last token."""
    edges = sorted([(r[0], 1) for r in requests] + [(r[2], -1) for r in requests])
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def test_request_rate_sets_the_duration():
    with SimulatorThread() as sim:
        output = run_load(Target(sim.url, model="sim"), PROMPTS, LoadShape(request_rate=60.0))
    # 60 requests at 60 req/s: the last is due at 1.0 s (all at once would take ~0.05 s).
    # How late a busy machine sends them is for benchmarks/bench_client.py; never early is
    # what holds on any machine.
    assert output.duration_s >= 0.95
    assert all(r.start_s >= r.scheduled_s - 1e-3 for r in output.results)


def test_several_processes_split_the_schedule_and_merge_results():
    progress = []
    with SimulatorThread(SimulatorSpec(replica_names=("a", "b"))) as sim:
        output = run_load(
            Target(sim.url, model="sim"),
            PROMPTS,
            LoadShape(request_rate=120.0, max_concurrency=8),
            num_processes=3,
            on_progress=progress.append,
        )
    assert len(output.results) == 60 and all(r.ok for r in output.results)
    scheduled = [r.scheduled_s for r in output.results]
    assert scheduled == sorted(scheduled)
    assert output.duration_s >= 0.45  # the last request is due at 0.5 s
    assert all(r.start_s >= r.scheduled_s - 1e-3 for r in output.results)
    assert progress[-1].num_done == 60 and progress[-1].num_output_tokens == 240
    assert {r.replica for r in output.results} == {"a", "b"}


def wait_for_requests(url: str, num_requests: int, timeout_s: float = 60.0) -> None:
    """Poll the simulator until the bench has sent ``num_requests``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/simulator/stats", timeout=5) as response:
            if json.load(response)["num_requests"] >= num_requests:
                return
        time.sleep(0.1)
    raise AssertionError(f"the bench sent fewer than {num_requests} requests in {timeout_s:.0f} s")


SERVE_SLOWLY = """
import sys, time
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread
with SimulatorThread(SimulatorSpec(token_delay_s=0.05)) as sim:
    print(sim.url, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("num_processes", [1, 2])
def test_ctrl_c_stops_and_still_writes_results(tmp_path, num_processes):
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_SLOWLY], stdout=subprocess.PIPE, text=True
    )
    try:
        url = server.stdout.readline().strip()
        data = tmp_path / "prompts.jsonl"
        data.write_text(json.dumps({"prompt": "hi", "max_tokens": 10}) + "\n")
        out = tmp_path / "result.json"
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rayfleet.cli",
                "bench",
                "--base-url",
                url,
                "--model",
                "sim",
                "--dataset-name",
                "jsonl",
                "--dataset-path",
                str(data),
                "--num-prompts",
                "1000",
                "--request-rate",
                "20",
                "--num-processes",
                str(num_processes),
                "--save-result",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        wait_for_requests(url, 30)  # 1.5 s at 20 req/s: the first ones have finished
        os.killpg(bench.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        stdout, stderr = bench.communicate(timeout=60)
        assert bench.returncode == 0, stderr
        result = json.loads(out.read_text())
        assert result["interrupted"] is True
        assert 0 < result["completed"] < 1000 and result["failed"] == 0
        assert result["completed"] + result["num_cancelled"] < 1000
        assert "cancelled by Ctrl-C" in stdout
    finally:
        server.kill()
        server.wait()
