"""``rayfleet bench``: load-test an OpenAI-compatible endpoint; ``bench compare`` runs.

Flags that vLLM's serving benchmark also has keep its names and meanings. This module
imports only typer and rich at load time; the load generator is imported when it runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rayfleet.errors import RayfleetError

AUTO_NAME = ""
_MULTI_VALUE_FLAGS = ("--goodput",)
_OPTIONAL_VALUE_FLAGS = ("--save-result",)


def vllm_style_args(args: list[str]) -> list[str]:
    """Accept vLLM's argparse spellings that click lacks: ``--goodput ttft:500 tpot:50``
    (several values after one flag) and ``--save-result`` with no file name."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        out.append(arg)
        i += 1
        if arg in _MULTI_VALUE_FLAGS:
            first = True
            while i < len(args) and not args[i].startswith("-"):
                if not first:
                    out.append(arg)
                out.append(args[i])
                first = False
                i += 1
        elif arg in _OPTIONAL_VALUE_FLAGS and (i == len(args) or args[i].startswith("-")):
            out.append(AUTO_NAME)
    return out


class _BenchGroup(typer.core.TyperGroup):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, vllm_style_args(list(args)))


app = typer.Typer(
    cls=_BenchGroup,
    help="Load-test an OpenAI-compatible endpoint (vLLM-compatible metrics), or compare runs.",
    no_args_is_help=False,
)

