"""Schedule windows at an instant: each read in its own timezone, start in, end out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from rayfleet.config import parse_fleet
from rayfleet.control.windows import Bounds, active_window, bounds_at, next_boundary

SHANGHAI = ZoneInfo("Asia/Shanghai")
NEW_YORK = ZoneInfo("America/New_York")


def window(**fields) -> dict:
    return {
        "name": "night",
        "timezone": "Asia/Shanghai",
        "start": "00:00",
        "end": "06:00",
        "min_replicas": 1,
        "max_replicas": 1,
        **fields,
    }


def model(*windows: dict, **fields):
    if "replicas" not in fields:
        fields.setdefault(
            "autoscaling", {"min_replicas": 2, "max_replicas": 4, "target_load_per_replica": 8}
        )
    data = {"models": [{"name": "m", "source": "/m", "schedules": list(windows), **fields}]}
    return parse_fleet(data).models[0]


def at(text: str, zone: ZoneInfo = SHANGHAI) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=zone)


@pytest.mark.parametrize(
    "when, expected",
    [
        ("2025-03-03T23:59:59", None),
        ("2025-03-04T00:00:00", "night"),  # start is inclusive
        ("2025-03-04T05:59:59.999", "night"),
        ("2025-03-04T06:00:00", None),  # end is exclusive
        ("2025-03-04T12:00:00", None),
    ],
)
def test_start_inclusive_end_exclusive(when, expected):
    found = active_window(model(window()).schedules, at(when))
    assert (found.name if found else None) == expected


def test_the_instant_is_read_in_the_window_timezone():
    windows = model(window()).schedules
    # 16:00 UTC on Monday is 00:00 Tuesday in Shanghai; 22:00 UTC is 06:00 there.
    assert active_window(windows, datetime(2025, 3, 3, 16, 0, tzinfo=UTC)) is not None
    assert active_window(windows, datetime(2025, 3, 3, 21, 59, tzinfo=UTC)) is not None
    assert active_window(windows, datetime(2025, 3, 3, 22, 0, tzinfo=UTC)) is None
    # the same instant written in New York time
    assert active_window(windows, at("2025-03-03T11:30", NEW_YORK)) is not None


def test_days_are_local_days():
    windows = model(window(days=["Sat", "Sun"])).schedules
    # 2025-03-08 is a Saturday in Shanghai, still Friday 16:30 UTC
    assert active_window(windows, at("2025-03-08T00:30")) is not None
    assert active_window(windows, at("2025-03-10T00:30")) is None  # Monday


def test_a_night_across_midnight_is_two_windows_with_one_name():
    windows = model(
        window(start="00:00", end="06:00"), window(start="22:00", end="24:00")
    ).schedules
    for when in ("2025-03-03T21:59", "2025-03-04T06:00"):
        assert active_window(windows, at(when)) is None
    for when in ("2025-03-03T22:00", "2025-03-03T23:59:59", "2025-03-04T00:00", "2025-03-04T05:00"):
        assert active_window(windows, at(when)).name == "night"


def test_windows_keep_local_hours_across_daylight_saving():
    windows = model(window(timezone="America/New_York", start="08:00", end="09:00")).schedules
    # New York moved to daylight time on 2025-03-09: 08:30 local is 13:30 UTC before, 12:30 after
    assert active_window(windows, datetime(2025, 3, 7, 13, 30, tzinfo=UTC)) is not None
    assert active_window(windows, datetime(2025, 3, 7, 12, 30, tzinfo=UTC)) is None
    assert active_window(windows, datetime(2025, 3, 10, 12, 30, tzinfo=UTC)) is not None
    assert active_window(windows, datetime(2025, 3, 10, 13, 30, tzinfo=UTC)) is None


def test_bounds_of_an_autoscaled_model():
    scaled = model(window(min_replicas=0, max_replicas=1))
    assert bounds_at(scaled, at("2025-03-04T03:00")) == Bounds(0, 1, "night")
    assert bounds_at(scaled, at("2025-03-04T09:00")) == Bounds(2, 4, None)


def test_bounds_of_a_fixed_model_are_its_count_clamped_into_the_window():
    fixed = model(window(min_replicas=0, max_replicas=1), replicas=3)
    assert bounds_at(fixed, at("2025-03-04T03:00")) == Bounds(1, 1, "night")
    assert bounds_at(fixed, at("2025-03-04T09:00")) == Bounds(3, 3, None)
    assert bounds_at(model(replicas=2), at("2025-03-04T03:00")) == Bounds(2, 2, None)


def test_next_boundary_is_the_next_open_or_close():
    windows = model(
        window(), window(name="day", start="09:00", end="17:00", days=["Mon"])
    ).schedules
    # Monday 2025-03-03, 07:00 Shanghai: the day window opens at 09:00 Shanghai
    assert next_boundary(windows, at("2025-03-03T07:00")) == at("2025-03-03T09:00")
    # inside the night: it closes at 06:00
    assert next_boundary(windows, at("2025-03-04T03:00")) == at("2025-03-04T06:00")
    # exactly at a boundary: the next one, not this one
    assert next_boundary(windows, at("2025-03-04T06:00")) == at("2025-03-05T00:00")
    assert next_boundary(windows, at("2025-03-03T07:00")).tzinfo is UTC


def test_next_boundary_at_midnight_between_two_windows_and_a_week_ahead():
    windows = model(window(start="22:00", end="24:00", days=["Sun"])).schedules
    # Monday: the next opening is Sunday 22:00, six days and more ahead
    assert next_boundary(windows, at("2025-03-03T23:00")) == at("2025-03-09T22:00")
    assert next_boundary(windows, at("2025-03-09T23:00")) == at("2025-03-10T00:00")
    assert next_boundary([], at("2025-03-03T23:00")) is None


def test_next_boundary_is_where_the_window_changes():
    windows = model(window(), window(start="22:00", end="24:00")).schedules
    now = at("2025-03-03T21:00")
    for _ in range(6):
        boundary = next_boundary(windows, now)
        assert boundary is not None
        before = active_window(windows, boundary - timedelta(microseconds=1))
        after = active_window(windows, boundary)
        assert (before is None) != (after is None) or before is not after
        now = boundary


def test_naive_time_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        active_window([], datetime(2025, 3, 3, 12, 0))
