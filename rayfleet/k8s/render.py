"""fleet.yaml to manifest files: ``render_fleet`` builds, ``write_manifests`` writes.

    render_fleet(config, fleet_text, image=, namespace=) -> [Manifest]
        refuses in one line (checks.fleet_problem), then builds each file's objects:
        configmap.yaml   the fleet.yaml as written
        rayservice.yaml  the RayService (rayservice.py)
        gateway.yaml     the gateway's Deployment and Service (gateway_objects.py)
        monitoring.yaml  PodMonitors, PrometheusRule, dashboard (monitoring_objects.py)
    write_manifests(manifests, out_dir) -> paths written

``--image`` and ``--namespace`` override ``kubernetes.image`` and
``kubernetes.namespace``; a fleet without a ``kubernetes`` section takes its defaults.
Each file starts with a comment saying what it holds and what to create first (the
Secrets, which the render never writes), so ``kubectl apply -f DIR`` takes the folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rayfleet.config import FleetConfig, KubernetesConfig
from rayfleet.errors import ConfigError
from rayfleet.k8s.checks import fleet_problem, operator_problems
from rayfleet.k8s.gateway_objects import (
    api_key_files,
    configmap,
    gateway_deployment,
    gateway_service,
    provider_env,
)
from rayfleet.k8s.monitoring_objects import monitoring_objects
from rayfleet.k8s.rayservice import rayservice

Obj = dict[str, Any]


@dataclass
class Manifest:
    """One file of the output: a header comment and its objects."""

    file: str
    header: str
    objects: list[Obj] = field(default_factory=list)

    def text(self) -> str:
        comment = "".join(f"# {line}".rstrip() + "\n" for line in self.header.splitlines())
        body = yaml.dump_all(
            self.objects, Dumper=_ManifestDumper, sort_keys=False, explicit_start=True
        )
        return comment + body


class _ManifestDumper(yaml.SafeDumper):
    """Plain YAML a person reads: no anchors, multi-line text (serveConfigV2, the
    fleet.yaml) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _text)


def kubernetes_section(
    config: FleetConfig, image: str | None = None, namespace: str | None = None
) -> KubernetesConfig:
    """The file's ``kubernetes`` section (or its defaults) with the flags applied."""
    k8s = config.kubernetes or KubernetesConfig()
    updates: dict[str, str] = {}
    if image:
        updates["image"] = image
    if namespace:
        updates["namespace"] = namespace
    if not updates:
        return k8s
    return KubernetesConfig.model_validate({**k8s.model_dump(), **updates})


def render_fleet(
    config: FleetConfig,
    fleet_text: str,
    *,
    image: str | None = None,
    namespace: str | None = None,
    origin: str = "fleet.yaml",
) -> list[Manifest]:
    """The manifests for ``config``; ConfigError with one line when it cannot run so."""
    try:
        k8s = kubernetes_section(config, image, namespace)
    except ValueError as exc:  # pydantic's ValidationError is one
        raise ConfigError(f"{origin}: --namespace: {_first_error(exc)}") from None
    problem = fleet_problem(config, k8s, k8s.image)
    if problem:
        raise ConfigError(f"{origin}: {problem}")
    image = k8s.image or ""  # fleet_problem refuses a fleet without one
    service = rayservice(config, k8s, image)
    broken = operator_problems(service)
    if broken:
        raise ConfigError(f"{origin}: the rendered RayService breaks KubeRay's rules: {broken[0]}")
    return [
        Manifest("configmap.yaml", _CONFIGMAP_HEADER, [configmap(k8s, fleet_text)]),
        Manifest("rayservice.yaml", _RAYSERVICE_HEADER, [service]),
        Manifest(
            "gateway.yaml",
            _gateway_header(config, k8s),
            [gateway_deployment(config, k8s, image), gateway_service(config, k8s)],
        ),
        Manifest("monitoring.yaml", _MONITORING_HEADER, monitoring_objects(k8s)),
    ]


def write_manifests(manifests: list[Manifest], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for manifest in manifests:
        path = out_dir / manifest.file
        path.write_text(manifest.text())
        paths.append(path)
    return paths


def secrets_to_create(config: FleetConfig, k8s: KubernetesConfig) -> list[str]:
    """``kubectl create secret`` lines for the Secrets the manifests reference."""
    lines = []
    env = [e["name"] for e in provider_env(config, k8s)]
    if env:
        literals = " ".join(f"--from-literal={n}=..." for n in env)
        lines.append(
            f"kubectl -n {k8s.namespace} create secret generic {k8s.secrets.provider_keys} "
            + literals
        )
    files = api_key_files(config)
    if files:
        sources = " ".join(f"--from-file={n}=PATH" for n in files)
        lines.append(
            f"kubectl -n {k8s.namespace} create secret generic {k8s.secrets.api_keys} " + sources
        )
    return lines


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return str(errors()[0]["msg"]).removeprefix("Value error, ")
    return str(exc)


def _gateway_header(config: FleetConfig, k8s: KubernetesConfig) -> str:
    lines = [
        "The gateway: a Deployment joining the RayService's head over Ray client, and its",
        f"Service on port {config.gateway.port}. Probes: GET /health.",
    ]
    secrets = secrets_to_create(config, k8s)
    if secrets:
        lines += ["Create its Secrets first (values never appear in these files):", *secrets]
    return "\n".join(lines)


_CONFIGMAP_HEADER = (
    "The fleet.yaml every pod reads at /etc/rayfleet/fleet.yaml (head, workers, gateway).\n"
    "Rendered by `rayfleet k8s render`; render again after changing the file."
)
_RAYSERVICE_HEADER = (
    "The RayService: serveConfigV2 (one application per model, no Serve HTTP proxy) and\n"
    "the Ray cluster: a head with no CPUs for Serve, one worker group per GPU count.\n"
    "Needs the KubeRay operator (ray.io/v1)."
)
_MONITORING_HEADER = (
    "Monitoring: PodMonitors and a PrometheusRule (Prometheus Operator's\n"
    "monitoring.coreos.com/v1), and a Grafana dashboard ConfigMap for Grafana's sidecar."
)
