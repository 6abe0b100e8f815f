"""Does `rayfleet bench` read the same numbers as vLLM's benchmark client?

Both clients run with the same arguments (``rayfleet.bench.peer.bench_argv``), one
process each, in alternating rounds (odd rounds start with the other client), and the
median of each metric over the rounds is compared as ours ÷ vLLM's:

1. Against the simulator (``rayfleet.bench.simulator``), which streams at a fixed pace
   (``--first-token-delay-ms`` before the first token, ``--token-delay-ms`` between
   tokens) and costs the machine almost nothing, so neither client slows the server it
   measures. Its own log of every request is the ground truth, shown beside both
   clients ("server"): requests and output tokens per second over the run's window
   (first arrival to last token), and per-request TTFT, TPOT and token gaps as sent.
   The clients must agree within ``--tolerance`` (5%) on every metric: exit 1 otherwise.
2. Against a real vLLM server on the tiny model at ``--vllm-concurrency`` (1 and 2),
   reported, not judged: there the server shares the machine's cores with the client.

Like with like, vLLM's client runs with its session opened without ``trust_env`` unless
``--vllm-trust-env``: as vLLM opens it, aiohttp looks up netrc and proxy settings on a
worker thread for every request after the request's start is stamped, which reads TTFT
high (at concurrency 8 on the simulator, p99 15% above the server's; docs/bench.md).

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/bench_vs_vllm.py \\
        --out results/bench_vs_vllm.json

Prints one markdown table per part: a row per concurrency and metric.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rayfleet.bench.peer import CLIENTS, Client, ClientRun, run_client
from rayfleet.bench.simulator import SimulatorProcess, SimulatorSpec
from rayfleet.control.engine import EngineProcess
from rayfleet.models import make_tiny

METRICS = {
    "request_throughput": "req/s",
    "output_throughput": "output tok/s",
    "median_ttft_ms": "TTFT p50 ms",
    "p99_ttft_ms": "TTFT p99 ms",
    "median_tpot_ms": "TPOT p50 ms",
    "median_itl_ms": "ITL p50 ms",
}
TINY_ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}

Runs = dict[str, list[dict[str, Any]]]


def alternate(
    run: ClientRun,
    num_rounds: int,
    out_dir: Path,
    *,
    before: Callable[[], None] = lambda: None,
    truth: Callable[[], dict[str, Any]] | None = None,
) -> Runs:
    """``num_rounds`` runs of each client, alternating which goes first. With ``truth``
    (the server's own view of the run just made), each result gets ``server``: that view."""
    runs: Runs = {client: [] for client in CLIENTS}
    for index in range(num_rounds):
        order: tuple[Client, ...] = CLIENTS if index % 2 == 0 else CLIENTS[::-1]
        for client in order:
            before()
            path = out_dir / f"{client}-c{run.max_concurrency}-{index}.json"
            result = run_client(client, run, path)
            if truth:
                result["server"] = truth()
            runs[client].append(result)
            print(
                f"c={run.max_concurrency} round {index} {client}: "
                + ", ".join(f"{METRICS[k]} {result[k]:.2f}" for k in METRICS)
                + f", client CPU {result['client_cpu_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def server_view(stats: dict[str, Any], num_prompts: int) -> dict[str, float]:
    """The metrics of the last ``num_prompts`` requests as the simulator sent them: the run's
    window is its first request's arrival to its last token's departure."""
    timings = sorted(stats["requests"])[-num_prompts:]
    arrival, first, end, tokens = (np.array(column) for column in zip(*timings, strict=True))
    window_s = float(end.max() - arrival.min())
    ttft_s = first - arrival
    return {
        "duration": window_s,
        "request_throughput": len(timings) / window_s,
        "output_throughput": float(tokens.sum()) / window_s,
        "median_ttft_ms": float(np.median(ttft_s)) * 1000,
        "p99_ttft_ms": float(np.percentile(ttft_s, 99)) * 1000,
        "median_tpot_ms": float(np.median((end - first) / np.maximum(tokens - 1, 1))) * 1000,
    }


def truth_of(sim: SimulatorProcess, num_prompts: int) -> Callable[[], dict[str, float]]:
    return lambda: server_view(sim.stats(), num_prompts)


def median_of(results: list[dict[str, Any]], key: str, over_server: bool = False) -> float:
    """The median over runs of ``key``, or of its ratio to the server's view of each run."""
    if over_server:
        if key not in results[0]["server"]:
            return float("nan")
        return float(statistics.median(r[key] / r["server"][key] for r in results))
    return float(statistics.median(r[key] for r in results))


def table(title: str, parts: dict[int, Runs], tolerance: float | None) -> tuple[str, bool]:
    """A markdown table of every concurrency's medians and ratios; and whether every ratio
    of ours to vLLM's is within ``tolerance`` (always True without one)."""
    with_server = any("server" in r for runs in parts.values() for r in runs["vllm"])
    head = "| c | metric | ours | vLLM's | ours ÷ vLLM's |"
    head += " ours ÷ server | vLLM's ÷ server |" if with_server else ""
    lines = [f"### {title}", "", head, "|---" * (head.count("|") - 1) + "|"]
    agree = True
    for concurrency, runs in parts.items():
        for key, label in {
            "duration": "duration s",
            **METRICS,
            "client_cpu_s": "client CPU s",
        }.items():
            ours, theirs = (median_of(runs[client], key) for client in CLIENTS)
            ratio = ours / theirs if theirs else float("nan")
            off = tolerance is not None and key in METRICS and not abs(ratio - 1) <= tolerance
            agree = agree and not off
            row = f"| {concurrency} | {label} | {ours:.2f} | {theirs:.2f} | {ratio:.3f}"
            row += " (off) |" if off else " |"
            if with_server:
                row += "".join(f" {median_of(runs[c], key, True):.3f} |" for c in CLIENTS)
            lines.append(row.replace("nan", "-"))
    return "\n".join(lines), agree


def simulator_part(args: argparse.Namespace, tokenizer: str, out_dir: Path) -> dict[int, Runs]:
    spec = SimulatorSpec(
        token_delay_s=args.token_delay_ms / 1000,
        first_token_delay_s=args.first_token_delay_ms / 1000,
    )
    parts = {}
    with SimulatorProcess(spec) as sim:
        for concurrency in args.sim_concurrency:
            run = ClientRun(
                sim.url,
                tokenizer,
                model="sim",
                output_len=args.sim_output_len,
                num_prompts=args.sim_num_prompts,
                max_concurrency=concurrency,
                our_event_loop=args.our_event_loop,
                vllm_trust_env=args.vllm_trust_env,
            )
            parts[concurrency] = alternate(
                run,
                args.rounds,
                out_dir,
                before=sim.reset,
                truth=truth_of(sim, run.num_prompts),
            )
    return parts


def vllm_part(args: argparse.Namespace, tokenizer: str, out_dir: Path) -> dict[int, Runs]:
    parts = {}
    with EngineProcess(tokenizer, "tiny", TINY_ENGINE_ARGS) as engine:
        engine.wait_healthy(timeout_s=600)
        for concurrency in args.vllm_concurrency:
            run = ClientRun(
                engine.url,
                tokenizer,
                num_prompts=args.vllm_num_prompts,
                max_concurrency=concurrency,
                our_event_loop=args.our_event_loop,
                vllm_trust_env=args.vllm_trust_env,
            )
            parts[concurrency] = alternate(run, args.rounds, out_dir)
    return parts


def integers(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--sim-concurrency", type=integers, default=[1, 2, 8])
    parser.add_argument("--sim-num-prompts", type=int, default=64)
    parser.add_argument("--sim-output-len", type=int, default=32)
    parser.add_argument("--first-token-delay-ms", type=float, default=50.0)
    parser.add_argument("--token-delay-ms", type=float, default=10.0)
    parser.add_argument("--vllm-concurrency", type=integers, default=[1, 2])
    parser.add_argument("--vllm-num-prompts", type=int, default=150)
    parser.add_argument("--our-event-loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--vllm-trust-env",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="open vLLM's client session as vLLM does (trust_env=True: a netrc and a proxy "
        "lookup on a worker thread per request, inside its TTFT); default: without",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tokenizer = str(make_tiny())
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as tmp:
        simulated = simulator_part(args, tokenizer, Path(tmp)) if args.sim_concurrency else {}
        real = vllm_part(args, tokenizer, Path(tmp)) if args.vllm_concurrency else {}
    setting = f"; vLLM's client trust_env={args.vllm_trust_env}"
    sim_title = (
        f"Simulator: {args.first_token_delay_ms:g} ms to the first token, "
        f"{args.token_delay_ms:g} ms between tokens, {args.sim_output_len} out, "
        f"{args.sim_num_prompts} prompts, medians of {args.rounds} rounds{setting}"
    )
    sim_table, agree = table(sim_title, simulated, args.tolerance) if simulated else ("", True)
    real_title = (
        f"vLLM on the tiny model: 64 in / 64 out, {args.vllm_num_prompts} prompts, "
        f"medians of {args.rounds} rounds{setting}"
    )
    real_table = table(real_title, real, None)[0] if real else ""
    print(sim_table, real_table, sep="\n\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "args": {**vars(args), "out": str(args.out)},
                    "simulator": simulated,
                    "vllm": real,
                },
                indent=1,
                default=str,
            )
        )
    if not agree:
        print(f"the clients disagree by more than {args.tolerance:.0%} on the simulator")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
