"""``rayfleet plan``: parse flags, call ``make_plan``, print. Nothing heavy at import time."""

from __future__ import annotations

from pathlib import Path

import typer

EXIT_DOES_NOT_FIT = 3

_HW = "Hardware"
_WORK = "Workload"
_ENGINE = "Engine (vLLM settings)"
_OUT = "Output"


def plan(
    model: str = typer.Argument(
        ...,
        help="The model: a config.json, a model directory, or a hub id (org/name) whose "
        "config is in the local Hugging Face cache. Nothing is downloaded.",
        show_default=False,
    ),
    gpus_per_node: int | None = typer.Option(
        None, min=1, help="GPUs in each node. Required unless --from-cluster.", rich_help_panel=_HW
    ),
    gpu_memory_gib: float | None = typer.Option(
        None,
        min=0.001,
        help="Memory of one GPU in GiB (80 for H100 80GB, 141 for H200). Required unless "
        "--from-cluster reads it with nvidia-smi.",
        rich_help_panel=_HW,
    ),
    nodes: int = typer.Option(1, min=1, help="Number of identical nodes.", rich_help_panel=_HW),
    intra_node_gbps: float = typer.Option(
        7200.0,
        min=0.001,
        help="GPU-to-GPU bandwidth inside a node, Gbit/s (NVLink 4 is 900 GB/s = 7200).",
        rich_help_panel=_HW,
    ),
    inter_node_gbps: float = typer.Option(
        100.0,
        min=0.001,
        help="Bandwidth between nodes, Gbit/s. TP crosses nodes only at 200 or more; under 10 "
        "the plan keeps replicas inside nodes when it can.",
        rich_help_panel=_HW,
    ),
    from_cluster: bool = typer.Option(
        False,
        "--from-cluster",
        help="Read nodes, GPUs per node and GPU memory from the running Ray cluster, and the "
        "inter-node bandwidth from the doctor's measurement ($RAYFLEET_HOME/doctor/network.json) "
        "when present; flags fill what cannot be read.",
        rich_help_panel=_HW,
    ),
    ray_address: str = typer.Option(
        "auto", help="Ray cluster address for --from-cluster.", rich_help_panel=_HW
    ),
    context_len: int | None = typer.Option(
        None,
        min=1,
        help="Tokens per sequence (prompt + output) to hold in KV cache; becomes vLLM's "
        "max_model_len. Default: the model's max context.",
        rich_help_panel=_WORK,
    ),
    concurrency: int | None = typer.Option(
        None, min=1, help="Target concurrent sequences across all replicas.", rich_help_panel=_WORK
    ),
    request_rate: float | None = typer.Option(
        None,
        min=0.0,
        help="Target requests per second; turned into concurrency with Little's law "
        "(rate x output-len x tpot-ms).",
        rich_help_panel=_WORK,
    ),
    output_len: int = typer.Option(
        256, min=1, help="Output tokens per request, for --request-rate.", rich_help_panel=_WORK
    ),
    tpot_ms: float = typer.Option(
        50.0,
        min=0.001,
        help="Assumed time per output token in ms, for --request-rate.",
        rich_help_panel=_WORK,
    ),
    dtype: str = typer.Option(
        "auto",
        help="Weights and activations dtype: auto (the config's), bfloat16, float16, float32.",
        rich_help_panel=_ENGINE,
    ),
    quantization: str | None = typer.Option(
        None,
        help="How linear weights are stored, overriding config.json: none, fp8, int8, awq, "
        "gptq, int4. fp8 on an unquantized checkpoint means vLLM's online fp8.",
        rich_help_panel=_ENGINE,
    ),
    kv_cache_dtype: str = typer.Option(
        "auto", help="KV cache dtype: auto (the model's dtype) or fp8.", rich_help_panel=_ENGINE
    ),
    gpu_memory_utilization: float = typer.Option(
        0.9,
        min=0.01,
        max=1.0,
        help="Fraction of each GPU's memory vLLM may use (weights, activations, KV cache).",
        rich_help_panel=_ENGINE,
    ),
    kv_cache_gib: float | None = typer.Option(
        None,
        min=0.0,
        help="Fixed KV cache per GPU in GiB instead of what the utilization leaves "
        "(vLLM's kv_cache_memory_bytes; on CPU, VLLM_CPU_KVCACHE_SPACE).",
        rich_help_panel=_ENGINE,
    ),
    block_size: int = typer.Option(
        16,
        min=1,
        help="KV cache block size in tokens (vLLM's --block-size).",
        rich_help_panel=_ENGINE,
    ),
    max_num_batched_tokens: int = typer.Option(
        8192,
        min=1,
        help="Tokens per forward pass; sizes the activation estimate.",
        rich_help_panel=_ENGINE,
    ),
    max_num_seqs: int = typer.Option(
        256, min=1, help="Sequences per batch; sizes the logits estimate.", rich_help_panel=_ENGINE
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the plan as JSON instead of tables.", rich_help_panel=_OUT
    ),
    emit: Path | None = typer.Option(
        None,
        help="Write the chosen layout as a fleet.yaml model entry to this file.",
        rich_help_panel=_OUT,
    ),
    name: str | None = typer.Option(
        None,
        help="Served model name in the --emit entry. Default: from the model's path or id.",
        rich_help_panel=_OUT,
    ),
) -> None:
    """Plan how to split a model over GPUs and nodes: does it fit, TP x PP x DP, whether
    Ray is needed, KV cache capacity, replicas for a target load.

    Exit code 0 when the model fits, 3 when it does not.
    """
    from rich.console import Console

    from rayfleet.planner.fleet_entry import write_fleet_entry
    from rayfleet.planner.layout import Workload
    from rayfleet.planner.memory import MemorySettings
    from rayfleet.planner.model_spec import load_model_spec
    from rayfleet.planner.plan import make_plan
    from rayfleet.planner.report import plan_json, print_plan

    spec = load_model_spec(model, dtype=dtype, quantization=quantization)
    hardware = _hardware(
        from_cluster,
        ray_address,
        gpus_per_node,
        gpu_memory_gib,
        nodes,
        intra_node_gbps,
        inter_node_gbps,
    )
    workload = Workload(
        context_len=context_len or spec.max_context,
        concurrency=concurrency,
        request_rate=request_rate,
        output_len=output_len,
        tpot_ms=tpot_ms,
    )
    settings = MemorySettings(
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=_kv_cache_dtype(kv_cache_dtype),
        kv_cache_gib=kv_cache_gib,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    result = make_plan(spec, hardware, workload, settings)
    if as_json:
        typer.echo(plan_json(result))
    else:
        print_plan(result, Console())
    if emit is not None and result.fits:
        write_fleet_entry(result, emit, name)
        if not as_json:
            Console().print(f"wrote a fleet.yaml model entry to {emit}", highlight=False)
    if not result.fits:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def _kv_cache_dtype(value: str) -> str:
    from rayfleet.errors import ConfigError

    normal = value.lower()
    if normal.startswith("fp8"):
        return "fp8"
    if normal != "auto":
        raise ConfigError(f"--kv-cache-dtype '{value}' is not one of auto, fp8")
    return normal


def _hardware(
    from_cluster: bool,
    ray_address: str,
    gpus_per_node: int | None,
    gpu_memory_gib: float | None,
    nodes: int,
    intra_node_gbps: float,
    inter_node_gbps: float,
):
    from rayfleet.errors import ConfigError
    from rayfleet.planner.hardware import Hardware, read_cluster

    flags = Hardware(
        gpus_per_node=gpus_per_node or 1,
        gpu_memory_gib=gpu_memory_gib or 0.0,
        nodes=nodes,
        intra_node_gbps=intra_node_gbps,
        inter_node_gbps=inter_node_gbps,
    )
    if from_cluster:
        return read_cluster(ray_address, flags)
    missing = [
        flag
        for flag, value in (
            ("--gpus-per-node", gpus_per_node),
            ("--gpu-memory-gib", gpu_memory_gib),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} not given: describe the GPUs with --gpus-per-node and "
            "--gpu-memory-gib, or read them from a running Ray cluster with --from-cluster"
        )
    return flags
