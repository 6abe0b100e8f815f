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

import contextlib
import difflib
import io
from pathlib import Path
from typing import Any, Literal

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
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="Logical CPUs of the embedded Ray (local only; default: enough "
        "for every replica).",
    )

    @field_validator("address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if value in ("local", "auto") or value.startswith("ray://") or ":" in value:
            return value
        raise ValueError(f"'{value}' is not 'local', 'auto', 'ray://host:port' or 'host:port'")


class LimitsConfig(_Strict):
    """Caps on what one request may ask for (OWASP API4). Unset fields impose no cap."""

    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Largest max_tokens (or max_completion_tokens) a request may ask for.",
    )
    max_tokens_action: Literal["reject", "clamp"] = Field(
        "reject",
        description="Over max_tokens: 'reject' with a 400 stating the cap, or "
        "'clamp' the request down to the cap.",
    )
    max_n: int | None = Field(None, ge=1, description="Largest 'n' (choices per request).")
    max_body_bytes: int | None = Field(
        None, ge=1, description="Largest request body in bytes; larger is a 413."
    )
    max_messages: int | None = Field(
        None, ge=1, description="Most chat messages per request (or prompts per completion)."
    )
    check_context: bool = Field(
        True,
        description="Refuse a request whose prompt plus max_tokens exceeds the model's "
        "context length with a 400 giving both numbers, before it reaches the engine.",
    )


class TimeWindow(_Strict):
    """A daily window of wall-clock time in gateway.timezone; 'from' after 'to' wraps midnight."""

    start: str = Field(alias="from", description="Start, 'HH:MM' (inclusive).")
    end: str = Field(alias="to", description="End, 'HH:MM' (exclusive).")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        parts = value.split(":")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            if (
                int(parts[0]) <= 24
                and int(parts[1]) < 60
                and (int(parts[0]) < 24 or parts[1] == "00")
            ):
                return value
        raise ValueError(f"'{value}' is not a time of day 'HH:MM' (00:00 to 24:00)")


class RuleConfig(_Strict):
    """One rule of a route: every condition given must hold; the first rule that holds wins."""

    name: str = Field(min_length=1, description="Shown in the x-rayfleet-route header.")
    target: str = Field(
        min_length=1, description="A model of the fleet, or 'fallback:<provider name>'."
    )
    prompt_tokens_below: int | None = Field(
        None,
        ge=1,
        description="Holds when the prompt has fewer tokens than this (counted "
        "with the target model's tokenizer).",
    )
    prompt_tokens_at_least: int | None = Field(
        None, ge=0, description="Holds when the prompt has at least this many tokens."
    )
    priority_classes: list[str] | None = Field(
        None, min_length=1, description="Holds when the request's priority class is one of these."
    )
    time_of_day: TimeWindow | None = Field(
        None, description="Holds inside this daily window (gateway.timezone)."
    )


class RouteConfig(_Strict):
    """A virtual model name whose target is chosen per request by ordered rules."""

    name: str = Field(min_length=1, description="The model name clients send for this route.")
    rules: list[RuleConfig] = Field(min_length=1, description="Tried in order.")
    fallback: str | None = Field(
        None, description="Provider used when no rule holds or every rule's target is down."
    )
    tokenizer: str | None = Field(
        None,
        description="Model whose tokenizer counts prompt tokens for rules whose target "
        "is a provider (default: the first model a rule names).",
    )


class ProviderConfig(_Strict):
    """An external OpenAI-compatible provider used as the degradation channel."""

    name: str = Field(min_length=1, description="Named in rules as 'fallback:<name>'.")
    base_url: str = Field(
        min_length=1, description="The provider's OpenAI base URL, e.g. https://api.example.com/v1."
    )
    api_key_env: str | None = Field(
        None, description="Environment variable holding the provider's API key (sent as Bearer)."
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Model or route name clients send -> the provider's model name. "
        "Only names listed here (or any, with default_model) fall back to this provider.",
    )
    default_model: str | None = Field(None, description="Provider model for names not in 'models'.")
    timeout_s: float = Field(600.0, gt=0, description="Longest a provider request may take.")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"'{value}' is not an http(s) URL")
        return value.rstrip("/")