_TARGET = "Target"
_DATA = "Dataset"
_LOAD = "Load shape"
_SWEEP = "Sweep"
_OUT = "Results"


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    base_url: Annotated[
        str | None,
        typer.Option(
            help="Server or gateway URL, e.g. http://127.0.0.1:8000.", rich_help_panel=_TARGET
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Host when --base-url is not given.", rich_help_panel=_TARGET)
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port when --base-url is not given.", rich_help_panel=_TARGET)
    ] = 8000,
    endpoint: Annotated[
        str, typer.Option(help="/v1/completions or /v1/chat/completions.", rich_help_panel=_TARGET)
    ] = "/v1/completions",
    model: Annotated[
        str | None,
        typer.Option(
            help="Model name (default: the first the endpoint lists).", rich_help_panel=_TARGET
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            help="Name sent in requests when it differs from --model.", rich_help_panel=_TARGET
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Tokenizer dir or name (default: --model if it is a local dir).",
            rich_help_panel=_TARGET,
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(help="Extra request header KEY=VALUE (repeatable).", rich_help_panel=_TARGET),
    ] = None,
    ignore_eos: Annotated[
        bool | None,
        typer.Option(
            "--ignore-eos/--no-ignore-eos",
            help="Ask for exactly the output length (default: on for random, prefix and mixed).",
            rich_help_panel=_TARGET,
        ),
    ] = None,
    request_timeout_s: Annotated[
        float,
        typer.Option(
            help="Give up on a request after this long (counted as failed).",
            rich_help_panel=_TARGET,
        ),
    ] = 600.0,
    dataset_name: Annotated[
        str, typer.Option(help="random | prefix | mixed | jsonl.", rich_help_panel=_DATA)
    ] = "random",
    dataset_path: Annotated[
        Path | None,
        typer.Option(
            help='JSONL file for --dataset-name jsonl: {"prompt": ..., "max_tokens": ...} a line.',
            rich_help_panel=_DATA,
        ),
    ] = None,
    num_prompts: Annotated[
        int, typer.Option(help="Requests to send.", rich_help_panel=_DATA)
    ] = 1000,
    random_input_len: Annotated[
        int,
        typer.Option(
            help="Input tokens per prompt (short prompts of mixed).", rich_help_panel=_DATA
        ),
    ] = 1024,
    random_output_len: Annotated[
        int,
        typer.Option(
            help="Output tokens per request (every synthetic dataset).", rich_help_panel=_DATA
        ),
    ] = 128,
    random_range_ratio: Annotated[
        float,
        typer.Option(
            help="Lengths vary uniformly by this ratio around the means.", rich_help_panel=_DATA
        ),
    ] = 0.0,
    prefix_repetition_prefix_len: Annotated[
        int, typer.Option(help="Shared prefix tokens (prefix dataset).", rich_help_panel=_DATA)
    ] = 256,
    prefix_repetition_suffix_len: Annotated[
        int, typer.Option(help="Random suffix tokens (prefix dataset).", rich_help_panel=_DATA)
    ] = 64,
    prefix_repetition_num_prefixes: Annotated[
        int, typer.Option(help="Distinct shared prefixes (prefix dataset).", rich_help_panel=_DATA)
    ] = 4,
    mixed_long_input_len: Annotated[
        int,
        typer.Option(
            help="Input tokens of the long prompts (mixed dataset).", rich_help_panel=_DATA
        ),
    ] = 2048,
    mixed_long_fraction: Annotated[
        float, typer.Option(help="Share of long prompts (mixed dataset).", rich_help_panel=_DATA)
    ] = 0.1,
    seed: Annotated[
        int, typer.Option(help="Seed for prompts and arrivals.", rich_help_panel=_DATA)
    ] = 0,
    max_concurrency: Annotated[
        int | None, typer.Option(help="Most requests in flight at once.", rich_help_panel=_LOAD)
    ] = None,
    request_rate: Annotated[
        float, typer.Option(help="Requests per second (inf: all at once).", rich_help_panel=_LOAD)
    ] = math.inf,
    burstiness: Annotated[
        float,
        typer.Option(
            help="1 = Poisson; below 1 burstier, above 1 steadier.", rich_help_panel=_LOAD
        ),
    ] = 1.0,
    ramp_up_strategy: Annotated[
        str | None, typer.Option(help="linear | exponential rate ramp.", rich_help_panel=_LOAD)
    ] = None,
    ramp_up_start_rps: Annotated[
        float | None, typer.Option(help="Ramp start rate.", rich_help_panel=_LOAD)
    ] = None,
    ramp_up_end_rps: Annotated[
        float | None, typer.Option(help="Ramp end rate.", rich_help_panel=_LOAD)
    ] = None,
    burst_size: Annotated[
        int | None,
        typer.Option(help="Send requests in bursts of this many...", rich_help_panel=_LOAD),
    ] = None,
    burst_interval_s: Annotated[
        float, typer.Option(help="...every this many seconds.", rich_help_panel=_LOAD)
    ] = 1.0,
    num_processes: Annotated[
        int,
        typer.Option(
            help="Client processes sharing the load (when one core is not enough).",
            rich_help_panel=_LOAD,
        ),
    ] = 1,
    num_warmups: Annotated[
        int, typer.Option(help="Unmeasured requests before the run.", rich_help_panel=_LOAD)
    ] = 0,
    sweep_request_rates: Annotated[
        str | None, typer.Option(help="Sweep these rates, e.g. 1,2,4,8.", rich_help_panel=_SWEEP)
    ] = None,
    sweep_max_concurrency: Annotated[
        str | None,
        typer.Option(help="Sweep these concurrencies, e.g. 1,4,16,64.", rich_help_panel=_SWEEP),
    ] = None,
    sweep_min_slo_attainment: Annotated[
        float,
        typer.Option(
            help="Stop when fewer requests than this meet --goodput.", rich_help_panel=_SWEEP
        ),
    ] = 0.9,
    sweep_max_error_share: Annotated[
        float, typer.Option(help="Stop when more requests than this fail.", rich_help_panel=_SWEEP)
    ] = 0.05,
    goodput: Annotated[
        list[str] | None,
        typer.Option(help="SLOs in ms, e.g. --goodput ttft:500 tpot:50.", rich_help_panel=_OUT),
    ] = None,
    metric_percentiles: Annotated[
        str, typer.Option(help="Percentiles to report, e.g. 90,99.", rich_help_panel=_OUT)
    ] = "90,99",
    price_per_hour: Annotated[
        float | None,
        typer.Option(help="Fleet cost per hour, for cost per 1M tokens.", rich_help_panel=_OUT),
    ] = None,
    save_result: Annotated[
        str | None,
        typer.Option(help="Write the result JSON (to FILE if given).", rich_help_panel=_OUT),
    ] = None,
    result_dir: Annotated[
        Path | None, typer.Option(help="Folder for --save-result.", rich_help_panel=_OUT)
    ] = None,
    result_filename: Annotated[
        str | None, typer.Option(help="File name for --save-result.", rich_help_panel=_OUT)
    ] = None,
    save_detailed: Annotated[
        bool, typer.Option(help="Also save per-request lists.", rich_help_panel=_OUT)
    ] = False,
    label: Annotated[
        str | None,
        typer.Option(help="Name of this run in results and comparisons.", rich_help_panel=_OUT),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write PNG plots to this folder.", rich_help_panel=_OUT)
    ] = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the result JSON instead of tables.", rich_help_panel=_OUT
        ),
    ] = False,
) -> None:
    """Load-test an OpenAI-compatible endpoint: `rayfleet bench --base-url URL [flags]`."""
    if ctx.invoked_subcommand is not None:
        return
    flags = dict(locals())
    flags.pop("ctx")
    run_and_report(flags)


