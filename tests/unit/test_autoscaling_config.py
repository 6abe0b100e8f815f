"""models[].autoscaling and models[].schedules: every mistake is one line through parse_fleet."""

from __future__ import annotations

import pytest
import yaml

from rayfleet.config import AutoscalingConfig, ScheduleWindow, parse_fleet
from rayfleet.errors import ConfigError

SCALING = {"min_replicas": 1, "max_replicas": 4, "target_load_per_replica": 8}


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


def fleet(**model) -> dict:
    return {"models": [{"name": "m", "source": "/models/m", **model}]}


def scaled(*windows: dict, **scaling) -> dict:
    return fleet(autoscaling={**SCALING, **scaling}, schedules=list(windows))


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, origin="fleet.yaml")
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "data, expected",
    [
        (
            fleet(replicas=2, autoscaling=SCALING),
            "models[0]: replicas and autoscaling are both set; a model has a fixed count "
            "(replicas) or bounds (autoscaling): remove one",
        ),
        (
            scaled(min_replicas=5),
            "models[0].autoscaling: min_replicas (5) is above max_replicas (4); lower "
            "min_replicas or raise max_replicas",
        ),
        (
            scaled(max_replicas=0, min_replicas=0),
            "models[0].autoscaling.max_replicas: Input should be greater than or equal to 1 "
            "(got 0)",
        ),
        (
            scaled(min_replicas=-1),
            "models[0].autoscaling.min_replicas: Input should be greater than or equal to 0 "
            "(got -1)",
        ),
        (
            scaled(target_load_per_replica=0),
            "models[0].autoscaling.target_load_per_replica: Input should be greater than 0 (got 0)",
        ),
        (
            scaled(kv_cache_high=1.5),
            "models[0].autoscaling.kv_cache_high: Input should be less than or equal to 1 "
            "(got 1.5)",
        ),
        (
            scaled(upscale_delay_s=-1),
            "models[0].autoscaling.upscale_delay_s: Input should be greater than or equal to 0 "
            "(got -1)",
        ),
        (
            scaled(min_replica=0),
            "models[0].autoscaling.min_replica: unknown field; did you mean 'min_replicas'?",
        ),
        (
            fleet(autoscaling={"max_replicas": 3}),
            "models[0].autoscaling.target_load_per_replica: required field is missing",
        ),
        (
            fleet(autoscalling=SCALING),
            "models[0].autoscalling: unknown field; did you mean 'autoscaling'?",
        ),
        (
            scaled(window(timezone="Mars/Base")),
            "models[0].schedules[0].timezone: unknown timezone; use an IANA name such as "
            "'Asia/Shanghai' or 'UTC' (got 'Mars/Base')",
        ),
        (
            scaled(window(timezone="America")),
            "models[0].schedules[0].timezone: unknown timezone; use an IANA name such as "
            "'Asia/Shanghai' or 'UTC' (got 'America')",
        ),
        (
            scaled(window(start="22:00", end="02:00")),
            "models[0].schedules[0]: end (02:00) is not after start (22:00); a window that "
            "crosses midnight is two windows: 22:00-24:00 and 00:00-02:00",
        ),
        (
            scaled(window(start="06:00", end="06:00")),
            "models[0].schedules[0]: end (06:00) is not after start (06:00); a whole day is "
            "00:00 to 24:00",
        ),
        (
            scaled(window(start="24:00", end="24:00")),
            "models[0].schedules[0]: start 24:00 is the end of the day; start at 00:00 instead",
        ),
        (
            scaled(window(start="7:00")),
            "models[0].schedules[0].start: not a time of day 'HH:MM' (00:00 to 24:00) (got '7:00')",
        ),
        (
            scaled(window(end="24:30")),
            "models[0].schedules[0].end: not a time of day 'HH:MM' (00:00 to 24:00) (got '24:30')",
        ),
        (
            scaled(window(days=["Mon", "Mun"])),
            "models[0].schedules[0].days[1]: Input should be 'Mon', 'Tue', 'Wed', 'Thu', "
            "'Fri', 'Sat' or 'Sun' (got 'Mun')",
        ),
        (
            scaled(window(days=["Sat", "Mon", "Sat"])),
            "models[0].schedules[0].days: Sat is listed twice",
        ),
        (
            scaled(window(days=[])),
            "models[0].schedules[0].days: List should have at least 1 item after validation, not 0",
        ),
        (
            scaled(window(min_replicas=2)),
            "models[0].schedules[0]: min_replicas (2) is above max_replicas (1); lower "
            "min_replicas or raise max_replicas",
        ),
        (
            scaled(window(max_replicas=5)),
            "models[0]: schedules[0] 'night' max_replicas (5) is above "
            "autoscaling.max_replicas (4); a window bounds replicas within 0..4",
        ),
        (
            fleet(replicas=2, schedules=[window(max_replicas=3)]),
            "models[0]: schedules[0] 'night' max_replicas (3) is above replicas (2); a window "
            "bounds replicas within 0..2",
        ),
        (
            scaled(window(name="nite", strat="01:00")),
            "models[0].schedules[0].strat: unknown field; did you mean 'start'?",
        ),
    ],
)
def test_config_error_is_one_line_with_the_field(data, expected):
    assert error_of(data) == f"fleet.yaml: {expected}"


