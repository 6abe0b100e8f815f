"""A benchmark's server in a child process: started in a process group of its own, ready
once it prints its first line (a port, or a JSON list of URLs), stopped with its whole
group. What GatewayProcess (sim_gateway.py), BareRelayProcess (bare_relay.py) and
CannedReplicasProcess (canned_replica.py) share.

    proc, line = start_server([sys.executable, __file__, ...], "the bare relay")
    ...
    stop_server(proc)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

STOP_WAIT_S = 30.0  # for SIGTERM's shutdown, before SIGKILL


def start_server(
    argv: list[str], what: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Run ``argv`` in a new process group; the process and its first line of output,
    read once it serves. Raises RuntimeError naming ``what`` if it exits first."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, process_group=0, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} exited ({proc.wait()}) before serving")
    return proc, line


def stop_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the process's group, then SIGKILL if it is not gone within
    ``STOP_WAIT_S``; nothing when it has exited already."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
