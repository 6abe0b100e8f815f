"""What a simulated replica is: its latency model, batch limits and KV capacity.

One engine step (prefill chunks and decodes batched together, as vLLM's continuous
batching does) costs ``step_s + prefill_token_s * prefill_tokens + decode_seq_s *
decode_seqs`` seconds, and a request pays ``request_overhead_s`` once before it reaches
the engine. ``rayfleet sim calibrate`` fits the three coefficients against a
real vLLM server and writes a spec file that ``rayfleet sim serve --spec FILE`` reads:
the fields below as one JSON object, plus an optional ``calibration`` object (how the
fit was made and its error) that the server ignores.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rayfleet.errors import RayfleetError

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class EngineSpec:
    """A simulated vLLM engine. The defaults are round numbers of a GPU step's order
    (a 4 ms floor); ``rayfleet sim calibrate`` measures real ones."""

    model: str = "sim"
    step_s: float = 0.004
    """a: the fixed cost of one engine step (scheduling, sampling, a forward's floor)."""
    prefill_token_s: float = 2.0e-5
    """b: seconds per prompt token computed in a step (cached tokens cost nothing)."""
    decode_seq_s: float = 1.0e-4
    """c: seconds per running sequence that decodes one token in a step."""
    request_overhead_s: float = 0.0
    """Once per request, before its first step: the frontend's work (HTTP, tokenizing)."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step (decodes count one each, prefill chunks fill the rest)."""
    max_num_seqs: int = 256
    """Most requests running at once; the rest wait."""
    num_gpu_blocks: int = 8192
    """KV capacity in blocks; a request reserves blocks for its prompt and output."""
    block_size: int = 16
    """Tokens per KV block (vLLM's default); prefix cache hits are whole blocks."""
    default_max_tokens: int = 16
    """Output tokens when a request names no max_tokens (the simulator has no EOS)."""

    def __post_init__(self) -> None:
        for name in ("step_s", "prefill_token_s", "decode_seq_s", "request_overhead_s"):
            if getattr(self, name) < 0:
                raise RayfleetError(f"sim spec: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_num_seqs", "num_gpu_blocks", "block_size", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise RayfleetError(f"sim spec: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise RayfleetError(
                f"sim spec: max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs"
            )

    def step_cost_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        """Seconds one step takes with this much work in its batch."""
        return (
            self.step_s
            + self.prefill_token_s * num_prefill_tokens
            + self.decode_seq_s * num_decode_seqs
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_from_dict(data: dict[str, Any], source: str = "sim spec") -> EngineSpec:
    """An ``EngineSpec`` from JSON data; unknown keys are refused by name."""
    known = {f.name for f in fields(EngineSpec)}
    unknown = sorted(set(data) - known - {"calibration"})
    if unknown:
        raise RayfleetError(
            f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values = {k: v for k, v in data.items() if k in known}
    try:
        return EngineSpec(**values)
    except TypeError as exc:
        raise RayfleetError(f"{source}: {exc}") from None


def load_spec(path: Path) -> EngineSpec:
    """Read a spec file written by ``rayfleet sim calibrate`` (or by hand)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RayfleetError(f"--spec: cannot read {path} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise RayfleetError(f"--spec {path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise RayfleetError(f"--spec {path} must hold one JSON object")
    return spec_from_dict(data, f"--spec {path}")
