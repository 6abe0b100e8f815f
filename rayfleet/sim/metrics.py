"""A simulated replica's ``/metrics``: Prometheus text with vLLM 0.32's metric names.

Names, types and labels (``model_name``, ``engine``) are those of vLLM's
``PrometheusStatLogger``, so anything that reads a real replica's metrics (the
gateway's load and cache signals, dashboards) reads a simulated one unchanged. Included:
``vllm:num_requests_running``/``waiting``, ``vllm:kv_cache_usage_perc``,
``vllm:prefix_cache_queries``/``hits``, ``vllm:prompt_tokens``,
``vllm:generation_tokens``, ``vllm:request_success``, the
``vllm:time_to_first_token_seconds`` histogram, ``vllm:cache_config_info`` (labels
``block_size`` and ``num_gpu_blocks``, as vLLM publishes its CacheConfig) and
``process_start_time_seconds``, which moves when the replica restarts. Counters are written as
prometheus_client writes them (``# TYPE name_total counter``, no ``_created``). Rendered by hand:
64 replicas share one process, and one prometheus_client registry each would cost more
than the text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfleet.sim.stats import TTFT_BUCKETS_S

if TYPE_CHECKING:
    from rayfleet.sim.engine import Engine


def _family(lines: list[str], name: str, kind: str, doc: str) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} {kind}")


def render_metrics(engine: Engine) -> str:
    """The replica's metrics, in Prometheus' text format."""
    spec, stats, cache = engine.spec, engine.stats, engine.cache
    labels = f'engine="0",model_name="{spec.model}"'
    lines: list[str] = []
    gauges = (
        ("vllm:num_requests_running", "Number of requests in model execution batches.",
         len(engine.running)),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
         len(engine.waiting)),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
         cache.num_used_blocks / cache.num_blocks),
    )  # fmt: skip
    for name, doc, value in gauges:
        _family(lines, name, "gauge", doc)
        lines.append(f"{name}{{{labels}}} {float(value)}")
    counters = (
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
         "tokens.", stats.prefix_cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         stats.prefix_cache_hits),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.",
         stats.generation_tokens),
    )  # fmt: skip
    for name, doc, value in counters:
        _family(lines, f"{name}_total", "counter", doc)
        lines.append(f"{name}_total{{{labels}}} {float(value)}")
    _family(
        lines, "vllm:request_success_total", "counter", "Count of successfully processed requests."
    )
    lines.append(
        f'vllm:request_success_total{{{labels},finished_reason="length"}} '
        f"{float(stats.num_finished)}"
    )
    _ttft_histogram(lines, engine, labels)
    _family(lines, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    lines.append(
        f'vllm:cache_config_info{{block_size="{spec.block_size}",enable_prefix_caching="True",'
        f'engine="0",num_gpu_blocks="{spec.num_gpu_blocks}"}} 1.0'
    )
    _family(
        lines,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    )
    lines.append(f"process_start_time_seconds {stats.start_time_s}")
    return "\n".join(lines) + "\n"


def _ttft_histogram(lines: list[str], engine: Engine, labels: str) -> None:
    name = "vllm:time_to_first_token_seconds"
    stats = engine.stats
    _family(lines, name, "histogram", "Histogram of time to first token in seconds.")
    cumulative = 0
    for bound, count in zip(TTFT_BUCKETS_S, stats.ttft_counts, strict=True):
        cumulative += count
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(cumulative)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(stats.ttft_count)}')
    lines.append(f"{name}_count{{{labels}}} {float(stats.ttft_count)}")
    lines.append(f"{name}_sum{{{labels}}} {stats.ttft_sum_s}")
