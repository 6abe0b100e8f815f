"""From ``rayfleet bench`` flags to a run's configuration, checking each flag once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rayfleet.bench.benchmark import BenchConfig
from rayfleet.bench.client import Target, first_model
from rayfleet.bench.datasets import DatasetSpec, Tokenizer, load_tokenizer
from rayfleet.bench.load import LoadShape, check_shape
from rayfleet.bench.metrics import parse_goodput
from rayfleet.bench.sweep import SweepPlan, parse_values
from rayfleet.errors import RayfleetError

SYNTHETIC_DATASETS = ("random", "prefix", "mixed")


@dataclass
class BenchPlan:
    """What the flags ask for: a run or a sweep, and where its outputs go."""

    config: BenchConfig
    tokenizer: Tokenizer | None
    sweep: SweepPlan | None
    result_path: Path | None
    plot_dir: Path | None


def plan_from_flags(flags: dict) -> BenchPlan:
    """Check every flag (cheap checks first), then find the model and load the tokenizer."""
    base_url = flags["base_url"] or f"http://{flags['host']}:{flags['port']}"
    if not base_url.startswith(("http://", "https://")):
        raise RayfleetError(f"--base-url {base_url!r} must start with http:// or https://")
    if flags["num_processes"] < 1 or flags["num_warmups"] < 0:
        raise RayfleetError("--num-processes must be at least 1 and --num-warmups at least 0")
    dataset, shape = dataset_from_flags(flags), shape_from_flags(flags)
    goodput_ms = parse_goodput(flags["goodput"] or [])
    percentiles = parse_percentiles(flags["metric_percentiles"])
    price_per_hour = check_price(flags["price_per_hour"])
    sweep = sweep_from_flags(flags)
    if dataset.name == "jsonl" and dataset.dataset_path and not dataset.dataset_path.is_file():
        raise RayfleetError(f"--dataset-path: cannot read {dataset.dataset_path} (no such file)")
    model = flags["model"] or first_model(base_url)
    if model is None:
        raise RayfleetError(
            f"--model: no model listed at {base_url}/v1/models (is --base-url "
            "right and the server up?); pass --model NAME"
        )
    target = target_from_flags(flags, base_url, model)
    tokenizer_id = tokenizer_source(flags["tokenizer"], model)
    tokenizer = load_tokenizer(tokenizer_id) if tokenizer_id else None
    config = BenchConfig(
        target=target,
        dataset=dataset,
        shape=shape,
        tokenizer_id=tokenizer_id,
        goodput_ms=goodput_ms,
        percentiles=percentiles,
        price_per_hour=price_per_hour,
        num_processes=flags["num_processes"],
        num_warmups=flags["num_warmups"],
        label=flags["label"],
        save_detailed=flags["save_detailed"],
    )
    return BenchPlan(config, tokenizer, sweep, result_path(flags, config), flags["plot"])


def tokenizer_source(tokenizer: str | None, model: str) -> str | None:
    """``--tokenizer`` (a local dir or a hub name), else the model if it is a local dir."""
    if tokenizer:
        return tokenizer
    return model if Path(model).is_dir() else None


def target_from_flags(flags: dict, base_url: str, model: str) -> Target:
    if not flags["endpoint"].startswith("/"):
        raise RayfleetError(f"--endpoint {flags['endpoint']!r} must be a path like /v1/completions")
    if flags["request_timeout_s"] <= 0:
        raise RayfleetError("--request-timeout-s must be positive")
    ignore_eos = flags["ignore_eos"]
    if ignore_eos is None:
        ignore_eos = flags["dataset_name"] in SYNTHETIC_DATASETS
    return Target(
        base_url=base_url,
        endpoint=flags["endpoint"],
        model=flags["served_model_name"] or model,
        ignore_eos=ignore_eos,
        request_timeout_s=flags["request_timeout_s"],
        headers=parse_headers(flags["header"] or []),
    )


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RayfleetError(f"--header {item!r} must be KEY=VALUE")
        headers[key.strip()] = value.strip()
    return headers


def dataset_from_flags(flags: dict) -> DatasetSpec:
    return DatasetSpec(
        name=flags["dataset_name"],
        num_prompts=flags["num_prompts"],
        random_input_len=flags["random_input_len"],
        random_output_len=flags["random_output_len"],
        random_range_ratio=flags["random_range_ratio"],
        prefix_len=flags["prefix_repetition_prefix_len"],
        suffix_len=flags["prefix_repetition_suffix_len"],
        num_prefixes=flags["prefix_repetition_num_prefixes"],
        mixed_long_input_len=flags["mixed_long_input_len"],
        mixed_long_fraction=flags["mixed_long_fraction"],
        dataset_path=flags["dataset_path"],
        seed=flags["seed"],
    )


def shape_from_flags(flags: dict) -> LoadShape:
    shape = LoadShape(
        request_rate=flags["request_rate"],
        burstiness=flags["burstiness"],
        max_concurrency=flags["max_concurrency"],
        ramp_up_strategy=flags["ramp_up_strategy"],
        ramp_up_start_rps=flags["ramp_up_start_rps"],
        ramp_up_end_rps=flags["ramp_up_end_rps"],
        burst_size=flags["burst_size"],
        burst_interval_s=flags["burst_interval_s"],
        seed=flags["seed"],
    )
    check_shape(shape)
    return shape


def sweep_from_flags(flags: dict) -> SweepPlan | None:
    rates, concurrencies = flags["sweep_request_rates"], flags["sweep_max_concurrency"]
    if rates and concurrencies:
        raise RayfleetError(
            "sweep one thing at a time: drop --sweep-request-rates or --sweep-max-concurrency"
        )
    if not (rates or concurrencies):
        return None
    if (
        not 0 <= flags["sweep_min_slo_attainment"] <= 1
        or not 0 <= flags["sweep_max_error_share"] <= 1
    ):
        raise RayfleetError(
            "--sweep-min-slo-attainment and --sweep-max-error-share are shares in [0, 1]"
        )
    if rates:
        variable, values = "request_rate", parse_values(rates, "--sweep-request-rates")
    else:
        variable, values = "max_concurrency", parse_values(concurrencies, "--sweep-max-concurrency")
    return SweepPlan(
        variable, values, flags["sweep_min_slo_attainment"], flags["sweep_max_error_share"]
    )


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


def result_path(flags: dict, config: BenchConfig) -> Path | None:
    """Where ``--save-result`` writes: its FILE, else ``--result-filename``, else a name
    made like vLLM's (label, rate, concurrency, model, date); under ``--result-dir``."""
    save = flags["save_result"]
    if save is None:
        if flags["result_filename"] or flags["result_dir"]:
            raise RayfleetError("--result-dir and --result-filename need --save-result")
        return None
    name = save or flags["result_filename"] or default_result_name(config)
    path = Path(name)
    if flags["result_dir"] and not path.is_absolute():
        path = flags["result_dir"] / path
    return path


def default_result_name(config: BenchConfig) -> str:
    shape = config.shape
    rate = "inf" if math.isinf(shape.request_rate) else f"{shape.request_rate:g}"
    concurrency = f"-concurrency{shape.max_concurrency}" if shape.max_concurrency else ""
    model = config.target.model.rstrip("/").split("/")[-1]
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config.label or 'rayfleet'}-{rate}qps{concurrency}-{model}-{date}.json"
