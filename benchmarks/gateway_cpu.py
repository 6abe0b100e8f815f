"""The gateway's CPU per streamed token: the relay against aiohttp's client, and direct vLLM.

    .venv/bin/python benchmarks/gateway_cpu.py [--rounds 4] [--num-prompts 800]

One vLLM server on the tiny model, and two gateways in front of it, each in a process of
its own: one relays replica streams through ``rayfleet/gateway/relay.py`` (the default),
the other reads them with aiohttp's client (``Gateway(relay=False)``, the path fallback
providers take). Every round runs vLLM's serving benchmark (random, 64 in / 64 out,
ignore EOS, concurrency 32) against the server directly and through each gateway, and
reads each gateway's CPU time (user + system, from /proc) around its run. Prints per
target the median output throughput, its ratio to direct (median of per-round ratios)
and the gateway's CPU per streamed token. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import ROOT, SETTLE_S, direct_server, vllm_bench, wait_http

from rayfleet.control.engine import free_port
from rayfleet.models import make_tiny

GATEWAY_APP = """
import asyncio, sys, uvloop
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.server import start_gateway
url, port, relay = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "relay"

async def source():
    return [{"replica_id": "r0", "model": "tiny", "url": url}]

async def main():
    await start_gateway(Gateway(["tiny"], source, relay=relay), "127.0.0.1", port)
    await asyncio.Event().wait()

uvloop.run(main())
"""
OUTPUT_LEN = 64


@contextlib.contextmanager
def gateway(replica_url: str, mode: str):
    """A gateway process in front of ``replica_url``; yields (url, pid)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", GATEWAY_APP, replica_url, str(port), mode], process_group=0, cwd=ROOT
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4, help="measurement rounds")
    parser.add_argument("--num-prompts", type=int, default=800, help="requests per run")
    args = parser.parse_args()

    model = make_tiny()
    runs: dict[str, list[dict]] = {}
    with (
        direct_server(model) as direct,
        gateway(direct, "relay") as relay,
        gateway(direct, "aiohttp") as plain,
    ):
        targets = {
            "vllm-direct": (direct, None),
            "gateway, relay": relay,
            "gateway, aiohttp client": plain,
        }
        for url, _ in targets.values():
            vllm_bench(url, model, 32, 40)  # warm-up
        for r in range(args.rounds):
            for name, (url, pid) in targets.items():
                print(f"  round {r + 1}/{args.rounds}  {name}", flush=True)
                time.sleep(SETTLE_S)
                before = cpu_seconds(pid) if pid else 0.0
                result = vllm_bench(url, model, 32, args.num_prompts)
                used = cpu_seconds(pid) - before if pid else 0.0
                tokens = result["total_output_tokens"] or args.num_prompts * OUTPUT_LEN
                runs.setdefault(name, []).append(
                    {
                        "out tok/s": result["output_throughput"],
                        "us per token": 1e6 * used / tokens,
                    }
                )

    base = runs["vllm-direct"]
    print("\n| target | out tok/s | vs direct | gateway CPU per streamed token |")
    print("|---|---|---|---|")
    for name, rows in runs.items():
        tput = statistics.median(r["out tok/s"] for r in rows)
        ratio = statistics.median(
            a["out tok/s"] / b["out tok/s"] for a, b in zip(rows, base, strict=True)
        )
        cpu = statistics.median(r["us per token"] for r in rows)
        cpu_cell = f"{cpu:.1f} us" if name != "vllm-direct" else "-"
        print(f"| {name} | {tput:.0f} | {ratio:.2f} | {cpu_cell} |")
    for name in list(runs)[1:]:
        print(
            f"{name}: per round vs direct "
            + ", ".join(
                f"{a['out tok/s'] / b['out tok/s']:.2f}"
                for a, b in zip(runs[name], base, strict=True)
            )
            + "; us per token "
            + ", ".join(f"{r['us per token']:.1f}" for r in runs[name])
        )


if __name__ == "__main__":
    main()
