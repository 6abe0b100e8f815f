"""Reading config.json into a ModelSpec, and parameter counts against published sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayfleet.errors import ConfigError
from rayfleet.planner.model_spec import load_model_spec
from rayfleet.planner.params import count_params

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner"

# Parameter counts the model publishers state (model cards, papers).
PUBLISHED_PARAMS = {
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "llama-3.1-405b": 405.9e9,
    "mixtral-8x7b": 46.7e9,
    "deepseek-v3": 671e9,  # without the 14B multi-token-prediction module
}


def write_config(tmp_path: Path, **fields) -> Path:
    base = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    base.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in base.items() if v is not None}))
    return path


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_published_size(name):
    spec = load_model_spec(str(FIXTURES / name))
    assert count_params(spec).total == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005)


def test_tiny_model_count_is_exact(tiny_model):
    spec = load_model_spec(str(tiny_model))
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    # embeddings vocab x 128 twice (untied) + 2 layers x (attention 49,152 + MLP 98,304 +
    # norms 256) + the final norm; the weights file holds exactly that many float32 values
    expected = 2 * vocab * 128 + 2 * (49_152 + 98_304 + 256) + 128
    assert count_params(spec).total == expected
    checkpoint_bytes = (tiny_model / "model.safetensors").stat().st_size
    assert expected * 4 == pytest.approx(checkpoint_bytes, rel=0.01)


def test_demo_model_count_matches_its_checkpoint(demo_model):
    spec = load_model_spec(str(demo_model))
    assert spec.tie_word_embeddings is True
    checkpoint_bytes = (demo_model / "model.safetensors").stat().st_size
    assert count_params(spec).total * 4 == pytest.approx(checkpoint_bytes, rel=0.001)


def test_deepseek_reads_mla_and_experts():
    spec = load_model_spec(str(FIXTURES / "deepseek-v3"))
    assert spec.attention.is_mla
    assert (spec.attention.kv_lora_rank, spec.attention.qk_rope_head_dim) == (512, 64)
    assert spec.experts.num_experts == 256
    assert spec.experts.num_experts_per_token == 8
    assert spec.experts.shared_intermediate_size == 2048
    assert (spec.num_dense_layers, spec.num_moe_layers) == (3, 58)
    assert spec.weight_format == "fp8"
    assert spec.online_quantization is None


def test_mixtral_experts_use_the_intermediate_size():
    spec = load_model_spec(str(FIXTURES / "mixtral-8x7b"))
    assert (spec.experts.num_experts, spec.experts.expert_intermediate_size) == (8, 14336)
    assert spec.num_moe_layers == 32


def test_awq_checkpoint_is_int4():
    spec = load_model_spec(str(FIXTURES / "llama-3.1-405b-awq-int4"))
    assert (spec.weight_format, spec.quant_group_size, spec.dtype) == ("int4", 128, "float16")


def test_flags_override_dtype_and_quantization():
    spec = load_model_spec(str(FIXTURES / "llama-3.1-8b"), dtype="fp16", quantization="fp8")
    assert (spec.dtype, spec.weight_format, spec.online_quantization) == ("float16", "fp8", "fp8")
    dequant = load_model_spec(str(FIXTURES / "deepseek-v3"), quantization="none")
    assert dequant.weight_format == "bfloat16"


def test_config_file_and_hub_cache_are_found(tmp_path, monkeypatch):
    config = write_config(tmp_path)
    assert load_model_spec(str(config)).num_layers == 4
    snapshot = tmp_path / "hub" / "models--acme--small-lm" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(config.read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = load_model_spec("acme/small-lm")
    assert (spec.name, spec.hidden_size) == ("small-lm", 256)


def test_multimodal_text_config_is_used(tmp_path):
    text = {
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 2000,
        "max_position_embeddings": 8192,
        "intermediate_size": 1024,
    }
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "llava", "text_config": text, "torch_dtype": "float16"})
    )
    spec = load_model_spec(str(path))
    assert (spec.num_layers, spec.dtype, spec.attention.num_kv_heads) == (6, "float16", 8)


def test_missing_field_names_the_file_and_the_field(tmp_path):
    path = write_config(tmp_path, num_hidden_layers=None)
    with pytest.raises(ConfigError) as err:
        load_model_spec(str(path))
    message = str(err.value)
    assert str(path) in message and "'num_hidden_layers'" in message and "\n" not in message


def test_wrong_type_names_the_field(tmp_path):
    path = write_config(tmp_path, num_attention_heads="four")
    with pytest.raises(ConfigError, match=r"config\.json: field 'num_attention_heads' must be"):
        load_model_spec(str(path))


def test_kv_heads_must_divide_heads(tmp_path):
    path = write_config(tmp_path, num_key_value_heads=3)
    with pytest.raises(ConfigError, match="'num_key_value_heads' \\(3\\) must divide"):
        load_model_spec(str(path))


def test_malformed_json_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 12,')
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON"):
        load_model_spec(str(path))


def test_unknown_quantization_says_what_to_pass(tmp_path):
    path = write_config(tmp_path, quantization_config={"quant_method": "mystery"})
    with pytest.raises(ConfigError, match=r"quant_method 'mystery'.*--quantization"):
        load_model_spec(str(path))


def test_missing_model_says_where_it_looked(tmp_path):
    with pytest.raises(ConfigError, match="not a file, a directory, or a model id"):
        load_model_spec(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json in this directory"):
        load_model_spec(str(tmp_path / "empty"))
