"""What the rayfleet gateway costs, side by side with direct vLLM and Ray Serve LLM.

    .venv/bin/python benchmarks/overhead.py [--rounds 2] [--skip-ray-serve-llm]

Client: vLLM's own serving benchmark (``vllm.benchmarks.serve``), random dataset,
64 input and 64 output tokens, ignore EOS, at concurrency 1 and 32, on the tiny
model. Targets, each measured in the same run:

  vllm-direct      a vLLM server started by hand (the reference)
  fleet-replica    the vLLM server inside a rayfleet replica, called directly
  rayfleet         the same replica through the rayfleet gateway
  rayfleet+policies  the same replica through a second gateway with policies on: a route
                   whose rules read the clock and the prompt's token count, limits, and
                   an API key with rate, token and concurrency quotas
  ray-serve-llm    Ray Serve LLM (ray.serve.llm.build_openai_app), default settings

The direct server and the fleet are up together and every round runs each of their
targets in turn (after a pause that lets the previous server's pollers go quiet), so
slow drift of the machine hits them alike; each cell is the median over rounds. Ray
Serve LLM runs after them, in a Ray of its own. Prints a table with
the ratio of each target to vllm-direct and writes results/overhead.json.
Traffic goes only to 127.0.0.1.

SESSIONS: every server here runs in this script's session (its own process group, so it
can be stopped as one), as the client does. Linux shares CPU between sessions first,
and vLLM's busy-polling engine processes in a session of their own starve the others
on a small machine (see rayfleet/control/engine.py); all targets get the same footing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayfleet.control.engine import EngineProcess, free_port  # noqa: E402
from rayfleet.models import make_tiny  # noqa: E402

ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
METRICS = {
    "req/s": "request_throughput",
    "out tok/s": "output_throughput",
    "TTFT p50 ms": "median_ttft_ms",
    "TTFT p99 ms": "p99_ttft_ms",
    "TPOT p50 ms": "median_tpot_ms",
}


def vllm_bench(
    base_url: str,
    tokenizer: Path,
    concurrency: int,
    num_prompts: int,
    model: str = "tiny",
    api_key: str | None = None,
) -> dict:
    """One run of vLLM's serving benchmark in a fresh process; returns its result dict."""
    with tempfile.TemporaryDirectory() as tmp:
        code = (
            "import sys\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "from vllm.benchmarks.serve import add_cli_args, main\n"
            "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
        )
        argv = [
            sys.executable,
            "-c",
            code,
            "--base-url",
            base_url,
            "--endpoint",
            "/v1/completions",
            "--model",
            "tiny",
            "--tokenizer",
            str(tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            "64",
            "--random-output-len",
            "64",
            "--ignore-eos",
            "--num-prompts",
            str(num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--result-dir",
            tmp,
            "--result-filename",
            "r.json",
            "--seed",
            "0",
            "--served-model-name",
            model,
        ]
        env = {**os.environ, "OPENAI_API_KEY": api_key} if api_key else None
        subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
        return json.loads((Path(tmp) / "r.json").read_text())


def num_prompts_for(concurrency: int) -> int:
    return 100 if concurrency == 1 else 320


def measure(targets: dict[str, str], tokenizer: Path, rounds: int, results: dict) -> None:
    """Alternate the targets round by round; append each run to results[target][c]."""
    for c in (1, 32):
        # One warm-up run per target so first-request effects stay out of the numbers.
        for name, url in targets.items():
            vllm_bench(url, tokenizer, c, 20, **TARGET_OPTIONS.get(name, {}))
        for r in range(rounds):
            for name, url in targets.items():
                print(f"  round {r + 1}/{rounds}  concurrency {c:>2}  {name}", flush=True)
                time.sleep(SETTLE_S)
                run = vllm_bench(
                    url, tokenizer, c, num_prompts_for(c), **TARGET_OPTIONS.get(name, {})
                )
                results.setdefault(name, {}).setdefault(str(c), []).append(
                    {label: run[key] for label, key in METRICS.items()}
                )


def paired_ttft(targets: dict[str, str], tokenizer: Path, num_rounds: int) -> dict:
    """TTFT of single requests sent to each target in turn, one at a time (concurrency 1).

    Each round sends one request to every target, in an order that rotates from round to
    round, so a target's requests sit between the others' in time and slow drift of the
    machine cancels out of the per-round differences. Returns every TTFT, in ms, by target
    (``paired_p50`` turns two of them into the median per-round difference).
    """
    import asyncio

    from rayfleet.bench.client import Target, open_session, request_headers, send_request
    from rayfleet.bench.datasets import DatasetSpec, load_tokenizer, make_prompts

    prompts = make_prompts(
        DatasetSpec(num_prompts=num_rounds, random_input_len=64, random_output_len=64),
        load_tokenizer(str(tokenizer)),
    )
    clients = {}
    for name, url in targets.items():
        options = TARGET_OPTIONS.get(name, {})
        headers = {"Authorization": f"Bearer {options['api_key']}"} if "api_key" in options else {}
        target = Target(url, model=options.get("model", "tiny"), ignore_eos=True, headers=headers)
        clients[name] = (target, request_headers(target))
    names = list(targets)

    async def run() -> dict[str, list[float]]:
        ttft: dict[str, list[float]] = {name: [] for name in names}
        async with open_session(len(names)) as session:
            for index, prompt in enumerate(prompts):
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    target, headers = clients[name]
                    result = await send_request(session, target, prompt, headers)
                    if not result.ok:
                        raise SystemExit(f"{name}: {result.error}")
                    ttft[name].append(result.ttft_s * 1000)
        return ttft

    return asyncio.run(run())


def paired_p50(ttft: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s TTFT minus ``base``'s in the same round, in ms."""
    return statistics.median(a - b for a, b in zip(ttft[name], ttft[base], strict=True))


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


# vLLM's engine processes busy-poll for a second after their last step; a run starts
# once the previous target's server has gone quiet.
SETTLE_S = 1.5


@contextlib.contextmanager
def direct_server(model: Path):
    print("vllm-direct: starting a vLLM server by hand", flush=True)
    with EngineProcess(str(model), "tiny", ENGINE_ARGS) as engine:
        engine.wait_healthy()
        yield engine.url


POLICY_KEY = "sk-overhead-bench"
TARGET_OPTIONS = {"rayfleet+policies": {"model": "chat", "api_key": POLICY_KEY}}

POLICY_GATEWAY_APP = """
import sys, asyncio, uvloop
from rayfleet.config import parse_fleet
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.server import start_gateway
from rayfleet.gateway.auth import hash_key
from rayfleet.gateway.policies import Policies
replica_url, port, model, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
fleet = parse_fleet({
    "gateway": {
        "limits": {"max_tokens": 512, "max_n": 4, "max_body_bytes": 1000000, "max_messages": 32},
        "routes": [{"name": "chat", "rules": [
            {"name": "night", "target": "tiny", "time_of_day": {"from": "23:59", "to": "00:00"}},
            {"name": "short", "target": "tiny", "prompt_tokens_below": 128},
            {"name": "long", "target": "tiny"}]}],
        "api_keys": [{"name": "bench", "key_sha256": hash_key(key), "requests_per_minute": 1000000,
                      "tokens_per_minute": 100000000, "max_concurrent": 64}],
    },
    "models": [{"name": "tiny", "source": model, "engine_args": {"max_model_len": 1024}}],
})
async def source():
    return [{"replica_id": "tiny#bench", "model": "tiny", "url": replica_url}]
async def main():
    gateway = Gateway(["tiny"], source, policies=Policies.from_fleet(fleet))
    await start_gateway(gateway, "127.0.0.1", port)
    print("READY", flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""


@contextlib.contextmanager
def policy_gateway(replica_url: str, model: Path):
    """A second gateway, with policies on, in front of the same replica."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", POLICY_GATEWAY_APP, replica_url, str(port), str(model), POLICY_KEY],
        process_group=0,
        cwd=ROOT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@contextlib.contextmanager
def fleet_targets(model: Path):
    """A one-replica fleet: its replica's own URL, its gateway, and a policy gateway."""
    import yaml

    home = Path(tempfile.mkdtemp(prefix="rayfleet-bench-"))
    port = free_port()
    config = home / "fleet.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {"port": port},
                "models": [{"name": "tiny", "source": str(model), "engine_args": ENGINE_ARGS}],
            }
        )
    )
    env = {**os.environ, "RAYFLEET_HOME": str(home)}
    cli = [sys.executable, "-m", "rayfleet.cli"]
    print("rayfleet: rayfleet up (one replica)", flush=True)
    # In this process's session, like the direct server and the client (see SESSIONS).
    fleet = subprocess.Popen(
        [*cli, "up", "-c", str(config)],
        env=env,
        process_group=0,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        status = wait_fleet_ready(cli, env, fleet, timeout_s=600)
        replica_url = status["replicas"][0]["url"]
        with policy_gateway(replica_url, model) as policies:
            yield {
                "fleet-replica": replica_url,
                "rayfleet": f"http://127.0.0.1:{port}",
                "rayfleet+policies": policies,
            }
    finally:
        fleet.send_signal(signal.SIGINT)  # what Ctrl-C does: the fleet stops cleanly
        try:
            fleet.wait(timeout=120)
        except subprocess.TimeoutExpired:
            subprocess.run([*cli, "down"], env=env, check=False)


def wait_fleet_ready(cli: list[str], env: dict, fleet: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fleet.poll() is not None:
            raise SystemExit(f"rayfleet up exited with code {fleet.returncode}")
        done = subprocess.run([*cli, "status", "--json"], env=env, capture_output=True, text=True)
        if done.returncode == 0:
            status = json.loads(done.stdout)
            if status.get("phase") == "ready" and status.get("replicas"):
                return status
        time.sleep(2)
    raise SystemExit(f"the fleet was not ready after {timeout_s:.0f}s")


RAY_SERVE_LLM_APP = """
import os, sys, time
import ray
from ray import serve
from ray.serve.llm import LLMConfig, build_openai_app
model, port = sys.argv[1], int(sys.argv[2])
ray.init(address="local", num_cpus=8, include_dashboard=False)
config = LLMConfig(
    model_loading_config={"model_id": "tiny", "model_source": model},
    engine_kwargs={"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"},
    placement_group_config={"bundles": [{"CPU": 1}]},
    deployment_config={"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
)
serve.start(http_options={"host": "127.0.0.1", "port": port})
serve.run(build_openai_app({"llm_configs": [config]}), blocking=False)
print("READY", flush=True)
while True:
    time.sleep(3600)
"""


def run_ray_serve_llm(model: Path, tokenizer: Path, rounds: int, results: dict) -> None:
    port = free_port()
    print("ray-serve-llm: build_openai_app, default settings", flush=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", RAY_SERVE_LLM_APP, str(model), str(port)],
        env=env,
        process_group=0,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", timeout_s=600)
        measure({"ray-serve-llm": f"http://127.0.0.1:{port}"}, tokenizer, rounds, results)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def summarize(results: dict) -> list[dict]:
    """Medians over rounds; the comparisons with direct are medians of per-round figures.

    A target's run in round i is compared with vllm-direct's run in round i (for the
    fleet's targets, the run just before it), so that drift of the shared machine from
    round to round stays out of the ratio.
    """
    rows = []
    for c in ("1", "32"):
        direct = results["vllm-direct"][c]
        for name, by_c in results.items():
            runs = by_c[c]
            cell = {k: statistics.median(r[k] for r in runs) for k in METRICS}
            pairs = list(zip(runs, direct, strict=True))
            rows.append(
                {
                    "target": name,
                    "concurrency": int(c),
                    **cell,
                    "TTFT p50 vs direct ms": statistics.median(
                        a["TTFT p50 ms"] - b["TTFT p50 ms"] for a, b in pairs
                    ),
                    "out tok/s vs direct": statistics.median(
                        a["out tok/s"] / b["out tok/s"] for a, b in pairs
                    ),
                }
            )
    return rows


def round_by_round(results: dict) -> list[str]:
    """Paired numbers per round: each target against the run just before it in that round."""

    def per_round(name: str, base: str, c: str, key: str, ratio: bool) -> str:
        pairs = zip(results[name][c], results[base][c], strict=True)
        values = [a[key] / b[key] if ratio else a[key] - b[key] for a, b in pairs]
        return ", ".join(f"{v:.2f}" if ratio else f"{v:+.1f} ms" for v in values)

    lines = []
    if "rayfleet" in results:
        lines.append(
            "rayfleet vs vllm-direct, TTFT p50 at c=1 per round: "
            + per_round("rayfleet", "vllm-direct", "1", "TTFT p50 ms", False)
        )
        lines.append(
            "rayfleet vs vllm-direct, output throughput at c=32 per round: "
            + per_round("rayfleet", "vllm-direct", "32", "out tok/s", True)
        )
    if "rayfleet+policies" in results:
        lines.append(
            "rayfleet+policies vs rayfleet, TTFT p50 at c=1 per round: "
            + per_round("rayfleet+policies", "rayfleet", "1", "TTFT p50 ms", False)
        )
    return lines


def print_table(rows: list[dict]) -> None:
    header = ["target", "c", *METRICS, "TTFT p50 vs direct", "throughput vs direct"]
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print(
            f"| {row['target']} | {row['concurrency']} | {row['req/s']:.1f} | "
            f"{row['out tok/s']:.0f} | {row['TTFT p50 ms']:.1f} | {row['TTFT p99 ms']:.1f} | "
            f"{row['TPOT p50 ms']:.2f} | {row['TTFT p50 vs direct ms']:+.1f} ms | "
            f"{row['out tok/s vs direct']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="measurement rounds per target")
    parser.add_argument("--skip-ray-serve-llm", action="store_true", help="leave out the peer")
    parser.add_argument(
        "--paired-rounds",
        type=int,
        default=300,
        help="rounds of the paired single-request TTFT measurement",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "overhead.json")
    args = parser.parse_args()

    model = make_tiny()
    results: dict = {}
    # Direct and fleet targets are up together and measured in alternation, so drift of
    # this shared machine hits them alike.
    with direct_server(model) as direct, fleet_targets(model) as fleet:
        measure({"vllm-direct": direct, **fleet}, model, args.rounds, results)
        print("paired single requests: fleet-replica, rayfleet, rayfleet+policies", flush=True)
        time.sleep(SETTLE_S)
        paired = paired_ttft(fleet, model, args.paired_rounds)
    if not args.skip_ray_serve_llm:
        run_ray_serve_llm(model, model, args.rounds, results)
    rows = summarize(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "runs": results, "paired": paired}, indent=2))
    print_table(rows)
    print("\n" + "\n".join(round_by_round(results)))
    print(f"\npaired single requests at concurrency 1 ({args.paired_rounds} rounds), TTFT p50:")
    for name, values in paired.items():
        print(f"  {name:<18} {statistics.median(values):.2f} ms")
    per_round = "(median of per-round differences)"
    gateway = paired_p50(paired, "rayfleet", "fleet-replica")
    policies = paired_p50(paired, "rayfleet+policies", "rayfleet")
    print(f"  the gateway over its replica called directly: {gateway:+.2f} ms {per_round}")
    print(f"  policies over the plain gateway: {policies:+.2f} ms {per_round}")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
