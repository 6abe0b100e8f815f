"""The one argument builder for both benchmark clients, and the simulator's ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.load import LoadShape
from rayfleet.bench.metrics import summarize
from rayfleet.bench.peer import ClientRun, bench_argv
from rayfleet.bench.runner import run_load
from rayfleet.bench.simulator import SimulatorProcess, SimulatorSpec

RUN = ClientRun("http://127.0.0.1:9", "/models/tiny", num_prompts=7, max_concurrency=3, seed=5)


def flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (None for a flag without a value)."""
    found: dict[str, str | None] = {}
    for i, item in enumerate(argv):
        if item.startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            found[item] = argv[i + 1] if has_value else None
    return found


def test_both_clients_get_the_same_run_from_one_builder(tmp_path):
    ours = flags(bench_argv("rayfleet", RUN, tmp_path / "ours.json"))
    theirs = flags(bench_argv("vllm", RUN, tmp_path / "vllm.json"))
    for flag in ("--base-url", "--model", "--tokenizer", "--num-prompts", "--seed"):
        assert ours[flag] == theirs[flag]
    assert ours["--max-concurrency"] == theirs["--max-concurrency"] == "3"
    assert "--ignore-eos" in ours and "--ignore-eos" in theirs
    assert ours["--save-result"] == str(tmp_path / "ours.json")
    assert theirs["--result-dir"] == str(tmp_path) and theirs["--result-filename"] == "vllm.json"
    assert set(theirs) - set(ours) == {
        "--backend",
        "--disable-tqdm",
        "--percentile-metrics",
        "--result-dir",
        "--result-filename",
    }


def test_vllms_own_parser_accepts_its_arguments(tmp_path):
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(bench_argv("vllm", RUN, tmp_path / "vllm.json"))
    assert (args.num_prompts, args.max_concurrency, args.seed) == (7, 3, 5)
    assert args.random_input_len == RUN.input_len and args.random_output_len == RUN.output_len


def test_the_simulators_log_is_the_ground_truth_our_client_agrees_with():
    """The server's own view of a run (arrival, first token, last token of every request)
    against what the client measured: the client's span covers the server's, its TTFT
    is never shorter than the server's, and it counts exactly the tokens sent."""
    spec = SimulatorSpec(first_token_delay_s=0.02, token_delay_s=0.005)
    with SimulatorProcess(spec) as sim:
        output = run_load(
            Target(sim.url, model="sim"), [Prompt("hi", 1, 8)] * 24, LoadShape(max_concurrency=4)
        )
        timings = np.array(sim.stats()["requests"])
    arrival, first, end, tokens = timings.T
    summary = summarize(output.results, output.duration_s)
    assert summary["completed"] == len(timings) == 24
    assert summary["total_output_tokens"] == tokens.sum() == 24 * 8
    assert output.start_s <= arrival.min() and output.end_s >= end.max()
    assert summary["median_ttft_ms"] >= np.median(first - arrival) * 1000 >= 20
    server_tpot_ms = np.median((end - first) / (tokens - 1)) * 1000
    assert server_tpot_ms >= 5 and summary["median_tpot_ms"] == pytest.approx(
        server_tpot_ms, rel=0.5
    )


def test_reset_forgets_the_requests_seen():
    with SimulatorProcess() as sim:
        run_load(Target(sim.url, model="sim"), [Prompt("hi", 1, 2)] * 3, LoadShape())
        assert len(sim.stats()["requests"]) == 3
        sim.reset()
        assert sim.stats()["requests"] == []
