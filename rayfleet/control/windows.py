"""A model's replica bounds at an instant, from its schedule windows.

    active_window(windows, now)   the window open at ``now``, or None
    bounds_at(model, now)         Bounds(min_replicas, max_replicas, window name or None)
    next_boundary(windows, now)   the next instant a window opens or closes, or None

``now`` is timezone-aware; each window is read in its own timezone (``zoneinfo``), so a
window keeps its local hours across daylight-saving changes. Windows of one model never
overlap (rayfleet/config/autoscaling.py refuses it), so at most one is open.

Bounds: inside a window, the window's; outside, ``autoscaling``'s min and max; a model
with a fixed ``replicas`` has (replicas, replicas), clamped into an open window's bounds.
Pure functions of config and time; the fleet's scaler (control/scaling.py) calls them
every period with its clock, and the Autoscaler (control/autoscaler.py) applies a change
of bounds at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rayfleet.config import ModelConfig, ScheduleWindow


@dataclass(frozen=True)
class Bounds:
    """How many replicas a model may run now, and the window that says so (None: its own)."""

    min_replicas: int
    max_replicas: int
    window: str | None = None

    def clamp(self, count: int) -> int:
        return min(max(count, self.min_replicas), self.max_replicas)


def active_window(windows: Sequence[ScheduleWindow], now: datetime) -> ScheduleWindow | None:
    """The window open at ``now`` (start inclusive, end exclusive), or None."""
    _require_aware(now)
    for window in windows:
        local = now.astimezone(window.zone)
        minute = local.hour * 60 + local.minute + local.second / 60 + local.microsecond / 6e7
        if window.opens_on(local.date()) and window.start_minute <= minute < window.end_minute:
            return window
    return None


def bounds_at(model: ModelConfig, now: datetime) -> Bounds:
    """``model``'s replica bounds at ``now``: its open window's, else its own."""
    window = active_window(model.schedules, now)
    if model.autoscaling is None:
        count = model.replicas
        if window is not None:
            count = min(max(count, window.min_replicas), window.max_replicas)
        return Bounds(count, count, window.name if window else None)
    if window is not None:
        return Bounds(window.min_replicas, window.max_replicas, window.name)
    return Bounds(model.autoscaling.min_replicas, model.autoscaling.max_replicas)


def next_boundary(windows: Sequence[ScheduleWindow], now: datetime) -> datetime | None:
    """The first instant after ``now`` at which a window opens or closes (in UTC), or None.

    A window that closes where another opens (a night written as two windows) still
    counts: the bounds may change there.
    """
    _require_aware(now)
    soonest: datetime | None = None
    for window in windows:
        today = now.astimezone(window.zone).date()
        # From yesterday (a span that began then may close today) to a week ahead.
        for offset in range(-1, 8):
            day = today + timedelta(days=offset)
            if not window.opens_on(day):
                continue
            for instant in window.span_on(day):
                if instant > now and (soonest is None or instant < soonest):
                    soonest = instant
    return soonest.astimezone(UTC) if soonest is not None else None


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, got naive {now.isoformat()}")
