"""The scaling decision, driven by a test clock: delays, windows at once, zero, KV pressure."""

from __future__ import annotations

from dataclasses import dataclass, field

from rayfleet.config import AutoscalingConfig
from rayfleet.control.autoscaler import Autoscaler, Decision
from rayfleet.control.load_signal import EngineLoad
from rayfleet.control.windows import Bounds

OWN = Bounds(1, 4)


def autoscaler(**config) -> Autoscaler:
    fields = {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_load_per_replica": 8,
        "upscale_delay_s": 10,
        "downscale_delay_s": 300,
        **config,
    }
    return Autoscaler("chat", AutoscalingConfig(**fields))


def busy(running: float, waiting: float = 0.0, kv: float = 0.1) -> EngineLoad:
    return EngineLoad(running=running, waiting=waiting, kv_cache_usage=kv)


@dataclass
class Run:
    """Feeds one scaler the same load every second and applies what it decides."""

    scaler: Autoscaler
    current: int
    now_s: float = 0.0
    bounds: Bounds = OWN
    inflight: int = 0
    waiting: int = 0
    loads: list[EngineLoad] = field(default_factory=list)
    changes: list[tuple[float, Decision]] = field(default_factory=list)

    def step(self) -> Decision:
        decision = self.scaler.decide(
            self.now_s, self.bounds, self.current, self.loads, self.inflight, self.waiting
        )
        if decision.direction != "none":
            self.changes.append((self.now_s, decision))
            self.current = decision.target
        return decision

    def for_s(self, seconds: float) -> Run:
        end = self.now_s + seconds
        while self.now_s < end:
            self.step()
            self.now_s += 1.0
        return self


def test_up_after_the_delay_to_ceil_of_load_over_target():
    run = Run(autoscaler(), current=1, loads=[busy(running=8, waiting=9)])  # 17 / 8 -> 3
    run.for_s(10)
    assert run.changes == []
    assert run.step() == Decision(3, "load", "up")
    assert run.now_s == 10


def test_a_spike_shorter_than_the_upscale_delay_does_not_scale():
    run = Run(autoscaler(), current=1)
    for _ in range(5):
        run.loads = [busy(running=20)]
        run.for_s(9)
        run.loads = [busy(running=3)]
        run.for_s(1)
    assert run.changes == []


def test_zero_upscale_delay_scales_at_once():
    run = Run(autoscaler(upscale_delay_s=0), current=1, loads=[busy(running=9)])
    assert run.step() == Decision(2, "load", "up")


def test_down_only_after_the_downscale_delay_and_within_bounds():
    run = Run(autoscaler(), current=3, loads=[busy(1), busy(0), busy(0)])
    run.for_s(300)
    assert run.changes == []
    assert run.step() == Decision(1, "load", "down")  # not 0: the min is 1


def test_a_load_that_returns_restarts_the_downscale_delay():
    run = Run(autoscaler(), current=2, loads=[busy(1), busy(0)])
    run.for_s(299)
    run.loads = [busy(8), busy(8)]
    run.for_s(1)
    run.loads = [busy(1), busy(0)]
    run.for_s(299)
    assert run.changes == []
    run.for_s(2)
    assert [d for _, d in run.changes] == [Decision(1, "load", "down")]


def test_a_load_on_the_boundary_neither_scales_in_nor_asks_for_more():
    # 8 requests and a target of 8: one replica would sit at its target, so two stay,
    # and one does not ask for a second; one request fewer, and one replica is enough.
    run = Run(autoscaler(upscale_delay_s=0), current=2, loads=[busy(4), busy(4)])
    run.for_s(600)
    run.current, run.loads = 1, [busy(8)]
    run.for_s(600)
    assert run.changes == []
    run.current, run.loads = 2, [busy(4), busy(3)]
    run.for_s(301)
    assert [d for _, d in run.changes] == [Decision(1, "load", "down")]