def test_unquoted_time_read_by_yaml_as_a_number_asks_for_quotes():
    data = yaml.safe_load(
        "models:\n"
        "  - name: m\n"
        "    source: /models/m\n"
        "    autoscaling: {max_replicas: 2, target_load_per_replica: 4}\n"
        "    schedules:\n"
        "      - {name: late, start: 22:00, end: '24:00', min_replicas: 0, max_replicas: 1}\n"
    )
    assert error_of(data) == (
        'fleet.yaml: models[0].schedules[0].start: write the time in quotes, "22:00" (got 1320)'
    )


def test_overlap_in_one_timezone():
    message = error_of(scaled(window(), window(name="dawn", start="05:00", end="08:00")))
    assert message == (
        "fleet.yaml: models[0].schedules: windows 0 'night' and 1 'dawn' overlap "
        "(Sun 05:00 Asia/Shanghai); windows of one model must not overlap: move or shorten one"
    )


def test_overlap_across_timezones():
    # 21:00-23:00 UTC on Sunday is 05:00-07:00 in Shanghai on Monday: it meets the night.
    utc = window(name="evening", timezone="UTC", days=["Sun"], start="21:00", end="23:00")
    message = error_of(scaled(window(), utc))
    assert "windows 0 'night' and 1 'evening' overlap (Mon 05:00 Asia/Shanghai)" in message


def test_overlap_only_in_daylight_saving_time_is_found():
    # New York is UTC-5 in January, UTC-4 in July: 12:00 UTC meets 08:00-09:00 local only
    # in July.
    ny = window(name="ny", timezone="America/New_York", start="08:00", end="09:00")
    utc = window(name="utc", timezone="UTC", start="12:00", end="12:30")
    assert "windows 0 'ny' and 1 'utc' overlap" in error_of(scaled(ny, utc))


def test_windows_that_touch_or_differ_in_days_do_not_overlap():
    config = parse_fleet(
        scaled(
            window(name="night", start="00:00", end="06:00"),
            window(name="night", start="22:00", end="24:00"),
            window(name="weekend", days=["Sat", "Sun"], start="06:00", end="22:00", max_replicas=4),
            window(name="weekday", days=["Mon"], start="06:00", end="22:00", max_replicas=4),
            # 22:00 UTC on Tuesday is 06:00 Wednesday in Shanghai: it touches, no overlap.
            window(name="utc", timezone="UTC", days=["Tue"], start="22:00", end="24:00"),
        )
    )
    assert [w.name for w in config.models[0].schedules] == [
        "night",
        "night",
        "weekend",
        "weekday",
        "utc",
    ]


def test_the_issue_example_with_defaults():
    config = parse_fleet(scaled(window(days=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])))
    model = config.models[0]
    assert model.autoscaling == AutoscalingConfig(
        min_replicas=1,
        max_replicas=4,
        target_load_per_replica=8,
        kv_cache_high=0.90,
        upscale_delay_s=10,
        downscale_delay_s=300,
    )
    assert model.schedules[0] == ScheduleWindow(**window())
    assert (model.schedules[0].start_minute, model.schedules[0].end_minute) == (0, 360)


def test_scale_to_zero_and_a_window_that_closes_the_model():
    model = parse_fleet(scaled(window(min_replicas=0, max_replicas=0), min_replicas=0)).models[0]
    assert model.autoscaling is not None and model.autoscaling.min_replicas == 0


def test_fixed_count_with_windows_and_no_autoscaling_is_the_default():
    model = parse_fleet(fleet(replicas=2, schedules=[window()])).models[0]
    assert (model.replicas, model.autoscaling) == (2, None)
    assert parse_fleet(fleet()).models[0].schedules == []


def test_a_model_sent_as_its_set_fields_validates_again():
    """Replicas receive their model as model_dump(exclude_unset=True)."""
    model = parse_fleet(scaled(window())).models[0]
    again = parse_fleet({"models": [model.model_dump(exclude_unset=True)]}).models[0]
    assert again == model
