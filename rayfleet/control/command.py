"""``rayfleet up``, ``status``, ``top`` and ``down``: parse, call one function of
rayfleet/control/lifecycle.py (top.py and top_view.py for ``top``), print. Nothing heavy is
imported before a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rayfleet.config import FleetConfig
    from rayfleet.control.lifecycle import ClusterFit, ModelLaunch
    from rayfleet.control.placement import NodeResources

console = Console(stderr=True, highlight=False)


def _say(message: str) -> None:
    console.print(message, markup=False)


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
        1200.0,
        "--ready-timeout-s",
        help="With --detach: seconds to wait for the fleet to be ready.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Validate the fleet, check engine arguments with vLLM's parser and print what "
        "each model would start with (derived arguments marked) and the placement each "
        "replica asks Ray for; start nothing.",
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="With --dry-run: read this running Ray cluster's nodes (auto, host:port or "
        "ray://host:port) and say which replicas fit where and which cannot be placed.",
    ),
) -> None:
    """Serve a fleet: start or join Ray, deploy every model, serve the OpenAI gateway.

    Runs in the foreground until Ctrl-C (or `rayfleet down`), which stops every vLLM
    server, Ray worker and port it started.
    """
    from rayfleet.control import lifecycle
    from rayfleet.gateway.auth import KeyTable

    if address is not None and not dry_run:
        raise typer.BadParameter(
            "--address reads a cluster for --dry-run only", param_hint="--address"
        )
    config = lifecycle.fleet_config(config_file, port, build_demo=not dry_run, say=_say)
    if dry_run:
        KeyTable.from_config(config.gateway.api_keys)  # reads key files, as `up` does at start
        _print_launches(config, lifecycle.dry_run(config))
        if address is not None:
            _print_fit(address, lifecycle.fit_on_cluster(config, address))
        return
    lifecycle.refuse_if_running()
    lifecycle.refuse_busy_port(config)
    if detach:
        with console.status("waiting for the fleet to be ready"):
            state = lifecycle.start_detached(config_file, port, ready_timeout_s, say=_say)
        _say(f"fleet ready: OpenAI-compatible API at {state.gateway_url}/v1")
        return
    lifecycle.serve(config, say=_say)


def _print_launches(config: FleetConfig, launches: list[ModelLaunch]) -> None:
    gateway = config.gateway
    typer.echo("fleet valid; vLLM's parser accepts every model's engine arguments; nothing started")
    typer.echo(f"gateway http://{gateway.host}:{gateway.port}/v1, Ray: {config.cluster.address}")
    for launch in launches:
        shape = f"{launch.num_cpus:g} CPU and {launch.num_gpus:g} GPU"
        shape += (
            f" on each of {launch.nodes_per_replica} nodes per replica"
            if launch.nodes_per_replica > 1
            else " each"
        )
        typer.echo(
            f"model '{launch.name}': {launch.replicas} replica(s) of {launch.source}, {shape}"
        )
        for key, value in launch.engine_args.items():
            shown = value if isinstance(value, str) else json.dumps(value)
            because = launch.derived.get(key)
            typer.echo(f"  {key}: {shown}" + (f"  (derived: {because})" if because else ""))
        typer.echo(f"  vLLM flags: {' '.join(launch.argv)}")
        typer.echo(f"  placement per replica: {launch.placement}")


def _print_fit(address: str, fit: ClusterFit) -> None:
    from rayfleet.control.placement import format_resources, resources_by_node

    typer.echo(f"Ray cluster at {address}: {len(fit.nodes)} node(s), free now / total")
    labels = {}
    for node in fit.nodes:
        labels[node.node_id] = node.label
        typer.echo(f"  node {node.label}: {_free(node, 'GPU')} GPU, {_free(node, 'CPU')} CPU")
    for demand, replica in zip(fit.demands, fit.fits, strict=True):
        name = f"model '{replica.model}' replica {replica.replica}"
        if replica.nodes is None:
            typer.echo(f"  {name}: cannot be placed: {replica.reason}")
            continue
        where = resources_by_node(demand, replica).items()
        shown = "; ".join(f"{labels[n]} [{format_resources(r)}]" for n, r in where)
        typer.echo(f"  {name}: fits on {shown}")
    unplaced = sum(not f.placed for f in fit.fits)
    typer.echo(
        f"{len(fit.fits) - unplaced} of {len(fit.fits)} replica(s) fit the cluster's free resources"
        + (f"; {unplaced} cannot be placed" if unplaced else "")
    )


def _free(node: NodeResources, key: str) -> str:
    return f"{node.available.get(key, 0.0):g}/{node.total.get(key, 0.0):g}"


def status(
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Show the running fleet: nodes, models, replicas with node, URL, health and load."""
    from rayfleet.control import lifecycle

    report = lifecycle.fetch_status(lifecycle.running_state())
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_status(report)


