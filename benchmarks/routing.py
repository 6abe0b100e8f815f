"""Replica routing on a simulated fleet: least_load, round_robin and prefix, side by side.

    .venv/bin/python benchmarks/routing.py [--replicas 8,64] [--rounds 1] [--out results/routing]
    .venv/bin/python benchmarks/routing.py --restart-only        # the restart case alone
    .venv/bin/python benchmarks/routing.py --policies least_load,prefix,prefix:load_factor=1000
    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/routing_vllm.py  # real vLLM

For each fleet size, ``--sim-processes`` ``rayfleet sim`` processes (one by default)
serve the replicas (``SimFleetProcess``) with the tiny model's calibrated spec
(benchmarks/data/tiny-sim-spec.json) whose step costs a, b, c are multiplied by
``--time-scale`` (a slower model, so that a fleet saturates at a request rate this
machine's gateway and client keep up with) and whose KV capacity is ``--kv-fraction`` of
the workload's shared prompts, so each replica holds a fraction of the working set. Each
round restarts every replica (cold caches, counters at 0), starts a fresh gateway process
with the round's policy (sim_gateway.py), and sends the workload through it with
``rayfleet bench``'s runner (over ``--client-processes`` processes) at a Poisson rate;
rounds alternate policies. Workloads (rayfleet.bench.workloads): shared-prefix (4 groups
a replica x 8 prompts, 1024/64/32 tokens, in a random order, cycling), zipf with one
dominant group (half the requests), no-reuse, and chat (sessions of 4 turns with 128-token
answers, as many sessions as fill the round, one system prompt a replica shared among them;
sent as a closed loop, each turn carrying the answers its session got), each ``--round-s``
seconds of requests at the fleet's ``--rate``. Shared-prefix is also sent closed-loop at 24
in flight a replica for saturation throughput: ``SATURATION_WAVES`` times that many
requests, so that the cold first wave is a small part of the round (1.5 times the Poisson
rounds' count, as before, was 1.4 waves at 64 replicas: mostly the cold start, then
replicas idle in the tail). ``--policies`` names a run's policies, each a name or a name
with options (``prefix:load_factor=1000``, read by sim_gateway.py); the goal lines need
least_load and prefix among them.

Per policy: realised hit rate (prefix_cache_hits / queries, read from every replica's
/simulator/stats), throughput, TTFT p50/p99 at the client, busy time max/mean across
replicas, ratios against least_load, the issue's goals as PASS/FAIL lines. The restart
case runs prefix routing on shared-prefix, restarts one replica a third of the way in
(POST /simulator/restart: cache emptied) and prints the fleet's hit rate per 5 s window.
Writes ``<out>.json`` and ``<out>.png`` (routing_plot.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_report import goal_lines, print_table, save_plot
from sim_gateway import GatewayProcess, get_json, policy_list, sim_fleets

from rayfleet.bench.client import Target
from rayfleet.bench.datasets import DatasetSpec, Prompt, WorkloadShape
from rayfleet.bench.drive import RunOutput
from rayfleet.bench.load import LoadShape
from rayfleet.bench.runner import run_load
from rayfleet.bench.workloads import make_workload
from rayfleet.sim.spec import EngineSpec, load_spec

SPEC_FILE = Path(__file__).resolve().parent / "data" / "tiny-sim-spec.json"
MODEL = "sim"
POLICIES = ("least_load", "round_robin", "prefix")
SYSTEM_LEN, QUESTION_LEN, OUTPUT_LEN = 1024, 64, 32
GROUPS_PER_REPLICA, PROMPTS_PER_GROUP = 4, 8
CHAT_TURNS, CHAT_OUTPUT_LEN = 4, 128  # the chat scenario: a session's turns and answers
SATURATION_CONCURRENCY = 24  # in flight a replica
SATURATION_WAVES = 7  # requests of the saturation round: this many times the concurrency
RESTART_WINDOW_S = 5.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str  # a workload of rayfleet bench, or "saturation" (shared-prefix, closed loop)
    prompts: list[Prompt]
    load: LoadShape
    endpoint: str = "/v1/completions"


def scenarios(num_replicas: int, rate: float, round_s: float, seed: int) -> list[Scenario]:
    groups = GROUPS_PER_REPLICA * num_replicas
    num_prompts = int(rate * round_s)
    shape = WorkloadShape(groups, PROMPTS_PER_GROUP, SYSTEM_LEN, QUESTION_LEN, OUTPUT_LEN)
    zipf = dataclasses.replace(shape, zipf_dominant_share=0.5)

    def prompts(name: str, workload: WorkloadShape, num: int = num_prompts) -> list[Prompt]:
        spec = DatasetSpec(name=name, num_prompts=num, seed=seed, workload=workload)
        return make_workload(spec, tokenizer=None)

    poisson = LoadShape(request_rate=rate, seed=seed)
    concurrency = SATURATION_CONCURRENCY * num_replicas
    saturation = LoadShape(max_concurrency=concurrency)
    num_saturation = SATURATION_WAVES * concurrency
    chat = dataclasses.replace(
        shape,
        num_groups=max(1, num_prompts // CHAT_TURNS),
        output_len=CHAT_OUTPUT_LEN,
        num_turns=CHAT_TURNS,
        num_system_prompts=num_replicas,
    )
    return [
        Scenario("shared-prefix", prompts("shared-prefix", shape), poisson),
        Scenario("saturation", prompts("shared-prefix", shape, num_saturation), saturation),
        Scenario("zipf-dominant", prompts("zipf", zipf), poisson),
        Scenario("no-reuse", prompts("no-reuse", shape), poisson),
        Scenario("chat", prompts("chat", chat), poisson, "/v1/chat/completions"),
    ]


def fleet_spec(num_replicas: int, time_scale: float, kv_fraction: float) -> EngineSpec:
    """The calibrated spec, step costs scaled, KV capacity a fraction of the shared prompts."""
    base = load_spec(SPEC_FILE)
    shared_blocks = GROUPS_PER_REPLICA * num_replicas * SYSTEM_LEN / base.block_size
    request_blocks = (SYSTEM_LEN + QUESTION_LEN + OUTPUT_LEN) / base.block_size
    return dataclasses.replace(
        base,
        model=MODEL,
        step_s=base.step_s * time_scale,
        prefill_token_s=base.prefill_token_s * time_scale,
        decode_seq_s=base.decode_seq_s * time_scale,
        num_gpu_blocks=max(math.ceil(kv_fraction * shared_blocks), math.ceil(2 * request_blocks)),
    )


def restart_all(urls: list[str]) -> None:
    for url in urls:
        get_json(url + "/simulator/restart", method="POST")


def fleet_counts(urls: list[str]) -> list[dict]:
    return [get_json(url + "/simulator/stats") for url in urls]


def summarise(output: RunOutput, stats: list[dict]) -> dict:
    ok = [r for r in output.results if r.ok]
    ttft_ms = np.array([r.ttft_s for r in ok]) * 1e3 if ok else np.array([math.nan])
    busy = np.array([s["busy_s"] for s in stats])
    queries = sum(s["prefix_cache_queries"] for s in stats)
    return {
        "num_ok": len(ok),
        "num_failed": len(output.results) - len(ok),
        "hit_rate": sum(s["prefix_cache_hits"] for s in stats) / max(queries, 1),
        "throughput_rps": len(ok) / output.duration_s,
        "ttft_p50_ms": float(np.percentile(ttft_ms, 50)),
        "ttft_p99_ms": float(np.percentile(ttft_ms, 99)),
        "busy_max_over_mean": float(busy.max() / busy.mean()) if busy.mean() > 0 else math.nan,
    }


@contextlib.contextmanager
def sim_fleet(spec: EngineSpec, num_replicas: int, num_processes: int) -> Iterator[list[str]]:
    """The replicas' URLs, served by ``num_processes`` simulator processes."""
    with sim_fleets(spec, num_replicas, num_processes) as fleets:
        yield [url for fleet in fleets for url in fleet.urls]


