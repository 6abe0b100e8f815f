"""``gateway.workers: N``: N gateway processes serving one port, one fleet behind them.

One gateway process saturates its core near 3,500 requests a second (README). With
``workers`` above 1 the fleet process stops serving clients itself and becomes the
workers' control; N worker processes (worker_process.py) serve the port::

    fleet process (rayfleet up)                  worker i of N (spawned)
      holds the port: bound with SO_REUSEPORT,      binds the port with SO_REUSEPORT and
        never listening                             listens: the kernel spreads new
      membership from the registry, scaler,         connections over the N workers
        drain, admin endpoints, /rayfleet/status  <- passes /metrics, /rayfleet/* asked
        on <run dir>/control.sock                   over TCP to the control socket
      gives each replica and each model a slot  -> GET /rayfleet/internal/membership
        in the shared counts                        each poll: replicas with slots
      /metrics: its own series folded with      <- <run dir>/worker-i.sock: /metrics
        every worker's (metrics_merge.py)
      restarts a worker that died (its row of
        the counts zeroed first)

What must agree across workers, and how:
- **in-flight counts**: shared memory, a row per worker and a column per replica
  (shared_state.py). Every policy's load (least_load, prefix, session's bound) and the
  autoscaler's gateway signal see the sum over workers, at most ``REFRESH_S`` old for
  the other workers' part; requests held for a replica are counted the same way;
- **API-key quotas**: each key's buckets and in-flight count in shared memory, changed
  under one lock, so a key's rate, tokens and concurrency hold over all workers;
- **the prefix index**: each worker's picks are sent to the others over Unix datagrams
  (index_sharing.py); every worker runs with the same ``PYTHONHASHSEED`` so that their
  block hashes agree;
- **membership and draining**: every worker polls the fleet process each
  ``poll_interval_s``, as one gateway polls the registry; a draining replica is out of
  every worker's rotation within one poll (control/drain.py waits longer than that);
- **the replicas' /metrics**: read by the fleet process alone, every 5 s as one gateway
  reads them (replica_gauges.py); the membership answer carries each replica's KV cache
  size, by which the workers size their prefix indexes.

``rayfleet apply`` gives the workers the new file: the membership answer carries the
file's generation, and a worker that sees a new one fetches it
(``/rayfleet/internal/config``) and reconfigures as one gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rayfleet.gateway.metrics_merge import read_metrics
from rayfleet.gateway.shared_state import (
    NUM_SLOTS,
    REFRESH_S,
    Columns,
    QuotaCells,
    SharedCounts,
)

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from rayfleet.config import FleetConfig
    from rayfleet.gateway.app import Gateway, Route
    from rayfleet.gateway.replicas import Entry

log = logging.getLogger("rayfleet.gateway")

FORWARDED_FOR = "x-rayfleet-forwarded-for"  # a worker passing a request on: the client
WORKER_HEADER = "x-rayfleet-worker"  # on every answer of a worker: its number
MEMBERSHIP_PATH = "/rayfleet/internal/membership"
CONFIG_PATH = "/rayfleet/internal/config"
_WATCH_S = 1.0
_STOP_TIMEOUT_S = 30.0

EntrySource = Callable[[], Awaitable[list["Entry"]]]


def control_socket(run_dir: Path) -> Path:
    return run_dir / "control.sock"


def worker_socket(run_dir: Path, worker: int) -> Path:
    return run_dir / f"worker-{worker}.sock"


class WorkerPool:
    """The worker processes of one fleet, run from the fleet process's event loop."""

    def __init__(
        self,
        config: FleetConfig,
        *,
        hold_s: dict[str, float],
        forwarded: list[tuple[str, str]],
        access_log: Path | None,
        log_requests: bool = True,
    ):
        """``access_log``: the file of one JSON line per request (None: standard
        output), unless ``log_requests`` is false."""
        self.config = config
        self.log_requests = log_requests
        self.num_workers = config.gateway.workers
        self.hold_s = dict(hold_s)
        self.forwarded = list(forwarded)
        self.access_log = str(access_log) if access_log is not None else None
        self.run_dir = Path(tempfile.mkdtemp(prefix="rayfleet-gateway-"))
        os.chmod(self.run_dir, 0o700)
        self.counts = SharedCounts.create(self.num_workers, NUM_SLOTS)
        self._context = multiprocessing.get_context("spawn")
        self._lock = self._context.Lock()
        self.generation = 0
        self.quotas = self._quota_cells(config)
        self._old_quotas: list[QuotaCells] = []
        self._hash_seed = str(random.randrange(1, 2**32))
        self.columns = Columns(self.counts)
        self._entries: list[Entry] = []
        self._version = 0  # of the membership, one more at each registry poll
        self._applied: dict[int, int] = {}  # worker -> the version it last applied
        self._processes: list[BaseProcess | None] = [None] * self.num_workers
        self._watcher: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._stopping = False
        self.num_restarts = 0

    @property
    def control_path(self) -> str:
        return str(control_socket(self.run_dir))

    def internal_routes(self) -> list[Route]:
        """The endpoints the workers call, served on the control socket only."""
        return [("GET", MEMBERSHIP_PATH, self._membership), ("GET", CONFIG_PATH, self._config)]

    def slotted(self, source: EntrySource) -> EntrySource:
        """``source`` (the registry's entries) with each replica's slot in the counts."""

        async def entries() -> list[Entry]:
            fresh = await source()
            self._entries = self.columns.assign(fresh)
            self._version += 1
            return self._entries

        return entries

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, gateway: Gateway) -> None:
        """Share the counts with ``gateway`` (the fleet process's view) and start every
        worker; ``wait_listening`` then says whether all of them serve."""
        gateway.replica_set.shared = self.counts
        gateway.metrics_peers = self.metrics_of_workers
        self._gateway = gateway
        for worker in range(self.num_workers):
            self._spawn(worker)
        self._refresher = asyncio.create_task(self._refresh())

    async def wait_listening(self, timeout_s: float) -> list[int]:
        """Wait until every worker serves (its local socket is up); the workers that did
        not within ``timeout_s`` or exited first (empty when all serve)."""
        deadline = time.monotonic() + timeout_s
        while True:
            missing = [
                w for w in range(self.num_workers) if not worker_socket(self.run_dir, w).exists()
            ]
            exited = [w for w in missing if not self._alive(w)]
            if not missing and self._watcher is None:
                # From now on a worker that dies is started again.
                self._watcher = asyncio.create_task(self._watch())
            if not missing or exited or time.monotonic() >= deadline:
                return missing
            await asyncio.sleep(0.1)

    async def wait_synced(self, timeout_s: float) -> bool:
        """Wait until every worker routes by the membership this process has now (so
        that a fleet reported ready is ready on every worker); False after ``timeout_s``."""
        target = self._version
        deadline = time.monotonic() + timeout_s
        while any(self._applied.get(w, -1) < target for w in range(self.num_workers)):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _alive(self, worker: int) -> bool:
        process = self._processes[worker]
        return process is not None and process.is_alive()

    async def stop(self) -> None:
        """Stop every worker (each finishes the requests it has), then free the memory."""
        self._stopping = True
        for task in (self._watcher, self._refresher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        processes = [p for p in self._processes if p is not None]
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the worker stops accepting, then ends
        await asyncio.to_thread(_join_all, processes, _STOP_TIMEOUT_S)
        self.counts.close()
        for cells in [self.quotas, *self._old_quotas]:
            if cells is not None:
                cells.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def reconfigure(self, config: FleetConfig, hold_s: dict[str, float]) -> None:
        """A new fleet file (``rayfleet apply``): the workers take it at their next poll."""
        self.config = config
        self.hold_s = dict(hold_s)
        if self.quotas is not None:
            self._old_quotas.append(self.quotas)
        self.generation += 1
        self.quotas = self._quota_cells(config)

    def report(self) -> dict[str, Any]:
        """For /rayfleet/status: the workers' pids and how often one was replaced."""
        pids = [p.pid if p is not None and p.is_alive() else None for p in self._processes]
        return {"workers": self.num_workers, "pids": pids, "restarts": self.num_restarts}

    # -- the workers ----------------------------------------------------------------------

    def _spawn(self, worker: int) -> None:
        from rayfleet.gateway.worker_process import WorkerSpec, run_worker

        spec = WorkerSpec(
            index=worker,
            num_workers=self.num_workers,
            config=self.config,
            host=self.config.gateway.host,
            port=self.config.gateway.port,
            run_dir=str(self.run_dir),
            counts=self.counts.spec,
            quotas=self.quotas.spec if self.quotas is not None else None,
            lock=self._lock,
            generation=self.generation,
            hold_s=self.hold_s,
            forwarded=self.forwarded,
            access_log=self.access_log,
            log_requests=self.log_requests,
        )
        # The block hashes of the prefix index must agree between workers.
        before = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = self._hash_seed
        try:
            process = self._context.Process(
                target=run_worker, args=(spec,), name=f"rayfleet-gateway-{worker}", daemon=True
            )
            process.start()
        finally:
            if before is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = before
        self._processes[worker] = process

    async def _watch(self) -> None:
        """Start again a worker that died; the requests it carried died with it."""
        while True:
            await asyncio.sleep(_WATCH_S)
            for worker, process in enumerate(self._processes):
                if self._stopping or process is None or process.is_alive():
                    continue
                log.warning(
                    "gateway worker %d (pid %s) exited with %s; starting it again",
                    worker,
                    process.pid,
                    process.exitcode,
                )
                self.counts.zero_row(worker)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(worker_socket(self.run_dir, worker))
                self.num_restarts += 1
                self._spawn(worker)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S * 10)  # the scaler and status read these
            self._gateway.replica_set.refresh_shared()

    async def metrics_of_workers(self) -> list[bytes]:
        """Each worker's own /metrics (those that answer), for the fleet's /metrics."""
        paths = [str(worker_socket(self.run_dir, w)) for w in range(self.num_workers)]
        return await read_metrics(paths)

    # -- what the workers ask -----------------------------------------------------------

    async def _membership(self, request: web.Request) -> web.Response:
        with contextlib.suppress(KeyError, ValueError):
            self._applied[int(request.query["worker"])] = int(request.query["applied"])
        models = [m.name for m in self.config.models]
        waiting = {m: self.columns.of(f"model:{m}") for m in models}
        body = {
            "entries": self._entries,
            "waiting_slots": waiting,
            "generation": self.generation,
            "version": self._version,
            "engines": self._engines(),
        }
        return web.json_response(body)

    def _engines(self) -> dict[str, dict[str, float | None]]:
        """Each replica's KV cache size in tokens and start time, as this process last
        read them from the replica's /metrics: the workers size their prefix indexes by
        the one and empty them when the other moves."""
        gauges = self._gateway.replica_gauges
        readings = gauges.readings.items() if gauges is not None else ()
        return {
            replica_id: {"kv_cache_tokens": stats.kv_cache_tokens, "start_time": stats.start_time}
            for (_, replica_id), stats in readings
            if stats is not None
        }

    async def _config(self, _request: web.Request) -> web.Response:
        quotas = self.quotas.spec if self.quotas is not None else None
        payload = pickle.dumps((self.generation, self.config, quotas, self.hold_s))
        return web.Response(body=payload, content_type="application/octet-stream")

    def _quota_cells(self, config: FleetConfig) -> QuotaCells | None:
        keys = config.gateway.api_keys
        if not keys:
            return None
        capacities = [
            (float(k.requests_per_minute or 0), float(k.tokens_per_minute or 0)) for k in keys
        ]
        return QuotaCells.create(capacities, self._lock)


def _join_all(processes: list[BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5.0)