class FallbackConfig(_Strict):
    """When requests go to a provider instead of the fleet."""

    providers: list[ProviderConfig] = Field(
        default_factory=list, description="In order of preference."
    )
    on_no_replica: bool = Field(True, description="When a model has no healthy replica.")
    on_failure: bool = Field(
        True, description="When a request failed before its first byte after the in-fleet retry."
    )
    max_queue_depth: int | None = Field(
        None,
        ge=1,
        description="When every healthy replica already has this many requests in flight.",
    )


class PriorityClassConfig(_Strict):
    """A class of traffic: vLLM priority (lower runs first, as in vLLM) and its timeouts."""

    name: str = Field(min_length=1, description="Class name, used by keys, rules and the header.")
    priority: int = Field(description="vLLM per-request priority; lower is served first.")
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Longest a request may take end to end; then 408 (or an error "
        "event ending the stream) and the upstream request is aborted.",
    )
    stream_idle_timeout_s: float | None = Field(
        None, gt=0, description="Longest gap between two bytes of a response; then as timeout_s."
    )


class ApiKeyConfig(_Strict):
    """A client key: who it is, what it may use, how much."""

    name: str = Field(min_length=1, description="Shown in metrics; never the key itself.")
    key_sha256: str | None = Field(
        None,
        description="'sha256:<64 hex>' of the key (make one with "
        "`python -m rayfleet.gateway.auth`).",
    )
    key_file: str | None = Field(
        None, description="File holding the key itself (first line); hashed at start."
    )
    priority_class: str | None = Field(None, description="Priority class of its requests.")
    models: list[str] | None = Field(
        None, description="Models and routes it may use (default: all)."
    )
    requests_per_minute: int | None = Field(None, ge=1, description="Request rate cap.")
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        description="Token rate cap: prompt tokens plus max_tokens, charged at admission.",
    )
    max_concurrent: int | None = Field(None, ge=1, description="Requests in flight at once.")

    @field_validator("key_sha256")
    @classmethod
    def _hash_form(cls, value: str | None) -> str | None:
        if value is None:
            return value
        digest = value.removeprefix("sha256:")
        if (
            value.startswith("sha256:")
            and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest.lower())
        ):
            return "sha256:" + digest.lower()
        raise ValueError(
            "must be 'sha256:' followed by 64 hex digits (the key's hash, not the key)"
        )

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeyConfig:
        if (self.key_sha256 is None) == (self.key_file is None):
            raise ValueError(
                f"key '{self.name}' needs exactly one of key_sha256 and key_file "
                f"(got key_sha256={'set' if self.key_sha256 else 'unset'}, "
                f"key_file={'set' if self.key_file else 'unset'})"
            )
        return self


class ReplicaProtectionConfig(_Strict):
    """Taking failing replicas out of rotation."""

    max_consecutive_failures: int = Field(
        1, ge=1, description="Failures in a row that take a replica out of rotation."
    )
    cooldown_s: float = Field(
        5.0, gt=0, description="How long it stays out before being tried again."
    )


