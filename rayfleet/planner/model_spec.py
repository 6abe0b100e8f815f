"""What the planner needs to know about a model, read from its Hugging Face ``config.json``.

``load_model_spec(source)`` accepts a ``config.json`` file, a model directory, or a
hub id whose config is already in the local Hugging Face cache (no download).
Everything is read from the config; nothing is guessed from the model's name.
Multimodal configs that nest the language model under ``text_config`` are read from there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfleet._home import hf_hub_cache
from rayfleet.errors import ConfigError
from rayfleet.planner.weight_format import resolve_dtype, resolve_weight_format


@dataclass(frozen=True)
class Attention:
    """Attention shape. ``kv_lora_rank > 0`` means Multi-head Latent Attention (MLA)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    bias: bool = False

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0


@dataclass(frozen=True)
class Experts:
    """Mixture of experts. ``num_experts == 0`` means a dense model."""

    num_experts: int = 0
    num_experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0  # all shared experts of one layer together
    num_dense_layers: int = 0  # leading layers with a plain MLP (DeepSeek's first_k_dense_replace)
    moe_layer_freq: int = 1

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape, storage format and context, as the planner uses them."""

    name: str
    source: str
    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention: Attention
    experts: Experts
    dtype: str  # activations and unquantized weights: float32, bfloat16 or float16
    weight_format: str  # linear layers: a DTYPE_BYTES key
    quant_group_size: int  # weights per scale for int4 formats
    max_context: int
    online_quantization: str | None = None  # vLLM --quantization to quantize at load time
    dtype_override: str | None = None  # vLLM --dtype when it differs from the config's

    @property
    def num_moe_layers(self) -> int:
        if not self.experts.is_moe:
            return 0
        candidates = range(self.experts.num_dense_layers, self.num_layers)
        return sum(1 for i in candidates if i % self.experts.moe_layer_freq == 0)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers


def load_model_spec(
    source: str, *, dtype: str = "auto", quantization: str | None = None
) -> ModelSpec:
    """Read ``source`` (config.json, model directory or cached hub id) into a ModelSpec.

    ``dtype`` (``auto`` keeps the config's) and ``quantization`` override what the
    config says, as vLLM's ``--dtype`` and ``--quantization`` would.
    Raises ConfigError naming the file and the field when something is missing.
    """
    path = find_config(source)
    config = _read_json(path)
    return spec_from_config(
        config, path=path, source=source, dtype=dtype, quantization=quantization
    )


def find_config(source: str) -> Path:
    """The config.json for a file, a directory, or a hub id in the local HF cache."""
    candidate = Path(source).expanduser()
    if candidate.is_file():
        return candidate
    if candidate.is_dir():
        config = candidate / "config.json"
        if config.is_file():
            return config
        raise ConfigError(f"{candidate}: no config.json in this directory; pass a model directory")
    cached = _cached_hub_config(source)
    if cached is not None:
        return cached
    raise ConfigError(
        f"{source}: not a file, a directory, or a model id in the local Hugging Face cache "
        f"({hf_hub_cache()}); pass the path to the model's config.json"
    )


def _cached_hub_config(model_id: str) -> Path | None:
    if model_id.count("/") != 1:
        return None
    snapshots = hf_hub_cache() / ("models--" + model_id.replace("/", "--")) / "snapshots"
    configs = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return configs[-1] if configs else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object with the model's config")
    return data


class _Fields:
    """Reads config fields with their common aliases; errors name the file and the field."""

    def __init__(self, config: dict[str, Any], path: Path):
        self.config = config
        self.path = path

    def int(self, *names: str, default: int | None = None) -> int:
        for name in names:
            value = self.config.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{self.path}: field '{name}' must be a non-negative integer, got {value!r}"
                )
            return value
        if default is not None:
            return default
        raise ConfigError(
            f"{self.path}: missing field '{names[0]}' "
            f"(the planner needs it to size the model; add it to config.json)"
        )


def spec_from_config(
    config: dict[str, Any],
    *,
    path: Path,
    source: str,
    dtype: str = "auto",
    quantization: str | None = None,
) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (see ``load_model_spec``)."""
    if isinstance(config.get("text_config"), dict):
        outer = config
        config = {**config["text_config"]}
        config.setdefault("torch_dtype", outer.get("torch_dtype") or outer.get("dtype"))
        config.setdefault("quantization_config", outer.get("quantization_config"))
    fields = _Fields(config, path)
    hidden = fields.int("hidden_size", "n_embd", "d_model")
    num_heads = fields.int("num_attention_heads", "n_head")
    if num_heads == 0 or hidden == 0:
        raise ConfigError(f"{path}: fields 'hidden_size' and 'num_attention_heads' must be > 0")
    num_layers = fields.int("num_hidden_layers", "n_layer", "num_layers")
    if num_layers == 0:
        raise ConfigError(f"{path}: field 'num_hidden_layers' must be > 0")
    base_dtype = resolve_dtype(config, path, dtype)
    weight_format, group_size = resolve_weight_format(config, path, base_dtype, quantization)
    return ModelSpec(
        name=_model_name(source, path),
        source=source,
        model_type=str(config.get("model_type", "unknown")),
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=fields.int("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
        vocab_size=fields.int("vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention=_attention(fields, hidden, num_heads),
        experts=_experts(fields),
        dtype=base_dtype,
        weight_format=weight_format,
        quant_group_size=group_size,
        max_context=fields.int("max_position_embeddings", "n_positions", "max_seq_len"),
        online_quantization=(
            "fp8" if weight_format == "fp8" and not config.get("quantization_config") else None
        ),
        dtype_override=base_dtype if dtype and dtype != "auto" else None,
    )


def _attention(fields: _Fields, hidden: int, num_heads: int) -> Attention:
    kv_lora_rank = fields.int("kv_lora_rank", default=0)
    if kv_lora_rank:
        rope = fields.int("qk_rope_head_dim")
        nope = fields.int("qk_nope_head_dim")
        return Attention(
            num_heads=num_heads,
            num_kv_heads=num_heads,
            head_dim=rope + nope,
            kv_lora_rank=kv_lora_rank,
            q_lora_rank=fields.int("q_lora_rank", default=0),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            v_head_dim=fields.int("v_head_dim", default=nope),
        )
    num_kv_heads = fields.int("num_key_value_heads", "num_kv_heads", default=num_heads)
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ConfigError(
            f"{fields.path}: field 'num_key_value_heads' ({num_kv_heads}) must divide "
            f"'num_attention_heads' ({num_heads})"
        )
    head_dim = fields.int("head_dim", default=hidden // num_heads)
    bias = bool(fields.config.get("attention_bias", fields.config.get("model_type") == "qwen2"))
    return Attention(num_heads, num_kv_heads, head_dim, bias=bias)


def _experts(fields: _Fields) -> Experts:
    num_experts = fields.int("n_routed_experts", "num_local_experts", "num_experts", default=0)
    if not num_experts:
        return Experts()
    expert_size = fields.int("moe_intermediate_size", "intermediate_size")
    shared_size = fields.int("shared_expert_intermediate_size", default=0)
    if not shared_size:
        shared_size = fields.int("n_shared_experts", default=0) * expert_size
    return Experts(
        num_experts=num_experts,
        num_experts_per_token=fields.int("num_experts_per_tok", "moe_top_k"),
        expert_intermediate_size=expert_size,
        shared_intermediate_size=shared_size,
        num_dense_layers=fields.int("first_k_dense_replace", default=0),
        moe_layer_freq=max(1, fields.int("moe_layer_freq", "decoder_sparse_step", default=1)),
    )


def _model_name(source: str, path: Path) -> str:
    candidate = Path(source).expanduser()
    if candidate.exists():
        folder = path.parent if path.name == "config.json" else candidate
        raw = folder.name if path.name == "config.json" else path.stem
    else:
        raw = source.rsplit("/", 1)[-1]
    return raw.lower().replace("_", "-") or "model"
