"""A replica's probe of its server (server_probe.py) on a real server process, the
simulated engine: a server stopped with SIGSTOP runs but answers nothing, as a server
starved of CPU does."""

from __future__ import annotations

import os
import signal

from rayfleet.control.engine import EngineProcess
from rayfleet.control.server_probe import ServerProbe


def test_a_live_server_is_replaced_only_after_the_limit_of_unanswered_probes(tmp_path):
    engine = EngineProcess("sim", "m", engine="sim", log_path=tmp_path / "sim.log").start()
    try:
        engine.wait_healthy(timeout_s=120)
        probe = ServerProbe(engine, timeout_s=0.5, limit=3)
        assert probe.problem() is None
        assert engine.pid is not None
        os.kill(engine.pid, signal.SIGSTOP)
        try:
            assert probe.problem() is None  # slow once: still serving
            assert probe.problem() is None and probe.slow.count == 2
            problem = probe.problem()
            assert problem is not None and "does not answer /health (3 checks" in problem
        finally:
            os.kill(engine.pid, signal.SIGCONT)
        probe.slow.count = 2
        assert probe.problem() is None and probe.slow.count == 0  # answered: count anew
        engine.stop(grace_s=5)
        problem = probe.problem()
        assert problem is not None and problem.endswith("has exited")  # at once
    finally:
        engine.stop(grace_s=5)