class GatewayConfig(_Strict):
    """The OpenAI-compatible endpoint and its policies."""

    host: str = Field("127.0.0.1", description="Interface the gateway listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port the gateway listens on.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="Longest a request may take end to end."
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, description="Longest the gateway waits to connect to a replica."
    )
    timezone: str = Field("UTC", description="IANA time zone of time_of_day rules.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Caps for every model.")
    model_limits: dict[str, LimitsConfig] = Field(
        default_factory=dict,
        description="Per model or route: caps that override 'limits' field by field.",
    )
    routes: list[RouteConfig] = Field(default_factory=list, description="Virtual model names.")
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)
    priority_classes: list[PriorityClassConfig] = Field(default_factory=list)
    default_priority_class: str | None = Field(
        None, description="Class of requests with neither a keyed class nor the priority header."
    )
    priority_header: str = Field(
        "x-rayfleet-priority", description="Request header naming a class (a key's class wins)."
    )
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="When any is given, /v1 requests need one (Bearer)."
    )
    open_metrics: bool = Field(True, description="/metrics answers without a key.")
    open_health: bool = Field(True, description="/health answers without a key.")
    replica_protection: ReplicaProtectionConfig = Field(default_factory=ReplicaProtectionConfig)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"'{value}' is not an IANA time zone (e.g. 'UTC', 'Europe/Paris')"
            ) from None
        return value

    @model_validator(mode="after")
    def _references_resolve(self) -> GatewayConfig:
        """Every class and provider a rule, key or default names must be defined here."""
        classes = [c.name for c in self.priority_classes]
        providers = [p.name for p in self.fallback.providers]
        for kind, names in (
            ("priority class", classes),
            ("fallback provider", providers),
            ("route", [r.name for r in self.routes]),
        ):
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup:
                raise ValueError(f"two {kind}s are named '{dup}'; names must be unique")
        wanted_classes = [
            (f"default_priority_class '{self.default_priority_class}'", self.default_priority_class)
        ]
        wanted_classes += [
            (f"api_keys '{k.name}' priority_class '{k.priority_class}'", k.priority_class)
            for k in self.api_keys
        ]
        wanted_providers = [
            (f"routes '{r.name}' fallback '{r.fallback}'", r.fallback) for r in self.routes
        ]
        for route in self.routes:
            for rule in route.rules:
                wanted_classes += [
                    (f"rule '{rule.name}' priority class '{c}'", c)
                    for c in rule.priority_classes or ()
                ]
                if rule.target.startswith("fallback:"):
                    wanted_providers.append(
                        (
                            f"rule '{rule.name}' target '{rule.target}'",
                            rule.target.removeprefix("fallback:"),
                        )
                    )
                low, high = rule.prompt_tokens_at_least, rule.prompt_tokens_below
                if low is not None and high is not None and low >= high:
                    raise ValueError(
                        f"rule '{rule.name}': prompt_tokens_at_least ({low}) must be below "
                        f"prompt_tokens_below ({high}), or no prompt can match; lower the first "
                        "or raise the second"
                    )
        for what, name in wanted_classes:
            if name is not None and name not in classes:
                raise ValueError(
                    f"{what} is not defined; priority_classes has: {', '.join(classes) or 'none'}"
                )
        for what, name in wanted_providers:
            if name is not None and name not in providers:
                raise ValueError(
                    f"{what} is not a fallback provider; fallback.providers has: "
                    f"{', '.join(providers) or 'none'}"
                )
        return self


class ModelConfig(_Strict):
    """One model served by the fleet, as a group of identical replicas."""

    name: str = Field(min_length=1, description="Model name clients put in requests.")
    source: str = Field(
        min_length=1,
        description="Local model directory or hub id; '~' expands on the node that loads it.",
    )
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
    def _unique_names(self) -> FleetConfig:
        seen: set[str] = set()
        for model in self.models:
            if model.name in seen:
                raise ValueError(f"two models are named '{model.name}'; model names must be unique")
            seen.add(model.name)
        return self

    @model_validator(mode="after")
    def _gateway_matches_models(self) -> FleetConfig:
        """Route targets and per-model settings name real models; priority classes need
        vLLM's priority scheduler, which this adds to every model that does not set it."""
        gateway = self.gateway
        models = [m.name for m in self.models]
        routes = [r.name for r in gateway.routes]
        clash = sorted(set(models) & set(routes))
        if clash:
            raise ValueError(f"'{clash[0]}' is both a model and a route; rename the route")
        for route in gateway.routes:
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
        names = models + routes
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
        if gateway.priority_classes:
            for model in self.models:
                policy = model.engine_args.get("scheduling_policy")
                if policy is None:
                    model.engine_args["scheduling_policy"] = "priority"
                elif policy != "priority":
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
        raise ConfigError(
            f"{origin}: expected a mapping with 'models' (and optionally "
            "'cluster', 'gateway') at the top level"
        )
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
    return (
        f"; did you mean '{match[0]}'?"
        if match
        else (f"; allowed: {', '.join(choices)}" if choices else "")
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
