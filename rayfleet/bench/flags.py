"""From ``rayfleet bench``'s option groups (``bench.options``) to a run's configuration,
checking each flag once: ``plan_from_options(options) -> BenchPlan``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rayfleet.bench.benchmark import BenchConfig
from rayfleet.bench.client import Target, first_model
from rayfleet.bench.datasets import (
    CACHE_WORKLOADS,
    DatasetSpec,
    Tokenizer,
    WorkloadShape,
    load_tokenizer,
)
from rayfleet.bench.load import LoadShape, check_shape
from rayfleet.bench.metrics import parse_goodput
from rayfleet.bench.options import (
    BenchOptions,
    DatasetOptions,
    LoadOptions,
    OutputOptions,
    SweepOptions,
    TargetOptions,
)
from rayfleet.bench.sweep import SweepPlan, parse_values
from rayfleet.errors import RayfleetError

SYNTHETIC_DATASETS = ("random", "prefix", "mixed", *CACHE_WORKLOADS)


@dataclass
class BenchPlan:
    """What the flags ask for: a run or a sweep, and where its outputs go."""

    config: BenchConfig
    tokenizer: Tokenizer | None
    sweep: SweepPlan | None
    result_path: Path | None
    plot_dir: Path | None


def plan_from_options(options: BenchOptions) -> BenchPlan:
    """Check every flag (cheap checks first), then find the model and load the tokenizer."""
    target, output = options.target, options.output
    base_url = target.base_url or f"http://{target.host}:{target.port}"
    if not base_url.startswith(("http://", "https://")):
        raise RayfleetError(f"--base-url {base_url!r} must start with http:// or https://")
    if options.load.num_processes < 1 or options.load.num_warmups < 0:
        raise RayfleetError("--num-processes must be at least 1 and --num-warmups at least 0")
    dataset = dataset_spec(options.dataset)
    shape = load_shape(options.load, seed=options.dataset.seed)
    goodput_ms = parse_goodput(output.goodput or [])
    percentiles = parse_percentiles(output.metric_percentiles)
    price_per_hour = check_price(output.price_per_hour)
    sweep = sweep_plan(options.sweep)
    if dataset.name == "jsonl" and dataset.dataset_path and not dataset.dataset_path.is_file():
        raise RayfleetError(f"--dataset-path: cannot read {dataset.dataset_path} (no such file)")
    model = target.model or first_model(base_url)
    if model is None:
        raise RayfleetError(
            f"--model: no model listed at {base_url}/v1/models (is --base-url "
            "right and the server up?); pass --model NAME"
        )
    tokenizer_id = tokenizer_source(target.tokenizer, model)
    tokenizer = load_tokenizer(tokenizer_id) if tokenizer_id else None
    config = BenchConfig(
        target=request_target(target, base_url, model, dataset.name),
        dataset=dataset,
        shape=shape,
        tokenizer_id=tokenizer_id,
        goodput_ms=goodput_ms,
        percentiles=percentiles,
        price_per_hour=price_per_hour,
        num_processes=options.load.num_processes,
        num_warmups=options.load.num_warmups,
        label=output.label,
        save_detailed=output.save_detailed,
    )
    return BenchPlan(config, tokenizer, sweep, result_path(output, config), output.plot)


def tokenizer_source(tokenizer: str | None, model: str) -> str | None:
    """``--tokenizer`` (a local dir or a hub name), else the model if it is a local dir."""
    if tokenizer:
        return tokenizer
    return model if Path(model).is_dir() else None


def request_target(options: TargetOptions, base_url: str, model: str, dataset_name: str) -> Target:
    if not options.endpoint.startswith("/"):
        raise RayfleetError(f"--endpoint {options.endpoint!r} must be a path like /v1/completions")
    if options.request_timeout_s <= 0:
        raise RayfleetError("--request-timeout-s must be positive")
    ignore_eos = options.ignore_eos
    if ignore_eos is None:
        ignore_eos = dataset_name in SYNTHETIC_DATASETS
    endpoint = options.endpoint
    if dataset_name == "chat" and endpoint == "/v1/completions":  # the default: chats are chats
        endpoint = "/v1/chat/completions"
    return Target(
        base_url=base_url,
        endpoint=endpoint,
        model=options.served_model_name or model,
        ignore_eos=ignore_eos,
        request_timeout_s=options.request_timeout_s,
        headers=parse_headers(options.header or []),
    )


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RayfleetError(f"--header {item!r} must be KEY=VALUE")
        headers[key.strip()] = value.strip()
    return headers


def dataset_spec(options: DatasetOptions) -> DatasetSpec:
    return DatasetSpec(
        name=options.dataset_name,
        num_prompts=options.num_prompts,
        random_input_len=options.random_input_len,
        random_output_len=options.random_output_len,
        random_range_ratio=options.random_range_ratio,
        prefix_len=options.prefix_repetition_prefix_len,
        suffix_len=options.prefix_repetition_suffix_len,
        num_prefixes=options.prefix_repetition_num_prefixes,
        mixed_long_input_len=options.mixed_long_input_len,
        mixed_long_fraction=options.mixed_long_fraction,
        dataset_path=options.dataset_path,
        seed=options.seed,
        workload=WorkloadShape(
            num_groups=options.gsp_num_groups,
            prompts_per_group=options.gsp_prompts_per_group,
            system_prompt_len=options.gsp_system_prompt_len,
            question_len=options.gsp_question_len,
            output_len=options.gsp_output_len,
            num_turns=options.chat_num_turns,
            num_system_prompts=options.chat_num_system_prompts,
            zipf_exponent=options.zipf_exponent,
            zipf_dominant_share=options.zipf_dominant_share,
        ),
    )


def load_shape(options: LoadOptions, *, seed: int) -> LoadShape:
    shape = LoadShape(
        request_rate=options.request_rate,
        burstiness=options.burstiness,
        max_concurrency=options.max_concurrency,
        max_connections=options.max_connections,
        ramp_up_strategy=options.ramp_up_strategy,
        ramp_up_start_rps=options.ramp_up_start_rps,
        ramp_up_end_rps=options.ramp_up_end_rps,
        burst_size=options.burst_size,
        burst_interval_s=options.burst_interval_s,
        seed=seed,
    )
    check_shape(shape)
    return shape


def sweep_plan(options: SweepOptions) -> SweepPlan | None:
    rates, concurrencies = options.sweep_request_rates, options.sweep_max_concurrency
    if rates and concurrencies:
        raise RayfleetError(
            "sweep one thing at a time: drop --sweep-request-rates or --sweep-max-concurrency"
        )
    if rates:
        variable, values = "request_rate", parse_values(rates, "--sweep-request-rates")
    elif concurrencies:
        variable, values = "max_concurrency", parse_values(concurrencies, "--sweep-max-concurrency")
    else:
        return None
    min_slo, max_errors = options.sweep_min_slo_attainment, options.sweep_max_error_share
    if not 0 <= min_slo <= 1 or not 0 <= max_errors <= 1:
        raise RayfleetError(
            "--sweep-min-slo-attainment and --sweep-max-error-share are shares in [0, 1]"
        )
    return SweepPlan(variable, values, min_slo, max_errors)


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < p < 100 for p in values):
        raise RayfleetError(
            f"--metric-percentiles {text!r} must be numbers in (0, 100), e.g. 90,99"
        )
    return values


def check_price(price_per_hour: float | None) -> float | None:
    if price_per_hour is not None and price_per_hour < 0:
        raise RayfleetError(
            "--price-per-hour must be the fleet's non-negative hourly cost, e.g. 12.40"
        )
    return price_per_hour


def result_path(options: OutputOptions, config: BenchConfig) -> Path | None:
    """Where ``--save-result`` writes: its FILE, else ``--result-filename``, else a name
    made like vLLM's (label, rate, concurrency, model, date); under ``--result-dir``."""
    if options.save_result is None:
        if options.result_filename or options.result_dir:
            raise RayfleetError("--result-dir and --result-filename need --save-result")
        return None
    path = Path(options.save_result or options.result_filename or default_result_name(config))
    if options.result_dir and not path.is_absolute():
        path = options.result_dir / path
    return path


def default_result_name(config: BenchConfig) -> str:
    shape = config.shape
    rate = "inf" if math.isinf(shape.request_rate) else f"{shape.request_rate:g}"
    concurrency = f"-concurrency{shape.max_concurrency}" if shape.max_concurrency else ""
    model = config.target.model.rstrip("/").split("/")[-1]
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config.label or 'rayfleet'}-{rate}qps{concurrency}-{model}-{date}.json"
