"""Each replica's vLLM gauges on the gateway's /metrics, read from real aiohttp servers that
serve a real vLLM /metrics text (tests/unit/data/vllm_metrics.txt, the tiny model's).

The servers stand in for replicas: each serves the captured text with its own values
written in, or fails, or hangs. Tests wait on conditions (a scrape polled until a series
shows), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.replica_gauges import ReplicaGauges
from rayfleet.gateway.replicas import ReplicaSet
from rayfleet.gateway.routing import TimedPolicy
from rayfleet.gateway.server import start_gateway

VLLM_METRICS = (Path(__file__).parent / "data" / "vllm_metrics.txt").read_text()
# The captured text's own values: running 6, waiting 0, KV 0.000733, prefix cache 0 hits
# of 306 queried tokens, 177 generated tokens.


def vllm_text(**values: float) -> str:
    """The captured text with some samples' values replaced (name without ``vllm:``)."""
    lines = []
    for line in VLLM_METRICS.splitlines():
        name = line.split("{", 1)[0]
        if name.startswith("vllm:") and name[5:] in values:
            line = line.rsplit(" ", 1)[0] + f" {values[name[5:]]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class Inside:
    """Reads in progress, across servers, and the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.total = 0
        self.starts: list[float] = []  # time.monotonic() of each read's arrival


class FakeReplica:
    """A server whose /metrics answers ``text``, an error ``status``, or hangs."""

    def __init__(self, text: str = VLLM_METRICS, inside: Inside | None = None):
        self.text = text
        self.status = 200
        self.hang = False
        self.inside = inside or Inside()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def metrics(self, _request: web.Request) -> web.Response:
        self.inside.now += 1
        self.inside.total += 1
        self.inside.starts.append(time.monotonic())
        self.inside.most = max(self.inside.most, self.inside.now)
        try:
            await asyncio.sleep(0.05)  # long enough for concurrent reads to overlap
            if self.hang:
                await asyncio.sleep(60)
            return web.Response(text=self.text, status=self.status)
        finally:
            self.inside.now -= 1

    async def start(self) -> FakeReplica:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def entry(replica_id: str, model: str, url: str) -> dict[str, object]:
    return {"replica_id": replica_id, "model": model, "url": url, "pid": 1}


def samples(text: str) -> dict[tuple[str, str, str], float]:
    """{(sample name, model, replica): value} of the rayfleet_replica_* series."""
    return {
        (s.name, s.labels["model"], s.labels["replica"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("rayfleet_replica_") and "replica" in s.labels
    }


def test_each_replica_gauges_under_its_labels_and_a_replica_that_left_disappears():
    async def main() -> None:
        a = await FakeReplica().start()
        b = await FakeReplica(
            vllm_text(
                num_requests_running=2,
                num_requests_waiting=3,
                kv_cache_usage_perc=0.5,
                prefix_cache_hits_total=75,
                prefix_cache_queries_total=300,
                generation_tokens_total=1000,
            )
        ).start()
        replica_set = ReplicaSet(["tiny", "other"])
        replica_set.update([entry("a", "tiny", a.url), entry("b", "other", b.url)])
        registry = CollectorRegistry()
        gauges = ReplicaGauges(replica_set, registry)
        try:
            async with aiohttp.ClientSession() as session:
                await gauges.scrape_once(session)
            seen = samples(generate_latest(registry).decode())
            assert seen == {
                ("rayfleet_replica_up", "tiny", "a"): 1.0,
                ("rayfleet_replica_requests_running", "tiny", "a"): 6.0,
                ("rayfleet_replica_requests_waiting", "tiny", "a"): 0.0,
                ("rayfleet_replica_kv_cache_usage", "tiny", "a"): seen[
                    ("rayfleet_replica_kv_cache_usage", "tiny", "a")
                ],
                ("rayfleet_replica_prefix_cache_hit_rate", "tiny", "a"): 0.0,
                ("rayfleet_replica_generation_tokens_total", "tiny", "a"): 177.0,
                ("rayfleet_replica_up", "other", "b"): 1.0,
                ("rayfleet_replica_requests_running", "other", "b"): 2.0,
                ("rayfleet_replica_requests_waiting", "other", "b"): 3.0,
                ("rayfleet_replica_kv_cache_usage", "other", "b"): 0.5,
                ("rayfleet_replica_prefix_cache_hit_rate", "other", "b"): 0.25,
                ("rayfleet_replica_generation_tokens_total", "other", "b"): 1000.0,
            }
            assert abs(seen[("rayfleet_replica_kv_cache_usage", "tiny", "a")] - 0.000733) < 1e-6

            replica_set.update([entry("b", "other", b.url)])  # a left: gone at once
            left = samples(generate_latest(registry).decode())
            assert {replica for _, _, replica in left} == {"b"}
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())


def test_a_replica_that_fails_keeps_only_up_zero_and_comes_back():
    async def main() -> None:
        broken = await FakeReplica().start()
        broken.status = 500
        gone = await FakeReplica().start()
        await gone.stop()  # connection refused from now on
        replica_set = ReplicaSet(["tiny"])
        replica_set.update([entry("x", "tiny", broken.url), entry("y", "tiny", gone.url)])
        registry = CollectorRegistry()
        gauges = ReplicaGauges(replica_set, registry)
        try:
            async with aiohttp.ClientSession() as session:
                await gauges.scrape_once(session)
                assert samples(generate_latest(registry).decode()) == {
                    ("rayfleet_replica_up", "tiny", "x"): 0.0,
                    ("rayfleet_replica_up", "tiny", "y"): 0.0,
                }
                broken.status = 200
                await gauges.scrape_once(session)
            back = samples(generate_latest(registry).decode())
            assert back[("rayfleet_replica_up", "tiny", "x")] == 1.0
            assert back[("rayfleet_replica_requests_running", "tiny", "x")] == 6.0
        finally:
            await broken.stop()

    asyncio.run(main())


def test_reads_are_bounded_in_number_and_time():
    async def main() -> None:
        inside = Inside()
        replicas = [await FakeReplica(inside=inside).start() for _ in range(6)]
        replicas[0].hang = True
        replica_set = ReplicaSet(["tiny"])
        replica_set.update([entry(f"r{i}", "tiny", r.url) for i, r in enumerate(replicas)])
        registry = CollectorRegistry()
        gauges = ReplicaGauges(replica_set, registry, timeout_s=0.5, max_concurrent=2)
        try:
            started = time.monotonic()
            async with aiohttp.ClientSession() as session:
                await gauges.scrape_once(session)
            assert time.monotonic() - started < 5  # the hanging one cut at 0.5 s
            assert inside.total == 6
            assert inside.most == 2
            seen = samples(generate_latest(registry).decode())
            assert seen[("rayfleet_replica_up", "tiny", "r0")] == 0.0
            assert all(seen[("rayfleet_replica_up", "tiny", f"r{i}")] == 1.0 for i in range(1, 6))
        finally:
            for replica in replicas:
                await replica.stop()

    asyncio.run(main())


def test_a_round_spreads_its_reads_over_the_time_given():
    """A round of reads at once stalled the gateway's loop (64 replicas: 30-66 ms), so
    ``run`` spreads each round's starts over its period."""

    async def main() -> None:
        inside = Inside()
        replicas = [await FakeReplica(inside=inside).start() for _ in range(4)]
        replica_set = ReplicaSet(["tiny"])
        replica_set.update([entry(f"r{i}", "tiny", r.url) for i, r in enumerate(replicas)])
        registry = CollectorRegistry()
        gauges = ReplicaGauges(replica_set, registry)
        try:
            async with aiohttp.ClientSession() as session:
                await gauges.scrape_once(session, spread_s=0.8)
            starts = sorted(inside.starts)
            assert len(starts) == 4
            # The 4th read starts 3/4 of the spread after the first, never sooner.
            assert starts[-1] - starts[0] >= 0.6 - 0.01, starts
            seen = samples(generate_latest(registry).decode())
            assert all(seen[("rayfleet_replica_up", "tiny", f"r{i}")] == 1.0 for i in range(4))
        finally:
            for replica in replicas:
                await replica.stop()

    asyncio.run(main())


