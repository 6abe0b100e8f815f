"""Load shapes: when each request is sent, and how many may be in flight.

- Fixed concurrency: every request is due at once; ``max_concurrency`` keeps N in flight.
- Poisson arrivals at ``request_rate`` (``burstiness`` 1), or gamma-distributed gaps
  (``burstiness`` below 1 is burstier, above 1 steadier), as in vLLM's benchmark.
- Bursts: ``burst_size`` requests at once every ``burst_interval_s``.
- Ramp: the rate grows from ``ramp_up_start_rps`` to ``ramp_up_end_rps``, linearly or
  exponentially over the run (vLLM's ``--ramp-up-strategy``).

A shape turns into arrival offsets (seconds from the start of the run), computed once
before the run so the send loop does no arithmetic of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from rayfleet.errors import RayfleetError

RAMP_STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive. The defaults send everything at once, like vLLM's."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    max_connections: int | None = None  # the client's pool; None: one a request in flight
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    burst_size: int | None = None
    burst_interval_s: float = 1.0
    seed: int = 0

    def describe(self) -> str:
        """A short label for tables and plots."""
        if self.ramp_up_strategy:
            load = f"ramp {self.ramp_up_start_rps:g}->{self.ramp_up_end_rps:g} req/s"
        elif self.burst_size:
            load = f"bursts of {self.burst_size} every {self.burst_interval_s:g}s"
        elif math.isinf(self.request_rate):
            load = "all at once"
        else:
            load = f"{self.request_rate:g} req/s"
        if self.max_concurrency:
            load += f", concurrency {self.max_concurrency}"
        if self.max_connections:
            load += f", {self.max_connections} connections"
        return load


def check_shape(shape: LoadShape) -> None:
    """Raise a RayfleetError naming the flag when the shape cannot be run."""
    if shape.max_concurrency is not None and shape.max_concurrency < 1:
        raise RayfleetError("--max-concurrency must be at least 1")
    if shape.max_connections is not None and shape.max_connections < 1:
        raise RayfleetError("--max-connections must be at least 1 (leave it out for no cap)")
    if shape.request_rate <= 0:
        raise RayfleetError("--request-rate must be positive (or inf to send all at once)")
    if shape.burstiness <= 0:
        raise RayfleetError("--burstiness must be positive: 1 is Poisson, below 1 burstier")
    if shape.ramp_up_strategy is not None:
        check_ramp(shape)
    if shape.burst_size is not None:
        if shape.burst_size < 1 or shape.burst_interval_s <= 0:
            raise RayfleetError("--burst-size must be at least 1 and --burst-interval-s positive")
        if shape.ramp_up_strategy or not math.isinf(shape.request_rate):
            raise RayfleetError(
                "--burst-size sets its own arrivals; drop --request-rate and --ramp-up-*"
            )


def check_ramp(shape: LoadShape) -> None:
    if shape.ramp_up_strategy not in RAMP_STRATEGIES:
        raise RayfleetError(f"--ramp-up-strategy must be one of {', '.join(RAMP_STRATEGIES)}")
    if not math.isinf(shape.request_rate):
        raise RayfleetError("--ramp-up-strategy sets the rate itself; drop --request-rate")
    start, end = shape.ramp_up_start_rps, shape.ramp_up_end_rps
    if start is None or end is None:
        raise RayfleetError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
    if start <= 0 or end < start:
        raise RayfleetError(
            f"--ramp-up-start-rps ({start:g}) must be positive and at most "
            f"--ramp-up-end-rps ({end:g})"
        )


def arrival_offsets_s(shape: LoadShape, num_requests: int) -> np.ndarray:
    """When each request is due, in seconds from the start of the run (non-decreasing)."""
    check_shape(shape)
    rng = np.random.default_rng(shape.seed)
    if shape.burst_size:
        return np.arange(num_requests) // shape.burst_size * shape.burst_interval_s
    if shape.ramp_up_strategy:
        # The first request goes at once; each later gap follows the rate then in force.
        gaps_s = _gaps_s(ramp_rates(shape, num_requests), shape.burstiness, rng)
        return np.concatenate(([0.0], np.cumsum(gaps_s[:-1])))
    if math.isinf(shape.request_rate):
        return np.zeros(num_requests)
    rates = np.full(num_requests, shape.request_rate)
    offsets = np.cumsum(_gaps_s(rates, shape.burstiness, rng))
    # Scale so the run lasts num_requests / rate exactly: a sum of random gaps drifts a
    # few percent from it, which would show up as throughput noise between seeds.
    scaled: np.ndarray = offsets * (num_requests / shape.request_rate) / offsets[-1]
    return scaled


def ramp_rates(shape: LoadShape, num_requests: int) -> np.ndarray:
    """The request rate in force when each request is sent."""
    start, end = float(shape.ramp_up_start_rps or 0.0), float(shape.ramp_up_end_rps or 0.0)
    progress = np.arange(num_requests) / max(num_requests - 1, 1)
    if shape.ramp_up_strategy == "linear":
        return start + (end - start) * progress
    return start * (end / start) ** progress


def split_for_processes(shape: LoadShape, num_processes: int, index: int) -> LoadShape:
    """The share of ``shape`` that process ``index`` of ``num_processes`` runs: its part
    of the concurrency and of the connections (at least one of each)."""

    def part(total: int | None) -> int | None:
        if total is None:
            return None
        base, extra = divmod(total, num_processes)
        return max(1, base + (index < extra))

    return replace(
        shape,
        max_concurrency=part(shape.max_concurrency),
        max_connections=part(shape.max_connections),
    )


def _gaps_s(rates: np.ndarray, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    if math.isinf(burstiness):
        return 1.0 / rates
    return rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
