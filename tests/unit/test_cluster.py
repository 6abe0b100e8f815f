"""Connecting to Ray: the one error when nothing is at the address (no Ray is started)."""

from __future__ import annotations

import socket

import pytest

from rayfleet.cluster import connect, connected
from rayfleet.errors import RayfleetError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_nothing_listening_names_the_address_and_the_callers_fix(scheme):
    address = f"{scheme}127.0.0.1:{free_port()}"
    with pytest.raises(RayfleetError) as caught:
        connect(address, hint="or pass --address")
    message = str(caught.value)
    assert message.startswith(f"no Ray cluster at '{address}' (")
    assert message.endswith("start one with `ray start --head`, or pass --address")
    assert "\n" not in message


def test_an_address_that_is_not_one_is_refused_before_ray_starts():
    with (
        pytest.raises(RayfleetError, match="'head' is not 'auto', 'local', host:port"),
        connected("head", hint="or pass --address"),
    ):
        pass
