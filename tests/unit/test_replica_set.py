"""Replica membership and health (ReplicaSet), and the first replica policy (LeastLoad)."""

import asyncio
import json

from rayfleet.gateway.least_load import LeastLoad
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import ReplicaSet
from tests.unit.hostile import exchange, post, serving, still_serving

INFO = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": "hi"}, {})


def entries(*ids, model="m"):
    return [
        {"replica_id": i, "model": model, "url": f"http://127.0.0.1:{n + 9000}"}
        for n, i in enumerate(ids)
    ]


def pick(rs: ReplicaSet, policy: LeastLoad, model="m", exclude=()):
    return policy.pick(INFO, rs.candidates(model, exclude))


def test_picks_fewest_inflight():
    rs, policy = ReplicaSet(["m"]), LeastLoad()
    rs.update(entries("a", "b", "c"))
    a, b, c = (next(r for r in rs.replicas("m") if r.replica_id == x) for x in "abc")
    rs.begin(a), rs.begin(a), rs.begin(b)
    assert pick(rs, policy) is c
    rs.begin(c), rs.begin(c)
    assert pick(rs, policy) is b
    rs.end(a), rs.end(a)
    assert pick(rs, policy) is a


def test_ties_rotate():
    rs, policy = ReplicaSet(["m"]), LeastLoad()
    rs.update(entries("a", "b"))
    assert {pick(rs, policy).replica_id for _ in range(4)} == {"a", "b"}


def test_exclude_and_cooldown():
    rs, policy = ReplicaSet(["m"], cooldown_s=60), LeastLoad()
    rs.update(entries("a", "b"))
    a = pick(rs, policy, exclude=["b"])
    assert a.replica_id == "a"
    rs.failed(a)
    assert rs.num_healthy("m") == 1
    assert all(pick(rs, policy).replica_id == "b" for _ in range(3))
    assert pick(rs, policy, exclude=["b"]) is None
    rs.succeeded(a)
    assert a.num_consecutive_failures == 0


def test_cooling_lists_the_replicas_out_of_rotation_but_not_draining_nor_excluded():
    rs = ReplicaSet(["m"], cooldown_s=60)
    rs.update(entries("a", "b", "c"))
    a, b, c = rs.replicas("m")
    assert rs.cooling("m") == []
    rs.failed(a), rs.failed(b)
    rs.set_draining(b)
    assert rs.cooling("m") == [a] and rs.cooling("m", exclude=["a"]) == []
    assert rs.candidates("m") == [c]


def test_a_lone_replica_cooling_down_still_serves_when_no_provider_would():
    """One failure (a connect timeout to a busy replica, say) must not turn the cool-down
    of a model's only replica into refusals: with no provider to go to, the request goes
    to the cooling replica."""

    async def main():
        async with serving(cooldown_s=60.0) as served:
            await still_serving(served)
            replica_set = served.gateway.replica_set
            (replica,) = replica_set.replicas("m")
            replica_set.failed(replica)
            assert replica_set.candidates("m") == [] and replica_set.cooling("m") == [replica]
            body = json.dumps({"model": "m", "prompt": "while cooling"}).encode()
            return await exchange(served, post("/v1/completions", body))

    answer = asyncio.run(main())
    assert answer.status == 200 and answer.json()["object"] == "answer"


def test_a_draining_replica_is_never_picked_and_follows_its_registry_state():
    rs, policy = ReplicaSet(["m"]), LeastLoad()
    rs.update(entries("a", "b"))
    a, b = rs.replicas("m")
    draining = entries("a", "b")
    draining[0]["state"] = "draining"
    rs.update(draining)
    assert a.draining and a.as_dict(0.0)["draining"]
    rs.begin(b), rs.begin(b)  # even when it is the least loaded
    assert all(pick(rs, policy) is b for _ in range(4))
    assert rs.candidates("m") == [b]
    assert rs.num_healthy("m") == 1  # a leaving replica is not capacity
    draining[1]["state"] = "draining"
    rs.update(draining)
    assert pick(rs, policy) is None and rs.num_healthy("m") == 0


def test_wait_for_candidates_returns_when_a_replica_arrives():
    import asyncio

    async def main() -> tuple[bool, bool]:
        rs = ReplicaSet(["m"])
        none_yet = await rs.wait_for_candidates("m", 0.05)
        waiter = asyncio.create_task(rs.wait_for_candidates("m", 30))
        await asyncio.sleep(0)
        rs.update(entries("a"))
        return none_yet, await waiter

    assert asyncio.run(main()) == (False, True)


def test_update_keeps_counts_and_drops_gone_replicas():
    rs, policy = ReplicaSet(["m", "n"]), LeastLoad()
    rs.update(entries("a", "b") + entries("x", model="n") + entries("z", model="unknown"))
    a = pick(rs, policy, exclude=["b"])
    rs.begin(a)
    rs.update(entries("a"))
    assert [r.replica_id for r in rs.replicas("m")] == ["a"]
    assert rs.replicas("m")[0].num_inflight == 1
    assert rs.replicas("n") == [] and pick(rs, policy, "n") is None
    assert pick(rs, policy, "unknown") is None


def test_set_models_follows_models_added_and_removed():
    rs = ReplicaSet(["a"])
    rs.update(entries("x", model="a"))
    rs.set_models(["b"])
    rs.update(entries("x", model="a") + entries("y", model="b"))
    assert [r.replica_id for r in rs.replicas()] == ["y"]
    assert rs.replicas("a") == [] and rs.num_healthy("b") == 1


def test_the_rotation_kept_between_requests_follows_failures_cool_downs_and_drains(
    monkeypatch,
):
    """Candidates are worked out once and kept: a failure, the end of its cool-down, a
    drain and a membership update each show at the next request."""
    import types

    from rayfleet.gateway import replicas

    clock = [1000.0]
    monkeypatch.setattr(replicas, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    rs = ReplicaSet(["m"], cooldown_s=5.0)
    rs.update(entries("a", "b", "c"))
    a, b, c = rs.replicas("m")
    assert rs.candidates("m") == [a, b, c]
    rs.candidates("m").clear()  # the caller's own list: the kept one is not touched
    assert rs.candidates("m") == [a, b, c]
    rs.failed(a)
    assert rs.candidates("m") == [b, c]
    clock[0] += 4.9
    assert rs.candidates("m") == [b, c]
    clock[0] += 0.1  # the cool-down is over: nothing else happened
    assert rs.candidates("m") == [a, b, c]
    rs.set_draining(b)
    assert rs.candidates("m") == [a, c] and rs.candidates("m", exclude=["a"]) == [c]
    rs.update(entries("a", "b"))  # c left; b's entry says nothing of draining
    assert [r.replica_id for r in rs.candidates("m")] == ["a", "b"]