def run_and_report(flags: dict) -> None:
    """Run what the flags ask for, then print, save and plot it."""
    from rayfleet.bench.flags import plan_from_flags

    try:
        plan = plan_from_flags(flags)
    except KeyboardInterrupt:
        raise RayfleetError("interrupted while preparing the run; nothing was sent") from None
    console = Console(stderr=flags["json_output"])
    if plan.sweep is None:
        _run_once(plan, console, flags["json_output"])
    else:
        _run_sweep(plan, console, flags["json_output"])


def _run_once(plan, console: Console, json_output: bool) -> None:
    from rayfleet.bench.benchmark import run_benchmark
    from rayfleet.bench.progress import LiveProgress
    from rayfleet.bench.report import latency_table, run_table

    config = plan.config
    with LiveProgress(config.dataset.num_prompts, "bench", console) as progress:
        run = run_benchmark(config, plan.tokenizer, on_progress=progress.update)
    if json_output:
        _print_json(run.result)
    else:
        console.print(run_table(run.result))
        console.print(latency_table(run.result))
    _save(plan, run.result, console)
    if plan.plot_dir:
        from rayfleet.bench.plots import plot_run

        for path in plot_run(run, plan.plot_dir):
            console.print(f"plot: {path}")


def _run_sweep(plan, console: Console, json_output: bool) -> None:
    from rayfleet.bench.progress import LiveProgress
    from rayfleet.bench.report import sweep_table
    from rayfleet.bench.sweep import run_sweep

    bars: list[LiveProgress] = []

    def on_step(value: float):
        if bars:
            bars.pop().__exit__(None, None, None)
        bar = LiveProgress(
            plan.config.dataset.num_prompts, f"{plan.sweep.variable}={value:g}", console
        )
        bars.append(bar.__enter__())
        return bar.update

    try:
        sweep = run_sweep(plan.config, plan.sweep, plan.tokenizer, on_step=on_step)
    finally:
        for bar in bars:
            bar.__exit__(None, None, None)
    result = sweep.result(plan.sweep)
    if json_output:
        _print_json(result)
    else:
        console.print(sweep_table(plan.sweep.variable, result["steps"]))
        console.print(sweep.stop_reason)
    _save(plan, result, console)
    if plan.plot_dir:
        from rayfleet.bench.plots import plot_sweep

        for path in plot_sweep(plan.sweep.variable, result["steps"], plan.plot_dir):
            console.print(f"plot: {path}")


def _print_json(result: dict) -> None:
    import json

    print(json.dumps(result, default=str))


def _save(plan, result: dict, console: Console) -> None:
    if plan.result_path is None:
        return
    from rayfleet.bench.report import save_result

    console.print(f"result: {save_result(result, plan.result_path)}")


@app.command()
def compare(
    files: Annotated[list[Path], typer.Argument(help="Result files written by --save-result.")],
) -> None:
    """Print runs side by side with ratios to the first: `rayfleet bench compare A.json B.json`."""
    from rayfleet.bench.report import compare_table, load_runs

    runs = [run for path in files for run in load_runs(path)]
    if len(runs) < 2:
        raise RayfleetError("bench compare needs at least two runs, e.g. compare A.json B.json")
    Console().print(compare_table(runs))
