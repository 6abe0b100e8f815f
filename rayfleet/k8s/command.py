"""``rayfleet k8s render``: parse, call rayfleet/k8s/render.py, print what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    help="Kubernetes manifests for a fleet: a KubeRay RayService, the gateway, monitoring.",
    no_args_is_help=True,
)


@app.command()
def render(
    config_file: Annotated[
        Path, typer.Option("--config", "-c", help="fleet.yaml to render (its kubernetes section).")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder to write the YAML files into.")
    ] = Path("k8s"),
    image: Annotated[
        str | None,
        typer.Option(help="Image with rayfleet, Ray and vLLM (overrides kubernetes.image)."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace of every object (overrides kubernetes.namespace).")
    ] = None,
) -> None:
    """Write the fleet as KubeRay manifests that `kubectl apply -f OUT` takes.

    configmap.yaml: the fleet.yaml every pod reads.

    rayservice.yaml: the RayService, one Serve application per model.

    gateway.yaml: the gateway's Deployment and Service, joining the head over Ray client.

    monitoring.yaml: PodMonitors, a PrometheusRule and a Grafana dashboard.

    Keys stay in Secrets referenced by name; the command prints how to create them.
    A fleet that could not run as rendered is refused in one line naming the field.
    """
    from rayfleet.config import load_fleet
    from rayfleet.k8s.render import (
        kubernetes_section,
        render_fleet,
        secrets_to_create,
        write_manifests,
    )

    config = load_fleet(config_file)
    manifests = render_fleet(
        config,
        config_file.read_text(),
        image=image,
        namespace=namespace,
        origin=str(config_file),
    )
    paths = write_manifests(manifests, out)
    console = Console(highlight=False, soft_wrap=True)
    for manifest, path in zip(manifests, paths, strict=True):
        for obj in manifest.objects:
            console.print(f"{path}  {obj['kind']} {obj['metadata']['name']}", markup=False)
    for line in secrets_to_create(config, kubernetes_section(config, image, namespace)):
        console.print(f"secret to create: {line}", markup=False)
