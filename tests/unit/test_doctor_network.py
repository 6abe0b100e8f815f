"""Link tests between two LinkPeers over real loopback TCP, in-process (no Ray)."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from rayfleet.doctor.needs import FleetNeeds, ModelNeed
from rayfleet.doctor.network import LinkMeasurement, LinkPeer, judge_link, pair_rounds, save_links
from rayfleet.doctor.result import Status


@pytest.fixture
def peers():
    server, client = LinkPeer(io_timeout_s=5), LinkPeer(io_timeout_s=5)
    host, port = server.listen("127.0.0.1")
    yield client, host, port
    server.close()


def test_loopback_link_is_measured(peers):
    client, host, port = peers
    measured = client.measure(host, port, seconds=0.5, max_bytes=128 * 1024**2)
    assert measured["gbps"] > 0.1
    assert 0 < measured["rtt_ms"] < 50


def test_byte_cap_ends_the_stream_before_the_time_cap(peers):
    client, host, port = peers
    started = time.monotonic()
    client.measure(host, port, seconds=30, max_bytes=8 * 1024**2)
    assert time.monotonic() - started < 10


def test_a_peer_that_is_gone_raises_instead_of_hanging():
    server = LinkPeer()
    host, port = server.listen("127.0.0.1")
    server.close()
    with pytest.raises(OSError):
        LinkPeer(io_timeout_s=2).measure(host, port, seconds=0.2, max_bytes=1024**2)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8])
def test_rounds_cover_every_pair_once_with_no_node_twice_per_round(count):
    ids = [f"n{i}" for i in range(count)]
    rounds = pair_rounds(ids)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(seen, key=sorted) == sorted(
        (frozenset(p) for p in itertools.combinations(ids, 2)), key=sorted
    )
    for r in rounds:
        members = [n for p in r for n in p]
        assert len(members) == len(set(members))
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)


def link(gbps: float) -> LinkMeasurement:
    return LinkMeasurement("a", "b", "10.0.0.1", "10.0.0.2", gbps, 0.1)


def test_link_thresholds():
    cross = FleetNeeds(models=[ModelNeed("big", "/m", True, 16, True)], given=True)
    assert judge_link(link(25), cross)[0] is Status.OK
    assert judge_link(link(5), FleetNeeds())[0] is Status.WARN
    assert "pipeline parallel" in judge_link(link(5), cross)[1]
    assert judge_link(link(0.5), FleetNeeds())[0] is Status.WARN
    status, fix = judge_link(link(0.5), cross)
    assert status is Status.FAIL and "big" in fix


def test_saved_links_have_the_planners_format(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path))
    path = save_links([link(12.34567)])
    assert path == tmp_path / "doctor" / "network.json"
    data = json.loads(path.read_text())
    assert set(data) == {"measured_at", "pairs"}
    assert data["measured_at"].endswith("+00:00")
    assert data["pairs"] == [
        {
            "src_node": "a",
            "dst_node": "b",
            "src_ip": "10.0.0.1",
            "dst_ip": "10.0.0.2",
            "gbps": 12.346,
            "rtt_ms": 0.1,
        }
    ]
