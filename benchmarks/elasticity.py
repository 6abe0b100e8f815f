"""An elastic fleet under a stepped load: scale-up time against a bare vLLM start, and
errors while replicas come, go and roll.

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/elasticity.py \\
        --out results/elasticity.json --plot docs/elasticity.png

One fleet (``rayfleet up`` in this session, in a temporary RAYFLEET_HOME, ``rayfleet down`` at the
end whatever happens) serves the tiny model with ``autoscaling`` 1..3 replicas,
``target_load_per_replica`` 3, ``upscale_delay_s`` 0, ``downscale_delay_s`` 20 and
``drain_timeout_s`` 60. A closed loop of streamed completions (``rayfleet bench``'s
request code, random 64-token prompts, 64 tokens out with ``ignore_eos``) goes through
the gateway at a concurrency stepped by phase:

    warm-up      1 in flight                       (1 replica)
    bare start   4 in flight on 1 replica held there (``rayfleet scale tiny 1``) while a
                 bare vLLM server starts beside the fleet; then ``scale tiny auto``
    scale-up     4 in flight, until 2 serve
    bare start at 2
                 8 in flight on 2 replicas held there (``rayfleet scale tiny 2``) while a
                 bare vLLM server starts beside the fleet; then ``scale tiny auto``
    scale-up to 3
                 8 in flight, until 3 serve, held a while
    scale-in     1 in flight, until 1 serves and none drains
    apply        2 in flight while `rayfleet apply` changes max_model_len 1024 -> 1000
                 (blue/green), until only the new application's replica serves

A closed loop, not an open-loop ramp: the scaler's signal is requests in flight, which a
closed loop sets exactly; on two cores an open-loop ramp queues without bound while new
replicas take CPU from the serving one. ``GET /rayfleet/status`` is read every second:

- time from the target's rise (the sample where it first reaches N) to N replicas
  serving, for 1 -> 2 and 2 -> 3, against a bare vLLM server's own start (one
  ``EngineProcess`` on the same model and arguments, start to ``wait_healthy``) under the
  same load as that step (the "bare start" phases: the peer starts on the same cores as
  the serving replicas and their streams, as the fleet's new replica does: one replica
  and 4 streams for 1 -> 2, two and 8 for 2 -> 3); the idle machine's bare start, timed
  before the fleet starts and again after it stops, is reported beside it;
- per phase: requests, failed requests, and streams that ended without their finish
  (a stream is finished when it reports all 64 tokens: ``usage.completion_tokens``,
  which vLLM sends after the chunk with the finish reason);
- the timeline (elasticity_report.py): load, replicas, TTFT p50 over the last 5 s,
  errors, fallback share (no fallback provider is configured here, so it stays 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elasticity_report import report

from rayfleet.bench.client import RequestResult, Target, open_session, request_headers, send_request
from rayfleet.bench.datasets import DatasetSpec, Prompt, load_tokenizer, make_prompts
from rayfleet.control.engine import EngineProcess, free_port
from rayfleet.models import make_tiny

MODEL = "tiny"
ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
APPLIED_MAX_MODEL_LEN = 1000
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 3,
    "target_load_per_replica": 3,
    "upscale_delay_s": 0,
    "downscale_delay_s": 20,
}
INPUT_LEN = OUTPUT_LEN = 64
SAMPLE_PERIOD_S = 1.0
PHASE_TIMEOUT_S = 300.0


class PhaseTimeout(Exception):
    """A phase's condition did not hold in time; the run stops and reports what it has."""


class Fleet:
    """A fleet in its own RAYFLEET_HOME, driven through the CLI."""

    def __init__(self, home: Path, config: dict[str, Any]):
        self.home = home
        self.config = config
        self.port: int = config["gateway"]["port"]
        self.config_path = home / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str, timeout_s: float = 900) -> str:
        argv = [sys.executable, "-m", "rayfleet.cli", *args]
        env = {**os.environ, "RAYFLEET_HOME": str(self.home)}
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"rayfleet {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def up(self, timeout_s: float = 900) -> None:
        """``rayfleet up`` as a child in this process's session, until the fleet is ready.

        Not ``up --detach``, which gives the fleet a session of its own: with autogroup
        scheduling this client then shares the CPU with the whole fleet as with one
        other process, and the engines' busy polling starved it. Measured on the 2-core
        machine (key_isolation.py, 2 streamed users): the client waited 10-12 s of each
        15 s for a core, its event loop stalled about 1 s at a time, and a steady TTFT p50
        of 10-12 ms read 40-1,070 ms; in one session, the stalls were gone (engine.py
        says the same of a vLLM server in a session of its own)."""
        env = {**os.environ, "RAYFLEET_HOME": str(self.home)}
        argv = [sys.executable, "-m", "rayfleet.cli", "up", "-c", str(self.config_path)]
        log_path = self.home / "up.log"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
            )
        state_file = self.home / "run" / "fleet.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rayfleet up failed:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                state = json.loads(state_file.read_text())
                if state["pid"] == self.proc.pid and state["phase"] == "ready":
                    return
            time.sleep(0.5)
        raise RuntimeError(f"rayfleet up not ready after {timeout_s:g}s; log: {log_path}")

    def down(self) -> None:
        state_file = self.home / "run" / "fleet.json"
        if state_file.exists():
            pid = json.loads(state_file.read_text())["pid"]
            with contextlib.suppress(Exception):
                self.cli("down", timeout_s=300)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


