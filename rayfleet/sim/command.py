"""``rayfleet sim``: serve simulated vLLM replicas, or calibrate their latency model.

Each command parses, calls one function of ``rayfleet.sim``, and prints. Imports only
typer and rich at load time, so ``--help`` is fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rayfleet.errors import RayfleetError

app = typer.Typer(
    help="A simulated vLLM engine: OpenAI-compatible replicas driven by a latency model "
    "(a + b * prefill_tokens + c * decode_seqs per step) with a prefix cache.",
    no_args_is_help=True,
)


@app.command()
def serve(
    replicas: Annotated[int, typer.Option(help="Simulated replicas, one port each.")] = 1,
    port_base: Annotated[
        int, typer.Option(help="Replica i listens on PORT_BASE + i; 0 takes free ports.")
    ] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    spec: Annotated[
        Path | None,
        typer.Option(help="Engine spec JSON (written by `rayfleet sim calibrate`)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name the replicas serve (overrides the spec).")
    ] = None,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="KV capacity per replica in 16-token blocks.")
    ] = None,
    restart_every_s: Annotated[
        float, typer.Option(help="Restart one replica every this many seconds, in turn (0: never).")
    ] = 0.0,
) -> None:
    """Serve simulated replicas on one event loop; prints their URLs as a JSON list.

    Every replica answers /v1/completions, /v1/chat/completions, /v1/models, /health,
    /metrics (vLLM's names), /simulator/stats and POST /simulator/restart.
    """
    import asyncio
    import dataclasses

    from rayfleet.sim.fleet import run_fleet
    from rayfleet.sim.spec import EngineSpec, load_spec

    if replicas < 1 or restart_every_s < 0:
        raise RayfleetError("--replicas must be at least 1 and --restart-every-s at least 0")
    engine = load_spec(spec) if spec else EngineSpec()
    if model is not None:
        engine = dataclasses.replace(engine, model=model)
    if num_gpu_blocks is not None:
        engine = dataclasses.replace(engine, num_gpu_blocks=num_gpu_blocks)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(run_fleet(engine, replicas, host, port_base, restart_every_s))
    except OSError as exc:
        raise RayfleetError(
            f"cannot listen on {host} from port {port_base} ({exc.strerror}); "
            "pick another --port-base or use 0"
        ) from None
    except KeyboardInterrupt:
        pass


@app.command()
def calibrate(
    base_url: Annotated[str, typer.Option(help="A real vLLM server, e.g. http://127.0.0.1:8000.")],
    model: Annotated[str, typer.Option(help="Model name the server serves.")],
    output: Annotated[Path, typer.Option(help="Where to write the fitted spec JSON.")] = Path(
        "sim-spec.json"
    ),
    max_num_batched_tokens: Annotated[
        int, typer.Option(help="The server's token budget per step (longest prompt sent).")
    ] = 2048,
    num_gpu_blocks: Annotated[
        int, typer.Option(help="KV blocks to give the simulated replica (see the server's log).")
    ] = 8192,
    num_repeats: Annotated[int, typer.Option(help="Repeats per measurement (median).")] = 3,
    json_output: Annotated[bool, typer.Option("--json", help="Print the fit as JSON.")] = False,
) -> None:
    """Fit a, b, c against a real vLLM server and write a spec `sim serve --spec` reads.

    Sends fresh prompts one at a time (TTFT = a + b * prompt_tokens) and batches of
    concurrent decodes (inter-token gap = a + c * sequences); prints the fit and its mean
    absolute relative error.
    """
    from rayfleet.sim.calibrate import CalibrationPlan
    from rayfleet.sim.calibrate import calibrate as fit_server
    from rayfleet.sim.report import fit_table
    from rayfleet.sim.spec import EngineSpec

    lens = tuple(n for n in CalibrationPlan().prompt_lens if n < max_num_batched_tokens - 32)
    plan = CalibrationPlan(prompt_lens=lens, num_repeats=max(1, num_repeats))
    fit = fit_server(base_url, model, plan)
    spec = EngineSpec(
        model=model,
        step_s=fit.step_s,
        prefill_token_s=fit.prefill_token_s,
        decode_seq_s=fit.decode_seq_s,
        request_overhead_s=fit.request_overhead_s,
        max_num_batched_tokens=max_num_batched_tokens,
        num_gpu_blocks=num_gpu_blocks,
    )
    data = {**spec.to_dict(), "calibration": {"base_url": base_url, **fit.as_dict()}}
    output.write_text(json.dumps(data, indent=2) + "\n")
    if json_output:
        print(json.dumps(data))
        return
    console = Console()
    console.print(fit_table(fit))
    console.print(f"spec: {output}")


def main() -> None:
    try:
        app()
    except RayfleetError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(exc.exit_code)
