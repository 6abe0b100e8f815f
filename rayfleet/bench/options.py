"""The flags of ``rayfleet bench``, declared once as typed groups, one ``--help`` panel each.

Flags that vLLM's serving benchmark also has keep its names and meanings. The command
parses them into these groups; ``bench.flags`` checks them and turns them into a run.
Imports only typer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import typer


@dataclass(frozen=True)
class TargetOptions:
    """Where the load goes and what the requests ask for."""

    PANEL: ClassVar[str] = "Target"
    base_url: Annotated[
        str | None, typer.Option(help="Server or gateway URL, e.g. http://127.0.0.1:8000.")
    ] = None
    host: Annotated[str, typer.Option(help="Host when --base-url is not given.")] = "127.0.0.1"
    port: Annotated[int, typer.Option(help="Port when --base-url is not given.")] = 8000
    endpoint: Annotated[str, typer.Option(help="/v1/completions or /v1/chat/completions.")] = (
        "/v1/completions"
    )
    model: Annotated[
        str | None, typer.Option(help="Model name (default: the first the endpoint lists).")
    ] = None
    served_model_name: Annotated[
        str | None, typer.Option(help="Name sent in requests when it differs from --model.")
    ] = None
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Tokenizer dir or name (default: --model if it is a local dir)."),
    ] = None
    header: Annotated[
        list[str] | None, typer.Option(help="Extra request header KEY=VALUE (repeatable).")
    ] = None
    ignore_eos: Annotated[
        bool | None,
        typer.Option(
            "--ignore-eos/--no-ignore-eos",
            help="Ask for exactly the output length (default: on for random, prefix and mixed).",
        ),
    ] = None
    request_timeout_s: Annotated[
        float, typer.Option(help="Give up on a request after this long (counted as failed).")
    ] = 600.0


@dataclass(frozen=True)
class DatasetOptions:
    """The prompts: which dataset, how many, how long."""

    PANEL: ClassVar[str] = "Dataset"
    dataset_name: Annotated[
        str,
        typer.Option(
            help="random | prefix | mixed | jsonl, or a cache-reuse workload: shared-prefix | "
            "chat | zipf | no-reuse (no tokenizer needed; chat sends chat messages)."
        ),
    ] = "random"
    dataset_path: Annotated[
        Path | None,
        typer.Option(
            help='JSONL file for --dataset-name jsonl: {"prompt": ..., "max_tokens": ...} a line.'
        ),
    ] = None
    num_prompts: Annotated[int, typer.Option(help="Requests to send.")] = 1000
    random_input_len: Annotated[
        int, typer.Option(help="Input tokens per prompt (short prompts of mixed).")
    ] = 1024
    random_output_len: Annotated[
        int, typer.Option(help="Output tokens per request (every synthetic dataset).")
    ] = 128
    random_range_ratio: Annotated[
        float, typer.Option(help="Lengths vary uniformly by this ratio around the means.")
    ] = 0.0
    prefix_repetition_prefix_len: Annotated[
        int, typer.Option(help="Shared prefix tokens (prefix dataset).")
    ] = 256
    prefix_repetition_suffix_len: Annotated[
        int, typer.Option(help="Random suffix tokens (prefix dataset).")
    ] = 64
    prefix_repetition_num_prefixes: Annotated[
        int, typer.Option(help="Distinct shared prefixes (prefix dataset).")
    ] = 4
    mixed_long_input_len: Annotated[
        int, typer.Option(help="Input tokens of the long prompts (mixed dataset).")
    ] = 2048
    mixed_long_fraction: Annotated[
        float, typer.Option(help="Share of long prompts (mixed dataset).")
    ] = 0.1
    gsp_num_groups: Annotated[
        int, typer.Option(help="Groups sharing a system prompt (chat: sessions).")
    ] = 64
    gsp_prompts_per_group: Annotated[
        int, typer.Option(help="Prompts per group (shared-prefix).")
    ] = 16
    gsp_system_prompt_len: Annotated[
        int, typer.Option(help="System prompt tokens (shared-prefix, chat, zipf, no-reuse).")
    ] = 2048
    gsp_question_len: Annotated[
        int, typer.Option(help="Question (chat: user turn) tokens of the cache workloads.")
    ] = 128
    gsp_output_len: Annotated[
        int, typer.Option(help="Output tokens of the cache workloads (chat: reply length).")
    ] = 256
    chat_num_turns: Annotated[
        int,
        typer.Option(
            help="Turns per chat session; a turn goes once the one before it has answered, "
            "with the answers its session got."
        ),
    ] = 4
    chat_num_system_prompts: Annotated[
        int, typer.Option(help="Distinct system prompts the chat sessions share.")
    ] = 4
    zipf_exponent: Annotated[
        float, typer.Option(help="Group popularity ~ 1 / rank ** this (zipf).")
    ] = 1.1
    zipf_dominant_share: Annotated[
        float, typer.Option(help="Share of zipf prompts sent to one dominant group.")
    ] = 0.0
    seed: Annotated[int, typer.Option(help="Seed for prompts and arrivals.")] = 0


@dataclass(frozen=True)
class LoadOptions:
    """When requests are sent, and by how many client processes."""

    PANEL: ClassVar[str] = "Load shape"
    max_concurrency: Annotated[
        int | None, typer.Option(help="Most requests in flight at once.")
    ] = None
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Most connections open at once, as an application's client pool caps them "
            "(the openai SDK's: 1,000); a request over it waits for one, and the wait counts "
            "in its TTFT. Default: a connection for each request in flight."
        ),
    ] = None
    request_rate: Annotated[float, typer.Option(help="Requests per second (inf: all at once).")] = (
        math.inf
    )
    burstiness: Annotated[
        float, typer.Option(help="1 = Poisson; below 1 burstier, above 1 steadier.")
    ] = 1.0
    ramp_up_strategy: Annotated[
        str | None, typer.Option(help="linear | exponential rate ramp.")
    ] = None
    ramp_up_start_rps: Annotated[float | None, typer.Option(help="Ramp start rate.")] = None
    ramp_up_end_rps: Annotated[float | None, typer.Option(help="Ramp end rate.")] = None
    burst_size: Annotated[
        int | None, typer.Option(help="Send requests in bursts of this many...")
    ] = None
    burst_interval_s: Annotated[float, typer.Option(help="...every this many seconds.")] = 1.0
    num_processes: Annotated[
        int, typer.Option(help="Client processes sharing the load (when one core is not enough).")
    ] = 1
    num_warmups: Annotated[int, typer.Option(help="Unmeasured requests before the run.")] = 0


@dataclass(frozen=True)
class SweepOptions:
    """Run once per value of one load setting, stopping when SLOs or errors say so."""

    PANEL: ClassVar[str] = "Sweep"
    sweep_request_rates: Annotated[
        str | None, typer.Option(help="Sweep these rates, e.g. 1,2,4,8.")
    ] = None
    sweep_max_concurrency: Annotated[
        str | None, typer.Option(help="Sweep these concurrencies, e.g. 1,4,16,64.")
    ] = None
    sweep_min_slo_attainment: Annotated[
        float, typer.Option(help="Stop when fewer requests than this meet --goodput.")
    ] = 0.9
    sweep_max_error_share: Annotated[
        float, typer.Option(help="Stop when more requests than this fail.")
    ] = 0.05


@dataclass(frozen=True)
class OutputOptions:
    """What is measured and reported, and where it is written."""

    PANEL: ClassVar[str] = "Results"
    goodput: Annotated[
        list[str] | None, typer.Option(help="SLOs in ms, e.g. --goodput ttft:500 tpot:50.")
    ] = None
    metric_percentiles: Annotated[str, typer.Option(help="Percentiles to report, e.g. 90,99.")] = (
        "90,99"
    )
    price_per_hour: Annotated[
        float | None, typer.Option(help="Fleet cost per hour, for cost per 1M tokens.")
    ] = None
    save_result: Annotated[
        str | None, typer.Option(help="Write the result JSON (to FILE if given).")
    ] = None
    result_dir: Annotated[Path | None, typer.Option(help="Folder for --save-result.")] = None
    result_filename: Annotated[str | None, typer.Option(help="File name for --save-result.")] = None
    save_detailed: Annotated[bool, typer.Option(help="Also save per-request lists.")] = False
    label: Annotated[
        str | None, typer.Option(help="Name of this run in results and comparisons.")
    ] = None
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots to this folder.")] = None
    json: Annotated[
        bool, typer.Option("--json", help="Print the result JSON instead of tables.")
    ] = False


@dataclass(frozen=True)
class BenchOptions:
    """Every flag of one ``rayfleet bench`` run, by group."""

    target: TargetOptions
    dataset: DatasetOptions
    load: LoadOptions
    sweep: SweepOptions
    output: OutputOptions
