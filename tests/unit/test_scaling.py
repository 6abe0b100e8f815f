"""The fleet's scaler against a real gateway object (no Ray): targets from held requests,
from windows on a clock moved by a file, `rayfleet scale` within bounds, and its metrics."""

from __future__ import annotations

import asyncio

import aiohttp

from rayfleet.config import parse_fleet
from rayfleet.control.scaling import Clock, FleetScaler, initial_target
from rayfleet.gateway.app import Gateway

AUTOSCALED = {
    "name": "m",
    "source": "/models/m",
    "autoscaling": {
        "min_replicas": 0,
        "max_replicas": 2,
        "target_load_per_replica": 2,
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
    },
    "schedules": [
        {"name": "night", "start": "01:00", "end": "02:00", "min_replicas": 0, "max_replicas": 1}
    ],
}
FIXED = {
    "name": "f",
    "source": "/models/f",
    "replicas": 2,
    "schedules": [
        {"name": "quiet", "start": "01:00", "end": "02:00", "min_replicas": 0, "max_replicas": 1}
    ],
}


def make(tmp_path, now="2026-01-05T00:30:00+00:00"):
    config = parse_fleet({"models": [AUTOSCALED, FIXED]})
    clock_file = tmp_path / "now.txt"
    clock_file.write_text(now)
    gateway = Gateway(["m", "f"])
    calls = []

    async def set_target(model: str, count: int) -> None:
        calls.append((model, count))

    scaler = FleetScaler(config, gateway, set_target, Clock(path=clock_file))
    return config, gateway, scaler, calls, clock_file


async def steps(scaler, config):
    async with aiohttp.ClientSession() as session:
        for model in config.models:
            await scaler._step(model, session)


def test_initial_targets_and_a_held_request_scales_from_zero(tmp_path):
    config, gateway, scaler, calls, _ = make(tmp_path)
    assert scaler.targets == {"m": 0, "f": 2}
    gateway.dispatcher.waiting["m"] = 1
    asyncio.run(steps(scaler, config))
    assert calls == [("m", 1)]
    assert scaler.report()["m"]["last_decision"] == "0 -> 1: request waiting"
    metrics = gateway.metrics.render().decode()
    assert 'rayfleet_scale_events_total{direction="up",model="m",reason="request"} 1.0' in metrics


def test_a_window_caps_a_fixed_model_at_once_and_releases_it(tmp_path):
    config, _, scaler, calls, clock_file = make(tmp_path)
    clock_file.write_text("2026-01-05T01:10:00+00:00")
    asyncio.run(steps(scaler, config))
    assert calls == [("f", 1)]
    assert (scaler.windows["m"], scaler.windows["f"]) == ("night", "quiet")
    clock_file.write_text("2026-01-05T02:00:00+00:00")
    asyncio.run(steps(scaler, config))
    assert calls == [("f", 1), ("f", 2)] and scaler.windows["f"] is None


def test_scale_is_refused_outside_the_bounds_in_force(tmp_path):
    config, _, scaler, calls, _ = make(tmp_path, "2026-01-05T01:10:00+00:00")
    assert scaler.scale("m", 2) == (
        "model 'm' must have 0 to 1 replicas now (window 'night'); asked for 2"
    )
    assert scaler.scale("x", 1).startswith("no model 'x' in the fleet")
    assert scaler.scale("m", 1) is None
    asyncio.run(steps(scaler, config))
    assert ("m", 1) in calls and scaler.report()["m"]["fixed"] == 1


def test_initial_target_reads_the_window_open_at_start(tmp_path):
    config = parse_fleet({"models": [AUTOSCALED, FIXED]})
    (tmp_path / "t").write_text("2026-01-05T01:30:00+00:00")
    at_night = Clock(path=tmp_path / "t").now()
    assert initial_target(config.model("f"), at_night) == 1
    assert initial_target(config.model("m"), at_night) == 0


def test_a_fixed_model_may_be_scaled_to_any_count_outside_its_windows(tmp_path):
    config, _, scaler, calls, _ = make(tmp_path)
    assert scaler.scale("f", 5) is None
    asyncio.run(steps(scaler, config))
    assert ("f", 5) in calls


def test_apply_refuses_a_routing_change_even_beside_a_rolled_field():
    from rayfleet.control.apply import fleet_diff, refusal

    old = parse_fleet({"models": [FIXED]})
    changed = {**FIXED, "routing": {"policy": "prefix"}, "env": {"A": "1"}}
    why = refusal(fleet_diff(old, parse_fleet({"models": [changed]})))
    assert why == (
        "model 'f' routing cannot change while the fleet runs; "
        "stop it with `rayfleet down` and start it with `rayfleet up`"
    )


def test_auto_hands_a_fixed_model_back_to_its_autoscaling(tmp_path):
    config, _, scaler, calls, _ = make(tmp_path)
    assert scaler.scale("m", 2) is None
    asyncio.run(steps(scaler, config))
    assert ("m", 2) in calls and scaler.report()["m"]["fixed"] == 2
    assert "m" not in scaler.inputs  # a fixed count reads no load
    assert scaler.scale("m", None) is None  # `rayfleet scale m auto`
    asyncio.run(steps(scaler, config))
    assert scaler.report()["m"]["fixed"] is None
    assert scaler.inputs["m"] == "in engines 0, in flight 0, held 0"  # the autoscaler's turn


def test_a_gateway_that_does_not_lead_refuses_to_scale(tmp_path):
    _, _, scaler, _, _ = make(tmp_path)
    scaler.leading = False  # another gateway of the fleet scales (rayfleet gateway)
    assert scaler.scale("m", 1) == (
        "another gateway of this fleet scales model 'm'; run rayfleet scale where that gateway runs"
    )