class SteppedLoad:
    """A closed loop whose concurrency the caller steps: worker ``i`` sends one request
    after another while ``i < level``; above the level it finishes its request and waits.
    Each request is recorded with the phase it started in and when it ended."""

    def __init__(self, target: Target, prompts: Sequence[Prompt], max_level: int):
        self.target = target
        self.prompts = prompts
        self.max_level = max_level
        self.level = 0
        self.phase = "idle"
        self.records: list[dict[str, Any]] = []
        self._next = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.level = 0
        self._stop.set()
        self._thread.join(timeout=PHASE_TIMEOUT_S)

    def num_done(self, phase: str) -> int:
        return sum(r["phase"] == phase for r in list(self.records))

    async def _main(self) -> None:
        headers = request_headers(self.target)
        async with open_session(self.max_level) as session:
            await asyncio.gather(
                *(self._worker(i, session, headers) for i in range(self.max_level))
            )

    async def _worker(self, index: int, session: Any, headers: dict[str, str]) -> None:
        while not self._stop.is_set():
            if index >= self.level:
                await asyncio.sleep(0.1)
                continue
            prompt = self.prompts[next(self._next) % len(self.prompts)]
            phase = self.phase
            result = await send_request(session, self.target, prompt, headers)
            self.records.append(record(phase, prompt, result, time.perf_counter()))


def record(phase: str, prompt: Prompt, result: RequestResult, end_s: float) -> dict[str, Any]:
    return {
        "phase": phase,
        "start_s": result.start_s,
        "end_s": end_s,
        "ok": result.ok,
        "finished": result.ok and result.num_output_tokens >= prompt.num_output_tokens,
        "ttft_s": result.ttft_s if result.ok else None,
        "replica": result.replica,
        "error": result.error,
    }


class StatusSampler:
    """``GET /rayfleet/status`` every period: the model's target and replica states."""

    def __init__(self, url: str, period_s: float = SAMPLE_PERIOD_S):
        self.url = url + "/rayfleet/status"
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def latest(self) -> dict[str, Any]:
        return self.samples[-1] if self.samples else {}

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.period_s):
                return

    def sample(self) -> dict[str, Any]:
        now_s = time.perf_counter()
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                status = json.loads(response.read())
        except (OSError, ValueError) as exc:
            return {"t_s": now_s, "error": str(exc)}
        scaling = status.get("scaling", {}).get(MODEL, {})
        replicas = [r for r in status.get("replicas", []) if r["model"] == MODEL]
        return {
            "t_s": now_s,
            "target": scaling.get("target"),
            **scaling.get("states", {}),
            "apps": sorted({r["app"] for r in replicas}),
            "gateway_in_flight": sum(r["inflight"] for r in replicas),
            "decision": scaling.get("last_decision"),
        }


def settled(sampler: StatusSampler, count: int, app: str | None = None) -> bool:
    """``count`` replicas serving, the target at ``count``, none draining or starting (and
    only application ``app``'s replicas left, when given)."""
    s = sampler.latest()
    return (
        s.get("target") == count
        and s.get("serving") == count
        and not s.get("draining")
        and not s.get("starting")
        and (app is None or s.get("apps") == [app])
    )


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = PHASE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise PhaseTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def time_bare_start(model_dir: Path) -> float:
    """Seconds from spawning one vLLM server on the tiny model to its /health answering."""
    engine = EngineProcess(str(model_dir), MODEL, ENGINE_ARGS)
    started = time.perf_counter()
    try:
        engine.start().wait_healthy(timeout_s=600)
        return time.perf_counter() - started
    finally:
        engine.stop()


def fleet_config(model_dir: Path) -> dict[str, Any]:
    model = {
        "name": MODEL,
        "source": str(model_dir),
        "engine_args": ENGINE_ARGS,
        "autoscaling": AUTOSCALING,
        "drain_timeout_s": 60,
    }
    return {"gateway": {"port": free_port()}, "models": [model]}


