"""What a simulated replica counts: the numbers behind its ``/metrics`` (vLLM's names)
and ``/simulator/stats`` (busy time and hit tokens, for benchmarks)."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfleet.sim.engine import SimRequest

# vLLM 0.32's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


@dataclass
class EngineStats:
    """Counters since the replica (re)started; ``start_time_s`` is wall-clock time."""

    start_time_s: float = field(default_factory=time.time)
    busy_s: float = 0.0
    num_steps: int = 0
    num_finished: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    ttft_sum_s: float = 0.0
    ttft_count: int = 0

    def record_first_token(self, request: SimRequest, now_s: float) -> None:
        ttft_s = now_s - request.arrival_s
        self.prompt_tokens += request.num_prompt_tokens
        self.ttft_sum_s += ttft_s
        self.ttft_count += 1
        index = bisect.bisect_left(TTFT_BUCKETS_S, ttft_s)
        if index < len(self.ttft_counts):
            self.ttft_counts[index] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "start_time_s": self.start_time_s,
            "busy_s": self.busy_s,
            "num_steps": self.num_steps,
            "num_finished": self.num_finished,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
        }
