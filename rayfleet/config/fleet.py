"""fleet.yaml: the one file that describes a fleet.

    cluster:
      address: local              # local (embedded Ray) | auto | ray://head:10001
      placement_timeout_s: 300    # fail `up` when a replica's nodes are not found by then
    gateway:                      # endpoint and policies: rayfleet/config/gateway.py
      host: 127.0.0.1
      port: 8000
    models:                       # one entry per model: rayfleet/config/models.py
      - name: smollm2-135m        # the model name clients send
        source: /models/smollm2   # local directory or hub id
        replicas: 2

``load_fleet(path)`` parses and validates a file; ``parse_fleet(data, origin)``
validates an already-loaded mapping; ``default_fleet()`` is what ``rayfleet up``
serves without a file. Every problem is a ``ConfigError`` whose one-line message
names the file, the field path, the reason and, for a misspelt key, the key it
probably meant (rayfleet/config/messages.py).

``FleetConfig`` checks what spans sections: model names are unique and no route takes
one; every model a route, limit, key or provider names is in the fleet; priority
classes need vLLM's priority scheduler on every model.

Validation never changes what the user wrote. Values the fleet derives from the
whole file are methods: ``FleetConfig.engine_args_for(model)`` is what a model's vLLM
servers start with, its ``engine_args`` plus ``derived_engine_args(model)`` (today:
``scheduling_policy: priority`` when the gateway defines priority classes).
``rayfleet up --dry-run`` prints both. Checking engine arguments against vLLM's own
parser imports vLLM and lives in the control plane (rayfleet/control/engine_args.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import Field, ValidationError, model_validator

from rayfleet.config.base import StrictModel
from rayfleet.config.cluster import ClusterConfig
from rayfleet.config.gateway import GatewayConfig
from rayfleet.config.kubernetes import KubernetesConfig
from rayfleet.config.messages import describe
from rayfleet.config.models import ModelConfig
from rayfleet.errors import ConfigError


class DerivedArg(NamedTuple):
    """An engine argument the fleet adds to a model's own, and the reason."""

    value: Any
    because: str


