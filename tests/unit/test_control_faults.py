"""One line of error for a fleet that cannot start: a busy gateway port found before
anything starts, a vLLM server's failure read out of its log and out of Serve's
message, a detached fleet's exit reason read out of its log."""

from __future__ import annotations

import socket

import pytest

from rayfleet.config import parse_fleet
from rayfleet.control.deploy import failure_reason
from rayfleet.control.engine import last_error
from rayfleet.control.lifecycle import _exit_reason, refuse_busy_port
from rayfleet.errors import RayfleetError

VLLM_LOG = """\
(APIServer pid=7) INFO 11-30 15:22:07 [api_utils.py:286] non-default args: {}
Traceback (most recent call last):
  File "/x/vllm/config/model.py", line 10, in __post_init__
(APIServer pid=7) ValueError: Invalid repository ID or local directory specified: '/m'.
"""


def test_a_busy_gateway_port_is_refused_before_anything_starts():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = parse_fleet({"gateway": {"port": port}, "models": [{"name": "a", "source": "/m"}]})
        with pytest.raises(RayfleetError) as refused:
            refuse_busy_port(config)
    message = str(refused.value)
    assert f"cannot listen on 127.0.0.1:{port}" in message and "--port" in message
    assert "\n" not in message
    refuse_busy_port(config)  # free again once the holder closed


def test_the_last_error_of_a_vllm_log():
    assert last_error(VLLM_LOG) == (
        " (ValueError: Invalid repository ID or local directory specified: '/m'.)"
    )
    assert last_error("INFO all good\n") == ""


def test_serves_message_for_a_server_that_failed_becomes_one_line():
    message = (
        "Deploying app 'broken' failed.\n"
        "The deployment failed to start 3 times in a row. Error:\n"
        "Traceback (most recent call last):\n"
        "rayfleet.control.engine.EngineFailed: vLLM server for 'broken' exited with code 1 "
        "before it was healthy (ValueError: bad); last lines of /logs/broken-x.log:\n" + VLLM_LOG
    )
    assert failure_reason(message) == (
        "vLLM server for 'broken' exited with code 1 before it was healthy "
        "(ValueError: bad); its log: /logs/broken-x.log"
    )
    assert failure_reason("placement group pending") == "placement group pending"


def test_a_detached_fleets_exit_reason_is_its_error_line(tmp_path):
    log = tmp_path / "up.log"
    log.write_text("starting Ray (local)\nerror: model 'b' failed to deploy: why\n")
    assert _exit_reason(log, 1) == f"model 'b' failed to deploy: why (log: {log})"
    log.write_text("Killed\n")
    assert _exit_reason(log, 137) == "the fleet exited with code 137 before it was ready:\nKilled"
