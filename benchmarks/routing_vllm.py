"""Replica routing on real vLLM: least_load, round_robin and prefix, side by side.

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/routing_vllm.py \\
        [--rounds 2] [--rate 4] [--round-s 40] [--system-tokens 768] \\
        [--question-tokens 32] [--output-tokens 16] [--out docs/results/routing-vllm]

Two vLLM servers of the tiny model (the CPU build here), prefix caching on, blocks of
``BLOCK_SIZE`` tokens, the KV cache capped with ``num_gpu_blocks_override`` so that each
server holds ``--kv-fraction`` of the shared-prefix workload's system prompts: a policy
that sends every group everywhere makes each server evict, one that keeps a group on one
server lets it fit. Each round resets both servers' prefix caches (vLLM's
``POST /reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``), starts a gateway
process with the round's policy in front of the two URLs (sim_gateway.py, the same
``Gateway`` rayfleet serves), and sends the workload through it with ``rayfleet bench``'s
runner at a Poisson rate; rounds alternate the order of the policies. Workloads
(rayfleet.bench.workloads, exact token lengths with the tiny model's tokenizer):
shared-prefix (``--groups`` groups, 8 unless set, x ``PROMPTS_PER_GROUP`` questions,
``--system-tokens`` / ``--question-tokens`` / ``--output-tokens`` tokens, in a random
order), no-reuse (the control) and, with ``--scenarios``, chat: sessions of
``CHAT_TURNS`` turns sharing the ``--groups`` system prompts, as many sessions as fill the
round, sent to the chat endpoint as a closed loop (each turn once the one before has
answered, with the answers its session got, so the history a server sees is the one it
wrote). The servers' ``max_model_len`` is the power of two that holds the longest prompt
and its output; the tiny model's positions stop at ``MAX_POSITIONS``.

Per policy: the realised hit rate (the increase of vLLM's own ``prefix_cache_hits`` over
``prefix_cache_queries`` on both servers during the round; for prefix, beside it in each
round's line, the hit rate its index predicted), throughput, TTFT p50/p99 at
the client; ratios against least_load; the issue's goals as PASS/FAIL lines (prefix's hit
rate at least 2x least_load's and its TTFT p50 at least 50% lower on shared-prefix;
within 5% of least_load's TTFT p50 on no-reuse). Writes ``<out>.json`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_report import mean_row, print_table, save_plot
from sim_gateway import GatewayProcess, metric_sum, policy_list

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import DatasetSpec, Prompt, WorkloadShape, load_tokenizer
from rayfleet.bench.drive import RunOutput
from rayfleet.bench.load import LoadShape
from rayfleet.bench.runner import run_load
from rayfleet.bench.workloads import make_workload
from rayfleet.control.engine import EngineProcess
from rayfleet.models.build import make_tiny

MODEL = "tiny"
POLICIES = ("least_load", "round_robin", "prefix")
SCENARIOS = ("shared-prefix", "no-reuse", "chat")
CHAT_TURNS = 4
BLOCK_SIZE = 32
SYSTEM_LEN, QUESTION_LEN, OUTPUT_LEN = 768, 32, 16  # the system prompt's by default
GROUPS, PROMPTS_PER_GROUP = 8, 8
MAX_POSITIONS = 2048  # the tiny model's max_position_embeddings
ENGINE_ARGS = {
    "enforce_eager": True,
    "dtype": "float32",
    "enable_prefix_caching": True,
    "block_size": BLOCK_SIZE,
}


def engine_args(shape: WorkloadShape, kv_fraction: float, chat: bool) -> dict[str, object]:
    """The servers' arguments: a context that holds the longest prompt and its output, and
    KV blocks for ``kv_fraction`` of the system prompts, or one whole context if that is
    more (vLLM refuses fewer blocks than max_model_len needs)."""
    prompt_len = longest_prompt(shape, chat)
    max_model_len = 1 << (prompt_len - 1).bit_length()
    shared = shape.num_groups * shape.system_prompt_len / BLOCK_SIZE
    blocks = max(math.ceil(kv_fraction * shared), max_model_len // BLOCK_SIZE)
    return {**ENGINE_ARGS, "max_model_len": max_model_len, "num_gpu_blocks_override": blocks}


def longest_prompt(shape: WorkloadShape, chat: bool) -> int:
    """Tokens of the longest prompt and its output: a chat's last turn holds every turn."""
    turns = CHAT_TURNS if chat else 1
    return shape.system_prompt_len + turns * (shape.question_len + shape.output_len)


