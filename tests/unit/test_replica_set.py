"""Replica picking: fewest requests in flight, cool-down after failures."""

from rayfleet.gateway.replicas import ReplicaSet


def entries(*ids, model="m"):
    return [
        {"replica_id": i, "model": model, "url": f"http://127.0.0.1:{n + 9000}"}
        for n, i in enumerate(ids)
    ]


def test_picks_fewest_inflight():
    rs = ReplicaSet(["m"])
    rs.update(entries("a", "b", "c"))
    a, b, c = (next(r for r in rs.replicas("m") if r.replica_id == x) for x in "abc")
    rs.begin(a), rs.begin(a), rs.begin(b)
    assert rs.pick("m") is c
    rs.begin(c), rs.begin(c)
    assert rs.pick("m") is b
    rs.end(a), rs.end(a)
    assert rs.pick("m") is a


def test_ties_rotate():
    rs = ReplicaSet(["m"])
    rs.update(entries("a", "b"))
    assert {rs.pick("m").replica_id for _ in range(4)} == {"a", "b"}


def test_exclude_and_cooldown():
    rs = ReplicaSet(["m"], cooldown_s=60)
    rs.update(entries("a", "b"))
    a = rs.pick("m", exclude=["b"])
    assert a.replica_id == "a"
    rs.failed(a)
    assert rs.num_healthy("m") == 1
    assert all(rs.pick("m").replica_id == "b" for _ in range(3))
    assert rs.pick("m", exclude=["b"]) is None
    rs.succeeded(a)
    assert a.num_consecutive_failures == 0


def test_update_keeps_counts_and_drops_gone_replicas():
    rs = ReplicaSet(["m", "n"])
    rs.update(entries("a", "b") + entries("x", model="n") + entries("z", model="unknown"))
    a = rs.pick("m", exclude=["b"])
    rs.begin(a)
    rs.update(entries("a"))
    assert [r.replica_id for r in rs.replicas("m")] == ["a"]
    assert rs.replicas("m")[0].num_inflight == 1
    assert rs.replicas("n") == [] and rs.pick("n") is None
    assert rs.pick("unknown") is None
