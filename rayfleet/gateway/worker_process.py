"""One worker process of ``gateway.workers`` (workers.py has the whole picture).

``run_worker(spec)`` is the process's target::

    attach the shared counts (its own row) and the keys' quota cells
    Gateway(models of the file, membership polled from the fleet process,
            policies of the file with the shared quotas)
    listen on gateway.host:port with SO_REUSEPORT, and on <run dir>/worker-<i>.sock
        (where the fleet process reads this worker's /metrics)
    share what its prefix picks learn with the other workers (index_sharing.py)
    every REFRESH_S: each replica's in flight summed over the workers
    each membership poll: the KV cache size of each replica that the fleet process read
        from its /metrics, for the prefix index (workers do not read the replicas'
        /metrics themselves: N workers would multiply that load on every vLLM by N)
    ... until SIGTERM (the fleet stopping it) or the fleet process is gone ...
    stop accepting, finish what it carries, exit

/metrics, /rayfleet/status and the fleet's admin endpoints asked of it over TCP are
passed to the fleet process, so that a client gets one answer whichever worker its
connection reached. SIGINT is ignored: a Ctrl-C reaches the whole process group, and
the fleet process stops its workers in its own order.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pickle
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from rayfleet.gateway.shared_state import (
    REFRESH_S,
    CountsSpec,
    QuotaCells,
    QuotaSpec,
    SharedCounts,
)
from rayfleet.gateway.workers import (
    CONFIG_PATH,
    FORWARDED_FOR,
    MEMBERSHIP_PATH,
    WORKER_HEADER,
    control_socket,
    worker_socket,
)

if TYPE_CHECKING:
    from rayfleet.config import FleetConfig
    from rayfleet.gateway.app import Gateway, Route
    from rayfleet.gateway.line_writer import LineWriter
    from rayfleet.gateway.policies import Policies
    from rayfleet.gateway.replicas import Entry

log = logging.getLogger("rayfleet.gateway")

_PR_SET_PDEATHSIG = 1
_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass
class WorkerSpec:
    """What a worker process is started with (pickled into it)."""

    index: int
    num_workers: int
    config: FleetConfig
    host: str
    port: int
    run_dir: str
    counts: CountsSpec
    quotas: QuotaSpec | None
    lock: Any  # the quotas' lock, a multiprocessing lock passed as the worker is spawned
    generation: int
    hold_s: dict[str, float]
    forwarded: list[tuple[str, str]]  # (method, path) of the fleet's admin endpoints
    access_log: str | None  # None: standard output
    log_requests: bool
    poll_interval_s: float = 1.0
    parent_pid: int = field(default_factory=os.getpid)


def run_worker(spec: WorkerSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    logging.basicConfig(level=logging.WARNING, format=f"gateway worker {spec.index}: %(message)s")
    try:
        import uvloop

        uvloop.run(_serve(spec))
    except ImportError:
        asyncio.run(_serve(spec))


def _exit_with_parent() -> None:
    """SIGTERM when the fleet process dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Worker:
    """One worker: its gateway, its link to the fleet process, its shared state."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.run_dir = Path(spec.run_dir)
        self.counts = SharedCounts.attach(spec.counts, spec.index)
        self.generation = spec.generation
        self.applied = -1  # the membership version last applied
        self.quotas = self._attach_quotas(spec.quotas)
        connector = aiohttp.UnixConnector(path=str(control_socket(self.run_dir)))
        self.control = aiohttp.ClientSession(connector=connector)
        self.gateway = self._gateway(spec.config, self._policies(spec.config, self.quotas))

    def _attach_quotas(self, spec: QuotaSpec | None) -> QuotaCells | None:
        return QuotaCells.attach(spec, self.spec.lock) if spec is not None else None

    def _policies(self, config: FleetConfig, quotas: QuotaCells | None) -> Policies:
        from rayfleet.gateway.policies import Policies

        return Policies.from_fleet(config, quotas=quotas)

    def _gateway(self, config: FleetConfig, policies: Policies) -> Gateway:
        from rayfleet.gateway.app import Gateway

        forwarded: list[Route] = [(m, p, self.forward) for m, p in self.spec.forwarded]
        gateway = Gateway(
            [m.name for m in config.models],
            self.membership,
            connect_timeout_s=config.gateway.connect_timeout_s,
            request_timeout_s=config.gateway.request_timeout_s,
            http_front=config.gateway.http_front == "rayfleet",
            poll_interval_s=self.spec.poll_interval_s,
            policies=policies,
            hold_s=self.spec.hold_s,
            extra_routes=forwarded,
            control=self.forward,
            replica_metrics_period_s=None,  # the fleet process reads them (membership)
        )
        gateway.replica_set.shared = self.counts
        gateway.response_headers[WORKER_HEADER] = str(self.spec.index)
        return gateway

    async def membership(self) -> list[Entry]:
        """The replicas, with their slots, as the fleet process sees them."""
        if os.getppid() != self.spec.parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)  # the fleet process is gone
        timeout = aiohttp.ClientTimeout(total=5.0)
        # ``applied``: the version of the last answer, which the gateway applied right
        # after this call returned it (the fleet process waits for it before "ready").
        query = {"worker": str(self.spec.index), "applied": str(self.applied)}
        url = "http://fleet" + MEMBERSHIP_PATH
        async with self.control.get(url, params=query, timeout=timeout) as r:
            r.raise_for_status()
            body: dict[str, Any] = await r.json()
        self.applied = body["version"]
        self.gateway.replica_set.waiting_slots = body["waiting_slots"]
        observe_engines(self.gateway, body.get("engines", {}))
        if body["generation"] != self.generation:
            try:
                await self._reconfigure()
            except Exception:  # membership goes on; the next poll tries again
                log.exception("could not take the fleet's new file")
        entries: list[Entry] = body["entries"]
        return entries

    async def _reconfigure(self) -> None:
        async with self.control.get("http://fleet" + CONFIG_PATH) as r:
            r.raise_for_status()
            generation, config, quota_spec, hold_s = pickle.loads(await r.read())
        self.quotas = self._attach_quotas(quota_spec)
        policies = await asyncio.to_thread(self._policies, config, self.quotas)
        await self.gateway.reconfigure([m.name for m in config.models], policies, hold_s)
        self.generation = generation
        self.share.hook()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """Pass a request to the fleet process and its answer back."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers[FORWARDED_FOR] = request.remote or ""
        body = await request.read()
        try:
            async with self.control.request(
                request.method, "http://fleet" + request.path_qs, data=body, headers=headers
            ) as r:
                payload = await r.read()
                kept = {k: v for k, v in r.headers.items() if k.lower() not in _HOP_HEADERS}
                return web.Response(body=payload, status=r.status, headers=kept)
        except (aiohttp.ClientError, OSError) as exc:
            from rayfleet.gateway.errors import openai_error

            return openai_error(503, f"the fleet process did not answer: {exc}")

    async def serve(self) -> None:
        from rayfleet.gateway.index_sharing import IndexShare
        from rayfleet.gateway.server import listen, start_gateway

        spec = self.spec
        sock = listen(spec.host, spec.port, reuse_port=True)
        local = worker_socket(self.run_dir, spec.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local)
        handler = _open_access_log(spec.access_log) if spec.log_requests else None
        self.share = IndexShare(self.run_dir, spec.index, spec.num_workers, self.gateway)
        self.share.start()
        runner = await start_gateway(self.gateway, spec.host, spec.port, sock, unix_path=str(local))
        refresher = asyncio.create_task(self._refresh())
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            await stop.wait()
        finally:
            refresher.cancel()
            self.share.close()
            await runner.cleanup()
            await self.control.close()
            if handler is not None:
                from rayfleet.gateway.access_log import close_access_log

                close_access_log(handler)
            self.counts.close()

    async def _refresh(self) -> None:
        replica_set = self.gateway.replica_set
        while True:
            await asyncio.sleep(REFRESH_S)
            replica_set.refresh_shared()


def observe_engines(gateway: Gateway, engines: dict[str, dict[str, Any]]) -> None:
    """Pass each replica's prefix policy what the fleet process read from its /metrics
    (by replica id: ``kv_cache_tokens``, ``start_time``); replicas this worker does not
    know yet are told at a later poll."""
    from rayfleet.gateway.routing import observe_engine

    policies = gateway.dispatcher.replica_policies
    for replica in gateway.replica_set.replicas():
        engine = engines.get(replica.replica_id, {})
        observe_engine(
            policies.get(replica.model),
            replica,
            engine.get("kv_cache_tokens"),
            engine.get("start_time"),
        )


def _open_access_log(path: str | None) -> LineWriter:
    from rayfleet.gateway.access_log import open_access_log

    return open_access_log(Path(path) if path is not None else None)


async def _serve(spec: WorkerSpec) -> None:
    await Worker(spec).serve()
