"""The scaling decision for one autoscaled model: a pure function of its inputs and time.

    scaler = Autoscaler(model_name, config)           config: AutoscalingConfig
    decision = scaler.decide(now_s, bounds, current, loads, gateway_inflight,
                             gateway_waiting)          -> Decision(target, reason, direction)

Inputs, read by the fleet's scaler (control/scaling.py) every period: ``now_s`` a
monotonic time in seconds (the only clock; tests drive it), ``bounds`` from
control/windows.py, ``current`` the model's present target count (replicas serving or
starting), ``loads`` each serving replica's vLLM gauges (control/load_signal.py),
``gateway_inflight`` the requests the gateway has sent to the model's replicas and
``gateway_waiting`` those it holds for lack of a replica.

The rule, in order:

    load     = max(sum of running + waiting over replicas, gateway_inflight)
               + gateway_waiting                 (held requests count: no vLLM sees them)
    up       = ceil(load / target_load_per_replica), at least current + 1 while the
               replicas' mean KV cache usage is above kv_cache_high
    down     = the fewest replicas that would each stay below the target:
               floor(load / target_load_per_replica) + 1, or 0 at no load
               (both clamped to bounds)
    current outside bounds  -> the nearest bound at once        ("window <name>", "bounds")
    current 0, a request held -> up at once                     ("request waiting")
    up > current for upscale_delay_s         -> up               ("load" or "kv_cache")
    down < current for downscale_delay_s     -> down             ("load")
    otherwise                                -> current, direction "none"

``up`` and ``down`` differ only where the load is an exact multiple of the target: at
4 requests and a target of 2, two replicas are kept (one would sit at its target), and a
third is not asked for. Without that band a load that sits on the boundary, as client
load does between one request's end and the next one's start, scales in and out again
every few seconds.

The vLLM gauges and the gateway count the same requests; the larger of the two is taken
so that a replica whose ``/metrics`` did not answer still counts through the gateway.
A spike shorter than the delay changes nothing: the timer restarts whenever desired
comes back to current, and after every change, so each step waits a whole delay.
The reason's first word is what the scale-event metric labels (window, bounds, request,
load, kv_cache).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rayfleet.config import AutoscalingConfig
from rayfleet.control.load_signal import EngineLoad
from rayfleet.control.windows import Bounds

Direction = Literal["up", "down", "none"]


@dataclass(frozen=True)
class Decision:
    """The target count now, why, and which way it moves from the current count."""

    target: int
    reason: str
    direction: Direction


@dataclass(frozen=True)
class _Wish:
    count: int
    reason: str


class Autoscaler:
    """Remembers since when the model has wanted more (or fewer) replicas."""

    def __init__(self, model_name: str, config: AutoscalingConfig):
        self.model_name = model_name
        self.config = config
        self._over_since: float | None = None
        self._under_since: float | None = None
        self._last_window: str | None = None

    def decide(
        self,
        now_s: float,
        bounds: Bounds,
        current: int,
        loads: Sequence[EngineLoad],
        gateway_inflight: int,
        gateway_waiting: int,
    ) -> Decision:
        """The target for ``current`` replicas at ``now_s``; see the module docstring."""
        left_window, self._last_window = self._last_window, bounds.window
        if not bounds.min_replicas <= current <= bounds.max_replicas:
            reason = _bounds_reason(bounds, left_window)
            return self._change(current, bounds.clamp(current), reason)
        up, down = self._desired(bounds, current, loads, gateway_inflight, gateway_waiting)
        if current == 0 and gateway_waiting > 0 and up.count > 0:
            return self._change(current, up.count, "request waiting")
        if up.count > current:
            self._under_since = None
            self._over_since = _since(self._over_since, now_s)
            if now_s - self._over_since >= self.config.upscale_delay_s:
                return self._change(current, up.count, up.reason)
        elif down.count < current:
            self._over_since = None
            self._under_since = _since(self._under_since, now_s)
            if now_s - self._under_since >= self.config.downscale_delay_s:
                return self._change(current, down.count, down.reason)
        else:
            self._over_since = self._under_since = None
        return Decision(current, "steady", "none")

    def _desired(
        self,
        bounds: Bounds,
        current: int,
        loads: Sequence[EngineLoad],
        gateway_inflight: int,
        gateway_waiting: int,
    ) -> tuple[_Wish, _Wish]:
        """The counts the load asks for now to scale up and to scale down, within
        ``bounds``, with no delay applied."""
        in_engines = sum(load.requests for load in loads)
        total = max(in_engines, gateway_inflight) + gateway_waiting
        per_replica = self.config.target_load_per_replica
        up = math.ceil(total / per_replica)
        down = math.floor(total / per_replica) + 1 if total > 0 else 0
        reason = "load"
        if loads:
            mean_kv = sum(load.kv_cache_usage for load in loads) / len(loads)
            if mean_kv > self.config.kv_cache_high and up <= current:
                up, down, reason = current + 1, current + 1, "kv_cache"
        return _Wish(bounds.clamp(up), reason), _Wish(bounds.clamp(down), reason)

    def _change(self, current: int, target: int, reason: str) -> Decision:
        self._over_since = self._under_since = None
        return Decision(target, reason, "up" if target > current else "down")


def _since(started: float | None, now_s: float) -> float:
    return now_s if started is None else started


def _bounds_reason(bounds: Bounds, left_window: str | None) -> str:
    if bounds.window is not None:
        return f"window {bounds.window}"
    if left_window is not None:
        return f"window {left_window} ended"
    return "bounds"
