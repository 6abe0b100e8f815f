"""How a checkpoint's weights are stored: dtype names, bytes per weight, quantization.

``resolve_dtype`` and ``resolve_weight_format`` read a model's config.json the way vLLM's
``--dtype`` and ``--quantization`` would, the flags overriding what the config says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayfleet.errors import ConfigError

# Bytes per weight for each way a checkpoint can be stored.
DTYPE_BYTES = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
}
# quant_method in config.json -> how its linear weights are stored.
_QUANT_METHODS = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "modelopt": "fp8",
    "awq": "int4",
    "gptq": "int4",
    "awq_marlin": "int4",
    "gptq_marlin": "int4",
    "bitsandbytes": "int4",
}


def normalize_dtype(name: str) -> str:
    key = name.lower().replace("torch.", "")
    return _DTYPE_ALIASES.get(key, key)


def resolve_dtype(config: dict[str, Any], path: Path, override: str) -> str:
    """Activations' and unquantized weights' dtype: ``override`` unless ``auto``, else the
    config's torch_dtype (bfloat16 when it has none)."""
    if override and override != "auto":
        chosen, field = normalize_dtype(override), "--dtype"
    else:
        chosen = normalize_dtype(
            str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        )
        field = "torch_dtype"
    if chosen not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"{path}: {field} '{chosen}' is not one of float32, bfloat16, float16")
    return chosen


def resolve_weight_format(
    config: dict[str, Any], path: Path, base_dtype: str, override: str | None
) -> tuple[str, int]:
    """(format of linear weights, int4 group size) from --quantization or quantization_config."""
    if override:
        method = normalize_dtype(override)
        if method == "none":
            return base_dtype, 0
        fmt = _QUANT_METHODS.get(method, method)
        if fmt not in DTYPE_BYTES:
            raise ConfigError(
                f"--quantization '{override}' is not one of none, fp8, int8, awq, gptq, int4"
            )
        return fmt, 128
    quant = config.get("quantization_config")
    if not quant:
        return base_dtype, 0
    if not isinstance(quant, dict):
        raise ConfigError(f"{path}: field 'quantization_config' must be an object")
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if method in ("compressed-tensors", "compressed_tensors"):
        return _compressed_tensors_format(quant), 128
    if method == "bitsandbytes" and quant.get("load_in_8bit"):
        return "int8", 0
    if method in _QUANT_METHODS:
        fmt = _QUANT_METHODS[method]
        if fmt == "int4" and bits == 8:
            fmt = "int8"
        return fmt, int(quant.get("group_size") or quant.get("q_group_size") or 128)
    raise ConfigError(
        f"{path}: quantization_config.quant_method '{method}' is not known to the planner; "
        "pass --quantization fp8|int8|int4 to say how the weights are stored"
    )


def _compressed_tensors_format(quant: dict[str, Any]) -> str:
    for group in (quant.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits, kind = weights.get("num_bits"), weights.get("type")
        if bits == 4:
            return "int4"
        if bits == 8:
            return "fp8" if kind == "float" else "int8"
    return "fp8"