def run_round(urls: list[str], policy: str, scenario: Scenario, num_clients: int) -> dict:
    restart_all(urls)
    with GatewayProcess(urls, MODEL, policy) as gateway:
        target = Target(gateway.url, scenario.endpoint, MODEL, request_timeout_s=300)
        output = run_load(target, scenario.prompts, scenario.load, num_processes=num_clients)
    return summarise(output, fleet_counts(urls))


def run_fleet(num_replicas: int, args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """Every scenario's rounds on one fleet size: {scenario: {policy: [round, ...]}}."""
    spec = fleet_spec(num_replicas, args.time_scale[num_replicas], args.kv_fraction)
    results: dict[str, dict[str, list[dict]]] = {}
    with sim_fleet(spec, num_replicas, args.sim_processes) as urls:
        for scenario in scenarios(num_replicas, args.rate[num_replicas], args.round_s, args.seed):
            if args.scenarios and scenario.name not in args.scenarios:
                continue
            per_policy = results.setdefault(scenario.name, {p: [] for p in args.policies})
            for round_ in range(args.rounds):
                order = args.policies if round_ % 2 == 0 else args.policies[::-1]
                for policy in order:
                    row = run_round(urls, policy, scenario, args.client_processes)
                    per_policy[policy].append(row)
                    print(
                        f"{num_replicas:3d} replicas {scenario.name:14s} {policy:22s} "
                        f"{json.dumps({k: round(v, 3) for k, v in row.items()})}",
                        flush=True,
                    )
    return results


def run_restart(num_replicas: int, args: argparse.Namespace) -> list[dict]:
    """Prefix routing on shared-prefix with one replica restarted a third of the way in;
    the fleet's hit rate per window (a restarted replica's counters start again at 0)."""
    spec = fleet_spec(num_replicas, args.time_scale[num_replicas], args.kv_fraction)
    rate = args.rate[num_replicas]
    shared = scenarios(num_replicas, rate, args.round_s, args.seed)[0]
    num_prompts = int(rate * args.restart_duration_s)
    prompts = [shared.prompts[i % len(shared.prompts)] for i in range(num_prompts)]
    windows: list[dict] = []
    with sim_fleet(spec, num_replicas, args.sim_processes) as urls:
        restart_all(urls)
        done = threading.Event()
        sampler = threading.Thread(
            target=_sample_windows, args=(urls, args.restart_duration_s / 3, done, windows)
        )
        with GatewayProcess(urls, MODEL, "prefix") as gateway:
            sampler.start()
            target = Target(gateway.url, "/v1/completions", MODEL, request_timeout_s=300)
            shape = LoadShape(request_rate=rate, seed=args.seed)
            run_load(target, prompts, shape, num_processes=args.client_processes)
            done.set()
            sampler.join()
    return windows


def _sample_windows(urls: list[str], restart_at_s: float, done: threading.Event, out: list):
    started = time.monotonic()
    last = fleet_counts(urls)
    restarted = False
    while not done.wait(RESTART_WINDOW_S):
        now = fleet_counts(urls)
        hits = queries = 0
        for before, after in zip(last, now, strict=True):
            reset = after["prefix_cache_queries"] < before["prefix_cache_queries"]
            hits += after["prefix_cache_hits"] - (0 if reset else before["prefix_cache_hits"])
            queries += after["prefix_cache_queries"] - (
                0 if reset else before["prefix_cache_queries"]
            )
        elapsed = time.monotonic() - started
        out.append(
            {"t_s": round(elapsed, 1), "hit_rate": hits / max(queries, 1), "restarted": restarted}
        )
        print(f"  t={elapsed:5.1f}s hit rate {hits / max(queries, 1):.2f}", flush=True)
        last = now
        if not restarted and elapsed >= restart_at_s:
            get_json(urls[0] + "/simulator/restart", method="POST")
            last = fleet_counts(urls)
            restarted = True
            print(f"  t={elapsed:5.1f}s replica r0 restarted (cache emptied)", flush=True)


def per_size(text: str, cast: type) -> dict[int, float]:
    """'8:5,64:40' -> {8: 5.0, 64: 40.0}."""
    return {int(k): cast(v) for k, v in (item.split(":") for item in text.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", default="8,64")
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        type=policy_list,
        help="comma-separated; a policy's options follow its name: prefix:alpha=2,load_factor=0.5",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--time-scale", default="8:5,64:40", type=lambda t: per_size(t, float))
    parser.add_argument("--rate", default="8:45,64:70", type=lambda t: per_size(t, float))
    parser.add_argument("--round-s", type=float, default=20.0)
    parser.add_argument("--kv-fraction", type=float, default=0.25)
    parser.add_argument("--restart-duration-s", type=float, default=60.0)
    parser.add_argument("--restart-only", action="store_true")
    parser.add_argument("--no-restart", action="store_true", help="skip the restart case")
    parser.add_argument(
        "--scenarios",
        type=lambda t: t.split(","),
        default=None,
        help="only these: shared-prefix,saturation,zipf-dominant,no-reuse,chat (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim-processes", type=int, default=1)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/routing"))
    args = parser.parse_args()
    sizes = [int(n) for n in args.replicas.split(",")]
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "fleets": {}}
    if not args.restart_only:
        for num_replicas in sizes:
            report["fleets"][str(num_replicas)] = run_fleet(num_replicas, args)
            print_table(num_replicas, report["fleets"][str(num_replicas)])
    if not args.no_restart:
        print(f"restart case: {sizes[0]} replicas, prefix, shared-prefix", flush=True)
        report["restart"] = run_restart(sizes[0], args)
    for line in goal_lines(report):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    if report["fleets"]:
        save_plot(report, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