def workload_shape(
    groups: int, system_len: int, question_len: int, output_len: int, chat: bool
) -> WorkloadShape:
    """The shared-prefix shape; the longest prompt and its output must fit the tiny model's
    positions (a one-line error naming the options otherwise)."""
    if min(system_len, question_len, output_len) < 1:
        sys.exit("error: --system-tokens, --question-tokens and --output-tokens must be >= 1")
    if groups < 2:
        sys.exit("error: --groups must be >= 2 (one group per server at least)")
    shape = WorkloadShape(groups, PROMPTS_PER_GROUP, system_len, question_len, output_len)
    if longest_prompt(shape, chat) > MAX_POSITIONS:
        turns = f"{CHAT_TURNS} chat turns of " if chat else ""
        sys.exit(
            f"error: --system-tokens {system_len} + {turns}--question-tokens {question_len} + "
            f"--output-tokens {output_len} is over the tiny model's {MAX_POSITIONS} "
            "positions; lower one of them"
        )
    return shape


def workload(
    name: str, num_prompts: int, tokenizer: object, seed: int, shape: WorkloadShape
) -> list[Prompt]:
    if name == "chat":
        sessions = max(1, num_prompts // CHAT_TURNS)
        shape = dataclasses.replace(
            shape, num_groups=sessions, num_turns=CHAT_TURNS, num_system_prompts=shape.num_groups
        )
    spec = DatasetSpec(name=name, num_prompts=num_prompts, seed=seed, workload=shape)
    return make_workload(spec, tokenizer)  # type: ignore[arg-type]


def cache_counters(urls: list[str]) -> tuple[float, float]:
    """(hits, queries) of vLLM's prefix cache, summed over the servers, in tokens."""
    hits = queries = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        hits += metric_sum(text, "vllm:prefix_cache_hits_total")
        queries += metric_sum(text, "vllm:prefix_cache_queries_total")
    return hits, queries


def reset_caches(urls: list[str]) -> None:
    for url in urls:
        request = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200, f"{url} refused to reset its prefix cache"


def summarise(output: RunOutput, hits: float, queries: float) -> dict[str, float]:
    ok = [r for r in output.results if r.ok]
    ttft_ms = np.array([r.ttft_s for r in ok]) * 1e3 if ok else np.array([math.nan])
    return {
        "num_ok": len(ok),
        "num_failed": len(output.results) - len(ok),
        "hit_rate": hits / max(queries, 1.0),
        "throughput_rps": len(ok) / output.duration_s,
        "ttft_p50_ms": float(np.percentile(ttft_ms, 50)),
        "ttft_p99_ms": float(np.percentile(ttft_ms, 99)),
    }


def run_round(
    urls: list[str], policy: str, scenario: str, prompts: list[Prompt], rate: float, seed: int
) -> dict:
    reset_caches(urls)
    hits0, queries0 = cache_counters(urls)
    endpoint = "/v1/chat/completions" if scenario == "chat" else "/v1/completions"
    with GatewayProcess(urls, MODEL, policy) as gateway:
        target = Target(gateway.url, endpoint, MODEL, ignore_eos=True)
        output = run_load(target, prompts, LoadShape(request_rate=rate, seed=seed))
        predicted = predicted_hit_rate(gateway.url)
    hits1, queries1 = cache_counters(urls)
    row = summarise(output, hits1 - hits0, queries1 - queries0)
    if predicted is not None:
        row["predicted_hit_rate"] = predicted
    return row


def predicted_hit_rate(gateway_url: str) -> float | None:
    """The prefix policy's own prediction over the round: blocks it believed the chosen
    replica held over prompt blocks sent (None for a policy that predicts nothing)."""
    with urllib.request.urlopen(gateway_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    sent = metric_sum(text, "rayfleet_prefix_prompt_blocks_total")
    held = metric_sum(text, "rayfleet_prefix_predicted_hit_blocks_total")
    return held / sent if sent else None


def goal_lines(scenarios: dict[str, dict[str, list[dict]]]) -> list[str]:
    needed = {"shared-prefix", "no-reuse"}
    if not needed <= scenarios.keys() or not all(
        {"prefix", "least_load"} <= scenarios[name].keys() for name in needed
    ):
        return ["(no goals: they need shared-prefix and no-reuse, prefix and least_load)"]

    def mean(scenario: str, policy: str, column: str) -> float:
        return mean_row(scenarios[scenario][policy])[column]

    hit_x = mean("shared-prefix", "prefix", "hit_rate") / max(
        mean("shared-prefix", "least_load", "hit_rate"), 1e-9
    )
    p50_x = mean("shared-prefix", "prefix", "ttft_p50_ms") / mean(
        "shared-prefix", "least_load", "ttft_p50_ms"
    )
    control_x = mean("no-reuse", "prefix", "ttft_p50_ms") / mean(
        "no-reuse", "least_load", "ttft_p50_ms"
    )
    goals = [
        (hit_x >= 2, f"shared-prefix: prefix hit rate {hit_x:.2f}x least_load's >= 2x"),
        (p50_x <= 0.5, f"shared-prefix: prefix TTFT p50 {p50_x:.2f}x least_load's <= 0.5x"),
        (abs(control_x - 1) <= 0.05, f"no-reuse: prefix TTFT p50 {control_x:.2f}x, within 5%"),
    ]
    return [f"{'PASS' if ok else 'FAIL'}  {text}" for ok, text in goals]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per policy and workload")
    parser.add_argument("--rate", type=float, default=4.0, help="requests/s (Poisson)")
    parser.add_argument("--round-s", type=float, default=40.0, help="seconds of requests a round")
    parser.add_argument("--kv-fraction", type=float, default=0.6)
    parser.add_argument(
        "--system-tokens",
        type=int,
        default=SYSTEM_LEN,
        help="tokens of each group's system prompt (SGLang's published setting is 2,048)",
    )
    parser.add_argument(
        "--question-tokens",
        type=int,
        default=QUESTION_LEN,
        help="tokens of each question after it (SGLang's published setting is 128)",
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        default=OUTPUT_LEN,
        help="tokens of each answer (SGLang's published setting is 256)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=GROUPS,
        help="shared-prefix's groups (system prompts; chat's sessions share as many); the KV "
        "cap is --kv-fraction of all of them",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scenarios",
        default="shared-prefix,no-reuse",
        type=lambda text: text.split(","),
        help=f"comma-separated, of {','.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        type=policy_list,
        help="comma-separated; a policy's options follow its name: prefix:alpha=2,load_factor=0.5",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/results/routing-vllm"))
    args = parser.parse_args()
    if unknown := set(args.scenarios) - set(SCENARIOS):
        sys.exit(f"error: --scenarios {','.join(sorted(unknown))}: not one of {SCENARIOS}")

    chat = "chat" in args.scenarios
    shape = workload_shape(
        args.groups, args.system_tokens, args.question_tokens, args.output_tokens, chat
    )
    model = str(make_tiny())
    tokenizer = load_tokenizer(model)
    arguments = engine_args(shape, args.kv_fraction, chat)
    num_prompts = int(args.rate * args.round_s)
    policies = args.policies
    results: dict[str, dict[str, list[dict]]] = {
        s: {p: [] for p in policies} for s in args.scenarios
    }
    engines = [
        EngineProcess(model, MODEL, arguments, env={"VLLM_SERVER_DEV_MODE": "1"}) for _ in range(2)
    ]
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_healthy(timeout_s=900)
        urls = [engine.url for engine in engines]
        for round_ in range(args.rounds):
            seed = args.seed + round_
            for scenario in args.scenarios:
                prompts = workload(scenario, num_prompts, tokenizer, seed, shape)
                order = policies if round_ % 2 == 0 else policies[::-1]
                for policy in order:
                    row = run_round(urls, policy, scenario, prompts, args.rate, seed)
                    results[scenario][policy].append(row)
                    shown = {k: round(v, 3) for k, v in row.items()}
                    print(f"round {round_} {scenario:13s} {policy:22s} {shown}", flush=True)
    finally:
        for engine in engines:
            engine.stop()
    report = {
        "fleets": {2: results},
        "engine_args": arguments,
        "workload": dataclasses.asdict(shape),
        "rate": args.rate,
        "round_s": args.round_s,
        "rounds": args.rounds,
    }
    print_table("2 real vLLM", results)
    lines = goal_lines(results)
    print("\n" + "\n".join(lines))
    report["goals"] = lines
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    save_plot(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
