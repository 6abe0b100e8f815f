"""What the processes of gateway.workers share: in-flight counts and key quotas in
shared memory (attached from another process for real), one /metrics folded from
theirs, and the prefix index's updates over Unix datagrams between two gateways."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.config.routing import RoutingConfig
from rayfleet.errors import RayfleetError
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.index_sharing import IndexShare, decode, encode
from rayfleet.gateway.limits import KeyQuota
from rayfleet.gateway.metrics_merge import merge
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica, ReplicaSet
from rayfleet.gateway.server import listen
from rayfleet.gateway.shared_state import Columns, CountsSpec, QuotaCells, SharedCounts
from rayfleet.gateway.worker_process import observe_engines


def _count_in_other_process(spec: CountsSpec, row: int, slot: int, times: int) -> None:
    counts = SharedCounts.attach(spec, row)
    for _ in range(times):
        counts.add(slot, 1)
    counts.close()


def test_counts_written_by_another_process_are_summed_here():
    counts = SharedCounts.create(num_rows=2, num_slots=8)
    try:
        mine = SharedCounts.attach(counts.spec, row=0)
        mine.add(3, 2)
        process = multiprocessing.get_context("spawn").Process(
            target=_count_in_other_process, args=(counts.spec, 1, 3, 5)
        )
        process.start()
        process.join(60)
        assert process.exitcode == 0
        assert counts.total(3) == 7 and counts.total(2) == 0
        assert not counts.column_is_zero(3)
        counts.zero_row(1)  # that worker was replaced: its requests went with it
        assert counts.total(3) == 2
        mine.add(3, -2)
        assert counts.column_is_zero(3)
        mine.close()
    finally:
        counts.close()


def test_a_column_is_reused_only_once_its_replica_left_and_its_counts_are_zero():
    counts = SharedCounts.create(num_rows=2, num_slots=3)
    worker = SharedCounts.attach(counts.spec, row=1)
    columns = Columns(counts)
    try:
        entries = [{"replica_id": r, "model": "m", "url": "http://a"} for r in ("a", "b")]
        slots = {e["replica_id"]: e["slot"] for e in columns.assign(entries)}
        assert sorted(slots.values()) == [0, 1]
        waiting = columns.of("model:m")
        assert waiting == 2 and columns.of("model:m") == waiting  # kept
        worker.add(slots["b"], 1)  # a request to b still in flight
        assert columns.assign(entries[:1]) == [entries[0] | {"slot": slots["a"]}]
        assert columns.of("replica:c") == -1  # b's column is still counted: none free
        worker.add(slots["b"], -1)
        columns.assign(entries[:1])  # b's requests ended: its column is free again
        assert columns.of("replica:c") == slots["b"]
    finally:
        worker.close()
        counts.close()


def test_each_replica_weighs_every_workers_requests():
    counts = SharedCounts.create(num_rows=2, num_slots=4)
    here, there = (SharedCounts.attach(counts.spec, row) for row in (0, 1))
    replica_set = ReplicaSet(["m"])
    replica_set.shared = here
    replica_set.update([{"replica_id": "r0", "model": "m", "url": "http://a", "slot": 1}])
    replica = replica_set.replicas("m")[0]
    replica_set.begin(replica)
    for _ in range(3):
        there.add(1, 1)  # another worker's requests to the same replica
    assert replica.num_inflight == 1  # until the next refresh
    replica_set.refresh_shared()
    assert replica.num_inflight == 4
    replica_set.end(replica)
    assert counts.total(1) == 3
    for view in (here, there, counts):
        view.close()


def test_a_keys_quota_holds_over_workers_sharing_its_cells():
    lock = multiprocessing.get_context("spawn").Lock()
    cells = QuotaCells.create([(5.0, 0.0)], lock)
    try:
        attached = QuotaCells.attach(cells.spec, lock)
        one, two = (
            KeyQuota("k", requests_per_minute=5, max_concurrent=4, cells=c.of_key(0), lock=lock)
            for c in (cells, attached)
        )
        now = 1000.0
        for quota in (one, two, one, two):
            quota.admit(1, now)
        assert one.num_inflight == two.num_inflight == 4
        with pytest.raises(RequestError) as full:
            two.admit(1, now)
        assert "4 requests in flight" in full.value.message
        one.release()
        one.admit(1, now)  # the fifth of five per minute
        one.release()
        with pytest.raises(RequestError) as spent:
            two.refuse_early(now)
        assert spent.value.status == 429 and "5 requests per minute" in spent.value.message
        attached.close()
    finally:
        cells.close()


def _exposition(requests: float, replicas: float, inflight: float) -> bytes:
    registry = CollectorRegistry()
    Counter("rayfleet_requests_total", "r", ["model"], registry=registry).labels("m").inc(requests)
    picks = Histogram("rayfleet_replica_pick_seconds", "p", registry=registry)
    if requests:
        picks.observe(0.001 * requests)
    Gauge("rayfleet_replicas", "s", ["state"], registry=registry).labels("serving").set(replicas)
    Gauge("rayfleet_inflight_requests", "i", registry=registry).set(inflight)
    return generate_latest(registry)


def _samples(text: bytes) -> dict[str, float]:
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def test_one_metrics_page_sums_counters_and_work_and_keeps_the_fleets_gauges():
    merged = _samples(merge(_exposition(0, 2, 0), [_exposition(3, 5, 1), _exposition(4, 2, 2)]))
    assert merged["rayfleet_requests_total[('model', 'm')]"] == 7
    assert merged["rayfleet_replica_pick_seconds_count[]"] == 2
    assert merged["rayfleet_inflight_requests[]"] == 3
    assert merged["rayfleet_replicas[('state', 'serving')]"] == 2  # the fleet process's


def test_index_records_survive_their_datagram():
    hashes = [random.Random(1).getrandbits(63) - 2**62 for _ in range(50)]
    records = decode(encode("chat", "chat#a1", hashes) + encode("m2", "r", []))
    assert [(m, r, list(h)) for m, r, h in records] == [
        ("chat", "chat#a1", hashes),
        ("m2", "r", []),
    ]


def _prefix_gateway() -> Gateway:
    policies = Policies.plain(["m"])
    policies.routing = {"m": RoutingConfig(policy="prefix")}
    gateway = Gateway(["m"], policies=policies, replica_metrics_period_s=None)
    gateway.replica_set.update(
        [
            {"replica_id": f"r{i}", "model": "m", "url": f"http://127.0.0.1:{9000 + i}", "pid": i}
            for i in range(4)
        ]
    )
    return gateway


def test_what_one_worker_learns_the_others_route_by(tmp_path: Path):
    async def scenario() -> tuple[list[str], list[str], int]:
        first, second = _prefix_gateway(), _prefix_gateway()
        shares = [IndexShare(tmp_path, w, 2, g) for w, g in enumerate((first, second))]
        for share in shares:
            share.start()
        requests = [
            RequestInfo("/v1/completions", "m", {"prompt": f"system prompt {g}. " * 40}, {})
            for g in range(6)
        ]
        chosen = [_pick(first, request) for request in requests]
        await _until(lambda: shares[1].num_received > 0)
        # The second worker has seen none of these prompts; among 4 idle replicas it
        # would pick at random, but it knows where the first one sent each.
        picked = [_pick(second, request) for request in requests]
        for share in shares:
            share.close()
        return chosen, picked, shares[0].num_sent

    chosen, picked, sent = asyncio.run(scenario())
    assert picked == chosen and len(set(chosen)) > 1
    assert sent == 1  # six picks in one turn of the loop: one datagram


def test_a_worker_sizes_its_index_by_the_kv_cache_the_fleet_process_read():
    """Workers do not read the replicas' /metrics; the membership answer carries each
    replica's KV cache tokens and start time: the index holds no more of a replica than
    its cache, and forgets what it held when its start time moves."""
    gateway = _prefix_gateway()
    # 400 tokens at 4 characters a token: 25 blocks of 64 characters for r0; r1 unsaid.
    read = {"kv_cache_tokens": 400, "start_time": 100.0}
    observe_engines(gateway, {"r0": read, "gone": {"kv_cache_tokens": 10_000}})
    policy = gateway.dispatcher.replica_policies["m"].policy  # under TimedPolicy
    replicas = {r.replica_id: r for r in gateway.replica_set.replicas("m")}
    long_prompt = {"prompt": "a long story about nothing at all. " * 200}  # 109 blocks

    def fill() -> dict[str, int]:
        for replica_id in ("r0", "r1"):
            table = policy.index.table_of(replicas[replica_id])
            policy.index.record(table, policy.hasher.hashes("", long_prompt["prompt"]))
        return policy.index.num_blocks()

    assert fill() == {"r0": 25, "r1": 109}
    # The same start, and r1's first: nothing to forget.
    observe_engines(gateway, {"r0": read, "r1": {"kv_cache_tokens": None, "start_time": 7.0}})
    assert policy.index.num_blocks() == {"r0": 25, "r1": 109}
    # r0's engine restarted under the same url and pid: its table starts empty, its bound stays.
    observe_engines(gateway, {"r0": {**read, "start_time": 160.0}})
    assert policy.index.num_blocks() == {"r1": 109}
    assert fill() == {"r0": 25, "r1": 109}


def _pick(gateway: Gateway, request: RequestInfo) -> str:
    replica = gateway.dispatcher.replica_policies["m"].pick(
        request, gateway.replica_set.replicas("m")
    )
    assert replica is not None
    return replica.replica_id


async def _until(condition, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "no datagram arrived"
        await asyncio.sleep(0.01)


def test_a_replica_object_keeps_its_slot_from_the_entry():
    replica_set = ReplicaSet(["m"])
    replica_set.update([{"replica_id": "r", "model": "m", "url": "http://a", "slot": 7}])
    assert replica_set.replicas("m")[0].slot == 7
    assert Replica("x", "m", "http://b").slot == -1


def test_the_port_held_for_workers_is_refused_when_another_serves_it():
    plain = socket.create_server(("127.0.0.1", 0))
    shared = listen("127.0.0.1", 0, reuse_port=True)  # another fleet's worker
    try:
        for taken in (plain, shared):
            port = taken.getsockname()[1]
            with pytest.raises(RayfleetError, match=f"cannot listen on 127.0.0.1:{port}"):
                listen("127.0.0.1", port, reuse_port=True, accept=False)
        held = listen("127.0.0.1", 0, reuse_port=True, accept=False)
        worker = listen("127.0.0.1", held.getsockname()[1], reuse_port=True)  # its own worker
        worker.close()
        held.close()
    finally:
        plain.close()
        shared.close()


def test_a_quota_lock_left_held_by_a_dead_worker_is_taken_over():
    lock = multiprocessing.get_context("spawn").Lock()
    cells = QuotaCells.create([(60.0, 0.0)], lock)
    try:
        lock.acquire()  # as a worker killed inside the lock's section leaves it
        quota = KeyQuota("k", requests_per_minute=60, cells=cells.of_key(0), lock=cells.lock)
        quota.admit(1, 1000.0)
        quota.release()
        assert lock.acquire(timeout=1)  # released again, not lost
        lock.release()
    finally:
        cells.close()
