"""The fleet's scaler: each model's target replica count, from its load and its windows.

Ray Serve owns the replicas' lifecycle; the fleet process sets each deployment's target
count (``num_replicas``; changing only it never restarts a replica) and Serve starts or
stops replicas to match. A stopped replica drains itself first (control/drain.py), so
Serve may choose any replica to stop. Targets are set here, not by a Serve autoscaling
policy, because the signal lives outside Serve: requests bypass its proxy, so its
request counters see nothing, while vLLM's own gauges and the gateway's in-flight and
held counts are in reach of this process, and windows need a clock tests can move::

    scaler = FleetScaler(config, gateway, set_target, clock)
    await scaler.run()                   every period, for every model:
        bounds = windows.bounds_at(model, clock.now())
        fixed models (replicas:) or `rayfleet scale`: target = the count within bounds
        autoscaled models: loads = load_signal.fetch_load(each serving replica),
                                   the reads spread over half the period
                           Autoscaler.decide(now, bounds, target, loads,
                                             gateway in flight, gateway held)
        a new target -> set_target(model, n) (Serve), a scale event counted
    scaler.scale(model, n)               `rayfleet scale`: a fixed count (None: the
                                         file's again), or a reason
    scaler.leads                         where several gateways serve one fleet
                                         (`rayfleet gateway`), asked every period:
                                         only the gateway it says leads scales
    scaler.report()                      targets, windows, last decisions (status)

Metrics (in the gateway's registry): ``rayfleet_target_replicas{model}``,
``rayfleet_replicas{model,state}`` (serving, draining, cooling_down, starting),
``rayfleet_scale_events_total{model,direction,reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client import Counter, Gauge
from ray.exceptions import RayError

from rayfleet.config import FleetConfig, ModelConfig
from rayfleet.control.autoscaler import Autoscaler
from rayfleet.control.load_signal import EngineLoad, LoadUnavailable, fetch_load, read_spread
from rayfleet.control.windows import Bounds, bounds_at

if TYPE_CHECKING:
    from rayfleet.gateway.app import Gateway

log = logging.getLogger("rayfleet.scaling")

SCALE_PERIOD_S = 1.0
LOAD_TIMEOUT_S = 2.0
UNBOUNDED = 1_000_000  # a fixed model's count outside its windows has no bound
CLOCK_ENV = "RAYFLEET_SCHEDULE_CLOCK"  # ISO time the fleet's schedule clock starts at

SetTarget = Callable[[str, int], Awaitable[None]]


class Clock:
    """Wall time for windows, monotonic time for delays.

    ``RAYFLEET_SCHEDULE_CLOCK`` moves the wall clock, to try schedules: an ISO time with a
    zone starts it there (then it runs at the normal pace); ``@PATH`` reads the time from
    the file PATH at each tick (it stands still until the file changes: tests move it).
    """

    def __init__(self, start: datetime | None = None, path: Path | None = None):
        self._offset_s = 0.0 if start is None else start.timestamp() - time.time()
        self._path = path

    @classmethod
    def from_env(cls) -> Clock:
        value = os.environ.get(CLOCK_ENV, "")
        if value.startswith("@"):
            return cls(path=Path(value[1:]))
        return cls(datetime.fromisoformat(value) if value else None)

    def now(self) -> datetime:
        if self._path is not None:
            return datetime.fromisoformat(self._path.read_text().strip())
        return datetime.fromtimestamp(time.time() + self._offset_s, UTC)

    def monotonic(self) -> float:
        return time.monotonic()


def initial_target(model: ModelConfig, now: datetime) -> int:
    """The count a model deploys with: its replicas, or its lower bound now."""
    bounds = bounds_at(model, now)
    if model.autoscaling is None:
        return bounds.clamp(model.replicas)
    return bounds.min_replicas


class FleetScaler:
    def __init__(
        self,
        config: FleetConfig,
        gateway: Gateway,
        set_target: SetTarget,
        clock: Clock,
        say: Callable[[str], None] = log.info,
    ):
        self.config = config
        self.say = say  # each target change, in the fleet's log
        self.inputs: dict[str, str] = {}  # the last load seen per model, for the log
        self.gateway = gateway
        self.set_target = set_target
        self.clock = clock
        now = clock.now()
        self.targets = {m.name: initial_target(m, now) for m in config.models}
        self.fixed: dict[str, int] = {}  # `rayfleet scale` overrides
        self.paused: set[str] = set()  # models in a blue/green rollout
        # Where several gateways serve one fleet, only the one ``leads`` says scales.
        self.leads: Callable[[], Awaitable[bool]] | None = None
        self.leading = True
        self.spread_s = SCALE_PERIOD_S / 2  # a model's /metrics reads start over this long
        self.windows: dict[str, str | None] = {}
        self.decisions: dict[str, str] = {}
        self.scalers = {
            m.name: Autoscaler(m.name, m.autoscaling) for m in config.models if m.autoscaling
        }
        registry = gateway.metrics.registry
        self.target_gauge = Gauge(
            "rayfleet_target_replicas",
            "Replicas each model should have.",
            ["model"],
            registry=registry,
        )
        self.replica_gauge = gateway.metrics.replicas
        self.events = Counter(
            "rayfleet_scale_events_total",
            "Target changes, by direction and reason.",
            ["model", "direction", "reason"],
            registry=registry,
        )

    @property
    def elastic(self) -> bool:
        return any(m.autoscaling or m.schedules for m in self.config.models)

    async def run(self, period_s: float = SCALE_PERIOD_S) -> None:
        self.spread_s = period_s / 2
        async with aiohttp.ClientSession() as session:
            while True:
                self.leading = await self._leading()
                for model in self.config.models if self.leading else ():
                    try:
                        await self._step(model, session)
                    except Exception:
                        log.exception("scaling step for %s failed", model.name)
                self._publish()
                await asyncio.sleep(period_s)

    async def _leading(self) -> bool:
        if self.leads is None:
            return True
        try:
            return await self.leads()
        except (RayError, ConnectionError) as exc:  # the registry is restarting: next period
            log.warning("cannot tell whether this gateway leads scaling: %s", exc)
            return False

    def reconfigure(self, config: FleetConfig) -> None:
        """Scale by ``config`` from now on (``rayfleet apply``): new models start at their
        initial target, changed autoscaling starts afresh, a fixed count is dropped."""
        now = self.clock.now()
        old = {m.name: m for m in self.config.models}
        for model in config.models:
            before = old.get(model.name)
            if before is None:
                self.targets[model.name] = initial_target(model, now)
            if before is None or before.autoscaling != model.autoscaling:
                self.scalers.pop(model.name, None)
                if model.autoscaling:
                    self.scalers[model.name] = Autoscaler(model.name, model.autoscaling)
            if before is not None and before.replicas != model.replicas:
                self.fixed.pop(model.name, None)
        self.config = config

    async def _step(self, model: ModelConfig, session: aiohttp.ClientSession) -> None:
        if model.name in self.paused:
            return
        bounds = self._bounds(model)
        self.windows[model.name] = bounds.window
        current = self.targets[model.name]
        scaler = self.scalers.get(model.name)
        if model.name in self.fixed or scaler is None:
            wanted = self.fixed.get(model.name, model.replicas)
            target = bounds.clamp(wanted)
            reason = f"window {bounds.window}" if target != wanted else "fixed"
        else:
            loads = await self._loads(model.name, session)
            inflight = sum(r.num_inflight for r in self.gateway.replica_set.replicas(model.name))
            waiting = self.gateway.num_waiting(model.name)
            decision = scaler.decide(
                self.clock.monotonic(), bounds, current, loads, inflight, waiting
            )
            target, reason = decision.target, decision.reason
            in_engines = sum(load.requests for load in loads)
            self.inputs[model.name] = (
                f"in engines {in_engines:g}, in flight {inflight}, held {waiting}"
            )
            if (
                target < current
                and self.replica_states(model.name)["starting"]
                and not (bounds.window or current > bounds.max_replicas)
            ):
                return  # a replica still starting would be stopped first: wait for it
        if target != current:
            await self._apply(model.name, current, target, reason)

    async def _apply(self, model: str, current: int, target: int, reason: str) -> None:
        direction = "up" if target > current else "down"
        inputs = self.inputs.get(model)
        self.say(
            f"model '{model}': {current} -> {target} replica(s), {reason}"
            + (f" ({inputs})" if inputs else "")
        )
        await self.set_target(model, target)
        self.targets[model] = target
        self.decisions[model] = f"{current} -> {target}: {reason}"
        self.events.labels(model, direction, reason.split(" ")[0]).inc()

    async def _loads(self, model: str, session: aiohttp.ClientSession) -> list[EngineLoad]:
        replicas = [r for r in self.gateway.replica_set.replicas(model) if not r.draining]

        async def read(url: str) -> EngineLoad | None:
            with contextlib.suppress(LoadUnavailable, aiohttp.ClientError, TimeoutError):
                return await fetch_load(session, url, LOAD_TIMEOUT_S)
            return None

        loads = await read_spread([r.url for r in replicas], read, self.spread_s)
        return [load for load in loads if load is not None]

    def _bounds(self, model: ModelConfig) -> Bounds:
        """The counts allowed now: a window's, or the autoscaling bounds; a fixed model
        outside its windows may be set to any count (`rayfleet scale`)."""
        bounds = bounds_at(model, self.clock.now())
        if model.autoscaling is None and bounds.window is None:
            return Bounds(0, UNBOUNDED)
        return bounds

    def scale(self, model: str, count: int | None) -> str | None:
        """`rayfleet scale MODEL N`: a fixed count from now on (None: the model's file
        decides again, its autoscaling or its replicas); the reason it cannot be."""
        try:
            config = self.config.model(model)
        except KeyError:
            names = ", ".join(m.name for m in self.config.models)
            return f"no model '{model}' in the fleet ({names})"
        if not self.leading:
            return (
                f"another gateway of this fleet scales model '{model}'; "
                "run rayfleet scale where that gateway runs"
            )
        if count is None:
            self.fixed.pop(model, None)
            return None
        bounds = self._bounds(config)
        if not bounds.min_replicas <= count <= bounds.max_replicas:
            where = f"window '{bounds.window}'" if bounds.window else "its autoscaling bounds"
            return (
                f"model '{model}' must have {bounds.min_replicas} to {bounds.max_replicas} "
                f"replicas now ({where}); asked for {count}"
            )
        self.fixed[model] = count
        return None

    def _publish(self) -> None:
        # The gateway sets the registered states at each poll; the scaler adds starting.
        for model in self.config.models:
            self.target_gauge.labels(model.name).set(self.targets[model.name])
            starting = self.replica_states(model.name)["starting"]
            self.replica_gauge.labels(model.name, "starting").set(starting)

    def replica_states(self, model: str) -> dict[str, int]:
        counts = self.gateway.replica_set.states(model)
        counts["starting"] = max(
            0, self.targets[model] - counts["serving"] - counts["cooling_down"]
        )
        return counts

    def report(self) -> dict[str, Any]:
        """Each model's target, active window, replica states and last decision."""
        return {
            m.name: {
                "target": self.targets[m.name],
                "window": self.windows.get(m.name),
                "fixed": self.fixed.get(m.name),
                "autoscaling": m.autoscaling is not None,
                "states": self.replica_states(m.name),
                "last_decision": self.decisions.get(m.name),
            }
            for m in self.config.models
        }
