"""The Serve config `rayfleet gateway` sends to change a replica count (declare_replicas),
from the dashboard's answer as Ray Serve gives it: only the model's deployment count
changes, every other application goes back as deployed, zero leaves the application out
and a later count puts it back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rayfleet.control.attach import declare_replicas
from rayfleet.errors import RayfleetError


def app_config(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "import_path": "rayfleet.control.serve_app:build",
        "route_prefix": None,
        "args": {"model": name, "config": "/etc/rayfleet/fleet.yaml"},
        **extra,
    }


def details(*apps: dict[str, Any]) -> dict[str, Any]:
    return {
        "proxy_location": "Disabled",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "grpc_options": None,
        "target_capacity": None,
        "applications": {a["name"]: {"status": "RUNNING", "deployed_app_config": a} for a in apps},
    }


def test_only_the_models_count_changes_and_the_rest_goes_back_as_deployed():
    chat = app_config("chat", deployments=[{"name": "chat", "max_ongoing_requests": 64}])
    embed = app_config("embed")
    before = details(chat, embed)
    answer = copy.deepcopy(before)
    body = declare_replicas(answer, {}, "chat", "chat", 3)
    assert answer == before  # the dashboard's answer is not changed in place
    assert body["proxy_location"] == "Disabled"
    assert body["http_options"] == {"host": "0.0.0.0", "port": 8000}
    assert "grpc_options" not in body and "target_capacity" not in body
    (sent_chat, sent_embed) = body["applications"]
    assert sent_chat["deployments"] == [
        {"name": "chat", "max_ongoing_requests": 64, "num_replicas": 3}
    ]
    assert {k: v for k, v in sent_chat.items() if k != "deployments"} == {
        k: v for k, v in chat.items() if k != "deployments"
    }
    assert sent_embed == embed


def test_zero_leaves_the_application_out_and_a_later_count_puts_it_back():
    declared: dict[str, dict[str, Any]] = {}
    chat, embed = app_config("chat"), app_config("embed")
    at_zero = declare_replicas(details(chat, embed), declared, "chat", "chat", 0)
    assert [a["name"] for a in at_zero["applications"]] == ["embed"]
    # Serve has deleted it: the dashboard no longer lists it, the remembered config is used.
    back = declare_replicas(details(embed), declared, "chat", "chat", 1)
    assert [a["name"] for a in back["applications"]] == ["embed", "chat"]
    assert back["applications"][1]["deployments"] == [{"name": "chat", "num_replicas": 1}]


def test_an_application_never_seen_cannot_be_scaled():
    with pytest.raises(RayfleetError, match="no Serve config for application 'chat'"):
        declare_replicas(details(app_config("embed")), {}, "chat", "chat", 1)
