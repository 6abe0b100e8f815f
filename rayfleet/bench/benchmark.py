"""One benchmark run, end to end: prompts, a check request, the load, the result dict.

The result dict is what ``--save-result`` writes: vLLM's keys for everything the two
benchmarks share (so vLLM's tooling and ours read each other's files), then ours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from rayfleet.bench.client import RequestResult, Target, send_one
from rayfleet.bench.datasets import DatasetSpec, Prompt, Tokenizer, make_prompts
from rayfleet.bench.drive import Counts, RunOutput
from rayfleet.bench.load import LoadShape, check_shape
from rayfleet.bench.metrics import DEFAULT_PERCENTILES, Summary, summarize
from rayfleet.bench.runner import run_load
from rayfleet.errors import RayfleetError


@dataclass(frozen=True)
class BenchConfig:
    """Everything one run needs; the CLI builds it from flags."""

    target: Target
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    shape: LoadShape = field(default_factory=LoadShape)
    tokenizer_id: str | None = None
    goodput_ms: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    price_per_hour: float | None = None
    num_processes: int = 1
    num_warmups: int = 0
    label: str | None = None
    save_detailed: bool = False


@dataclass
class BenchRun:
    """A finished run: the result dict and the raw requests (for plots)."""

    result: Summary
    output: RunOutput


def check_endpoint(target: Target, prompt: Prompt) -> None:
    """Send one request first, so a wrong URL or model fails in one line, not N."""
    result = send_one(target, prompt)
    if not result.ok:
        raise RayfleetError(
            f"the first request to {target.url} failed ({' '.join(result.error.split())[:200]}); "
            "check --base-url, --endpoint and --model"
        )


def warm_up(config: BenchConfig, prompt: Prompt) -> None:
    if config.num_warmups > 0:
        run_load(
            config.target,
            [prompt] * config.num_warmups,
            replace(config.shape, request_rate=math.inf, ramp_up_strategy=None, burst_size=None),
        )


def run_benchmark(
    config: BenchConfig,
    tokenizer: Tokenizer | None,
    *,
    prompts: list[Prompt] | None = None,
    on_progress: Callable[[Counts], None] | None = None,
) -> BenchRun:
    """Run one load against the target and measure it."""
    check_shape(config.shape)
    if config.num_processes < 1:
        raise RayfleetError("--num-processes must be at least 1")
    prompts = prompts if prompts is not None else make_prompts(config.dataset, tokenizer)
    check_endpoint(config.target, prompts[0])
    warm_up(config, prompts[0])
    output = run_load(
        config.target,
        prompts,
        config.shape,
        num_processes=config.num_processes,
        on_progress=on_progress,
    )
    return BenchRun(result_dict(config, output), output)


def result_dict(config: BenchConfig, output: RunOutput) -> Summary:
    """The saved result: vLLM's header keys, the metrics, then our run details."""
    shape = config.shape
    result: Summary = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if config.target.is_chat else "openai",
        "backend": "openai-chat" if config.target.is_chat else "openai",
        "label": config.label,
        "model_id": config.target.model,
        "tokenizer_id": config.tokenizer_id,
        "num_prompts": config.dataset.num_prompts,
        "request_rate": shape.request_rate if not math.isinf(shape.request_rate) else "inf",
        "burstiness": shape.burstiness,
        "max_concurrency": shape.max_concurrency,
        "max_connections": shape.max_connections,
    }
    if shape.ramp_up_strategy:
        result.update(
            ramp_up_strategy=shape.ramp_up_strategy,
            ramp_up_start_rps=shape.ramp_up_start_rps,
            ramp_up_end_rps=shape.ramp_up_end_rps,
        )
    result.update(
        summarize(
            output.results,
            output.duration_s,
            goodput_ms=config.goodput_ms,
            percentiles=config.percentiles,
            price_per_hour=config.price_per_hour,
        )
    )
    result["latencies"] = [r.e2e_s for r in output.results]
    result["queue_times"] = [r.start_s - r.scheduled_s for r in output.results]
    result.update(
        base_url=config.target.base_url,
        endpoint=config.target.endpoint,
        dataset_name=config.dataset.name,
        load=shape.describe(),
        num_processes=config.num_processes,
        num_cancelled=output.num_cancelled,
        interrupted=output.interrupted,
        goodput_slos_ms=config.goodput_ms or None,
    )
    if config.save_detailed:
        result.update(detailed_lists(output.results))
    return result


def detailed_lists(results: list[RequestResult]) -> Summary:
    """Per-request lists under vLLM's ``--save-detailed`` keys, plus the replica of each."""
    return {
        "input_lens": [r.num_input_tokens for r in results],
        "output_lens": [r.num_output_tokens if r.ok else 0 for r in results],
        "ttfts": [r.ttft_s for r in results],
        "itls": [r.itl_s for r in results],
        "start_times": [r.start_s for r in results],
        "errors": [r.error for r in results],
        "served_by": [r.replica for r in results],
    }
