"""One vLLM OpenAI-compatible server, run as a child process.

``EngineProcess`` is the piece every replica (and every test that needs a real
engine) uses:

    engine = EngineProcess(model="/models/tiny", served_name="tiny",
                           engine_args={"enforce_eager": True})
    engine.start()            # picks a free port, spawns the server
    engine.wait_healthy()     # polls GET /health; raises EngineFailed with the log tail
    engine.url                # "http://127.0.0.1:PORT"
    engine.stop()             # SIGTERM to the process group, SIGKILL after a grace period

The server is started as it would be by hand: niceness reset to 0 and
``OMP_NUM_THREADS`` removed (a Ray worker has 15 and 1, which cost a fifth of the
throughput), in a process group of its own so that stopping it also stops the
engine core processes vLLM spawns. Output goes to a log file whose tail is reported
when the server fails to start.

The server stays in its parent's *session*. Linux (with autogroup scheduling, the
default) shares the CPU between sessions first and between the processes of a session
second, and vLLM's engine-core and worker processes busy-poll with ``sched_yield``
while they wait for each other. In a session of its own the server's pollers starved
every other session's processes: on a 2-core machine, streams of a fixed-concurrency
benchmark arrived in one burst about a second late in 18 of 25 runs (a client-side
TTFT of 1.0 s against a server-side one under 0.1 s), and kernel threads waited up to
1.9 s for a core. In the session of the replica or test that started it, the yields
reach the gateway and the client, and the stalls were gone (0 of 16 runs).

``EngineProcess(..., engine="sim")`` runs a simulated engine instead (``simulator_argv``:
rayfleet/sim/, same endpoints and metric names), for fleets larger than this machine
holds. ``EngineProcess(..., headless=True)`` is a headless rank of an engine that spans nodes
(``headless_argv``: rayfleet/control/headless.py; no port, no /health, alive is healthy).
``server_argv`` is the server's whole command line; the engine arguments in it come
from ``engine_argv`` (rayfleet/control/engine_args.py), unchanged. ``kill_process_group``
stops a server's group; ``rayfleet down`` uses it for servers its fleet process left
(both in rayfleet/control/process_groups.py).

``EngineProcess(..., pid_dir=d)`` records the server the moment it is spawned
(``record_engine``) and removes the record once ``stop`` has stopped it. A fleet keeps
the records in ``<log dir>/pids`` (``PID_DIR``); its shutdown and ``rayfleet down`` stop
every group still recorded there (``kill_recorded_engines``), and ``start`` first stops
the recorded groups of the node whose server is gone (``stop_leaderless_engines``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfleet.control.engine_args import engine_argv
from rayfleet.control.process_groups import (
    kill_process_group,
    record_engine,
    stop_leaderless_engines,
)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HEADLESS_MODULE = "rayfleet.control.headless"  # a rank of an engine that spans nodes
PID_DIR = "pids"  # in a fleet's log directory: the engines it has spawned and not stopped
_LOG_TAIL_BYTES = 4000

if TYPE_CHECKING:
    import psutil


class EngineFailed(RuntimeError):
    """The vLLM server exited or did not become healthy in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def server_argv(
    model: str, served_name: str, engine_args: Mapping[str, Any], host: str, port: int
) -> list[str]:
    """The full command that starts vLLM's OpenAI server for one model."""
    return [
        sys.executable,
        "-m",
        SERVER_MODULE,
        "--model",
        model,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        *engine_argv(engine_args),
    ]


def simulator_argv(source: str, served_name: str, host: str, port: int) -> list[str]:
    """The command that starts a simulated engine (``engine: sim``, rayfleet/sim/) in
    place of vLLM: one replica on ``port``, its spec from ``source`` when that is a JSON
    file written by ``rayfleet sim calibrate``, else the simulator's defaults."""
    argv = [sys.executable, "-m", "rayfleet.sim", "serve", "--replicas", "1"]
    argv += ["--port-base", str(port), "--host", host, "--model", served_name]
    if source.endswith(".json"):
        argv += ["--spec", source]
    return argv


def headless_argv(model: str, engine_args: Mapping[str, Any]) -> list[str]:
    """The command that starts a headless rank (no API server) of a multi-node engine."""
    return [sys.executable, "-m", HEADLESS_MODULE, "--model", model, *engine_argv(engine_args)]


def _engine_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


# The server is started through this, which execs it in place (same pid): no Python code
# may run in the child between fork and exec. With a ``preexec_fn``, subprocess forks
# instead of vforking, and fork runs the at-fork handlers of Ray's gRPC in the child; they
# restart gRPC's poller threads there, the child's closing of inherited descriptors closes
# their epoll descriptor, and gRPC aborted the child (SIGABRT, "epoll_wait error: Bad file
# descriptor" in the server's log): a simulated replica's server died within 3 s of its
# start, twice in fresh-clone runs (tests/integration/test_sim_fleet.py).
EXEC_UNNICED = """
import ctypes, os, signal, sys
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
except OSError:
    pass
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
os.execvp(sys.argv[1], sys.argv[1:])
"""


def unniced(argv: list[str]) -> list[str]:
    """``argv`` run at niceness 0 (a Ray worker may be niced; the engine must not be),
    and SIGKILLed by Linux if the process that started it dies.

    Not SIGTERM: on SIGTERM vLLM 0.32's server aborted its engine and then waited for its
    open HTTP requests to end, and a non-streamed one never did. With its replica actor
    killed, two such requests hung until the gateway's 600 s timeout (test_recovery). Killed,
    the server resets its connections and the gateway retries them on another replica. Its
    engine core and workers are in its process group, which the fleet stops by group."""
    return [sys.executable, "-S", "-c", EXEC_UNNICED, *argv]


