"""One API key's flood beside another key's traffic: does the other key keep its TTFT?

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/key_isolation.py \\
        --rounds 3 --out docs/results/key-isolation.json

One fleet (fleet_load.py: ``rayfleet up`` in this session, 2 replicas of the tiny model) whose
gateway has two keys:

    steady   no limits
    flood    requests_per_minute --flood-rpm (60), max_concurrent 2

Each round runs two phases of ``--phase-s`` seconds, in alternating order (quiet first in
odd rounds, flood first in even ones), so a drift of the machine hits both alike:

    quiet    ``--steady-users`` clients on the steady key, each sending one streamed short
             chat request after another
    flood    the same, while the flood key sends ``--flood-rate`` requests a second
             (Poisson, open loop: a 429 is not waited out, whatever its Retry-After says),
             as short chat requests, from a client process of its own

Reported per round and phase: the steady key's TTFT p50 and p99, its errors, and the flood
key's answers by status, with the share of its 429s that carry ``Retry-After``. The
issue's goal: the steady key's TTFT under the flood within 20% of its quiet value (the
ratio of p50s, per round; p99 shown beside it). The flood's admitted requests (its quota)
share the replicas with the steady key, as they would in production; the refused rest
costs only the gateway. Clients, gateway and engines share this machine's cores, in one
session (fleet_load.py's ``Fleet.up`` says why that matters).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import secrets
import statistics
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
from fleet_load import (
    CHAT_ENDPOINT,
    ENGINE_ARGS,
    MODEL,
    fleet_pid,
    mixed_chat_prompts,
    print_table,
    replica_urls,
    start_fleet,
    write_json,
)

from rayfleet.bench.client import Target, open_session, request_body, send_request
from rayfleet.bench.datasets import Prompt, load_tokenizer
from rayfleet.gateway.auth import hash_key
from rayfleet.models.build import make_tiny

GOAL_RATIO = 1.2


def fleet_config(steady_key: str, flood_key: str, flood_rpm: int) -> dict[str, Any]:
    model = {"name": MODEL, "source": str(make_tiny()), "engine_args": ENGINE_ARGS, "replicas": 2}
    keys = [
        {"name": "steady", "key_sha256": hash_key(steady_key)},
        {
            "name": "flood",
            "key_sha256": hash_key(flood_key),
            "requests_per_minute": flood_rpm,
            "max_concurrent": 2,
        },
    ]
    return {"models": [model], "gateway": {"api_keys": keys}}


async def steady_user(
    session: aiohttp.ClientSession, target: Target, prompts: list[Prompt], until: float
) -> list[tuple[float, str]]:
    """(TTFT s, error) of each request, one after another until ``until``."""
    out = []
    rng = np.random.default_rng(int(time.time_ns() % 2**32))
    headers = {"Content-Type": "application/json", **target.headers}
    while time.perf_counter() < until:
        prompt = prompts[int(rng.integers(len(prompts)))]
        result = await send_request(session, target, prompt, headers)
        out.append((result.ttft_s, "" if result.ok else result.error_kind))
    return out


async def flood(
    session: aiohttp.ClientSession, target: Target, prompt: Prompt, rate: float, until: float
) -> Counter[str]:
    """Open-loop Poisson arrivals on the flood key; answers counted by status (and
    ``429+retry-after`` for refusals that say when to come back)."""
    answers: Counter[str] = Counter()
    headers = {"Content-Type": "application/json", **target.headers}
    body = request_body(target, prompt)
    rng = np.random.default_rng(1)

    async def one() -> None:
        try:
            async with session.post(target.url, json=body, headers=headers) as response:
                await response.read()
                retry = response.status == 429 and "Retry-After" in response.headers
                answers["429+retry-after" if retry else str(response.status)] += 1
        except aiohttp.ClientError as exc:
            answers[type(exc).__name__] += 1

    tasks = set()
    next_at = time.perf_counter()
    while next_at < until:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_at += float(rng.exponential(1.0 / rate))
    if tasks:
        await asyncio.wait(tasks)
    return answers


def flood_process(
    target: Target, prompt: Prompt, rate: float, duration_s: float, pipe: Connection
) -> None:
    """The flood as a client of its own: says "ready", floods for ``duration_s`` and
    sends back its answers and CPU seconds. In the steady client's process, its 200
    requests a second would share that client's event loop and delay its reads."""

    async def run() -> Counter[str]:
        async with open_session(None) as session:
            pipe.send("ready")
            return await flood(session, target, prompt, rate, time.perf_counter() + duration_s)

    answers = asyncio.run(run())
    pipe.send((dict(answers), cpu_s(psutil.Process())))


