"""``rayfleet bench``: load-test an OpenAI-compatible endpoint; ``bench compare`` runs.

The flags are declared once, by group, in ``bench.options``; ``bench.flags`` turns them
into a run (``BenchPlan``), the load generator runs it, and this module prints, saves and
plots what it measured. Flags that vLLM's serving benchmark also has keep its names and
meanings. Only typer and rich are imported at load time, so ``--help`` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from rayfleet.bench.options import (
    BenchOptions,
    DatasetOptions,
    LoadOptions,
    OutputOptions,
    SweepOptions,
    TargetOptions,
)
from rayfleet.errors import RayfleetError
from rayfleet.option_groups import option_groups

if TYPE_CHECKING:
    from collections.abc import Callable

    from rayfleet.bench.drive import Counts
    from rayfleet.bench.flags import BenchPlan
    from rayfleet.bench.sweep import SweepPlan

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
    # ctx is typer's private copy of click's Context; only passed on here.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, vllm_style_args(list(args)))


app = typer.Typer(
    cls=_BenchGroup,
    help="Load-test an OpenAI-compatible endpoint (vLLM-compatible metrics), or compare runs.",
    no_args_is_help=False,
)


@app.callback(invoke_without_command=True)
@option_groups
def bench(
    ctx: typer.Context,
    target: TargetOptions,
    dataset: DatasetOptions,
    load: LoadOptions,
    sweep: SweepOptions,
    output: OutputOptions,
) -> None:
    """Load-test an OpenAI-compatible endpoint: `rayfleet bench --base-url URL [flags]`."""
    if ctx.invoked_subcommand is not None:
        return
    from rayfleet.bench.flags import plan_from_options

    try:
        plan = plan_from_options(BenchOptions(target, dataset, load, sweep, output))
    except KeyboardInterrupt:
        raise RayfleetError("interrupted while preparing the run; nothing was sent") from None
    console = Console(stderr=output.json)
    if plan.sweep is None:
        _run_once(plan, console, output.json)
    else:
        _run_sweep(plan, plan.sweep, console, output.json)


def _run_once(plan: BenchPlan, console: Console, json_output: bool) -> None:
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


def _run_sweep(plan: BenchPlan, sweep_plan: SweepPlan, console: Console, json_output: bool) -> None:
    from rayfleet.bench.progress import LiveProgress
    from rayfleet.bench.report import sweep_table
    from rayfleet.bench.sweep import run_sweep

    bars: list[LiveProgress] = []

    def on_step(value: float) -> Callable[[Counts], None]:
        if bars:
            bars.pop().__exit__(None, None, None)
        bar = LiveProgress(
            plan.config.dataset.num_prompts, f"{sweep_plan.variable}={value:g}", console
        )
        bars.append(bar.__enter__())
        return bar.update

    try:
        sweep = run_sweep(plan.config, sweep_plan, plan.tokenizer, on_step=on_step)
    finally:
        for bar in bars:
            bar.__exit__(None, None, None)
    result = sweep.result(sweep_plan)
    if json_output:
        _print_json(result)
    else:
        console.print(sweep_table(sweep_plan.variable, result["steps"]))
        console.print(sweep.stop_reason)
    _save(plan, result, console)
    if plan.plot_dir:
        from rayfleet.bench.plots import plot_sweep

        for path in plot_sweep(sweep_plan.variable, result["steps"], plan.plot_dir):
            console.print(f"plot: {path}")


def _print_json(result: dict[str, Any]) -> None:
    import json

    print(json.dumps(result, default=str))


def _save(plan: BenchPlan, result: dict[str, Any], console: Console) -> None:
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


@app.command()
@option_groups
def dataset(
    dataset: DatasetOptions,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The JSONL file to write ('-': stdout).")
    ],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Tokenizer (a local directory or hub name) for lengths in the model's tokens; "
            "without one the cache workloads count the simulator's tokens (4 characters)."
        ),
    ] = None,
) -> None:
    """Write the prompts `rayfleet bench` would send to a JSONL file other tools read:
    `rayfleet bench dataset --dataset-name shared-prefix -o sp.jsonl`, then `rayfleet bench
    --dataset-name jsonl --dataset-path sp.jsonl` or `vllm bench serve --dataset-name custom
    --dataset-path sp.jsonl --custom-output-len -1`."""
    from rayfleet.bench.dataset_file import write_dataset
    from rayfleet.bench.datasets import load_tokenizer, make_prompts
    from rayfleet.bench.flags import dataset_spec

    spec = dataset_spec(dataset)
    prompts = make_prompts(spec, load_tokenizer(tokenizer) if tokenizer else None)
    write_dataset(prompts, output)
    if str(output) != "-":
        Console(stderr=True).print(f"wrote {len(prompts)} prompts to {output}")
