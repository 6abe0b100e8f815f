"""What ``rayfleet up``, ``status`` and ``down`` do, apart from parsing and printing.

    fleet_config(file, port)      fleet.yaml (or the demo fleet), port override applied
    dry_run(config)               check engine args with vLLM's parser; what each model
                                  would start with (``ModelLaunch``), derived args marked,
                                  and what each replica asks Ray for
    fit_on_cluster(config, addr)  the running cluster's nodes and free resources, and
                                  where each replica would fit or why not (``ClusterFit``)
    refuse_busy_port(config)      the gateway's port must be free before anything starts
    serve(config)                 check engine args, run the fleet in this process
                                  (``FleetProcess``) until SIGINT or SIGTERM
    start_detached(file, port)    the same in a background process; returns its state
                                  once the fleet is ready, or raises its one-line error
    running_state()               the running fleet's ``RunState``; a gone fleet's
                                  leftovers (vLLM servers, state file) are cleaned up
    fetch_status(state)           the gateway's ``/rayfleet/status`` report
    stop_fleet(state, timeout_s)  SIGTERM the fleet process, wait for its clean stop,
                                  then kill whatever it left

A fleet process that has exited but is not yet reaped by its parent (a zombie) counts
as gone everywhere here: ``down`` runs in another process, cannot reap it, and would
otherwise wait out its whole timeout for a process that will never stop again.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from rayfleet._home import rayfleet_home
from rayfleet.config import FleetConfig, default_fleet, load_fleet
from rayfleet.control.engine import PID_DIR
from rayfleet.control.engine_args import check_engine_args, engine_argv
from rayfleet.control.fleet import Say
from rayfleet.control.placement import (
    NodeResources,
    ReplicaDemand,
    ReplicaFit,
    describe_demand,
    fit_replicas,
    fleet_demands,
    replica_demand,
)
from rayfleet.control.process_groups import kill_process_group, kill_recorded_engines
from rayfleet.control.state import RunState, clear_state, process_running, state_path
from rayfleet.errors import RayfleetError

# Processes the fleet process started (Ray, Serve replicas) get this long after it stopped.
DESCENDANTS_GRACE_S = 10.0
_POLL_S = 0.2


def fleet_config(
    config_file: Path | None, port: int | None, *, build_demo: bool = True, say: Say = print
) -> FleetConfig:
    """The fleet to serve: ``config_file``, or the demo fleet (its model built unless
    ``build_demo`` is false), with ``port`` replacing gateway.port when given."""
    if config_file is None:
        config = default_fleet()
        if build_demo:
            from rayfleet.models.build import make_demo

            make_demo(Path(config.models[0].source), progress=say)
    else:
        config = load_fleet(config_file)
    if port is not None:
        config.gateway.port = port
    return config


@dataclass
class ModelLaunch:
    """What one model's replicas would start with."""

    name: str
    source: str
    replicas: int
    num_cpus: float
    num_gpus: float
    nodes_per_replica: int
    engine_args: dict[str, Any]  # the user's, then the derived ones
    derived: dict[str, str]  # derived argument -> why
    argv: list[str]  # engine_args as vLLM's flags
    placement: str  # what each replica asks Ray for, per node (placement.describe_demand)


def dry_run(config: FleetConfig) -> list[ModelLaunch]:
    """Check every model's engine arguments with vLLM's parser (raises ConfigError) and
    say what each model would start with. Starts nothing."""
    check_engine_args(config)
    launches = []
    for model in config.models:
        engine_args = config.engine_args_for(model)
        launches.append(
            ModelLaunch(
                name=model.name,
                source=model.source,
                replicas=model.replicas,
                num_cpus=model.num_cpus,
                num_gpus=model.num_gpus,
                nodes_per_replica=model.nodes_per_replica,
                engine_args=engine_args,
                derived={k: d.because for k, d in config.derived_engine_args(model).items()},
                argv=engine_argv(engine_args),
                placement=describe_demand(replica_demand(model)),
            )
        )
    return launches


@dataclass
class ClusterFit:
    """Where a fleet's replicas would go in a running cluster, as it is now."""

    nodes: list[NodeResources]
    demands: list[ReplicaDemand]
    fits: list[ReplicaFit]  # one per demand, in the same order


def fit_on_cluster(config: FleetConfig, address: str) -> ClusterFit:
    """Read the nodes' total and free resources at ``address`` and fit every replica
    into them (``placement.fit_replicas``). Starts nothing on the cluster."""
    from rayfleet.cluster import connected, node_resources

    with connected(address, hint="or drop --address to see the placement alone"):
        nodes = [NodeResources(**record) for record in node_resources()]
    demands = fleet_demands(config.models)
    return ClusterFit(nodes, demands, fit_replicas(demands, nodes))


def refuse_if_running() -> None:
    """Raise when a fleet started by ``rayfleet up`` is still running."""
    running = RunState.load()
    if running is not None and running.process_alive():
        raise RayfleetError(
            f"a fleet is already running (pid {running.pid}, {running.gateway_url}); "
            "stop it with `rayfleet down` first"
        )


def refuse_busy_port(config: FleetConfig) -> None:
    """Raise when the gateway could not listen on its host and port, before Ray or any
    replica starts (the gateway itself starts once the replicas are deployed)."""
    host, port = config.gateway.host, config.gateway.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise RayfleetError(
                f"gateway cannot listen on {host}:{port} ({exc.strerror}{_holder(port)}); "
                "pass another --port or stop what uses it"
            ) from None