def _print_status(report: dict[str, Any]) -> None:
    out = Console()
    out.print(f"fleet [bold]{report['phase']}[/] at {report['gateway_url']}/v1")
    if report.get("status_error"):
        out.print(f"[yellow]warning[/]: {report['status_error']}")
    nodes = Table("node", "ip", "alive", "CPUs", "GPUs", title="nodes")
    for n in report.get("nodes", []):
        nodes.add_row(
            n["node_id"][:12], n["ip"], str(n["alive"]), f"{n['cpus']:g}", f"{n['gpus']:g}"
        )
    out.print(nodes)
    models = Table("model", "serving", "target", "window", "serve status", title="models")
    apps = report.get("applications", {})
    scaling = report.get("scaling", {})
    for name, healthy in report.get("models", {}).items():
        scaled = scaling.get(name, {})
        models.add_row(
            name,
            str(healthy),
            str(scaled.get("target", "?")),
            scaled.get("window") or "-",
            apps.get(name, {}).get("status", "?"),
        )
    out.print(models)
    replicas = Table("replica", "node", "url", "pid", "health", "in flight", title="replicas")
    for r in report.get("replicas", []):
        health = "[green]serving[/]" if r["healthy"] else "[yellow]cooling down[/]"
        if r.get("draining"):
            health = "[cyan]draining[/]"
        replicas.add_row(
            r["replica_id"], _node(r), r["url"], str(r["pid"]), health, str(r["inflight"])
        )
        ranks = r.get("ranks", [])
        for rank in ranks if len(ranks) > 1 else []:
            replicas.add_row(f"  rank {rank['rank']}", _node(rank), "", str(rank["pid"]), "", "")
    out.print(replicas)


def top(
    interval_s: float = typer.Option(
        2.0,
        "--interval",
        min=0.1,
        help="Seconds between refreshes; req/s, tokens/s and TTFT are over this interval.",
    ),
    once: bool = typer.Option(
        False,
        "--once",
        help="Print one frame (rates over one interval) and exit; what runs when standard "
        "output is not a terminal.",
    ),
) -> None:
    """Watch the running fleet live, like `top`: every model and replica with its state,
    requests in flight, req/s, tokens/s, TTFT p50/p99, KV cache usage, prefix-cache hit
    rate, and each model's window and target replicas. `q` quits."""
    from rayfleet.control import lifecycle
    from rayfleet.control.top import scrape
    from rayfleet.control.top_view import print_once, watch

    state = lifecycle.running_state()
    out = Console()
    if once or not out.is_terminal:
        print_once(lambda: scrape(state), interval_s, out)
    else:
        watch(lambda: scrape(state), interval_s, out)


def _node(where: dict[str, Any]) -> str:
    """A node as its address and Ray node id (raylets may share an address)."""
    return f"{where.get('node_ip', '')} ({where.get('node_id', '')[:8]})".strip()


def down(
    timeout_s: float = typer.Option(
        120.0, "--timeout-s", help="Seconds to wait for a clean stop before killing."
    ),
) -> None:
    """Stop the running fleet: gateway, replicas, vLLM servers and the embedded Ray."""
    from rayfleet.control import lifecycle

    lifecycle.stop_fleet(lifecycle.running_state(), timeout_s, say=_say)
    _say("fleet stopped")


def scale(
    model: str = typer.Argument(..., help="The model to scale."),
    replicas: str = typer.Argument(
        ...,
        metavar="N|auto",
        help="The fixed replica count from now on, or 'auto' to hand the model back to "
        "its autoscaling (or to the replicas in its file).",
    ),
) -> None:
    """Set a model's replica count on the running fleet, without editing fleet.yaml.

    The count must lie within the model's bounds now (its schedule window, if one is
    active). It holds until `rayfleet scale MODEL auto`, or until `rayfleet apply` changes
    the model's replicas or autoscaling; replicas leaving drain first, so no request is cut.
    """
    from rayfleet.control import lifecycle

    count: int | str = replicas
    if replicas != "auto":
        if not replicas.isdigit():
            raise typer.BadParameter("a replica count (0 or more) or 'auto'", param_hint="N")
        count = int(replicas)
    state = lifecycle.running_state()
    lifecycle.admin_call(state, "/rayfleet/scale", {"model": model, "replicas": count})
    if count == "auto":
        _say(f"model '{model}': scaled by its file again; `rayfleet status` shows progress")
    else:
        _say(f"model '{model}': target {count} replica(s); `rayfleet status` shows progress")


def apply(
    config_path: Path = typer.Option(
        ..., "-c", "--config", help="The new fleet.yaml for the running fleet."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; change nothing."),
) -> None:
    """Bring the running fleet to a new fleet.yaml, with no request lost.

    Prints the diff per model, then applies it: scaling changes keep every replica (same
    vLLM processes); changed engine arguments or source roll blue/green (new replicas
    serve before the old ones drain); added models start, removed ones drain. A file that
    fails validation changes nothing. The diff and the steps go to standard output.
    """
    from rayfleet.config import load_fleet
    from rayfleet.control import lifecycle

    load_fleet(config_path)  # a bad file fails here, in one line, before the fleet sees it
    state = lifecycle.running_state()
    body = {"config": config_path.read_text(), "dry_run": dry_run}
    if not dry_run:
        preview = lifecycle.admin_call(state, "/rayfleet/apply", {**body, "dry_run": True})
        for line in preview["diff"]["lines"]:
            typer.echo(line)
    answer = lifecycle.admin_call(state, "/rayfleet/apply", body)
    if dry_run:
        for line in answer["diff"]["lines"]:
            typer.echo(line)
        typer.echo("dry run: nothing changed")
        return
    for step in answer["steps"]:
        typer.echo(step)
    typer.echo("applied" if answer["applied"] else "nothing to apply")