def test_up_is_capped_by_max_and_each_step_waits_a_whole_delay():
    run = Run(autoscaler(), current=1, loads=[busy(running=100)])
    run.for_s(25)
    assert run.changes == [(10.0, Decision(4, "load", "up"))]


def test_gateway_counts_when_engines_do_not_answer_and_held_requests_add():
    scaler = autoscaler(upscale_delay_s=0)
    # one replica's /metrics missing: the gateway's 20 in flight count, not the 4 seen
    assert scaler.decide(0, OWN, 1, [busy(4)], 20, 0) == Decision(3, "load", "up")
    # 8 running and 9 held in the gateway for lack of a replica: 17 -> 3
    assert scaler.decide(1, OWN, 3, [busy(4), busy(4)], 8, 9) == Decision(3, "steady", "none")


def test_a_window_bounds_at_once_in_both_directions():
    run = Run(autoscaler(), current=3, loads=[busy(8), busy(8), busy(8)])
    run.step()
    run.bounds = Bounds(1, 1, "night")
    assert run.step() == Decision(1, "window night", "down")
    run.for_s(60)  # load is still 24: capped, no further change
    assert len(run.changes) == 1
    run.bounds = Bounds(2, 4, None)
    assert run.step() == Decision(2, "window night ended", "up")
    # then the load raises it to 3 after the upscale delay, as usual
    run.for_s(11)
    assert [d for _, d in run.changes][-1] == Decision(3, "load", "up")


def test_a_window_that_raises_the_minimum_applies_at_once():
    run = Run(autoscaler(), current=1)
    run.bounds = Bounds(3, 4, "business")
    assert run.step() == Decision(3, "window business", "up")
    assert Run(autoscaler(), current=0).step() == Decision(1, "bounds", "up")


def test_scale_to_zero_after_the_delay_and_from_zero_at_once():
    run = Run(autoscaler(min_replicas=0), current=1, bounds=Bounds(0, 4), loads=[busy(0)])
    run.for_s(301)
    assert run.changes == [(300.0, Decision(0, "load", "down"))]
    run.loads = []
    run.for_s(60)
    assert run.current == 0
    run.waiting = 1  # the first request after idle is held in the gateway
    assert run.step() == Decision(1, "request waiting", "up")


def test_from_zero_goes_straight_to_what_the_held_requests_need():
    scaler = autoscaler(min_replicas=0, upscale_delay_s=30)
    assert scaler.decide(0, Bounds(0, 4), 0, [], 0, 20) == Decision(3, "request waiting", "up")


def test_a_window_with_max_zero_holds_requests_instead_of_starting_a_replica():
    scaler = autoscaler(min_replicas=0, upscale_delay_s=0)
    closed = Bounds(0, 0, "closed")
    assert scaler.decide(0, closed, 0, [], 0, 5) == Decision(0, "steady", "none")


def test_kv_pressure_adds_a_replica_after_the_upscale_delay():
    # two long requests fill the cache: the count alone asks for one replica
    run = Run(autoscaler(), current=1, loads=[busy(running=2, kv=0.95)])
    run.for_s(11)
    assert run.changes == [(10.0, Decision(2, "kv_cache", "up"))]
    # the mean over replicas is what counts; no further step while it is below the mark
    run.loads = [busy(2, kv=0.95), busy(0, kv=0.05)]
    run.for_s(20)
    assert run.current == 2


def test_kv_pressure_blocks_scaling_down_and_stays_within_max():
    run = Run(autoscaler(), current=4, loads=[busy(1, kv=0.99)] * 4)
    run.for_s(400)
    assert run.changes == []
    assert run.current == 4


def test_each_model_keeps_its_own_timers():
    a, b = autoscaler(), autoscaler()
    assert a.decide(0, OWN, 1, [busy(20)], 0, 0).direction == "none"
    assert b.decide(9, OWN, 1, [busy(20)], 0, 0).direction == "none"
    assert a.decide(10, OWN, 1, [busy(20)], 0, 0).direction == "up"
    assert b.decide(10, OWN, 1, [busy(20)], 0, 0).direction == "none"
