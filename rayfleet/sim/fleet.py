"""Many simulated replicas in one process, on one event loop, one port each.

- ``run_fleet(spec, num_replicas, ...)``: the coroutine behind ``rayfleet sim serve``;
  prints the replicas' URLs as one JSON list on one line once all listen, then serves
  until cancelled, restarting one replica every ``restart_every_s`` in turn if asked.
- ``SimFleet(spec, num_replicas)``: the same on a thread of this process (tests), a
  context manager with ``urls``, ``stats()`` and ``restart(i)`` that act on the loop.
- ``SimFleetProcess(spec, num_replicas)``: the same in a process of its own (benchmarks,
  so the load client and the gateway do not share its loop); it reads the URL line.

Ports: ``port_base`` P gives replica i port P + i; 0 takes free ports from the OS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from rayfleet.sim.server import Replica
from rayfleet.sim.spec import EngineSpec


class Running:
    """Started replicas and their runners (stopped with ``stop``)."""

    def __init__(self, replicas: list[Replica], runners: list[web.AppRunner], urls: list[str]):
        self.replicas = replicas
        self.runners = runners
        self.urls = urls

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def start_replicas(
    spec: EngineSpec, num_replicas: int, host: str = "127.0.0.1", port_base: int = 0
) -> Running:
    """Start ``num_replicas`` replicas on the running loop; each listens once this returns."""
    replicas = [Replica(spec, index=i) for i in range(num_replicas)]
    runners, urls = [], []
    for i, replica in enumerate(replicas):
        runner = web.AppRunner(replica.app, access_log=None, handle_signals=False)
        await runner.setup()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port_base + i if port_base else 0))
        await web.SockSite(runner, sock, backlog=1024).start()
        runners.append(runner)
        urls.append(f"http://{host}:{sock.getsockname()[1]}")
    return Running(replicas, runners, urls)


async def restart_in_turn(replicas: list[Replica], every_s: float) -> None:
    """Restart replica 0, 1, ... one every ``every_s`` seconds (the recovery benchmark)."""
    i = 0
    while True:
        await asyncio.sleep(every_s)
        replicas[i % len(replicas)].engine.restart()
        i += 1


async def run_fleet(
    spec: EngineSpec,
    num_replicas: int,
    host: str = "127.0.0.1",
    port_base: int = 0,
    restart_every_s: float = 0.0,
    on_ready: Callable[[list[str]], None] | None = None,
) -> None:
    """Serve a simulated fleet until cancelled."""
    running = await start_replicas(spec, num_replicas, host, port_base)
    (on_ready or _print_urls)(running.urls)
    try:
        if restart_every_s > 0:
            await restart_in_turn(running.replicas, restart_every_s)
        else:
            await asyncio.Event().wait()
    finally:
        await running.stop()


def _print_urls(urls: list[str]) -> None:
    print(json.dumps(urls), flush=True)


class SimFleet:
    """A simulated fleet on a background thread of this process, for tests."""

    def __init__(self, spec: EngineSpec | None = None, num_replicas: int = 1):
        self.spec = spec or EngineSpec()
        self.num_replicas = num_replicas
        self.urls: list[str] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: Running | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SimFleet:
        self._thread.start()
        if not self._ready.wait(timeout=60):
            raise RuntimeError(f"{self.num_replicas} simulated replicas did not start in 60 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._running = await start_replicas(self.spec, self.num_replicas)
        self.urls = self._running.urls
        self._ready.set()
        await self._stop.wait()
        await self._running.stop()

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        assert self._loop is not None, "use SimFleet as a context manager"
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    def stats(self) -> list[dict[str, Any]]:
        """Every replica's ``/simulator/stats``, read on the fleet's loop."""
        assert self._running is not None, "use SimFleet as a context manager"
        replicas = self._running.replicas
        result: list[dict[str, Any]] = self._call(lambda: [r.stats_dict() for r in replicas])
        return result

    def restart(self, index: int) -> None:
        """Restart replica ``index``: cache and counters cleared, start time moved."""
        assert self._running is not None, "use SimFleet as a context manager"
        self._call(self._running.replicas[index].engine.restart)


class SimFleetProcess:
    """``rayfleet sim serve`` in a process of its own, stopped (its whole group) on exit."""

    def __init__(
        self, spec: EngineSpec | None = None, num_replicas: int = 1, restart_every_s: float = 0.0
    ):
        self.spec = spec or EngineSpec()
        self.num_replicas = num_replicas
        self.restart_every_s = restart_every_s
        self.urls: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SimFleetProcess:
        self._spec_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(self.spec.to_dict(), self._spec_file)
        self._spec_file.close()
        argv = [sys.executable, "-m", "rayfleet.sim", "serve", "--spec", self._spec_file.name]
        argv += ["--replicas", str(self.num_replicas), "--port-base", "0"]
        argv += ["--restart-every-s", repr(self.restart_every_s)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the URL line, or "" if it died first
        if not line:
            self.__exit__()
            raise RuntimeError(f"rayfleet sim serve exited ({self.proc.wait()}) before listening")
        self.urls = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        Path(self._spec_file.name).unlink(missing_ok=True)

    def stats(self) -> list[dict[str, Any]]:
        """Every replica's ``/simulator/stats``."""
        return [_get_json(url + "/simulator/stats") for url in self.urls]

    def restart(self, index: int) -> None:
        request = urllib.request.Request(self.urls[index] + "/simulator/restart", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data
