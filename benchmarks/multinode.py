"""A replica that spans two nodes against one process, side by side on one Ray cluster.

Two raylets on this machine (Ray's cluster utilities). Each round runs both layouts
of the tiny model, in alternating order (odd rounds start with the other one):

- ``one process``: ``tensor_parallel_size: 1``, one vLLM server on one node;
- ``TP 2 over 2 nodes``: ``tensor_parallel_size: 2, nodes_per_replica: 2``, vLLM's
  multi-node launch (rank 0 on one raylet, a headless rank on the other), its
  tensor-parallel traffic over loopback gloo.

For each: the time from ``rayfleet up --detach`` to a ready fleet, then a closed loop
of ``--num-prompts`` random prompts (``--input-len`` / ``--output-len`` tokens,
``ignore_eos``) at ``--concurrency`` through the gateway, then ``rayfleet down``.
Prints a markdown table of medians over the rounds and the ratio TP 2 ÷ one process.
On this machine both layouts share the same two cores, so TP 2 cannot gain compute: the
ratio shows what splitting the model across processes and the network costs.

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/multinode.py --rounds 2 \\
        --out docs/results/multinode.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from ray.cluster_utils import Cluster

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import DatasetSpec, load_tokenizer, make_prompts
from rayfleet.bench.load import LoadShape
from rayfleet.bench.metrics import summarize
from rayfleet.bench.runner import run_load
from rayfleet.control.engine import free_port
from rayfleet.models import make_tiny

ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
LAYOUTS = {
    "one process": {"engine_args": {**ENGINE_ARGS, "tensor_parallel_size": 1}},
    "TP 2 over 2 nodes": {
        "engine_args": {**ENGINE_ARGS, "tensor_parallel_size": 2},
        "nodes_per_replica": 2,
    },
}
METRICS = (
    ("up to ready (s)", "up_s"),
    ("output tok/s", "output_throughput"),
    ("TTFT p50 (ms)", "median_ttft_ms"),
    ("TTFT p99 (ms)", "p99_ttft_ms"),
    ("TPOT p50 (ms)", "median_tpot_ms"),
)


def rayfleet(home: Path, *args: str, timeout_s: float = 900) -> None:
    env = {**os.environ, "RAYFLEET_HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        raise SystemExit(f"rayfleet {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")


def run_layout(
    name: str, address: str, model_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="rayfleet-multinode-"))
    port = free_port()
    model = {"name": "tiny", "source": str(model_dir), "num_cpus": 1, **LAYOUTS[name]}
    config = {"cluster": {"address": address}, "gateway": {"port": port}, "models": [model]}
    (home / "fleet.yaml").write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    rayfleet(home, "up", "-c", str(home / "fleet.yaml"), "--detach")
    up_s = time.perf_counter() - started
    try:
        prompts = make_prompts(
            DatasetSpec(
                num_prompts=args.num_prompts,
                random_input_len=args.input_len,
                random_output_len=args.output_len,
            ),
            load_tokenizer(str(model_dir)),
        )
        target = Target(f"http://127.0.0.1:{port}", model="tiny", ignore_eos=True)
        output = run_load(target, prompts, LoadShape(max_concurrency=args.concurrency))
        summary = summarize(output.results, output.duration_s)
    finally:
        rayfleet(home, "down")
    if summary["failed"]:
        raise SystemExit(f"{name}: {summary['failed']} requests failed")
    return {"up_s": up_s, **{key: summary[key] for _, key in METRICS if key in summary}}


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    one, tp2 = (runs[name] for name in LAYOUTS)
    lines = [
        "| metric | one process | TP 2 over 2 nodes | ratio |",
        "|---|---|---|---|",
    ]
    for label, key in METRICS:
        a = statistics.median(r[key] for r in one)
        b = statistics.median(r[key] for r in tp2)
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write every round's numbers as JSON")
    args = parser.parse_args()

    model_dir = make_tiny()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in LAYOUTS}
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        for round_index in range(args.rounds):
            order = list(LAYOUTS) if round_index % 2 == 0 else list(reversed(LAYOUTS))
            for name in order:
                result = run_layout(name, cluster.address, model_dir, args)
                runs[name].append(result)
                print(f"round {round_index + 1} {name}: {json.dumps(result)}", flush=True)
    finally:
        cluster.shutdown()
    print(table(runs))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2, default=str))


if __name__ == "__main__":
    main()
