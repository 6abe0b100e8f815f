"""Chat sessions sent as a closed loop: each turn after the one before, with its answers."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from rayfleet.bench.client import Target
from rayfleet.bench.conversations import with_answers
from rayfleet.bench.datasets import DatasetSpec, Prompt, WorkloadShape
from rayfleet.bench.load import LoadShape
from rayfleet.bench.runner import run_load
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread
from rayfleet.bench.workloads import make_workload

OUTPUT_LEN = 3
SIM_ANSWER = " tok" * OUTPUT_LEN  # what the simulator answers to every request
CHAT = Target("", "/v1/chat/completions", model="sim")


def chat(num_sessions: int, num_turns: int, num_prompts: int | None = None) -> list[Prompt]:
    shape = WorkloadShape(
        num_groups=num_sessions,
        num_turns=num_turns,
        system_prompt_len=8,
        question_len=2,
        output_len=OUTPUT_LEN,
        num_system_prompts=1,
    )
    size = num_prompts or num_sessions * num_turns
    return make_workload(DatasetSpec(name="chat", num_prompts=size, workload=shape), None)


def test_answers_take_the_place_of_the_fixed_ones_in_order() -> None:
    history = [("system", "s"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    history += [("assistant", "a2"), ("user", "q3")]
    prompt = Prompt("q3", 1, 1, messages=tuple(history), session=0)
    assert with_answers(prompt, [None, None]) is prompt
    replaced = with_answers(prompt, ["real 1", None])
    assert replaced.messages is not None
    assert [c for r, c in replaced.messages if r == "assistant"] == ["real 1", "a2"]
    assert [c for r, c in replaced.messages if r != "assistant"] == ["s", "q1", "q2", "q3"]


def test_a_workload_cycled_past_its_sessions_starts_new_ones() -> None:
    prompts = chat(2, 2, num_prompts=10)
    assert [p.session for p in prompts] == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5]
    assert prompts[4].messages == prompts[0].messages


@pytest.mark.parametrize("num_processes", [1, 2])
def test_each_turn_follows_its_predecessor_and_carries_the_answers(num_processes: int) -> None:
    prompts = chat(num_sessions=3, num_turns=3)
    with SimulatorThread(SimulatorSpec(token_delay_s=0.01, keep_bodies=True)) as sim:
        target = Target(sim.url, CHAT.endpoint, model="sim")
        # Every request is due at once: only the closed loop holds the later turns back.
        output = run_load(target, prompts, LoadShape(), num_processes=num_processes)
        bodies, timings = simulator_seen(sim.url)
    assert len(output.results) == 9 and all(r.ok for r in output.results)
    assert all(r.text == SIM_ANSWER for r in output.results)
    sessions: dict[str, list[int]] = {}
    for i, body in enumerate(bodies):
        sessions.setdefault(body["messages"][1]["content"], []).append(i)
    assert sorted(len(turns) for turns in sessions.values()) == [3, 3, 3]
    for turns in sessions.values():
        for number, i in enumerate(turns):
            assistant = [m["content"] for m in bodies[i]["messages"] if m["role"] == "assistant"]
            assert assistant == [SIM_ANSWER] * number
            if number:  # sent after the turn before had its last token
                assert timings[i][0] >= timings[turns[number - 1]][2]
    # A turn is counted as due when the one before it ended, not when the schedule said.
    assert all(r.start_s - r.scheduled_s < 1.0 for r in output.results)


def test_a_failed_turn_leaves_its_fixed_answer_in_the_next() -> None:
    prompts = chat(num_sessions=1, num_turns=3)
    with SimulatorThread(SimulatorSpec(fail_every=2, keep_bodies=True)) as sim:
        target = Target(sim.url, CHAT.endpoint, model="sim")
        output = run_load(target, prompts, LoadShape())
        bodies, _ = simulator_seen(sim.url)
    assert [r.ok for r in output.results] == [True, False, True]
    fixed = prompts[2].messages
    assert fixed is not None
    fixed_answers = [c for r, c in fixed if r == "assistant"]
    assert [m["content"] for m in bodies[2]["messages"] if m["role"] == "assistant"] == [
        SIM_ANSWER,
        fixed_answers[1],
    ]


def simulator_seen(url: str) -> tuple[list[dict[str, Any]], list[list[float]]]:
    """The bodies of the requests the simulator took, by arrival, and each one's
    [arrival, first token, last token, tokens] ([arrival] alone for a failure it answered
    at once)."""
    with urllib.request.urlopen(url + "/simulator/stats") as response:
        seen = json.load(response)
    timing_at = {timing[0]: timing for timing in seen["requests"]}
    arrivals = sorted(seen["bodies"], key=lambda pair: pair[0])
    return [body for _, body in arrivals], [timing_at.get(a, [a]) for a, _ in arrivals]
