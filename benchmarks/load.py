"""Hundreds of concurrent streaming users through the gateway of a 2-replica fleet: errors,
TTFT and end-to-end latency, and the gateway process's memory, per level of users.

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/load.py \\
        --users 200,500,1000 --requests-per-user 2 --out docs/results/load.json

A capacity and robustness benchmark, not a latency one: on a small machine the replicas
queue most of 1,000 users, so TTFT here is mostly time waiting for a vLLM batch slot. The
gateway's own cost per request is measured by overhead.py (README: "Performance").

One fleet (fleet_load.py: ``rayfleet up`` in this session, 2 replicas of the tiny model, ``down``
at the end) serves every level. At a level of N users, N * ``--requests-per-user``
streamed chat requests (``rayfleet bench``'s request code; ``ignore_eos`` so each asks
for exactly its output length) are sent with N in flight at once: each user sends its
requests one after another. Prompts are mixed: 80% short (32 tokens in, 16 out, +-50%)
and 20% long (512 in, 128 out, +-25%), each used once.

Per level, through the gateway, and (unless ``--no-direct``) the same requests straight
to the two replicas' vLLM servers (half the users each), as the peer column:
requests, errors (the goal: 0), TTFT and end-to-end p50 and p99, output tokens a second;
for the gateway, the fleet process's RSS (psutil on the pid in its run-state file, read
every 0.5 s: before, peak, after), its CPU seconds per request, and the answers and
errors its own /metrics counted. The fleet process also runs Ray's driver: its RSS
includes that.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
from fleet_load import (
    CHAT_ENDPOINT,
    MODEL,
    ProcessProbe,
    Sampler,
    counter_delta,
    fleet_pid,
    gateway_counters,
    mixed_chat_prompts,
    percentile_ms,
    print_table,
    replica_urls,
    tiny_fleet,
    write_json,
)

from rayfleet.bench.client import RequestResult, Target
from rayfleet.bench.datasets import Prompt, load_tokenizer
from rayfleet.bench.drive import Counts, drive, use_uvloop
from rayfleet.bench.load import LoadShape, arrival_offsets_s
from rayfleet.models import make_tiny

REQUEST_TIMEOUT_S = 600.0
WARMUP_REQUESTS = 20


async def _send_all(parts: list[tuple[Target, list[Prompt], int]]) -> list[RequestResult]:
    stop = asyncio.Event()
    outputs = await asyncio.gather(
        *(
            drive(
                target, prompts, arrival_offsets_s(LoadShape(), len(prompts)), users, Counts(), stop
            )
            for target, prompts, users in parts
        )
    )
    return [result for output in outputs for result in output.results]


def send_users(
    targets: list[Target], prompts: list[Prompt], num_users: int
) -> tuple[list[RequestResult], float]:
    """``prompts`` sent by ``num_users`` users (each sends one request after another), the
    users split evenly over ``targets``; the results and the wall-clock seconds taken."""
    n = len(targets)
    parts = [
        (t, prompts[i::n], num_users // n + (i < num_users % n)) for i, t in enumerate(targets)
    ]
    started = time.perf_counter()
    results = asyncio.run(_send_all(parts))
    return results, time.perf_counter() - started


def latency_row(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    ttft = [r.ttft_s for r in ok]
    e2e = [r.e2e_s for r in ok]
    tpot = [(r.e2e_s - r.ttft_s) / (r.num_output_tokens - 1) for r in ok if r.num_output_tokens > 1]
    return {
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "errors": errors,
        "first_errors": [r.error for r in results if not r.ok][:5],
        "duration_s": duration_s,
        "ttft_p50_ms": percentile_ms(ttft, 50),
        "ttft_p99_ms": percentile_ms(ttft, 99),
        "e2e_p50_ms": percentile_ms(e2e, 50),
        "e2e_p99_ms": percentile_ms(e2e, 99),
        "tpot_p50_ms": percentile_ms(tpot, 50),
        "num_output_tokens": sum(r.num_output_tokens for r in ok),
        "output_tok_s": sum(r.num_output_tokens for r in ok) / duration_s,
    }


def gateway_level(
    fleet_url: str, probe: ProcessProbe, prompts: list[Prompt], num_users: int
) -> dict[str, Any]:
    target = Target(fleet_url, CHAT_ENDPOINT, MODEL, True, REQUEST_TIMEOUT_S)
    before, counters = probe.sample(), gateway_counters(fleet_url)
    with Sampler(probe.sample, period_s=0.5) as sampler:
        results, duration_s = send_users([target], prompts, num_users)
    after, counters_after = probe.sample(), gateway_counters(fleet_url)
    return {
        **latency_row(results, duration_s),
        "rss_mb_before": before["rss_mb"],
        "rss_mb_peak": max(sampler.peak("rss_mb"), after["rss_mb"]),
        "rss_mb_after": after["rss_mb"],
        "peak_tcp_clients": sampler.peak("tcp_clients"),
        "peak_tcp_upstream": sampler.peak("tcp_upstream"),
        "peak_fds": sampler.peak("num_fds"),
        "num_samples": len(sampler.samples),
        "cpu_ms_per_request": 1e3 * (after["cpu_s"] - before["cpu_s"]) / len(results),
        "gateway_answers": counter_delta(counters_after, counters, "rayfleet_requests"),
        "gateway_errors": counter_delta(counters_after, counters, "rayfleet_request_errors"),
        "gateway_answers_by_replica": counter_delta(counters_after, counters, "answers_by_replica"),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = load_tokenizer(str(make_tiny()))
    per_level = [n * args.requests_per_user for n in args.users]
    pool = mixed_chat_prompts(tokenizer, max(per_level), args.long_fraction, args.seed)
    rows: list[dict[str, Any]] = []
    with tiny_fleet(num_replicas=2) as fleet:
        urls = replica_urls(fleet)
        ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in urls]
        probe = ProcessProbe(fleet_pid(fleet), fleet.port, ports)
        warmup, _ = send_users(
            [Target(fleet.url, CHAT_ENDPOINT, MODEL, True)], pool[:WARMUP_REQUESTS], 10
        )
        print(f"warm-up: {sum(r.ok for r in warmup)}/{len(warmup)} ok", flush=True)
        for num_users, num_requests in zip(args.users, per_level, strict=True):
            prompts = pool[:num_requests]
            row = {
                "users": num_users,
                "gateway": gateway_level(fleet.url, probe, prompts, num_users),
            }
            print(f"{num_users} users via gateway: {summary(row['gateway'])}", flush=True)
            if args.direct:
                direct_targets = [
                    Target(u, CHAT_ENDPOINT, MODEL, True, REQUEST_TIMEOUT_S) for u in urls
                ]
                row["direct"] = latency_row(*send_users(direct_targets, prompts, num_users))
                print(f"{num_users} users direct: {summary(row['direct'])}", flush=True)
            rows.append(row)
    return {
        "fleet": {"model": MODEL, "replicas": 2, "replica_urls": urls},
        "requests_per_user": args.requests_per_user,
        "long_fraction": args.long_fraction,
        "mean_input_tokens": float(np.mean([p.num_input_tokens for p in pool])),
        "mean_output_tokens": float(np.mean([p.num_output_tokens for p in pool])),
        "levels": rows,
    }


def summary(row: dict[str, Any]) -> str:
    return (
        f"{row['num_requests']} requests, {row['num_errors']} errors {row['errors']}, "
        f"TTFT p50/p99 {row['ttft_p50_ms']:.0f}/{row['ttft_p99_ms']:.0f} ms, "
        f"E2E p50/p99 {row['e2e_p50_ms']:.0f}/{row['e2e_p99_ms']:.0f} ms, "
        f"TPOT p50 {row['tpot_p50_ms']:.1f} ms, "
        f"{row['duration_s']:.1f} s"
    )


def report(run: dict[str, Any]) -> None:
    columns = ["users", "path", "requests", "errors", "TTFT p50 ms", "TTFT p99 ms"]
    columns += ["E2E p50 ms", "E2E p99 ms", "out tok/s", "RSS MB before/peak/after"]
    rows = []
    for level in run["levels"]:
        for path in ("gateway", "direct"):
            if path not in level:
                continue
            r = level[path]
            rss = (
                f"{r['rss_mb_before']:.0f}/{r['rss_mb_peak']:.0f}/{r['rss_mb_after']:.0f}"
                if path == "gateway"
                else "-"
            )
            rows.append(
                [
                    level["users"],
                    path,
                    r["num_requests"],
                    r["num_errors"],
                    *(r[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")),
                    r["output_tok_s"],
                    rss,
                ]
            )
    print_table("concurrent streaming users, 2 replicas of the tiny model", columns, rows)
    for level in run["levels"]:
        g = level["gateway"]
        print(
            f"{level['users']} users: gateway CPU {g['cpu_ms_per_request']:.2f} ms/request, "
            f"peak TCP {g['peak_tcp_clients']:.0f} from clients / "
            f"{g['peak_tcp_upstream']:.0f} to replicas, peak fds {g['peak_fds']:.0f}; "
            f"gateway counted {g['gateway_answers']} {g['gateway_errors'] or 'no errors'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--users",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[200, 500, 1000],
        help="levels of concurrent users, comma-separated (default 200,500,1000)",
    )
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--long-fraction", type=float, default=0.2, help="share of long prompts")
    parser.add_argument(
        "--no-direct", dest="direct", action="store_false", help="skip the direct peer runs"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/results/load.json"))
    args = parser.parse_args()
    use_uvloop()
    run = measure(args)
    report(run)
    write_json(args.out, {"command": vars(args) | {"out": str(args.out)}, **run})


if __name__ == "__main__":
    main()
