"""Offline validation of rendered manifests against the official schemas.

- RayService / RayCluster: KubeRay v1.7.0's own CRD schemas (tests/unit/data/kuberay,
  SOURCE.md), every object schema with ``properties`` and no
  ``x-kubernetes-preserve-unknown-fields`` closed, as the API server's strict field
  validation does with a structural schema; Draft 4, as OpenAPI v3's schema subset.
- Core objects (ConfigMap, Deployment, Service): Kubernetes' published schemas as
  ``kubernetes_validate`` ships them, strict (unknown fields refused).
- serveConfigV2: Ray Serve's own ``ServeDeploySchema``.

Each ``*_errors`` function returns ``"<path>: <message>"`` lines, empty when valid.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

KUBERAY = Path(__file__).parent / "data" / "kuberay"
KUBERNETES_VERSION = "1.30.0"


def closed(schema: Any) -> Any:
    """``schema`` with unknown fields refused where the API server refuses them."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def kuberay_validator(kind: str) -> jsonschema.Draft4Validator:
    schema = json.loads((KUBERAY / f"{kind.lower()}-v1.schema.json").read_text())
    return jsonschema.Draft4Validator(closed(schema))


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def kuberay_errors(obj: dict[str, Any]) -> list[str]:
    validator = kuberay_validator(obj["kind"])
    return [f"{_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def core_errors(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(copy.deepcopy(obj), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{_path(exc.path)}: {exc.message}"]
    return []


def serve_config_errors(text: str) -> list[str]:
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        return [str(exc)]
    return []
