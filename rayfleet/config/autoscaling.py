"""How many replicas a model runs over time: ``models[].autoscaling`` and ``models[].schedules``.

    autoscaling:                     # instead of a fixed `replicas`
      min_replicas: 1                # 0 allowed: scale to zero
      max_replicas: 4
      target_load_per_replica: 8     # running + waiting requests per replica
      kv_cache_high: 0.90            # also scale up while mean KV cache usage is above this
      upscale_delay_s: 10
      downscale_delay_s: 300
    schedules:                       # windows that bound the count; overlaps are refused
      - name: night
        timezone: Asia/Shanghai
        days: [Mon, Tue, Wed, Thu, Fri, Sat, Sun]
        start: "00:00"               # inclusive
        end: "06:00"                 # exclusive; crossing midnight is two windows
        min_replicas: 1
        max_replicas: 1

A window replaces the model's own bounds while it is active. On an autoscaled model its
bounds lie within 0..autoscaling.max_replicas; on a model with a fixed ``replicas`` they
lie within 0..replicas and the model runs ``replicas`` clamped into the window's bounds,
that is the window's ``max_replicas`` (a window can only lower a fixed count, for example
to 1 at night). Two windows may share a name (a night written as 22:00-24:00 and
00:00-06:00). Windows of one model must not overlap, in whatever timezones they are written:
each is laid out in UTC over a January and a July week (standard and daylight time of both
hemispheres) and compared there; days on which a clock changes are not checked.

``ModelConfig`` (rayfleet/config/models.py) holds both fields and calls
``replica_count_problem`` from its validator: ``replicas`` together with ``autoscaling``,
and windows above the model's ceiling, are one-line errors. What the bounds are at an
instant is rayfleet/control/windows.py; the scaling decision is rayfleet/control/autoscaler.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, Field, field_validator, model_validator

from rayfleet.config.base import StrictModel

if TYPE_CHECKING:
    from rayfleet.config.models import ModelConfig

Day = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
DAYS: tuple[Day, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

# Mondays of the weeks windows are compared in: standard time in the north and daylight
# time in the south, then the reverse.
_REFERENCE_MONDAYS = (date(2025, 1, 13), date(2025, 7, 14))


class AutoscalingConfig(StrictModel):
    """Bounds and signal of an autoscaled model (the fleet's control plane decides)."""

    min_replicas: int = Field(
        default=1, ge=0, description="Fewest replicas; 0 stops the last one when idle."
    )
    max_replicas: int = Field(ge=1, description="Most replicas, windows included.")
    target_load_per_replica: float = Field(
        gt=0,
        description="Requests one replica should carry, running + waiting in its vLLM "
        "(vllm:num_requests_running + vllm:num_requests_waiting); the fleet runs "
        "ceil(load / target) replicas.",
    )
    kv_cache_high: float = Field(
        default=0.90,
        gt=0,
        le=1,
        description="Add a replica while the replicas' mean vllm:kv_cache_usage_perc is "
        "above this, whatever the request count.",
    )
    upscale_delay_s: float = Field(
        default=10.0, ge=0, description="How long more replicas must be wanted before adding."
    )
    downscale_delay_s: float = Field(
        default=300.0, ge=0, description="How long fewer replicas must be wanted before removing."
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas "
                f"({self.max_replicas}); lower min_replicas or raise max_replicas"
            )
        return self


class ScheduleWindow(StrictModel):
    """Weekly hours during which a model's replica count has other bounds."""

    name: str = Field(min_length=1, description="Shown in status and in scale events.")
    timezone: str = Field(
        default="UTC", description="IANA timezone that start, end and days are read in."
    )
    days: list[Day] = Field(
        default_factory=lambda: list(DAYS), min_length=1, description="Days the window opens."
    )
    start: str = Field(description="Opening time, 'HH:MM' (inclusive).")
    end: str = Field(
        description="Closing time, 'HH:MM' (exclusive), after start; 24:00 is midnight."
    )
    min_replicas: int = Field(ge=0, description="Fewest replicas while the window is open.")
    max_replicas: int = Field(ge=0, description="Most replicas while the window is open.")

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                "unknown timezone; use an IANA name such as 'Asia/Shanghai' or 'UTC'"
            ) from None
        return value

    @field_validator("days")
    @classmethod
    def _days_once(cls, days: list[Day]) -> list[Day]:
        repeated = sorted({d for d in days if days.count(d) > 1}, key=DAYS.index)
        if repeated:
            raise ValueError(f"{repeated[0]} is listed twice")
        return days

    @field_validator("start", "end", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        # YAML 1.1 reads an unquoted 22:00 as the base-60 number 1320 (but 06:00 as text).
        if isinstance(value, int) and not isinstance(value, bool):
            hours, minutes = divmod(value, 60)
            raise ValueError(f'write the time in quotes, "{hours:02d}:{minutes:02d}"')
        return value

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        if clock_minutes(value) is None:
            raise ValueError("not a time of day 'HH:MM' (00:00 to 24:00)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleWindow:
        if self.start_minute == 24 * 60:
            raise ValueError("start 24:00 is the end of the day; start at 00:00 instead")
        if self.end_minute == self.start_minute:
            raise ValueError(
                f"end ({self.end}) is not after start ({self.start}); a whole day is 00:00 to 24:00"
            )
        if self.end_minute < self.start_minute:
            raise ValueError(
                f"end ({self.end}) is not after start ({self.start}); a window that crosses "
                f"midnight is two windows: {self.start}-24:00 and 00:00-{self.end}"
            )
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas "
                f"({self.max_replicas}); lower min_replicas or raise max_replicas"
            )
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def start_minute(self) -> int:
        """Minutes after local midnight at which the window opens."""
        return clock_minutes(self.start) or 0

    @property
    def end_minute(self) -> int:
        """Minutes after local midnight at which the window closes (1440: midnight)."""
        return clock_minutes(self.end) or 0

    def opens_on(self, day: date) -> bool:
        return DAYS[day.weekday()] in self.days

    def span_on(self, day: date) -> tuple[datetime, datetime]:
        """The instants (aware, in the window's timezone) it opens and closes on local ``day``."""
        return _wall(day, self.start_minute, self.zone), _wall(day, self.end_minute, self.zone)


def clock_minutes(value: str) -> int | None:
    """``'HH:MM'`` (00:00 to 24:00) as minutes after midnight; None when it is not one."""
    parts = value.split(":")
    if len(parts) != 2 or not all(len(p) == 2 and p.isdigit() for p in parts):
        return None
    hours, minutes = int(parts[0]), int(parts[1])
    if minutes >= 60 or hours > 24 or (hours == 24 and minutes):
        return None
    return hours * 60 + minutes


def _wall(day: date, minute: int, zone: ZoneInfo) -> datetime:
    """Local wall-clock ``minute`` of ``day`` (1440: the next midnight) in ``zone``."""
    day += timedelta(days=minute // (24 * 60))
    hour, minute = divmod(minute % (24 * 60), 60)
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)


def _no_overlap(windows: list[ScheduleWindow]) -> list[ScheduleWindow]:
    spans = sorted(
        (start.astimezone(UTC), end.astimezone(UTC), index)
        for index, window in enumerate(windows)
        for start, end in _reference_spans(window)
    )
    # One window's own spans never overlap, so a span that starts before the latest end
    # seen so far overlaps the span of another window that holds that end.
    latest: tuple[datetime, int] | None = None
    for start, end, index in spans:
        if latest is not None and start < latest[0]:
            a, b = sorted((latest[1], index))
            when = start.astimezone(windows[a].zone)
            raise ValueError(
                f"windows {a} '{windows[a].name}' and {b} '{windows[b].name}' overlap "
                f"({DAYS[when.weekday()]} {when:%H:%M} {windows[a].timezone}); windows of "
                "one model must not overlap: move or shorten one"
            )
        if latest is None or end > latest[0]:
            latest = (end, index)
    return windows


def _reference_spans(window: ScheduleWindow) -> Iterator[tuple[datetime, datetime]]:
    # A day either side of each week, so that windows that meet across the week's end in
    # different timezones are compared too.
    for monday in _REFERENCE_MONDAYS:
        for offset in range(-1, 8):
            day = monday + timedelta(days=offset)
            if window.opens_on(day):
                yield window.span_on(day)


Schedules = Annotated[list[ScheduleWindow], AfterValidator(_no_overlap)]


def replica_count_problem(model: ModelConfig) -> str | None:
    """Why ``model``'s replicas, autoscaling and schedules do not go together, or None."""
    scaling = model.autoscaling
    if scaling is not None and "replicas" in model.model_fields_set:
        return (
            "replicas and autoscaling are both set; a model has a fixed count (replicas) or "
            "bounds (autoscaling): remove one"
        )
    ceiling, field = (
        (scaling.max_replicas, "autoscaling.max_replicas")
        if scaling is not None
        else (model.replicas, "replicas")
    )
    for index, window in enumerate(model.schedules):
        if window.max_replicas > ceiling:
            return (
                f"schedules[{index}] '{window.name}' max_replicas ({window.max_replicas}) is "
                f"above {field} ({ceiling}); a window bounds replicas within 0..{ceiling}"
            )
    return None