class FleetConfig(StrictModel):
    """A whole fleet: where it runs, its endpoint, its models."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    models: list[ModelConfig] = Field(min_length=1, description="Models to serve.")
    kubernetes: KubernetesConfig | None = Field(default=None, description="`rayfleet k8s render`.")

    @model_validator(mode="after")
    def _unique_names(self) -> FleetConfig:
        seen: set[str] = set()
        for model in self.models:
            if model.name in seen:
                raise ValueError(f"two models are named '{model.name}'; model names must be unique")
            seen.add(model.name)
        return self

    @model_validator(mode="after")
    def _routes_name_models(self) -> FleetConfig:
        """Route targets and tokenizers are models of the fleet, and no route is one."""
        models = [m.name for m in self.models]
        clash = sorted(set(models) & {r.name for r in self.gateway.routes})
        if clash:
            raise ValueError(f"'{clash[0]}' is both a model and a route; rename the route")
        for route in self.gateway.routes:
            for rule in route.rules:
                if not rule.target.startswith("fallback:") and rule.target not in models:
                    raise ValueError(
                        f"route '{route.name}' rule '{rule.name}' targets '{rule.target}', which "
                        f"is not a model of the fleet ({', '.join(models)}) nor 'fallback:<name>'"
                    )
            if route.tokenizer is not None and route.tokenizer not in models:
                raise ValueError(
                    f"route '{route.name}' tokenizer '{route.tokenizer}' is not a "
                    f"model of the fleet ({', '.join(models)})"
                )
        return self

    @model_validator(mode="after")
    def _policies_name_models(self) -> FleetConfig:
        """Per-model limits, keys' models and providers' models are models or routes."""
        gateway = self.gateway
        names = [m.name for m in self.models] + [r.name for r in gateway.routes]
        named = [(f"gateway.model_limits '{n}'", n) for n in gateway.model_limits]
        named += [
            (f"api_keys '{k.name}' models '{n}'", n)
            for k in gateway.api_keys
            for n in k.models or ()
        ]
        named += [
            (f"fallback provider '{p.name}' models '{n}'", n)
            for p in gateway.fallback.providers
            for n in p.models
        ]
        for what, name in named:
            if name not in names:
                raise ValueError(f"{what} is neither a model nor a route ({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _priority_scheduler_possible(self) -> FleetConfig:
        """Priority classes need vLLM's priority scheduler on every model."""
        if self.gateway.priority_classes:
            for model in self.models:
                policy = model.engine_args.get("scheduling_policy", "priority")
                if policy != "priority":
                    raise ValueError(
                        f"model '{model.name}' sets scheduling_policy '{policy}', but "
                        "gateway.priority_classes need 'priority'; remove it or set 'priority'"
                    )
        return self

    def model(self, name: str) -> ModelConfig:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def derived_engine_args(self, model: ModelConfig) -> dict[str, DerivedArg]:
        """Engine arguments the fleet adds to ``model``'s own ``engine_args``, with reasons.

        ``scheduling_policy: priority`` when the gateway defines priority classes (vLLM
        honours a request's priority only under that scheduler) and the model does not
        set it; a model that sets another policy fails validation instead.
        """
        derived: dict[str, DerivedArg] = {}
        if self.gateway.priority_classes and "scheduling_policy" not in model.engine_args:
            derived["scheduling_policy"] = DerivedArg(
                "priority", "gateway.priority_classes need vLLM's priority scheduler"
            )
        return derived

    def engine_args_for(self, model: ModelConfig) -> dict[str, Any]:
        """The engine arguments ``model``'s vLLM servers start with: its own, then derived."""
        derived = self.derived_engine_args(model)
        return {**model.engine_args, **{key: arg.value for key, arg in derived.items()}}


DEMO_MODEL_NAME = "smollm2-135m"
DEMO_ENGINE_ARGS = {"max_model_len": 2048, "enforce_eager": True, "dtype": "float32"}


def default_fleet() -> FleetConfig:
    """The demo fleet: SmolLM2-135M-Instruct on an embedded Ray, gateway on :8000."""
    from rayfleet.models.build import DEMO_NAME, default_model_dir

    return FleetConfig(
        models=[
            ModelConfig(
                name=DEMO_MODEL_NAME,
                source=str(default_model_dir(DEMO_NAME)),
                engine_args=dict(DEMO_ENGINE_ARGS),
            )
        ]
    )


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a fleet.yaml; raise ConfigError with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; pass an existing fleet.yaml with -c") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{path}{where}: {problem}") from None
    return parse_fleet(data, origin=str(path))


def parse_fleet(data: Any, origin: str = "fleet.yaml") -> FleetConfig:
    """Validate an already-loaded fleet.yaml mapping; ``origin`` prefixes every message."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{origin}: expected a mapping with 'models' (and optionally "
            "'cluster', 'gateway') at the top level"
        )
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_every_error(exc, data, origin)) from None


MAX_ERRORS_SHOWN = 10


def _every_error(exc: ValidationError, data: Any, origin: str) -> str:
    """One line per invalid field, each prefixed with ``origin``, so that
    a file with several mistakes is mended in one round; past ``MAX_ERRORS_SHOWN``, a
    count of the rest."""
    described = (f"{origin}: {describe(error, data, FleetConfig)}" for error in exc.errors())
    lines = list(dict.fromkeys(described))  # a union's variants can repeat one line
    if len(lines) > MAX_ERRORS_SHOWN:
        rest = len(lines) - MAX_ERRORS_SHOWN
        lines = [*lines[:MAX_ERRORS_SHOWN], f"{origin}: ... and {rest} more"]
    return "\n".join(lines)
