"""A steady mixed load through the gateway for N minutes: does anything grow, is anything lost?

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/soak.py \\
        --minutes 30 --out docs/results/soak.json --plot docs/soak.png

One fleet (fleet_load.py: ``rayfleet up`` in this session, 2 replicas of the tiny model, ``down``
at the end) and ``--users`` clients on loopback, each sending one request after another
until the time is up (or ``--max-requests`` are sent), each request drawn at random:

    stream       60%  streamed chat (``rayfleet bench``'s request code), mixed lengths;
                      completed when every asked-for token arrived (``ignore_eos``)
    non-stream   20%  the same, not streamed; completed when usage counts every token
    disconnect   10%  streamed, and the client closes the connection at its first token
    bad request  10%  one of BAD_BODIES; answered when the status is 4xx with a JSON error

Every request ends as completed, a planned disconnect, or a bad request answered 4xx;
anything else is lost, and the goal is 0 lost. The gateway's own /metrics counts are
reported beside the client's (answers by status, errors by reason).

Every ``--sample-s`` (60) the fleet process, where the gateway runs, is read with psutil
(pid from its run-state file): RSS, open file descriptors, threads, TCP connections from
clients, to replicas and others (Ray's), and the gateway's requests in flight from its
/metrics, and the tasks alive on its event loop (``rayfleet_gateway_asyncio_tasks``, read
at each scrape: one per open client connection and per request being answered). After
``--warmup-minutes`` each reading's slope is fitted (least squares, per minute). Before the load
and after it (once the gateway reports nothing in flight) the process is read idle too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
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
    print_table,
    replica_urls,
    tiny_fleet,
    write_json,
)

from rayfleet.bench.client import Target, open_session, request_body, send_request
from rayfleet.bench.datasets import Prompt, load_tokenizer
from rayfleet.bench.drive import use_uvloop
from rayfleet.models import make_tiny

REQUEST_TIMEOUT_S = 120.0
KINDS = {"stream": 0.6, "non-stream": 0.2, "disconnect": 0.1, "bad request": 0.1}
_HELLO = [{"role": "user", "content": "hello"}]
BAD_BODIES: dict[str, bytes] = {
    "malformed JSON": b'{"model": "tiny", "messages": [',
    "not an object": b"[1, 2, 3]",
    "missing messages": json.dumps({"model": MODEL}).encode(),
    "unknown model": json.dumps({"model": "no-such-model", "messages": _HELLO}).encode(),
    "messages a string": json.dumps({"model": MODEL, "messages": "hello"}).encode(),
    "max_tokens over context": json.dumps(
        {"model": MODEL, "messages": _HELLO, "max_tokens": 100_000}
    ).encode(),
    "negative max_tokens": json.dumps(
        {"model": MODEL, "messages": _HELLO, "max_tokens": -5}
    ).encode(),
}
READINGS = ("rss_mb", "num_fds", "num_threads", "tcp_clients", "tcp_upstream", "tcp_other")


class Soak:
    """The clients: ``run(deadline)`` keeps ``num_users`` requests in flight until then and
    records each request's (kind, outcome, end time, detail)."""

    def __init__(self, target: Target, prompts: list[Prompt], num_users: int, seed: int):
        self.target = target
        self.prompts = prompts
        self.num_users = num_users
        self.rng = random.Random(seed)
        self.records: list[tuple[str, str, float, str]] = []
        self.headers = {"Content-Type": "application/json"}

    async def run(self, deadline: float, max_requests: int) -> None:
        async with open_session(self.num_users) as session:
            await asyncio.gather(
                *(self._user(session, deadline, max_requests) for _ in range(self.num_users))
            )

    async def _user(self, session: aiohttp.ClientSession, deadline: float, limit: int) -> None:
        while time.monotonic() < deadline and len(self.records) < limit:
            kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            prompt = self.prompts[self.rng.randrange(len(self.prompts))]
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    outcome, detail = await self._send(session, kind, prompt)
            except (TimeoutError, aiohttp.ClientError) as exc:
                outcome, detail = "lost", f"{type(exc).__name__}: {exc}"
            self.records.append((kind, outcome, time.monotonic(), detail))

    async def _send(
        self, session: aiohttp.ClientSession, kind: str, prompt: Prompt
    ) -> tuple[str, str]:
        if kind == "stream":
            result = await send_request(session, self.target, prompt, self.headers)
            if result.ok and result.num_output_tokens == prompt.num_output_tokens:
                return "completed", ""
            return "lost", result.error or f"{result.num_output_tokens} tokens"
        if kind == "bad request":
            name = self.rng.choice(list(BAD_BODIES))
            return await self._bad(session, name)
        body = request_body(self.target, prompt)
        if kind == "non-stream":
            body.pop("stream_options")
            body["stream"] = False
        async with session.post(self.target.url, json=body) as response:
            if response.status != 200:
                return "lost", f"HTTP {response.status}: {(await response.read())[:200]!r}"
            if kind == "disconnect":
                return await _disconnect_at_first_token(response)
            answer = await response.json()
        tokens = (answer.get("usage") or {}).get("completion_tokens")
        if answer.get("choices") and tokens == prompt.num_output_tokens:
            return "completed", ""
        return "lost", f"non-stream answer with {tokens} tokens"

    async def _bad(self, session: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        async with session.post(
            self.target.url, data=BAD_BODIES[name], headers=self.headers
        ) as response:
            text = await response.text(errors="replace")
        try:
            is_error_json = "error" in json.loads(text)
        except ValueError:
            is_error_json = False
        if 400 <= response.status < 500 and is_error_json:
            return "rejected 4xx", name
        return "bad not 4xx", f"{name}: HTTP {response.status} {text[:200]}"


async def _disconnect_at_first_token(response: aiohttp.ClientResponse) -> tuple[str, str]:
    async for data in response.content.iter_any():
        if b'"choices":[{' in data or b'"choices": [{' in data:
            response.close()  # drops the connection: the gateway sees the client go
            return "disconnected", ""
    return "lost", "stream ended before its first token"


def slope_per_minute(samples: list[dict[str, float]], key: str, after_s: float) -> float:
    points = [(s["t_s"] / 60, s[key]) for s in samples if s["t_s"] >= after_s]
    if len(points) < 2:
        return float("nan")
    minutes, values = zip(*points, strict=True)
    return float(np.polyfit(minutes, values, 1)[0])


def wait_idle(url: str, timeout_s: float = 120.0) -> bool:
    """True once the gateway reports no request in flight."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not gateway_counters(url)["rayfleet_inflight_requests"].get("all", 0.0):
            return True
        time.sleep(0.5)
    return False


def measure(args: argparse.Namespace) -> dict[str, Any]:
    prompts = mixed_chat_prompts(load_tokenizer(str(make_tiny())), 2000, 0.2, args.seed)
    with tiny_fleet(num_replicas=2) as fleet:
        ports = [int(u.rsplit(":", 1)[1].split("/")[0]) for u in replica_urls(fleet)]
        probe = ProcessProbe(fleet_pid(fleet), fleet.port, ports)

        def read() -> dict[str, float]:
            counters = gateway_counters(fleet.url)
            return {
                **probe.sample(),
                "gateway_inflight": counters["rayfleet_inflight_requests"].get("all", 0.0),
                "asyncio_tasks": counters["rayfleet_gateway_asyncio_tasks"].get("all", 0.0),
            }

        soak = Soak(Target(fleet.url, CHAT_ENDPOINT, MODEL, True), prompts, args.users, args.seed)
        idle_before, counters_before = read(), gateway_counters(fleet.url)
        started = time.monotonic()
        with Sampler(read, args.sample_s) as sampler:
            asyncio.run(soak.run(started + 60 * args.minutes, args.max_requests))
            ended = time.monotonic()
            drained = wait_idle(fleet.url)
        idle_after, counters_after = read(), gateway_counters(fleet.url)
    return {
        "users": args.users,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes,
        "duration_s": ended - started,
        "drained": drained,
        "samples": sampler.samples,
        "idle_before": idle_before,
        "idle_after": idle_after,
        "outcomes": outcome_table(soak.records),
        "per_minute": Counter(int((end - started) // 60) for _, _, end, _ in soak.records),
        "lost": [r for r in soak.records if r[1] in ("lost", "bad not 4xx")][:20],
        "gateway_answers": counter_delta(counters_after, counters_before, "rayfleet_requests"),
        "gateway_errors": counter_delta(counters_after, counters_before, "rayfleet_request_errors"),
        "gateway_answers_by_replica": counter_delta(
            counters_after, counters_before, "answers_by_replica"
        ),
    }


def outcome_table(records: list[tuple[str, str, float, str]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
    for kind, outcome, _, _ in records:
        table[kind][outcome] = table[kind].get(outcome, 0) + 1
    return table


def add_slopes(run: dict[str, Any]) -> None:
    after_s = 60 * run["warmup_minutes"]
    run["slopes_per_minute"] = {
        key: slope_per_minute(run["samples"], key, after_s)
        for key in (*READINGS, "gateway_inflight", "asyncio_tasks")
    }
    outcomes = [o for kinds in run["outcomes"].values() for o in kinds.items()]
    run["num_requests"] = sum(n for _, n in outcomes)
    run["num_lost"] = sum(n for o, n in outcomes if o in ("lost", "bad not 4xx"))


def report(run: dict[str, Any]) -> None:
    rows = [[kind, sum(o.values()), json.dumps(o)] for kind, o in run["outcomes"].items()]
    print_table(
        f"{run['minutes']:g} minutes, {run['users']} users: {run['num_requests']} requests, "
        f"{run['num_lost']} lost",
        ["kind", "requests", "outcomes"],
        rows,
    )
    columns = ["reading", "idle before", "idle after", "min", "max", "slope per minute"]
    rows = []
    for key in (*READINGS, "gateway_inflight", "asyncio_tasks"):
        values = [s[key] for s in run["samples"]]
        rows.append(
            [
                key,
                *(run["idle_before"][key], run["idle_after"][key], min(values), max(values)),
                f"{run['slopes_per_minute'][key]:+.3f}",
            ]
        )
    print_table(
        f"fleet process, sampled every minute; slopes after {run['warmup_minutes']:g} min",
        columns,
        rows,
    )
    print(f"gateway counted answers {run['gateway_answers']}, errors {run['gateway_errors']}")
    for record in run["lost"]:
        print("lost:", record)


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("rss_mb", "num_fds", "tcp_clients", "tcp_upstream", "asyncio_tasks")
    fig, axes = plt.subplots(1, len(keys), figsize=(17, 3))
    minutes = [s["t_s"] / 60 for s in run["samples"]]
    for ax, key in zip(axes, keys, strict=True):
        ax.plot(minutes, [s[key] for s in run["samples"]], marker="o")
        ax.axvline(run["warmup_minutes"], color="grey", linestyle=":")
        ax.set_title(f"{key} ({run['slopes_per_minute'][key]:+.2f}/min)")
        ax.set_xlabel("minute")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    parser.add_argument("--users", type=int, default=48, help="clients, each one request at a time")
    parser.add_argument("--warmup-minutes", type=float, default=2.0, help="left out of slopes")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between readings")
    parser.add_argument("--max-requests", type=int, default=500_000, help="stop after this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/results/soak.json"))
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the readings")
    args = parser.parse_args()
    use_uvloop()
    run = measure(args)
    add_slopes(run)
    report(run)
    write_json(args.out, {"command": vars(args) | {"out": str(args.out)}, **run})
    if args.plot:
        plot(run, args.plot)


if __name__ == "__main__":
    main()
