"""fleet.yaml: the one file that describes a fleet.

    cluster:
      address: local              # local (embedded Ray) | auto | ray://head:10001
    gateway:
      host: 127.0.0.1
      port: 8000
    models:
      - name: smollm2-135m        # the model name clients send
        source: /models/smollm2   # local directory or hub id
        engine_args:              # vLLM server flags, underscores or dashes, unchanged
          max_model_len: 2048
          enforce_eager: true
        replicas: 2
        num_cpus: 1
        num_gpus: 0
        placement_strategy: PACK  # PACK | SPREAD | STRICT_PACK

``load_fleet(path)`` parses and validates a file; ``parse_fleet(data, origin)``
validates an already-loaded mapping; ``default_fleet()`` is what ``rayfleet up``
serves without a file. Every problem is a ``ConfigError`` whose one-line message
names the file, the field path, the reason and, for a misspelt key, the key it
probably meant. ``check_engine_args`` runs each model's engine arguments through
vLLM's own argument parser (imports vLLM: call it just before deploying).
"""

from __future__ import annotations

import difflib
import io
import contextlib
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rayfleet.errors import ConfigError

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK"]

# Flags rayfleet sets itself for every replica; a user value would be silently lost.
RESERVED_ENGINE_ARGS = {"model", "served_model_name", "host", "port"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ClusterConfig(_Strict):
    """Which Ray cluster runs the fleet."""

    address: str = Field(
        "local",
        description="'local' starts an embedded Ray on this machine; 'auto' joins the Ray "
        "cluster started with `ray start`; 'ray://host:10001' connects through Ray Client.",
    )
    num_cpus: Optional[int] = Field(
        None, ge=1, description="Logical CPUs of the embedded Ray (local only; default: enough "
        "for every replica)."
    )

    @field_validator("address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if value in ("local", "auto") or value.startswith("ray://") or ":" in value:
            return value
        raise ValueError(f"'{value}' is not 'local', 'auto', 'ray://host:port' or 'host:port'")


class GatewayConfig(_Strict):
    """The OpenAI-compatible endpoint."""

    host: str = Field("127.0.0.1", description="Interface the gateway listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port the gateway listens on.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="Longest a request may take end to end."
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, description="Longest the gateway waits to connect to a replica."
    )


class ModelConfig(_Strict):
    """One model served by the fleet, as a group of identical replicas."""

    name: str = Field(min_length=1, description="Model name clients put in requests.")
    source: str = Field(min_length=1, description="Local model directory or hub id.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM server arguments, passed unchanged (checked by vLLM's parser).",
    )
    replicas: int = Field(1, ge=1, description="Number of identical vLLM servers.")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica (single-node).")
    placement_strategy: PlacementStrategy = Field(
        "PACK", description="How the bundles of one multi-GPU replica are placed."
    )
    startup_timeout_s: float = Field(
        900.0, gt=0, description="Longest a replica may take to load its model."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the vLLM server."
    )

    @field_validator("source")
    @classmethod
    def _expand_home(cls, source: str) -> str:
        return str(Path(source).expanduser()) if source.startswith("~") else source

    @field_validator("engine_args")
    @classmethod
    def _no_reserved(cls, args: dict[str, Any]) -> dict[str, Any]:
        normal = {k.replace("-", "_"): v for k, v in args.items()}
        taken = sorted(RESERVED_ENGINE_ARGS & normal.keys())
        if taken:
            raise ValueError(
                f"{', '.join(taken)} is set by rayfleet for each replica; use the model's "
                "'name' and 'source' fields instead"
            )
        return normal

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.engine_args.get("tensor_parallel_size", 1))

    @property
    def pipeline_parallel_size(self) -> int:
        return int(self.engine_args.get("pipeline_parallel_size", 1))

    @property
    def world_size(self) -> int:
        """Engine workers (GPUs) one replica needs."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


class FleetConfig(_Strict):
    """A whole fleet: where it runs, its endpoint, its models."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    models: list[ModelConfig] = Field(min_length=1, description="Models to serve.")

    @model_validator(mode="after")
    def _unique_names(self) -> "FleetConfig":
        seen: set[str] = set()
        for model in self.models:
            if model.name in seen:
                raise ValueError(f"two models are named '{model.name}'; model names must be unique")
            seen.add(model.name)
        return self

    def model(self, name: str) -> ModelConfig:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)


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
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping with 'models' (and optionally "
                          "'cluster', 'gateway') at the top level")
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {_describe(exc.errors()[0], data)}") from None


def _describe(error: dict, data: Any) -> str:
    loc = list(error["loc"])
    path = _field_path(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_for(loc[:-1])
        hint = _did_you_mean(str(loc[-1]), list(parent.model_fields) if parent else [])
        return f"{path}: unknown field{hint}"
    if kind == "missing":
        return f"{path}: required field is missing"
    value = _value_at(data, loc)
    simple = loc and value is not _MISSING and not isinstance(value, (dict, list))
    shown = f" (got {value!r})" if simple else ""
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}{shown}" if path else f"{message}{shown}"


def _field_path(loc: list) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_MISSING = object()


def _value_at(data: Any, loc: list) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


def _model_for(loc: list) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for suggestions)."""
    model: type[BaseModel] = FleetConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        candidates = [annotation, *(inner or ())]
        nested = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nested is None:
            return None
        model = nested
    return model


def _did_you_mean(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else (
        f"; allowed: {', '.join(choices)}" if choices else ""
    )


def check_engine_args(fleet: FleetConfig) -> None:
    """Run every model's engine_args through vLLM's own server argument parser.

    Raises ConfigError naming the model and the argument. Imports vLLM (seconds).
    """
    from rayfleet.control.engine import engine_argv

    parser = _vllm_server_parser()
    known = sorted({a.dest for a in parser._actions if a.dest != "help"})
    for index, model in enumerate(fleet.models):
        for key in model.engine_args:
            if key not in known:
                hint = _did_you_mean(key, known)
                raise ConfigError(
                    f"models[{index}].engine_args.{key}: not a vLLM server argument{hint}"
                )
        argv = ["--model", model.source, *engine_argv(model.engine_args)]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(argv)
            except SystemExit:
                reason = err.getvalue().strip().splitlines()[-1] if err.getvalue() else "rejected"
                reason = reason.split("error: ", 1)[-1]
                raise ConfigError(
                    f"models[{index}].engine_args ({model.name}): vLLM rejects them: {reason}"
                ) from None


def _vllm_server_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # older vLLM releases
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser(prog="vllm-server"))
