"""``rayfleet gateway``: the API in front of replicas that the cluster's own Serve config
deployed (control/attach.py). Nothing heavy is imported before the command runs."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import typer
from rich.console import Console

console = Console(stderr=True, highlight=False)

DASHBOARD_PORT = 8265  # Ray's default dashboard port, on the head


def _say(message: str) -> None:
    console.print(message, markup=False)


def gateway(
    config_file: Path = typer.Option(
        ..., "--config", "-c", help="The fleet file the replicas were deployed from."
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="The Ray cluster (ray://HEAD:10001 from outside it, auto on one of its nodes); "
        "default: cluster.address in the file.",
    ),
    dashboard: str | None = typer.Option(
        None,
        "--dashboard",
        help="The Ray dashboard's URL, through which replica counts are changed "
        f"(default: http://HEAD:{DASHBOARD_PORT}, HEAD taken from a ray:// address).",
    ),
    port: int | None = typer.Option(
        None, "--port", help="Gateway port, overriding gateway.port in the file."
    ),
) -> None:
    """Serve the OpenAI API in front of a fleet that Ray Serve's config deployed.

    For KubeRay's RayService (what `rayfleet k8s render` writes) or `serve deploy` of
    applications built by rayfleet.control.serve_app:build. It joins the cluster, finds
    the replicas, applies the file's policies and routing, and scales autoscaled models
    by rewriting their replica counts in the Serve config. It owns no replica: stopping it
    (Ctrl-C) leaves them serving.
    """
    from rayfleet.control import lifecycle
    from rayfleet.control.attach import AttachedFleet
    from rayfleet.errors import RayfleetError

    config = lifecycle.fleet_config(config_file, port, build_demo=False, say=_say)
    if address is not None:
        config.cluster.address = address
    if config.cluster.address == "local":
        raise RayfleetError(
            "cluster.address is 'local': rayfleet gateway joins a running cluster; "
            "pass --address ray://HEAD:10001 (or use rayfleet up for a local fleet)"
        )
    url = dashboard or _dashboard_from(config.cluster.address)
    lifecycle.refuse_if_running()
    AttachedFleet(config, url, say=_say).run()


def _dashboard_from(address: str) -> str:
    from rayfleet.errors import RayfleetError

    host = urlsplit(address).hostname if "://" in address else None
    if not host:
        raise RayfleetError(
            f"cannot tell the Ray dashboard's URL from address '{address}': "
            "pass --dashboard http://HEAD:8265"
        )
    return f"http://{host}:{DASHBOARD_PORT}"
