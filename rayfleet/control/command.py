"""``rayfleet up``, ``rayfleet status`` and ``rayfleet down``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rayfleet.errors import RayfleetError

console = Console(stderr=True, highlight=False)


def up(
    config_file: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="fleet.yaml to serve (default: the demo fleet: "
        "SmolLM2-135M-Instruct as 'smollm2-135m' on an embedded Ray).",
    ),
    port: int | None = typer.Option(
        None, "--port", help="Gateway port, overriding gateway.port in the file."
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Run in the background; return once the fleet is ready."
    ),
    ready_timeout_s: float = typer.Option(
        1200.0, "--ready-timeout", help="With --detach: seconds to wait for the fleet to be ready."
    ),
) -> None:
    """Serve a fleet: start or join Ray, deploy every model, serve the OpenAI gateway.

    Runs in the foreground until Ctrl-C (or `rayfleet down`), which stops every vLLM
    server, Ray worker and port it started.
    """
    from rayfleet.control.state import RunState

    config = _load_config(config_file, port)
    running = RunState.load()
    if running is not None and running.process_alive():
        raise RayfleetError(
            f"a fleet is already running (pid {running.pid}, {running.gateway_url}); "
            "stop it with `rayfleet down` first"
        )
    if detach:
        _up_detached(config_file, port, ready_timeout_s)
        return
    from rayfleet.control.engine_args import check_engine_args
    from rayfleet.control.fleet import FleetProcess

    console.print("checking engine arguments with vLLM's parser")
    check_engine_args(config)
    FleetProcess(config, say=lambda msg: console.print(msg)).run()


def _load_config(config_file: Path | None, port: int | None):
    from rayfleet.config import default_fleet, load_fleet

    if config_file is None:
        from rayfleet.models.build import make_demo

        config = default_fleet()
        make_demo(Path(config.models[0].source), progress=lambda m: console.print(m))
    else:
        config = load_fleet(config_file)
    if port is not None:
        config.gateway.port = port
    return config


def _up_detached(config_file: Path | None, port: int | None, ready_timeout_s: float) -> None:
    from rayfleet._home import rayfleet_home
    from rayfleet.control.state import RunState, clear_state

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
    console.print(f"fleet starting in the background (pid {proc.pid}); log: {log_path}")
    deadline = time.monotonic() + ready_timeout_s
    with console.status("waiting for the fleet to be ready"):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
                raise RayfleetError(
                    f"the fleet exited with code {proc.returncode} before it was ready:\n"
                    + "\n".join(tail)
                )
            state = RunState.load()
            if state is not None and state.pid == proc.pid and state.phase == "ready":
                console.print(f"fleet ready: OpenAI-compatible API at {state.gateway_url}/v1")
                return
            time.sleep(0.5)
    raise RayfleetError(
        f"the fleet was not ready after {ready_timeout_s:.0f}s; see {log_path}, "
        "then `rayfleet down`"
    )


def status(
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Show the running fleet: nodes, models, replicas with node, URL, health and load."""
    state = _running_state()
    try:
        with urllib.request.urlopen(state.gateway_url + "/rayfleet/status", timeout=10) as resp:
            report = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        raise RayfleetError(
            f"the fleet (pid {state.pid}) is {state.phase} but its gateway at "
            f"{state.gateway_url} does not answer ({exc}); see logs in {state.log_dir}"
        ) from None
    report["phase"] = state.phase
    report["gateway_url"] = state.gateway_url
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_status(report)


def _print_status(report: dict) -> None:
    out = Console()
    out.print(f"fleet [bold]{report['phase']}[/] at {report['gateway_url']}/v1")
    nodes = Table("node", "ip", "alive", "CPUs", "GPUs", title="nodes")
    for n in report.get("nodes", []):
        nodes.add_row(
            n["node_id"][:12], n["ip"], str(n["alive"]), f"{n['cpus']:g}", f"{n['gpus']:g}"
        )
    out.print(nodes)
    models = Table("model", "healthy replicas", "serve status", title="models")
    apps = report.get("applications", {})
    for name, healthy in report.get("models", {}).items():
        models.add_row(name, str(healthy), apps.get(name, {}).get("status", "?"))
    out.print(models)
    replicas = Table("replica", "node", "url", "pid", "health", "in flight", title="replicas")
    for r in report.get("replicas", []):
        health = "[green]healthy[/]" if r["healthy"] else "[yellow]cooling down[/]"
        replicas.add_row(
            r["replica_id"],
            r["node_ip"] or r["node_id"][:12],
            r["url"],
            str(r["pid"]),
            health,
            str(r["inflight"]),
        )
    out.print(replicas)


def _running_state():
    from rayfleet.control.state import RunState, clear_state, state_path

    state = RunState.load()
    if state is None:
        raise RayfleetError(
            f"no fleet is running (no {state_path()}); start one with `rayfleet up`"
        )
    if not state.process_alive():
        _kill_engines(state)
        clear_state()
        raise RayfleetError(
            f"the fleet process {state.pid} is gone (stale state removed); start one with `rayfleet up`"
        )
    return state


def down(
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds to wait for a clean stop."),
) -> None:
    """Stop the running fleet: gateway, replicas, vLLM servers and the embedded Ray."""
    import psutil

    from rayfleet.control.state import clear_state

    state = _running_state()
    proc = psutil.Process(state.pid)
    descendants = proc.children(recursive=True)
    console.print(f"stopping the fleet (pid {state.pid})")
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        console.print(f"[yellow]no clean stop after {timeout_s:.0f}s; killing what is left[/]")
        proc.kill()
    gone, alive = psutil.wait_procs(descendants, timeout=10)
    for leftover in alive:
        leftover.kill()
    _kill_engines(state)
    clear_state()
    console.print("fleet stopped")


def _kill_engines(state) -> None:
    from rayfleet.control.engine import kill_process_group

    for pid in state.engine_pids:
        kill_process_group(pid, grace_s=5)
