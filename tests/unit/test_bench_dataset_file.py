"""`rayfleet bench dataset`: a workload written as JSONL, read back by `rayfleet bench`."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayfleet.bench.datasets import DatasetSpec, make_prompts
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread
from rayfleet.cli import app
from rayfleet.errors import RayfleetError

CHAT_FLAGS = ["--dataset-name", "chat", "--num-prompts", "6", "--gsp-num-groups", "2"]
CHAT_FLAGS += ["--chat-num-turns", "3", "--gsp-system-prompt-len", "16"]
CHAT_FLAGS += ["--gsp-question-len", "4", "--gsp-output-len", "3"]


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_chat_workload_is_written_with_its_sessions_and_flat_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    result = bench("dataset", *CHAT_FLAGS, "--output", str(path))
    assert result.exit_code == 0, result.output
    written = rows(path)
    assert [row["session"] for row in written] == [0, 1, 0, 1, 0, 1]
    assert all(row["output_tokens"] == row["max_tokens"] == 3 for row in written)
    first, second = written[0], written[2]  # session 0, turns 1 and 2
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["prompt"].startswith(first["prompt"])
    assert second["input_tokens"] > first["input_tokens"]


def test_the_file_reads_back_as_the_same_prompts(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    assert bench("dataset", *CHAT_FLAGS, "-o", str(path)).exit_code == 0
    made = make_prompts(DatasetSpec(name="jsonl", num_prompts=12, dataset_path=path), None)
    written = rows(path)
    for prompt, row in zip(made, written + written, strict=True):
        assert prompt.messages == tuple((m["role"], m["content"]) for m in row["messages"])
        assert prompt.num_output_tokens == row["max_tokens"]
    # Cycled past its end, the file's sessions come again as new ones.
    assert [p.session for p in made[6:]] == [2, 3, 2, 3, 2, 3]


def test_rayfleet_bench_replays_the_file_as_chats(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    assert bench("dataset", *CHAT_FLAGS, "-o", str(path)).exit_code == 0
    with SimulatorThread(SimulatorSpec(keep_bodies=True)) as sim:
        result = bench(
            "--base-url",
            sim.url,
            "--model",
            "sim",
            "--endpoint",
            "/v1/chat/completions",
            "--dataset-name",
            "jsonl",
            "--dataset-path",
            str(path),
            "--num-prompts",
            "6",
        )
        assert result.exit_code == 0, result.output
        with urllib.request.urlopen(sim.url + "/simulator/stats") as r:
            bodies = [body for _, body in sorted(json.load(r)["bodies"], key=lambda b: b[0])]
    last_turns = [b for b in bodies if len(b["messages"]) == 6]
    assert len(last_turns) == 2
    for body in last_turns:  # the answers the simulator gave, not the file's fixed text
        answers = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        assert answers == [" tok" * 3] * 2


def test_bad_rows_are_refused_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "messages": [{"role": "user"}]}\n')
    with pytest.raises(RayfleetError, match=r"bad.jsonl:2: each of \"messages\" needs"):
        make_prompts(DatasetSpec(name="jsonl", num_prompts=2, dataset_path=path), None)
    path.write_text('{"prompt": "a", "session": -1}\n')
    with pytest.raises(RayfleetError, match=r"bad.jsonl:1: \"session\" must be"):
        make_prompts(DatasetSpec(name="jsonl", num_prompts=1, dataset_path=path), None)


def test_an_unwritable_output_is_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rayfleet.cli", "bench", "dataset"]
    command += ["-o", str(tmp_path / "no/x"), "--dataset-name", "no-reuse", "--num-prompts", "2"]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "--output: cannot write" in result.stderr and "Traceback" not in result.stderr
