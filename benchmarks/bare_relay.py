"""A bare HTTP/1.1 relay: the control for the gateway's CPU per request, not a gateway.

    with BareRelayProcess(replica_urls, cpu=0) as relay:   # relay.url, relay.cpu_times()
        ...

What any Python process pays to pass a request and its streamed answer between two
sockets on this machine, with the gateway's own tools (uvloop, httptools) and nothing
else: no JSON, no routing policy beyond round robin, no limits, metrics, logs or retries.
Each client connection's request is found whole by httptools and written, as it came, to a
kept connection to the next replica in turn; every read of the replica's answer goes to
the client as it came, in one write; the answer's end (httptools again) frees the replica
connection for the next request. It assumes what the benchmark client does: one request
at a time on a connection (a pipelined request is not handled), and replicas that keep
their connections alive. A request httptools cannot parse closes the connection.

gateway_scaling.py runs it beside the gateway (``--kinds rayfleet,bare``): its CPU per
request is the floor the gateway's is measured against, and how that floor grows with N
copies running at once, each on a core of its own, is the machine's part of the gateway's
scaling.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import sys
from urllib.parse import urlsplit

import httptools
import uvloop
from child_server import start_server, stop_server


class ReplicaConnection(asyncio.Protocol):
    """A kept connection to one replica; while it carries a request, what it reads goes
    to ``client``."""

    def __init__(self, relay: Relay, address: tuple[str, int]):
        self.relay, self.address = relay, address
        self.transport: asyncio.Transport | None = None
        self.client: ClientConnection | None = None
        self._parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is not None and client.transport is not None:
            client.transport.write(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.relay.idle[self.address].append(self)
        if client is not None:
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        with contextlib.suppress(ValueError):
            self.relay.idle[self.address].remove(self)
        if self.client is not None:
            self.client.close()


class ClientConnection(asyncio.Protocol):
    """One client connection: its requests, one at a time, to the replicas in turn."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._request = bytearray()
        self._complete = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._request += data
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()
            return
        if self._complete:
            request, self._request, self._complete = bytes(self._request), bytearray(), False
            self.relay.send(request, self)

    def on_message_complete(self) -> None:
        self._complete = True

    def answered(self) -> None:
        if self.transport is not None and not self._parser.should_keep_alive():
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class Relay:
    """The replicas in turn, and each one's idle connections."""

    def __init__(self, urls: list[str]):
        addresses = []
        for url in urls:
            parts = urlsplit(url)
            addresses.append((parts.hostname or "127.0.0.1", parts.port or 80))
        self.idle: dict[tuple[str, int], list[ReplicaConnection]] = {a: [] for a in addresses}
        self._turn = itertools.cycle(addresses)
        self._loop = asyncio.get_running_loop()

    def send(self, request: bytes, client: ClientConnection) -> None:
        address = next(self._turn)
        idle = self.idle[address]
        if idle:
            self._write(idle.pop(), request, client)
        else:
            self._loop.create_task(self._connect_and_send(address, request, client))

    async def _connect_and_send(
        self, address: tuple[str, int], request: bytes, client: ClientConnection
    ) -> None:
        try:
            _, replica = await self._loop.create_connection(
                lambda: ReplicaConnection(self, address), *address
            )
        except OSError:
            client.close()
            return
        self._write(replica, request, client)

    @staticmethod
    def _write(replica: ReplicaConnection, request: bytes, client: ClientConnection) -> None:
        if replica.transport is None:
            client.close()
            return
        replica.client = client
        replica.transport.write(request)


async def serve(urls: list[str], listener: socket.socket) -> None:
    relay = Relay(urls)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientConnection(relay), sock=listener)
    print(listener.getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


class BareRelayProcess:
    """The relay in a process of its own, on ``cpu`` when given; ``url`` once started."""

    def __init__(self, urls: list[str], cpu: int | None = None):
        self.urls, self.cpu = urls, cpu
        self.url = ""
        self.pid = 0

    def __enter__(self) -> BareRelayProcess:
        cpu = str(self.cpu) if self.cpu is not None else ""
        argv = [sys.executable, __file__, json.dumps(self.urls), cpu]
        self.proc, line = start_server(argv, "the bare relay")
        self.url = f"http://127.0.0.1:{int(line)}"
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        stop_server(self.proc)

    def cpu_times(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the relay so far."""
        import psutil

        times = psutil.Process(self.pid).cpu_times()
        return times.user, times.system


def main() -> None:
    urls, cpu = json.loads(sys.argv[1]), sys.argv[2]
    if cpu:
        os.sched_setaffinity(0, {int(cpu)})
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    uvloop.run(serve(urls, listener))


if __name__ == "__main__":
    main()
