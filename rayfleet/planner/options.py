"""The flags of ``rayfleet plan``, declared once as typed groups, and the plan they ask for.

Each group is one ``--help`` panel and knows what it means to the planner::

    HardwareOptions.hardware()          -> Hardware (the flags, or read from a Ray cluster)
    WorkloadOptions.workload(context)   -> Workload
    EngineOptions.settings()            -> MemorySettings
    plan_model(model, hardware, workload, engine) -> Plan   (what ``rayfleet plan`` calls)

Imports typer and the planner's own pure modules; Ray only with ``--from-cluster``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import typer

from rayfleet.errors import ConfigError
from rayfleet.planner.hardware import Hardware, read_cluster
from rayfleet.planner.layout import Workload
from rayfleet.planner.memory import MemorySettings
from rayfleet.planner.model_spec import load_model_spec
from rayfleet.planner.plan import Plan, make_plan


@dataclass(frozen=True)
class HardwareOptions:
    """The GPUs and links to plan for."""

    PANEL: ClassVar[str] = "Hardware"
    gpus_per_node: Annotated[
        int | None, typer.Option(min=1, help="GPUs in each node. Required unless --from-cluster.")
    ] = None
    gpu_memory_gib: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Memory of one GPU in GiB (80 for H100 80GB, 141 for H200). Required unless "
            "--from-cluster reads it with nvidia-smi.",
        ),
    ] = None
    nodes: Annotated[int, typer.Option(min=1, help="Number of identical nodes.")] = 1
    intra_node_gbps: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="GPU-to-GPU bandwidth inside a node, Gbit/s (NVLink 4 is 900 GB/s = 7200).",
        ),
    ] = 7200.0
    inter_node_gbps: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Bandwidth between nodes, Gbit/s. TP crosses nodes only at 200 or more; under "
            "10 the plan keeps replicas inside nodes when it can.",
        ),
    ] = 100.0
    from_cluster: Annotated[
        bool,
        typer.Option(
            "--from-cluster",
            help="Read nodes, GPUs per node and GPU memory from the running Ray cluster, and the "
            "inter-node bandwidth from the doctor's measurement "
            "($RAYFLEET_HOME/doctor/network.json) when present; flags fill what cannot be read.",
        ),
    ] = False
    address: Annotated[
        str,
        typer.Option(help="Ray cluster for --from-cluster: auto, host:port or ray://host:port."),
    ] = "auto"

    def hardware(self) -> Hardware:
        """The hardware the flags describe, or the cluster's with the flags filling gaps."""
        given = Hardware(
            gpus_per_node=self.gpus_per_node or 1,
            gpu_memory_gib=self.gpu_memory_gib or 0.0,
            nodes=self.nodes,
            intra_node_gbps=self.intra_node_gbps,
            inter_node_gbps=self.inter_node_gbps,
        )
        if self.from_cluster:
            return read_cluster(self.address, given)
        missing = [
            flag
            for flag, value in (
                ("--gpus-per-node", self.gpus_per_node),
                ("--gpu-memory-gib", self.gpu_memory_gib),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(
                f"{' and '.join(missing)} not given: describe the GPUs with --gpus-per-node and "
                "--gpu-memory-gib, or read them from a running Ray cluster with --from-cluster"
            )
        return given


@dataclass(frozen=True)
class WorkloadOptions:
    """What the deployment must serve."""

    PANEL: ClassVar[str] = "Workload"
    context_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Tokens per sequence (prompt + output) to hold in KV cache; becomes vLLM's "
            "max_model_len. Default: the model's max context.",
        ),
    ] = None
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Target concurrent sequences across all replicas."),
    ] = None
    request_rate: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Target requests per second; turned into concurrency with Little's law "
            "(rate x output-len x tpot-ms).",
        ),
    ] = None
    output_len: Annotated[
        int, typer.Option(min=1, help="Output tokens per request, for --request-rate.")
    ] = 256
    tpot_ms: Annotated[
        float,
        typer.Option(min=0.001, help="Assumed time per output token in ms, for --request-rate."),
    ] = 50.0

    def workload(self, max_context: int) -> Workload:
        return Workload(
            context_len=self.context_len or max_context,
            concurrency=self.concurrency,
            request_rate=self.request_rate,
            output_len=self.output_len,
            tpot_ms=self.tpot_ms,
        )


@dataclass(frozen=True)
class EngineOptions:
    """The vLLM settings that decide memory."""

    PANEL: ClassVar[str] = "Engine (vLLM settings)"
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights and activations dtype: auto (the config's), bfloat16, float16, float32."
        ),
    ] = "auto"
    quantization: Annotated[
        str | None,
        typer.Option(
            help="How linear weights are stored, overriding config.json: none, fp8, int8, awq, "
            "gptq, int4. fp8 on an unquantized checkpoint means vLLM's online fp8."
        ),
    ] = None
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV cache dtype: auto (the model's dtype) or fp8.")
    ] = "auto"
    gpu_memory_utilization: Annotated[
        float,
        typer.Option(
            min=0.01,
            max=1.0,
            help="Fraction of each GPU's memory vLLM may use (weights, activations, KV cache).",
        ),
    ] = 0.9
    kv_cache_gib: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Fixed KV cache per GPU in GiB instead of what the utilization leaves "
            "(vLLM's kv_cache_memory_bytes; on CPU, VLLM_CPU_KVCACHE_SPACE).",
        ),
    ] = None
    block_size: Annotated[
        int, typer.Option(min=1, help="KV cache block size in tokens (vLLM's --block-size).")
    ] = 16
    max_num_batched_tokens: Annotated[
        int,
        typer.Option(min=1, help="Tokens per forward pass; sizes the activation estimate."),
    ] = 8192
    max_num_seqs: Annotated[
        int, typer.Option(min=1, help="Sequences per batch; sizes the logits estimate.")
    ] = 256

    def settings(self) -> MemorySettings:
        return MemorySettings(
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_dtype=kv_cache_dtype(self.kv_cache_dtype),
            kv_cache_gib=self.kv_cache_gib,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )


@dataclass(frozen=True)
class OutputOptions:
    """How the plan is shown, and the fleet.yaml entry it may write."""

    PANEL: ClassVar[str] = "Output"
    json: Annotated[
        bool, typer.Option("--json", help="Print the plan as JSON instead of tables.")
    ] = False
    emit: Annotated[
        Path | None,
        typer.Option(help="Write the chosen layout as a fleet.yaml model entry to this file."),
    ] = None
    name: Annotated[
        str | None,
        typer.Option(
            help="Served model name in the --emit entry. Default: from the model's path or id."
        ),
    ] = None


def plan_model(
    model: str, hardware: HardwareOptions, workload: WorkloadOptions, engine: EngineOptions
) -> Plan:
    """Plan ``model`` (a config.json, model directory or cached hub id) as the flags ask."""
    spec = load_model_spec(model, dtype=engine.dtype, quantization=engine.quantization)
    return make_plan(
        spec, hardware.hardware(), workload.workload(spec.max_context), engine.settings()
    )


def kv_cache_dtype(value: str) -> str:
    """``--kv-cache-dtype`` as the planner counts it: auto, or fp8 for any fp8 variant."""
    normal = value.lower()
    if normal.startswith("fp8"):
        return "fp8"
    if normal != "auto":
        raise ConfigError(f"--kv-cache-dtype '{value}' is not one of auto, fp8")
    return normal