class FloodClient:
    """``flood_process`` in a spawned process, started and awaited around a phase."""

    def __init__(self, target: Target, prompt: Prompt, rate: float, duration_s: float):
        context = multiprocessing.get_context("spawn")
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=flood_process, args=(target, prompt, rate, duration_s, child_end)
        )

    def start(self) -> None:
        self._process.start()
        if self._pipe.recv() != "ready":
            raise RuntimeError("the flood client did not start")

    async def result(self) -> tuple[dict[str, int], float]:
        answers, cpu = await asyncio.to_thread(self._pipe.recv)
        await asyncio.to_thread(self._process.join)
        return answers, cpu


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def phase(
    steady: Target,
    flood_target: Target | None,
    prompts: list[Prompt],
    args: argparse.Namespace,
    gateway: psutil.Process,
) -> dict[str, Any]:
    """One phase; CPU shares are of one core, over the phase: the fleet process (the
    gateway, beside Ray's driver), the steady client and the flood client."""
    flooding = None
    if flood_target is not None:
        flooding = FloodClient(flood_target, prompts[0], args.flood_rate, args.phase_s)
        await asyncio.to_thread(flooding.start)
    client = psutil.Process()
    started, gateway_before, client_before = time.perf_counter(), cpu_s(gateway), cpu_s(client)
    until = started + args.phase_s
    async with open_session(None) as session:
        per_user = await asyncio.gather(
            *(steady_user(session, steady, prompts, until) for _ in range(args.steady_users))
        )
    answers, flood_cpu = await flooding.result() if flooding is not None else ({}, 0.0)
    records = [r for user in per_user for r in user]
    ttfts = [t for t, error in records if not error]
    elapsed = time.perf_counter() - started
    return {
        "gateway_cpu_share": (cpu_s(gateway) - gateway_before) / elapsed,
        "client_cpu_share": (cpu_s(client) - client_before) / elapsed,
        "flood_client_cpu_share": flood_cpu / elapsed,
        "num_requests": len(records),
        "errors": dict(Counter(e for _, e in records if e)),
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p99_ms": 1e3 * float(np.percentile(ttfts, 99)),
        "flood_answers": answers,
    }


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    steady_key, flood_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tokenizer = load_tokenizer(str(make_tiny()))
    prompts = mixed_chat_prompts(tokenizer, 200, long_fraction=0.0, seed=args.seed)
    fleet = start_fleet(fleet_config(steady_key, flood_key, args.flood_rpm))
    try:

        def target(key: str) -> Target:
            headers = {"Authorization": f"Bearer {key}"}
            return Target(fleet.url, CHAT_ENDPOINT, MODEL, True, headers=headers)

        steady, flooding = target(steady_key), target(flood_key)
        if args.steady_direct:  # the control: the steady key's requests bypass the gateway
            steady = Target(replica_urls(fleet)[0], CHAT_ENDPOINT, MODEL, True)
        gateway = psutil.Process(fleet_pid(fleet))
        warm_up = argparse.Namespace(**{**vars(args), "phase_s": 5.0})
        asyncio.run(phase(steady, None, prompts, warm_up, gateway))
        rounds = []
        for number in range(1, args.rounds + 1):
            order = ("quiet", "flood") if number % 2 else ("flood", "quiet")
            result: dict[str, Any] = {"round": number}
            for name in order:
                result[name] = asyncio.run(
                    phase(steady, flooding if name == "flood" else None, prompts, args, gateway)
                )
                print(f"round {number} {name}: {result[name]}", flush=True)
            result["ratio_p50"] = result["flood"]["ttft_p50_ms"] / result["quiet"]["ttft_p50_ms"]
            result["ratio_p99"] = result["flood"]["ttft_p99_ms"] / result["quiet"]["ttft_p99_ms"]
            rounds.append(result)
        return rounds
    finally:
        fleet.down()


def report(rounds: list[dict[str, Any]]) -> None:
    rows = []
    for r in rounds:
        q, f = r["quiet"], r["flood"]
        rows.append(
            [
                r["round"],
                f"{q['ttft_p50_ms']:.1f} / {q['ttft_p99_ms']:.1f}",
                f"{f['ttft_p50_ms']:.1f} / {f['ttft_p99_ms']:.1f}",
                f"{r['ratio_p50']:.2f} / {r['ratio_p99']:.2f}",
                f"{sum(q['errors'].values())} / {sum(f['errors'].values())}",
                " ".join(f"{k}:{v}" for k, v in sorted(f["flood_answers"].items())),
                f"{q['gateway_cpu_share']:.0%} / {f['gateway_cpu_share']:.0%}",
                f"{q['client_cpu_share']:.0%} / {f['client_cpu_share']:.0%}",
                f"{f.get('flood_client_cpu_share', 0.0):.0%}",
            ]
        )
    print_table(
        "steady key's TTFT (ms, p50 / p99), quiet and beside the flood key",
        [
            "round",
            "quiet",
            "flood",
            "flood/quiet",
            "steady errors",
            "flood key's answers",
            "gateway CPU",
            "steady client CPU",
            "flood client CPU",
        ],
        rows,
    )
    worst = max(r["ratio_p50"] for r in rounds)
    verdict = "met" if worst <= GOAL_RATIO else "NOT met"
    print(
        f"goal: TTFT p50 under the flood within {GOAL_RATIO:.1f}x of quiet: {verdict} "
        f"(worst round {worst:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds a phase")
    parser.add_argument("--steady-users", type=int, default=2)
    parser.add_argument("--flood-rate", type=float, default=200.0, help="flood requests a second")
    parser.add_argument("--flood-rpm", type=int, default=60, help="the flood key's quota")
    parser.add_argument(
        "--steady-direct",
        action="store_true",
        help="the control: steady requests go straight to one replica's vLLM server, so a "
        "slowdown under the flood that shows here too is not the gateway's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/results/key-isolation.json"))
    args = parser.parse_args()
    rounds = measure(args)
    report(rounds)
    write_json(args.out, {"command": vars(args) | {"out": str(args.out)}, "rounds": rounds})


if __name__ == "__main__":
    main()
