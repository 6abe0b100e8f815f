"""Datasets are made offline, seeded, and have the token lengths they promise."""

from __future__ import annotations

import json

import pytest

from rayfleet.bench.datasets import DatasetSpec, count_tokens, load_tokenizer, make_prompts
from rayfleet.errors import RayfleetError


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(str(tiny_model))


def test_random_prompts_have_exact_lengths_and_repeat_with_the_seed(tokenizer):
    spec = DatasetSpec(
        name="random", num_prompts=20, random_input_len=64, random_output_len=16, seed=3
    )
    prompts = make_prompts(spec, tokenizer)
    assert len(prompts) == 20
    assert all(count_tokens(tokenizer, p.text) == p.num_input_tokens == 64 for p in prompts)
    assert all(p.num_output_tokens == 16 for p in prompts)
    assert len({p.text for p in prompts}) == 20
    assert make_prompts(spec, tokenizer) == prompts
    assert (
        make_prompts(
            DatasetSpec(name="random", num_prompts=20, random_input_len=64, seed=4), tokenizer
        )
        != prompts
    )


def test_random_range_ratio_spreads_lengths_within_bounds(tokenizer):
    spec = DatasetSpec(
        num_prompts=50, random_input_len=40, random_output_len=20, random_range_ratio=0.5
    )
    prompts = make_prompts(spec, tokenizer)
    inputs = [p.num_input_tokens for p in prompts]
    outputs = [p.num_output_tokens for p in prompts]
    assert min(inputs) >= 20 and max(inputs) <= 60 and len(set(inputs)) > 5
    assert min(outputs) >= 10 and max(outputs) <= 30 and len(set(outputs)) > 5


def test_prefix_dataset_shares_k_system_prompts(tokenizer):
    spec = DatasetSpec(
        name="prefix",
        num_prompts=30,
        prefix_len=100,
        suffix_len=10,
        num_prefixes=3,
        random_output_len=8,
    )
    prompts = make_prompts(spec, tokenizer)
    heads = {
        tokenizer.decode(tokenizer.encode(p.text, add_special_tokens=False)[:90]) for p in prompts
    }
    assert len(heads) == 3
    assert len({p.text for p in prompts}) == 30
    assert all(p.num_input_tokens == count_tokens(tokenizer, p.text) for p in prompts)
    assert all(abs(p.num_input_tokens - 110) <= 3 for p in prompts)


def test_mixed_dataset_has_its_share_of_long_prompts(tokenizer):
    spec = DatasetSpec(
        name="mixed",
        num_prompts=200,
        random_input_len=16,
        mixed_long_input_len=300,
        mixed_long_fraction=0.25,
    )
    lengths = [p.num_input_tokens for p in make_prompts(spec, tokenizer)]
    assert set(lengths) == {16, 300}
    assert 30 <= lengths.count(300) <= 70


def test_jsonl_prompts_cycle_and_keep_their_max_tokens(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        json.dumps({"prompt": "a b c", "max_tokens": 5})
        + "\n\n"
        + json.dumps({"prompt": "d"})
        + "\n"
    )
    prompts = make_prompts(
        DatasetSpec(name="jsonl", dataset_path=path, num_prompts=5, random_output_len=9), None
    )
    assert [p.text for p in prompts] == ["a b c", "d", "a b c", "d", "a b c"]
    assert [p.num_output_tokens for p in prompts] == [5, 9, 5, 9, 5]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "ok"}\nnot json\n', "prompts.jsonl:2 is not JSON"),
        ('{"text": "x"}\n', 'needs a "prompt" string'),
        ('{"prompt": "x", "max_tokens": 0}\n', "max_tokens"),
        ("\n", "has no prompts"),
    ],
)
def test_jsonl_errors_name_the_line_and_the_fix(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(RayfleetError, match=message):
        make_prompts(DatasetSpec(name="jsonl", dataset_path=path, num_prompts=1), None)


def test_user_errors_name_the_flag(tokenizer, tmp_path):
    with pytest.raises(RayfleetError, match="--dataset-name 'sharegpt'"):
        make_prompts(DatasetSpec(name="sharegpt"), tokenizer)
    with pytest.raises(RayfleetError, match="--tokenizer"):
        make_prompts(DatasetSpec(name="random", num_prompts=1), None)
    with pytest.raises(RayfleetError, match="--dataset-path"):
        make_prompts(DatasetSpec(name="jsonl", num_prompts=1), None)
    with pytest.raises(RayfleetError, match="--num-prompts"):
        make_prompts(DatasetSpec(num_prompts=0), tokenizer)
    with pytest.raises(RayfleetError, match="--tokenizer: cannot load"):
        load_tokenizer(str(tmp_path / "missing"))
