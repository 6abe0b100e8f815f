"""A model's Serve application built from a fleet file, for clusters where Ray Serve's own
config deploys the replicas (KubeRay's RayService, ``serve deploy``) instead of
``rayfleet up``::

    applications:
      - name: chat
        import_path: rayfleet.control.serve_app:build
        args: {model: chat, config: /etc/rayfleet/fleet.yaml}

``build(args)`` runs where Serve builds applications. It reads the fleet file, makes the
replica registry if it is missing (detached: no one driver owns it here) and returns the
application ``rayfleet up`` would deploy for that model, with ``ATTACHED_LOG_DIR`` for the
vLLM logs and no advertised host (each replica registers its node's address). The replica
count is ``args["replicas"]`` when given, else the model's count at start (``replicas``,
or its lower bound now), at least 1: Serve refuses an application of no replica. A
deployment's ``num_replicas`` in the Serve config overrides both.

``rayfleet gateway`` (control/attach.py) then serves the API in front of these replicas
and changes their counts through the same Serve config, so the deployment version, a
digest of what each replica starts with, stays the one built here and no replica restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.serve import Application

ATTACHED_LOG_DIR = Path("/tmp/rayfleet/logs")  # on each Ray node, beside Ray's own logs


def build(args: dict[str, Any]) -> Application:
    """The Serve application for ``args["model"]`` of the fleet file ``args["config"]``."""
    from rayfleet.config import load_fleet
    from rayfleet.control.registry import get_or_create_registry
    from rayfleet.control.replica import build_application
    from rayfleet.control.scaling import Clock, initial_target
    from rayfleet.errors import RayfleetError

    unknown = set(args) - {"model", "config", "replicas"}
    if unknown or "model" not in args or "config" not in args:
        raise RayfleetError(
            f"serve_app.build takes args {{model, config[, replicas]}}; got {sorted(args)}"
        )
    config = load_fleet(args["config"])
    try:
        model = config.model(str(args["model"]))
    except KeyError:
        names = ", ".join(m.name for m in config.models)
        raise RayfleetError(f"no model '{args['model']}' in {args['config']} ({names})") from None
    replicas = int(args.get("replicas") or max(1, initial_target(model, Clock.from_env().now())))
    get_or_create_registry(detached=True)
    return build_application(
        model,
        config.engine_args_for(model),
        advertise_host=None,
        log_dir=ATTACHED_LOG_DIR,
        num_replicas=replicas,
    )
