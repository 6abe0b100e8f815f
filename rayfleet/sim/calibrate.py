"""Fit the simulator's latency model to a real vLLM server: ``rayfleet sim calibrate``.

Two kinds of measurement, each a median over repeats, each one row of a least-squares
problem in ``(a, b, c)`` (``EngineSpec.step_s``, ``prefill_token_s``, ``decode_seq_s``)
and a per-request overhead (below):
- prefill: one request alone, a fresh prompt of P tokens (no prefix in common with any
  other, so nothing is cached), one output token: its TTFT is one step, ``a + b * P``
  (P comes from the server's ``usage.prompt_tokens``; prompts stay within one step's
  token budget, ``max_num_batched_tokens``);
- decode: N requests at once with short prompts and ``ignore_eos``: a request's mean gap
  between tokens (its decode time over its tokens, not the median chunk gap: a busy
  client reads several streams' chunks in one wake-up, and a server that falls behind
  sends several tokens in one chunk) is one decode step of N sequences, ``a + c * N``.
A request also pays a fixed cost once, before its first step (HTTP, tokenizing,
detokenizing; vLLM's frontend): ``request_overhead_s``, the fourth coefficient, in
prefill rows only. Measured on the tiny model on this 2-core machine, TTFT at 64 tokens
was 8.7 ms while a lone decode step was 4.0 ms; without it the fit was off by 26%.
Rows are weighted by 1 / measured, so the fit minimises relative error, which is what
``mean_abs_rel_error`` reports (0.05 = the model is off by 5% on average).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rayfleet.bench.client import RequestResult, Target, open_session, send_request
from rayfleet.bench.datasets import Prompt
from rayfleet.errors import RayfleetError

_COMMON_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend"
)
_WORDS = _COMMON_WORDS.split()


@dataclass(frozen=True)
class CalibrationPlan:
    """What to send: prompt lengths (in the server's tokens, aimed at from a probe's
    ``usage.prompt_tokens``) and decode concurrencies."""

    prompt_lens: tuple[int, ...] = (64, 256, 512, 1024, 1400, 1800)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_repeats: int = 3
    decode_tokens: int = 32
    num_warmups: int = 2
    seed: int = 0


@dataclass
class Observation:
    """One measured row: the step's work and the seconds it took."""

    kind: str
    num_prefill_tokens: int
    num_decode_seqs: int
    measured_s: float
    fitted_s: float = 0.0


@dataclass
class Fit:
    """The fitted coefficients and how well they explain the measurements."""

    step_s: float
    prefill_token_s: float
    decode_seq_s: float
    request_overhead_s: float
    mean_abs_rel_error: float
    observations: list[Observation] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "observations": [asdict(o) for o in self.observations]}


def fit_coefficients(observations: list[Observation]) -> Fit:
    """Least squares in relative terms; a coefficient that comes out negative is 0."""
    if len(observations) < 4:
        raise RayfleetError("calibration needs at least 4 measurements; add lengths or levels")
    x = np.array(
        [
            [1.0, o.num_prefill_tokens, o.num_decode_seqs, float(o.kind == "prefill")]
            for o in observations
        ]
    )
    y = np.array([o.measured_s for o in observations])
    weights = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * weights[:, None], y * weights, rcond=None)
    coef = np.clip(coef, 0.0, None)
    fitted = x @ coef
    for o, f in zip(observations, fitted, strict=True):
        o.fitted_s = float(f)
    error = float(np.mean(np.abs(fitted - y) / y))
    a, b, c, overhead = (float(v) for v in coef)
    return Fit(a, b, c, overhead, error, observations)


class PromptMaker:
    """Fresh prompts: a unique head, so no two share a cached block, then common words."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def text(self, num_words: int) -> str:
        self.count += 1
        head = f"request {self.count} {self.rng.integers(1 << 62)}:"
        words = self.rng.choice(_WORDS, size=max(1, num_words - 4))
        return head + " " + " ".join(words)


async def _send(session: Any, target: Target, prompt: Prompt) -> RequestResult:
    result = await send_request(session, target, prompt, {"Content-Type": "application/json"})
    if not result.ok:
        raise RayfleetError(f"calibration request failed at {target.url}: {result.error}")
    return result


async def measure(target: Target, plan: CalibrationPlan) -> list[Observation]:
    """Send the plan's requests and return one observation per length and concurrency."""
    prompts = PromptMaker(plan.seed)
    observations = []
    async with open_session(max(plan.concurrencies)) as session:
        for _ in range(max(1, plan.num_warmups)):
            probe = await _send(session, target, Prompt(prompts.text(256), 0, 4))
        words_per_token = 256 / max(1, probe.num_input_tokens)  # the server's tokenizer
        for length in plan.prompt_lens:
            num_words = max(1, round(length * words_per_token))
            runs = [
                await _send(session, target, Prompt(prompts.text(num_words), 0, 1))
                for _ in range(plan.num_repeats)
            ]
            num_tokens = round(statistics.median(r.num_input_tokens for r in runs))
            ttft_s = statistics.median(r.ttft_s for r in runs)
            observations.append(Observation("prefill", num_tokens, 0, ttft_s))
        for level in plan.concurrencies:
            gaps: list[float] = []
            for _ in range(plan.num_repeats):
                batch = [Prompt(prompts.text(16), 0, plan.decode_tokens) for _ in range(level)]
                runs = await asyncio.gather(*(_send(session, target, p) for p in batch))
                gaps += [(r.e2e_s - r.ttft_s) / (r.num_output_tokens - 1) for r in runs]
            observations.append(Observation("decode", 0, level, statistics.median(gaps)))
    return observations


def calibrate(base_url: str, model: str, plan: CalibrationPlan) -> Fit:
    """Measure a vLLM server (or anything OpenAI-compatible) and fit a, b, c."""
    target = Target(base_url=base_url, model=model, ignore_eos=True, request_timeout_s=300)
    return fit_coefficients(asyncio.run(measure(target, plan)))
