"""A fleet of simulated engines (``engine: sim``, named a simulator everywhere): the
control plane and the gateway run unchanged over them, which makes the parts of
`rayfleet apply` that add and remove models cheap to test for real (Ray, Serve, the
registry, the gateway), and `rayfleet scale` up to more replicas than vLLM fits here."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.fleet import RunningFleet, model_entry, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 300


def sim_model(name: str, **fields: Any) -> dict[str, Any]:
    return model_entry(name, "sim", {}, engine="sim", **fields)


@pytest.fixture(scope="module")
def fleet_models() -> list[dict[str, Any]]:
    return [sim_model("sim-a", replicas=2)]


def serving(fleet: RunningFleet, model: str, count: int) -> list[dict[str, Any]] | None:
    now = [r for r in fleet.status()["replicas"] if r["model"] == model]
    ok = [r for r in now if r["healthy"] and not r["draining"]]
    return now if len(now) == len(ok) == count else None


def test_simulated_replicas_serve_through_the_gateway(fleet, client):
    assert serving(fleet, "sim-a", 2)
    reply = client.chat.completions.create(
        model="sim-a", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason == "length"


def test_scale_up_keeps_the_replicas_it_has(fleet):
    before = {r["pid"] for r in serving(fleet, "sim-a", 2) or []}
    fleet.cli("scale", "sim-a", "4")
    now = wait_until(lambda: serving(fleet, "sim-a", 4), TIMEOUT_S, poll_s=1.0)
    assert now is not None, fleet.serve_events()
    assert before <= {r["pid"] for r in now}, fleet.serve_events()
    fleet.cli("scale", "sim-a", "2")
    assert wait_until(lambda: serving(fleet, "sim-a", 2), TIMEOUT_S, poll_s=1.0)


def test_apply_adds_and_removes_models(fleet, client):
    config = yaml.safe_load(fleet.config_path.read_text())
    config["models"] = [sim_model("sim-b", replicas=1)]
    new = fleet.home / "swap.yaml"
    new.write_text(yaml.safe_dump(config))
    out = fleet.cli("apply", "-c", str(new), timeout_s=TIMEOUT_S).stdout
    assert "+ model 'sim-b': added" in out and "- model 'sim-a': removed" in out
    assert wait_until(lambda: serving(fleet, "sim-b", 1), TIMEOUT_S, poll_s=1.0)
    reply = client.completions.create(model="sim-b", prompt="hi", max_tokens=2)
    assert reply.choices[0].text
    gone = wait_until(
        lambda: not [r for r in fleet.status()["replicas"] if r["model"] == "sim-a"],
        TIMEOUT_S,
        poll_s=1.0,
    )
    assert gone
    with pytest.raises(Exception, match="does not exist"):
        client.completions.create(model="sim-a", prompt="hi", max_tokens=2)
