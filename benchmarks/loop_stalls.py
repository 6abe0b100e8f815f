"""Where a gateway process's event loop stalls: for a benchmark's gateway process only.

    stalls = LoopStalls.install(gateway)      # in the process, on its running loop
    ...                                       # serve the benchmark's load
    stalls.write(path)                        # JSON: the stalls and what ran then

Three recorders, each timestamped on the monotonic clock:
- the loop's lag: a timer due every ``TICK_S`` notes how late it ran; a lag over
  ``STALL_S`` is a stall (the loop ran something else for that long);
- the garbage collector's passes (``gc.callbacks``): generation and duration;
- the gateway's reads of its replicas' /metrics (``ReplicaGauges.scrape_once``): start
  and duration of each round.
A stall that overlaps a collection or a round of reads is put down to it. (A round's
reads are spread over the period, so a round spans most of it: "scrape" then says a
round was under way, not that a read held the loop.)
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

TICK_S = 0.002
STALL_S = 0.004


class LoopStalls:
    def __init__(self) -> None:
        self.lags: list[tuple[float, float]] = []  # (when, seconds late) over STALL_S
        self.ticks = 0
        self.collections: list[tuple[float, int, float]] = []  # (start, generation, seconds)
        self.scrapes: list[tuple[float, float]] = []  # (start, seconds)
        self._gc_started = 0.0

    @classmethod
    def install(cls, gateway: Any) -> LoopStalls:
        stalls = cls()
        loop = asyncio.get_running_loop()
        due = time.monotonic() + TICK_S

        def tick() -> None:
            nonlocal due
            now = time.monotonic()
            stalls.ticks += 1
            if now - due > STALL_S:
                stalls.lags.append((due, now - due))
            due = now + TICK_S
            loop.call_later(TICK_S, tick)

        loop.call_later(TICK_S, tick)
        gc.callbacks.append(stalls._on_gc)
        gauges = gateway.replica_gauges
        if gauges is not None:
            scrape = gauges.scrape_once

            async def timed(session: Any, **options: Any) -> None:
                started = time.monotonic()
                try:
                    await scrape(session, **options)
                finally:
                    stalls.scrapes.append((started, time.monotonic() - started))

            gauges.scrape_once = timed
        return stalls

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            self.collections.append((time.monotonic() - took, info["generation"], took))

    def summary(self) -> dict[str, Any]:
        def overlaps(when: float, lag: float, spans: list[tuple[float, float]]) -> bool:
            return any(start <= when + lag and when <= start + took for start, took in spans)

        gc_spans = [(start, took) for start, _, took in self.collections]
        by_cause = {"gc": 0.0, "scrape": 0.0, "other": 0.0}
        for when, lag in self.lags:
            cause = (
                "gc"
                if overlaps(when, lag, gc_spans)
                else "scrape"
                if overlaps(when, lag, self.scrapes)
                else "other"
            )
            by_cause[cause] += lag
        lags = sorted(lag for _, lag in self.lags)
        return {
            "ticks": self.ticks,
            "stalls": len(lags),
            "stall_s_total": sum(lags),
            "stall_ms_max": 1e3 * max(lags, default=0.0),
            "stall_ms_p50": 1e3 * lags[len(lags) // 2] if lags else 0.0,
            "stall_s_by_cause": by_cause,
            "gc_by_generation": {
                g: {
                    "passes": sum(1 for _, gen, _ in self.collections if gen == g),
                    "ms_max": 1e3
                    * max((t for _, gen, t in self.collections if gen == g), default=0),
                    "s_total": sum(t for _, gen, t in self.collections if gen == g),
                }
                for g in (0, 1, 2)
            },
            "scrapes": len(self.scrapes),
            "scrape_ms_max": 1e3 * max((t for _, t in self.scrapes), default=0.0),
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"summary": self.summary(), "lags": self.lags}, indent=1))