def run_phases(
    fleet: Fleet, load: SteppedLoad, sampler: StatusSampler, hold_s: float, model_dir: Path
) -> dict[str, Any]:
    """Step the load through the phases; returns phase marks, the apply's output and, if a
    phase did not complete, why."""
    marks: list[tuple[str, float]] = []

    def step(phase: str, level: int) -> None:
        load.phase, load.level = phase, level
        marks.append((phase, time.perf_counter()))
        print(f"{time.strftime('%H:%M:%S')} {phase}: {level} in flight", flush=True)

    run: dict[str, Any] = {"marks": marks}
    try:
        wait_for("the fleet at 1 serving replica", lambda: settled(sampler, 1))
        first_app = sampler.latest()["apps"][0]
        step("warm-up", 1)
        wait_for("3 warm-up requests", lambda: load.num_done("warm-up") >= 3)
        loaded = run["bare_loaded_s"] = {}
        fleet.cli("scale", MODEL, "1")  # held at 1 while the peer starts under the same load
        step("bare start", 4)
        wait_for("4 requests at 4 in flight", lambda: load.num_done("bare start") >= 4)
        loaded["1 -> 2"] = time_bare_start(model_dir)
        print(f"bare vLLM start under 1 -> 2's load: {loaded['1 -> 2']:.1f}s", flush=True)
        step("settle", 1)
        fleet.cli("scale", MODEL, "auto")
        wait_for("1 serving replica after the bare start", lambda: settled(sampler, 1))
        step("scale-up", 4)
        wait_for("2 serving replicas", lambda: settled(sampler, 2))
        fleet.cli("scale", MODEL, "2")  # held at 2 while the peer starts under 2 -> 3's load
        step("bare start at 2", 8)
        wait_for("4 requests at 8 in flight", lambda: load.num_done("bare start at 2") >= 4)
        loaded["2 -> 3"] = time_bare_start(model_dir)
        print(f"bare vLLM start under 2 -> 3's load: {loaded['2 -> 3']:.1f}s", flush=True)
        fleet.cli("scale", MODEL, "auto")
        step("scale-up to 3", 8)
        wait_for("3 serving replicas", lambda: settled(sampler, 3))
        held = time.monotonic() + hold_s
        wait_for("the hold at 3", lambda: time.monotonic() >= held)
        step("scale-in", 1)
        wait_for("1 serving replica, none draining", lambda: settled(sampler, 1))
        step("apply", 2)
        run["apply_output"] = apply_changed_engine_args(fleet)
        wait_for("the new application", lambda: bool(set(sampler.latest()["apps"]) - {first_app}))
        (new_app,) = set(sampler.latest()["apps"]) - {first_app}
        wait_for(f"only {new_app} serving", lambda: settled(sampler, 1, new_app))
        step("after apply", 2)
        wait_for("4 requests after the apply", lambda: load.num_done("after apply") >= 4)
    except (PhaseTimeout, RuntimeError, ValueError) as exc:
        run["incomplete"] = f"{load.phase}: {exc}"
        print(f"phase {load.phase} did not complete: {exc}", flush=True)
    marks.append(("end", time.perf_counter()))
    return run


def apply_changed_engine_args(fleet: Fleet) -> str:
    config = json.loads(json.dumps(fleet.config))
    config["models"][0]["engine_args"]["max_model_len"] = APPLIED_MAX_MODEL_LEN
    changed = fleet.home / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    output = fleet.cli("apply", "-c", str(changed), timeout_s=PHASE_TIMEOUT_S)
    print(f"apply took {time.perf_counter() - started:.1f}s:\n{output}", flush=True)
    return output


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    prompts = make_prompts(
        DatasetSpec(num_prompts=2000, random_input_len=INPUT_LEN, random_output_len=OUTPUT_LEN),
        load_tokenizer(str(model_dir)),
    )
    home = Path(tempfile.mkdtemp(prefix="rayfleet-elasticity-"))
    fleet = Fleet(home, fleet_config(model_dir))
    target = Target(fleet.url, model=MODEL, ignore_eos=True, request_timeout_s=PHASE_TIMEOUT_S)
    load = SteppedLoad(target, prompts, max_level=8)
    sampler = StatusSampler(fleet.url)
    try:
        started = time.perf_counter()
        fleet.up()
        print(f"fleet up in {time.perf_counter() - started:.1f}s", flush=True)
        sampler.start()
        load.start()
        run = run_phases(fleet, load, sampler, args.hold_s, model_dir)
    finally:
        load.stop()
        sampler.stop()
        fleet.down()
    return {"fleet": fleet.config, **run, "samples": sampler.samples, "records": load.records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-s", type=float, default=15.0, help="time held at 3 replicas")
    parser.add_argument("--out", type=Path, default=Path("results/elasticity.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/elasticity.png"))
    args = parser.parse_args()

    model_dir = make_tiny()
    bare_s = [time_bare_start(model_dir)]
    print(f"bare vLLM start: {bare_s[0]:.1f}s", flush=True)
    run = measure(model_dir, args)
    bare_s.append(time_bare_start(model_dir))
    print(f"bare vLLM start: {bare_s[1]:.1f}s", flush=True)
    report({**run, "bare_start_s": bare_s}, args.out, args.plot)


if __name__ == "__main__":
    main()