def test_the_gateway_republishes_while_a_replica_hangs():
    """Through the real gateway: its /metrics shows the replicas' gauges, read in a task
    of their own, and answers at once while one replica's /metrics hangs."""

    async def main() -> None:
        good = await FakeReplica().start()
        stuck = await FakeReplica().start()
        stuck.hang = True

        async def source():
            return [entry("good", "tiny", good.url), entry("stuck", "tiny", stuck.url)]

        gateway = Gateway(["tiny"], source, replica_metrics_period_s=0.1)
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        seen: dict[tuple[str, str, str], float] = {}
        try:
            async with aiohttp.ClientSession() as client:

                async def scrape() -> float:
                    nonlocal seen
                    started = time.monotonic()
                    async with client.get(f"http://{host}:{port}/metrics") as response:
                        seen = samples(await response.text())
                    return time.monotonic() - started

                while ("rayfleet_replica_up", "tiny", "stuck") not in seen:
                    assert await scrape() < 1.0  # never waits for the stuck replica
                    await asyncio.sleep(0.05)
            assert seen[("rayfleet_replica_requests_running", "tiny", "good")] == 6.0
            assert seen[("rayfleet_replica_up", "tiny", "stuck")] == 0.0
        finally:
            await runner.cleanup()
            await good.stop()
            await stuck.stop()

    asyncio.run(main())


def test_the_gateway_sizes_its_prefix_index_from_each_replicas_kv_cache():
    """The captured text's cache_config_info says 1,048,576 tokens: at 4 characters a
    token that is 65,536 blocks of 64, under this index's own bound of 100,000."""

    async def main() -> None:
        replica = await FakeReplica().start()

        async def source():
            return [entry("a", "tiny", replica.url)]

        policies = Policies.plain(["tiny"])
        policies.routing = {"tiny": RoutingConfig(policy="prefix", index_blocks=100_000)}
        gateway = Gateway(["tiny"], source, policies=policies, replica_metrics_period_s=0.1)
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        timed = gateway.dispatcher.replica_policies["tiny"]
        assert isinstance(timed, TimedPolicy) and isinstance(timed.policy, PrefixRouting)
        index = timed.policy.index
        try:
            while not gateway.replica_set.replicas() or ("tiny", "a") not in (
                gateway.replica_gauges.readings if gateway.replica_gauges else {}
            ):
                await asyncio.sleep(0.05)
            (table,) = index.tables_of(gateway.replica_set.replicas(), now=0.0)
            assert table.capacity == 65_536
        finally:
            await runner.cleanup()
            await replica.stop()

    asyncio.run(main())
