"""The cache-reuse workloads of ``rayfleet bench``: their shapes and how they are sent."""

from __future__ import annotations

from collections import Counter

import pytest

from rayfleet.bench.client import Target, request_body
from rayfleet.bench.datasets import DatasetSpec, WorkloadShape, make_prompts
from rayfleet.bench.flags import dataset_spec, request_target
from rayfleet.bench.options import DatasetOptions, TargetOptions
from rayfleet.errors import RayfleetError

SHAPE = WorkloadShape(
    num_groups=4, prompts_per_group=3, system_prompt_len=64, question_len=8, output_len=5
)


def make(name: str, num_prompts: int, **shape: object) -> list:  # type: ignore[type-arg]
    workload = WorkloadShape(**{**SHAPE.__dict__, **shape})  # type: ignore[arg-type]
    return make_prompts(DatasetSpec(name=name, num_prompts=num_prompts, workload=workload), None)


def test_shared_prefix_is_groups_times_prompts_sharing_a_system_prompt() -> None:
    prompts = make("shared-prefix", 12)
    heads = Counter(p.text[: 64 * 4] for p in prompts)
    assert len(heads) == 4 and set(heads.values()) == {3}
    assert len({p.text for p in prompts}) == 12
    assert all(p.num_input_tokens == 72 and p.num_output_tokens == 5 for p in prompts)


def test_chat_turns_resend_the_history_with_shared_system_prompts() -> None:
    prompts = make("chat", 4 * 3, num_turns=3, num_system_prompts=2)
    assert all(p.messages for p in prompts)
    first, second = prompts[0].messages, prompts[4].messages  # session 0, turns 1 and 2
    assert first is not None and second is not None
    assert second[: len(first)] == first and [r for r, _ in second[len(first) :]] == [
        "assistant",
        "user",
    ]
    assert len({p.messages[0] for p in prompts if p.messages}) == 2
    assert prompts[8].num_input_tokens > prompts[4].num_input_tokens > prompts[0].num_input_tokens


def test_zipf_is_skewed_and_a_dominant_group_takes_its_share() -> None:
    heads = Counter(p.text[:256] for p in make("zipf", 400, num_groups=16))
    counts = sorted(heads.values(), reverse=True)
    assert counts[0] > 3 * counts[-1] and counts[0] > 400 / 16 * 2
    single = Counter(p.text[:256] for p in make("zipf", 100, zipf_dominant_share=1.0))
    assert len(single) == 1


def test_no_reuse_shares_nothing_and_is_as_long_as_shared_prefix() -> None:
    prompts = make("no-reuse", 20)
    assert len({p.text[:64] for p in prompts}) == 20
    assert all(p.num_input_tokens == 72 for p in prompts)


def test_bad_shapes_are_refused_with_the_flag() -> None:
    with pytest.raises(RayfleetError, match="--gsp-num-groups"):
        make("shared-prefix", 4, num_groups=0)
    with pytest.raises(RayfleetError, match="--zipf-dominant-share"):
        make("zipf", 4, zipf_dominant_share=2.0)


def test_chat_sends_messages_to_the_chat_endpoint_by_default() -> None:
    target = request_target(TargetOptions(), "http://h:1", "m", "chat")
    assert target.endpoint == "/v1/chat/completions" and target.ignore_eos
    prompt = make("chat", 8, num_turns=2)[5]
    body = request_body(target, prompt)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    plain = request_body(Target("http://h:1", "/v1/chat/completions"), make("zipf", 1)[0])
    assert [m["role"] for m in plain["messages"]] == ["user"]


def test_flags_shape_the_workload() -> None:
    spec = dataset_spec(DatasetOptions(dataset_name="zipf", gsp_num_groups=8, zipf_exponent=2.0))
    assert spec.workload.num_groups == 8 and spec.workload.zipf_exponent == 2.0


def test_with_a_tokenizer_lengths_are_the_models_tokens(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from rayfleet.bench.datasets import count_tokens, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model))
    spec = DatasetSpec(name="shared-prefix", num_prompts=6, workload=SHAPE)
    prompts = make_prompts(spec, tokenizer)
    assert all(count_tokens(tokenizer, p.text) == p.num_input_tokens for p in prompts)
    assert all(70 <= p.num_input_tokens <= 74 for p in prompts)  # 64 + 8, give or take a seam
