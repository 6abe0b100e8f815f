"""Replica policies from fleet.yaml's routing: config errors, round robin, session affinity
with bounded load, the factory and its metrics, and the prefix policy through the real
gateway in front of two simulated replicas, read with the openai client."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from openai import AsyncOpenAI

from rayfleet.bench.simulator import SimulatorThread
from rayfleet.config import RoutingConfig, parse_fleet
from rayfleet.errors import ConfigError
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.errors import REPLICA_HEADER
from rayfleet.gateway.least_load import LeastLoad
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica
from rayfleet.gateway.round_robin import RoundRobin
from rayfleet.gateway.routing import TimedPolicy, build_replica_policy
from rayfleet.gateway.server import start_gateway
from rayfleet.gateway.session_affinity import SessionAffinity


def replicas(n: int) -> list[Replica]:
    return [Replica(f"r{i}", "m", f"http://127.0.0.1:{9000 + i}") for i in range(n)]


def session(key: str | None, header: str = "x-session-id") -> RequestInfo:
    headers = {header: key} if key is not None else {}
    return RequestInfo("/v1/chat/completions", "m", {"messages": []}, headers)


# -- config -------------------------------------------------------------------------


def fleet_with(routing: dict) -> dict:
    return {"models": [{"name": "m", "source": "/models/m", "routing": routing}]}


@pytest.mark.parametrize(
    ("routing", "expected"),
    [
        ({"policy": "prefx"}, "models[0].routing.policy: Input should be"),
        ({"polcy": "prefix"}, "models[0].routing.polcy: unknown field; did you mean 'policy'?"),
        ({"policy": "prefix", "block_chars": 0}, "models[0].routing.block_chars: Input should"),
        ({"policy": "prefix", "alpha": -1}, "models[0].routing.alpha: Input should be greater"),
        (
            {"alpha": 2},
            "models[0].routing: alpha is an option of policy 'prefix', but policy is "
            "'least_load'; remove alpha or set policy: prefix",
        ),
        (
            {"policy": "prefix", "session_header": "x"},
            "models[0].routing: session_header is an option of policy 'session'",
        ),
        ({"policy": "session", "load_factor": 0}, "models[0].routing.load_factor: Input"),
        (
            {"policy": "round_robin", "load_factor": 1},
            "models[0].routing: load_factor is an option of policy 'session' or 'prefix', "
            "but policy is 'round_robin'; remove load_factor or set policy: session",
        ),
    ],
)
def test_bad_routing_is_one_line_naming_the_field(routing, expected):
    with pytest.raises(ConfigError) as err:
        parse_fleet(fleet_with(routing))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"fleet.yaml: {expected}")


def test_a_routing_dumped_whole_validates_again():
    for config in (RoutingConfig(), RoutingConfig(policy="prefix", alpha=3.0)):
        assert RoutingConfig.model_validate(config.model_dump()) == config


def test_routing_defaults_to_least_load_and_reaches_the_gateway_policies():
    fleet = parse_fleet({"models": [{"name": "m", "source": "/models/m"}]})
    assert fleet.models[0].routing == RoutingConfig()
    assert isinstance(build_replica_policy(fleet.models[0].routing), LeastLoad)
    fleet = parse_fleet(fleet_with({"policy": "prefix", "alpha": 2.0, "index_blocks": 100}))
    policies = Policies.from_fleet(fleet)
    policy = build_replica_policy(policies.routing["m"])
    assert isinstance(policy, PrefixRouting)
    assert (policy.alpha, policy.index.capacity_blocks) == (2.0, 100)


# -- round robin and sessions -------------------------------------------------------


def test_round_robin_takes_the_candidates_in_turn():
    fleet = replicas(3)
    fleet[0].num_inflight = 50  # load is not its business
    policy = RoundRobin()
    picked = [policy.pick(session(None), fleet) for _ in range(6)]
    assert [r.replica_id for r in picked if r] == ["r0", "r1", "r2", "r0", "r1", "r2"]
    assert policy.pick(session(None), []) is None


def test_a_session_stays_on_one_replica_and_sessions_spread():
    policy = SessionAffinity()
    fleet = replicas(8)
    homes = {}
    for key in (f"conversation-{i}" for i in range(400)):
        home = policy.pick(session(key), fleet)
        assert all(policy.pick(session(key), fleet) is home for _ in range(3))
        homes[key] = home.replica_id
    spread = Counter(homes.values())
    assert len(spread) == 8 and max(spread.values()) < 2 * 400 / 8
    # A replica leaving moves only its own sessions.
    policy2 = SessionAffinity()
    without = [r for r in fleet if r.replica_id != "r3"]
    moved = [k for k, home in homes.items() if policy2.pick(session(k), without).replica_id != home]
    assert {homes[k] for k in moved} == {"r3"}


def test_a_busy_replica_passes_its_session_to_the_same_next_one():
    policy = SessionAffinity(RoutingConfig(policy="session", load_factor=0.25))
    fleet = replicas(4)
    home = policy.pick(session("chat-1"), fleet)
    assert home is not None
    for r in fleet:
        r.num_inflight = 1
    home.num_inflight = 3  # bound: ceil(1.25 * (6 + 1) / 4) = 3
    spill = policy.pick(session("chat-1"), fleet)
    assert spill is not home
    assert all(policy.pick(session("chat-1"), fleet) is spill for _ in range(5))
    home.num_inflight = 1
    assert policy.pick(session("chat-1"), fleet) is home


def test_no_session_header_goes_to_least_load_and_the_header_is_configurable():
    policy = SessionAffinity(RoutingConfig(policy="session", session_header="x-conv"))
    fleet = replicas(3)
    fleet[0].num_inflight = fleet[1].num_inflight = 2
    assert policy.pick(session(None), fleet) is fleet[2]
    key = next(
        f"k{i}"
        for i in range(100)
        if policy.pick(session(f"k{i}", "x-conv"), fleet) is not fleet[2]
    )
    assert policy.pick(session(key, "x-session-id"), fleet) is fleet[2]  # not its header


# -- the factory and metrics --------------------------------------------------------


def test_each_policy_is_built_and_timed_into_metrics():
    metrics = GatewayMetrics()
    kinds = {"least_load": LeastLoad, "round_robin": RoundRobin, "session": SessionAffinity}
    kinds["prefix"] = PrefixRouting
    for name, kind in kinds.items():
        policy = build_replica_policy(RoutingConfig(policy=name), model="m", metrics=metrics)
        assert isinstance(policy, TimedPolicy) and isinstance(policy.policy, kind)
        body = {"messages": [{"role": "user", "content": "x" * 300}]}
        picked = policy.pick(RequestInfo("/v1/chat/completions", "m", body, {}), replicas(2))
        assert picked is not None
    text = metrics.render().decode()
    for name in kinds:
        assert f'rayfleet_replica_pick_seconds_count{{model="m",policy="{name}"}} 1.0' in text
    assert 'rayfleet_prefix_prompt_blocks_total{model="m",replica="r' in text
    assert 'rayfleet_prefix_index_blocks{model="m",replica="r' in text


# -- through the gateway ------------------------------------------------------------


def test_prefix_routing_through_the_gateway_keeps_a_shared_prompt_on_one_replica():
    rng = random.Random(1)
    system = " ".join(f"rule {rng.randrange(10**6)}" for _ in range(300))

    async def main(urls: list[str]) -> tuple[list[str], list[str], str]:
        entries = [{"replica_id": f"r{i}", "model": "m", "url": u} for i, u in enumerate(urls)]

        async def source():
            return entries

        policies = Policies.plain(["m"])
        policies.routing = {"m": RoutingConfig(policy="prefix")}
        gateway = Gateway(["m"], source, policies=policies)
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        client = AsyncOpenAI(base_url=f"http://{host}:{port}/v1", api_key="-", max_retries=0)
        served, texts = [], []
        try:
            for i in range(6):
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ]
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, max_tokens=3, stream=True
                )
                served.append(raw.headers[REPLICA_HEADER])
                stream = raw.parse()
                pieces = [c.choices[0].delta.content async for c in stream if c.choices]
                texts.append("".join(p or "" for p in pieces))
            metrics = gateway.metrics.render().decode()
        finally:
            await client.close()
            await runner.cleanup()
        return served, texts, metrics

    with SimulatorThread() as first, SimulatorThread() as second:
        served, texts, metrics = asyncio.run(main([first.url, second.url]))
    assert len(set(served)) == 1, served
    assert texts == [" tok" * 3] * 6
    assert f'rayfleet_prefix_predicted_hit_blocks_total{{model="m",replica="{served[0]}"}}' in (
        metrics
    )


def test_the_load_bound_defaults_per_policy_and_follows_a_set_factor():
    assert RoutingConfig(policy="session").bounded_load_factor == 0.25
    assert RoutingConfig(policy="prefix").bounded_load_factor == 0.5
    assert RoutingConfig(policy="prefix", load_factor=1.0).bounded_load_factor == 1.0
    assert PrefixRouting(RoutingConfig(policy="prefix")).load_factor == 0.5


def test_the_prefix_cost_is_fixed_unless_set_to_be_learned():
    assert PrefixRouting(RoutingConfig(policy="prefix")).request_cost == 2.0
    learned = PrefixRouting(RoutingConfig(policy="prefix", request_cost_blocks=None))
    assert learned.request_cost == 1.0  # learned from the requests it routes, from 1