def _holder(port: int) -> str:
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                return f", held by pid {conn.pid}" if conn.pid else ""
    except psutil.Error:
        pass
    return ""


def serve(config: FleetConfig, say: Say = print) -> None:
    """Check the engine arguments, then run the fleet here until SIGINT or SIGTERM."""
    from rayfleet.control.fleet import FleetProcess

    say("checking engine arguments with vLLM's parser")
    check_engine_args(config)
    FleetProcess(config, say=say).run()


def start_detached(
    config_file: Path | None, port: int | None, ready_timeout_s: float, say: Say = print
) -> RunState:
    """Run ``rayfleet up`` in a background session; return its state once it is ready.

    Raises with the tail of its log when it exits first, or after ``ready_timeout_s``.
    """
    clear_state()
    argv = [sys.executable, "-m", "rayfleet.cli", "up"]
    if config_file is not None:
        argv += ["-c", str(config_file)]
    if port is not None:
        argv += ["--port", str(port)]
    log_path = rayfleet_home() / "logs" / f"up-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    say(f"fleet starting in the background (pid {proc.pid}); log: {log_path}")
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RayfleetError(_exit_reason(log_path, proc.returncode))
        state = RunState.load()
        if state is not None and state.pid == proc.pid and state.phase == "ready":
            return state
        time.sleep(0.5)
    raise RayfleetError(
        f"the fleet was not ready after {ready_timeout_s:.0f}s; see {log_path}, "
        "then `rayfleet down`"
    )


def _exit_reason(log_path: Path, returncode: int) -> str:
    """Why a detached fleet exited: the error line `rayfleet up` ended with (its log
    named), else the end of its log."""
    lines = log_path.read_text(errors="replace").strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    if errors:
        return f"{errors[-1].removeprefix('error: ')} (log: {log_path})"
    return f"the fleet exited with code {returncode} before it was ready:\n" + "\n".join(
        lines[-15:]
    )


def running_state() -> RunState:
    """The running fleet's state. When its process is gone, stop the vLLM servers it
    left, remove the stale state and raise."""
    state = RunState.load()
    if state is None:
        raise RayfleetError(
            f"no fleet is running (no {state_path()}); start one with `rayfleet up`"
        )
    if not state.process_alive():
        kill_engines(state)
        clear_state()
        raise RayfleetError(
            f"the fleet process {state.pid} is gone (stale state removed); "
            "start one with `rayfleet up`"
        )
    return state


def fetch_status(state: RunState) -> dict[str, Any]:
    """The gateway's ``/rayfleet/status`` report, with the fleet's phase and URL added."""
    try:
        with urllib.request.urlopen(state.gateway_url + "/rayfleet/status", timeout=10) as resp:
            report: dict[str, Any] = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        raise RayfleetError(
            f"the fleet (pid {state.pid}) is {state.phase} but its gateway at "
            f"{state.gateway_url} does not answer ({exc}); see logs in {state.log_dir}"
        ) from None
    report["phase"] = state.phase
    report["gateway_url"] = state.gateway_url
    return report


def admin_call(
    state: RunState, path: str, body: dict[str, Any], timeout_s: float = 3600
) -> dict[str, Any]:
    """POST ``body`` to one of the running fleet's admin endpoints (control/admin.py);
    its refusal (an OpenAI error's message) as a RayfleetError."""
    request = urllib.request.Request(
        state.gateway_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            answer: dict[str, Any] = json.load(resp)
            return answer
    except urllib.error.HTTPError as exc:
        try:
            message = json.load(exc)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        raise RayfleetError(message) from None
    except (urllib.error.URLError, OSError) as exc:
        raise RayfleetError(
            f"the fleet's gateway at {state.gateway_url} does not answer ({exc}); "
            f"see logs in {state.log_dir}"
        ) from None


def stop_fleet(state: RunState, timeout_s: float, say: Say = print) -> None:
    """Stop the fleet process (SIGTERM, SIGKILL after ``timeout_s``), then whatever it
    started that is still running, then the vLLM servers it recorded; clear the state."""
    try:
        proc = psutil.Process(state.pid)
        descendants = proc.children(recursive=True)
        say(f"stopping the fleet (pid {state.pid})")
        proc.terminate()
    except psutil.NoSuchProcess:
        descendants = []
    else:
        if wait_gone([proc], timeout_s):
            say(f"no clean stop after {timeout_s:.0f}s; killing what is left")
            _kill([proc])
    _kill(wait_gone(descendants, DESCENDANTS_GRACE_S))
    kill_engines(state)
    clear_state()


def wait_gone(procs: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``procs`` to exit; return those still running.

    Unlike ``psutil.wait_procs``, an exited process its parent has not reaped yet (a
    zombie) counts as gone: only its parent can reap it, and it will not run again.
    """
    deadline = time.monotonic() + timeout_s
    running = list(procs)
    while True:
        running = [p for p in running if process_running(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(_POLL_S)


def kill_engines(state: RunState) -> None:
    """Stop the vLLM servers (and their process groups) the fleet recorded: those it
    saw registered, and those its replicas spawned on this machine and did not stop."""
    for pid in state.engine_pids:
        kill_process_group(pid, grace_s=5)
    if state.log_dir:
        kill_recorded_engines(Path(state.log_dir) / PID_DIR)


def _kill(procs: Iterable[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
