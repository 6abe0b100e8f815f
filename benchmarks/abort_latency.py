"""How soon vLLM drops a request whose client left, mid-stream and while queued: through
the gateway, and straight to vLLM (the peer), in alternating trials.

    flock /tmp/rayfleet-heavy.lock .venv/bin/python benchmarks/abort_latency.py \\
        --trials 6 --out docs/results/abort-latency.json

One fleet (fleet_load.py: ``rayfleet up`` in this session) of one replica of the tiny
model with ``max_num_seqs: 1``, so that a second request waits in vLLM's queue. Each
trial, on one path (the gateway's port, or the replica's vLLM server):

    mid-stream   a streamed completion (``ignore_eos``, far more tokens than the trial
                 lasts) is sent on a raw connection; at its first bytes the client closes
                 the connection. Timed: until vLLM's ``num_requests_running`` reads 0.
    mid-queue    a long completion runs (not streamed) and a second one waits behind it
                 (``num_requests_waiting`` 1); the second's client closes its connection.
                 Timed: until ``num_requests_waiting`` reads 0 while the first still runs.
                 Then the first's client leaves too, and the engine goes idle.

The issue's bound is 1 s. A time is from the close to the end of the first /metrics
reading that no longer counts the request: an upper bound, over by at most that reading's
own duration, which is reported beside it (the "resolution" column).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleet_load import ENGINE_ARGS, MODEL, print_table, replica_urls, start_fleet, write_json

from rayfleet.control.load_signal import parse_engine_load
from rayfleet.models.build import make_tiny

GOAL_S = 1.0
DEADLINE_S = 30.0
LONG_TOKENS = 900  # far longer than a trial: the request is still generating when it leaves


def open_completion(port: int, max_tokens: int, stream: bool) -> socket.socket:
    """A completion sent on a raw connection to 127.0.0.1:port, its answer left unread."""
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def gauges(url: str) -> tuple[float, float]:
    """vLLM's (running, waiting) requests, read as the gateway reads them."""
    with urllib.request.urlopen(url + "/metrics", timeout=DEADLINE_S) as response:
        load = parse_engine_load(response.read().decode())
    return load.running, load.waiting


def wait_for(url: str, holds: Callable[[float, float], bool], what: str) -> tuple[float, float]:
    """Poll the gauges until ``holds(running, waiting)``: (seconds from the call to the end
    of the reading that saw it, that reading's duration)."""
    started = time.monotonic()
    while True:
        read_at = time.monotonic()
        running, waiting = gauges(url)
        now = time.monotonic()
        if holds(running, waiting):
            return now - started, now - read_at
        if now - started > DEADLINE_S:
            raise RuntimeError(f"no {what} after {DEADLINE_S:g} s")
        time.sleep(0.01)


def mid_stream(port: int, engine_url: str) -> tuple[float, float]:
    sock = open_completion(port, LONG_TOKENS, stream=True)
    try:
        first = sock.recv(4096)  # the head and the first tokens: it runs
        if b" 200 " not in first.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"not a 200: {first[:200]!r}")
    finally:
        sock.close()
    return wait_for(engine_url, lambda running, _: running == 0, "drop of the stream")


def mid_queue(port: int, engine_url: str) -> tuple[float, float]:
    ahead = open_completion(port, LONG_TOKENS, stream=False)
    leaving = open_completion(port, 16, stream=True)
    try:
        wait_for(engine_url, lambda r, w: r == 1 and w == 1, "request waiting behind one")
        leaving.close()
        took = wait_for(engine_url, lambda r, w: w == 0, "drop of the waiting request")
        if gauges(engine_url)[0] != 1:
            raise RuntimeError("the request ahead finished first: the trial proves nothing")
        return took
    finally:
        leaving.close()
        ahead.close()
        wait_for(engine_url, lambda r, w: r == 0 and w == 0, "an idle engine")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    engine_args = {**ENGINE_ARGS, "max_num_seqs": 1}
    model = {"name": MODEL, "source": str(make_tiny()), "engine_args": engine_args}
    fleet = start_fleet({"models": [{**model, "replicas": 1}]})
    try:
        (engine_url,) = replica_urls(fleet)
        ports = {"gateway": fleet.port, "direct": urlsplit(engine_url).port or 80}
        wait_for(engine_url, lambda r, w: r == 0 and w == 0, "an idle engine")
        trials = []
        for number in range(args.trials):
            order = ("gateway", "direct") if number % 2 == 0 else ("direct", "gateway")
            for path in order:
                for case, run in (("mid-stream", mid_stream), ("mid-queue", mid_queue)):
                    took, resolution = run(ports[path], engine_url)
                    trial = {"path": path, "case": case, "s": took, "resolution_s": resolution}
                    print(f"trial {number + 1} {path} {case}: {took * 1e3:.0f} ms", flush=True)
                    trials.append(trial)
        return trials
    finally:
        fleet.down()


def report(trials: list[dict[str, Any]]) -> None:
    rows = []
    for case in ("mid-stream", "mid-queue"):
        for path in ("gateway", "direct"):
            times = [t["s"] for t in trials if t["case"] == case and t["path"] == path]
            resolution = [t["resolution_s"] for t in trials if t["case"] == case]
            rows.append(
                [
                    case,
                    path,
                    len(times),
                    f"{1e3 * statistics.median(times):.0f}",
                    f"{1e3 * max(times):.0f}",
                    f"{1e3 * statistics.median(resolution):.0f}",
                    "met" if max(times) <= GOAL_S else "NOT met",
                ]
            )
    print_table(
        "from the client's close to vLLM no longer counting the request (ms)",
        ["case", "path", "trials", "p50", "max", "resolution p50", f"within {GOAL_S:g} s"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=6, help="trials a path and case")
    parser.add_argument("--out", type=Path, default=Path("docs/results/abort-latency.json"))
    args = parser.parse_args()
    trials = measure(args)
    report(trials)
    write_json(args.out, {"command": vars(args) | {"out": str(args.out)}, "trials": trials})


if __name__ == "__main__":
    main()