class EngineProcess:
    """A vLLM OpenAI server child process for one model."""

    def __init__(
        self,
        model: str,
        served_name: str,
        engine_args: Mapping[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        headless: bool = False,
        engine: str = "vllm",
        pid_dir: Path | None = None,
    ):
        # '~' means the home of the node that runs the server.
        self.model = os.path.expanduser(model)
        self.served_name = served_name
        self.engine_args = dict(engine_args or {})
        self.host = host
        self.port = port
        self.env = dict(env or {})
        self.log_path = log_path
        self.headless = headless  # a rank with no API server: no port, alive is healthy
        self.engine = engine  # "vllm", or "sim": a simulated engine (named so everywhere)
        self.pid_dir = pid_dir  # where the spawned server is recorded until stopped
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> EngineProcess:
        if self.pid_dir is not None:
            # A server killed with its replica left its engine core and workers, which
            # hold the memory (a GPU's too) this server needs: stop them first.
            stop_leaderless_engines(self.pid_dir)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"vllm-{self.served_name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        if self.headless:
            argv = headless_argv(self.model, self.engine_args)
        else:
            if self.port is None:
                self.port = free_port(self.host)
            if self.engine == "sim":
                argv = simulator_argv(self.model, self.served_name, self.host, self.port)
            else:
                argv = server_argv(
                    self.model, self.served_name, self.engine_args, self.host, self.port
                )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                unniced(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_engine_env(self.env),
                process_group=0,  # its own group, its parent's session (see above)
            )
        if self.pid_dir is not None:
            record_engine(self.pid_dir, self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True when the process runs and ``GET /health`` answers 200 (a headless rank
        has no endpoint: running is all it can say)."""
        if not self.alive() or self.headless:
            return self.alive()
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout_s) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(
        self,
        timeout_s: float = 600.0,
        poll_s: float = 0.5,
        also: Callable[[], str | None] | None = None,
    ) -> None:
        """Poll until healthy; EngineFailed with the log tail when the server exits, when
        ``also()`` reports a failure (a rank of the same engine died), or at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or not self.alive():
                code = self.proc.returncode if self.proc else None
                tail = self.log_tail()
                raise EngineFailed(
                    f"vLLM server for {self.served_name!r} exited with code {code} before it "
                    f"was healthy{last_error(tail)}; last lines of {self.log_path}:\n{tail}"
                )
            problem = also() if also is not None else None
            if problem:
                raise EngineFailed(f"vLLM server for {self.served_name!r}: {problem}")
            if self.healthy(timeout_s=2.0):
                keep_scheduler_off_worker_cores(self.proc.pid)
                return
            time.sleep(poll_s)
        raise EngineFailed(
            f"vLLM server for {self.served_name!r} not healthy after {timeout_s:.0f}s; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, num_bytes: int = _LOG_TAIL_BYTES) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - num_bytes))
            return f.read().decode(errors="replace")

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server and every process in its process group."""
        if self.proc is None:
            return
        kill_process_group(self.proc.pid, grace_s=grace_s)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=1)
        if self.pid_dir is not None:
            (self.pid_dir / f"{self.proc.pid}.pid").unlink(missing_ok=True)

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_ERROR_LINE = re.compile(r"\b(\w*(?:Error|Exception)): (.+)$")


def last_error(log_text: str) -> str:
    """The last exception a log names, as " (Kind: message)", or ""."""
    for line in reversed(log_text.splitlines()):
        match = _ERROR_LINE.search(line.strip())
        if match:
            return f" ({match.group(1)}: {match.group(2)[:300]})"
    return ""


def vllm_processes(server_pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The CPU workers and the engine-core processes under vLLM's server ``server_pid``,
    as two lists of ``psutil.Process`` (told apart by the names vLLM gives them)."""
    import psutil

    family = psutil.Process(server_pid).children(recursive=True)
    workers = [p for p in family if p.name().startswith("VLLM::Worker")]
    cores = [p for p in family if p.name().startswith("VLLM::EngineCor")]
    return workers, cores


def keep_scheduler_off_worker_cores(server_pid: int) -> list[int]:
    """Move vLLM's engine-core (scheduler) process off the cores its CPU workers own.

    The CPU build pins each worker to its cores, and a worker busy-polls its input
    queue for a second after every step. A scheduler placed on the same core then
    runs in the gaps, and streams come out in bursts (measured here: time to first
    token equal to the whole generation at concurrency 1, at random from one start to
    the next). vLLM leaves the other cores to its frontend processes; this puts the
    engine core there too. A no-op for GPU builds, whose workers are not pinned.
    Returns the cores the engine core may use ([] when nothing was changed).
    """
    import psutil

    try:
        server = psutil.Process(server_pid)
        workers, cores = vllm_processes(server_pid)
        worker_cpus = {cpu for w in workers for cpu in w.cpu_affinity()}
        allowed = set(server.cpu_affinity())
        free = sorted(allowed - worker_cpus)
        if not workers or not cores or not free:
            return []
        for core in cores:
            for thread in core.threads():  # its I/O threads too, not only the main one
                os.sched_setaffinity(thread.id, free)
        return free
    except (psutil.Error, OSError):
        return []
