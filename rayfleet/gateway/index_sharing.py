"""The prefix index across the gateway's worker processes (``gateway.workers``).

Each worker routes with an index of its own (prefix_routing.py). What a pick teaches
it (replica R now holds blocks h1..hk) is sent to every other worker, which records
the same: so a worker that never saw a conversation's first turn still sends its
second turn where the first one went::

    share = IndexShare(run_dir, worker, num_workers, gateway)
    share.start()            binds <run_dir>/index-<worker>.sock (a Unix datagram socket)
                             and hooks every prefix policy's ``on_learn``
    ... picks: learned(model, replica, hashes) -> batched, sent once per loop turn
    ... peers' datagrams: PrefixRouting.learn_from_peer(replica, hashes)
    share.close()

A datagram holds records of (model, replica id, block hashes as int64), at most
``MAX_DATAGRAM`` bytes, and a record at most ``MAX_HASHES`` hashes (a longer prompt's
first ones). The hashes agree across workers because every worker runs with the same
``PYTHONHASHSEED`` (workers.py). Sending never blocks: a peer that is not listening
(starting, replaced) or whose queue is full misses the update, and learns that prefix
from its own next pick of it instead. On loopback a record arrives well within a
millisecond, faster than the next turn of a chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.replicas import Replica

if TYPE_CHECKING:
    from rayfleet.gateway.app import Gateway

log = logging.getLogger("rayfleet.gateway")

MAX_DATAGRAM = 60 * 1024
MAX_HASHES = 4096
_HEADER = struct.Struct("!HHI")  # model bytes, replica id bytes, number of hashes


def socket_path(run_dir: Path, worker: int) -> Path:
    return run_dir / f"index-{worker}.sock"


def encode(model: str, replica_id: str, hashes: Sequence[int]) -> bytes:
    name, rid = model.encode(), replica_id.encode()
    packed = array("q", hashes[:MAX_HASHES]).tobytes()
    return _HEADER.pack(len(name), len(rid), len(packed) // 8) + name + rid + packed


def decode(datagram: bytes) -> list[tuple[str, str, array[int]]]:
    records = []
    at = 0
    while at + _HEADER.size <= len(datagram):
        name_len, rid_len, count = _HEADER.unpack_from(datagram, at)
        at += _HEADER.size
        model = datagram[at : at + name_len].decode()
        at += name_len
        rid = datagram[at : at + rid_len].decode()
        at += rid_len
        hashes = array("q")
        hashes.frombytes(datagram[at : at + 8 * count])
        at += 8 * count
        records.append((model, rid, hashes))
    return records


class IndexShare:
    """Sends this worker's index updates to its peers and records theirs."""

    def __init__(self, run_dir: Path, worker: int, num_workers: int, gateway: Gateway):
        self.path = socket_path(run_dir, worker)
        self.peers = [str(socket_path(run_dir, w)) for w in range(num_workers) if w != worker]
        self.gateway = gateway
        self._sock: socket.socket | None = None
        self._pending: list[bytes] = []
        self._flush_scheduled = False
        self.num_sent = 0
        self.num_received = 0
        self.num_dropped = 0

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(str(self.path))
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)
        self.hook()

    def hook(self) -> None:
        """Hook every prefix policy of the gateway (again after ``rayfleet apply``)."""
        for model, policy in self.gateway.dispatcher.replica_policies.items():
            inner = getattr(policy, "policy", policy)
            if isinstance(inner, PrefixRouting):
                inner.on_learn = self._learner(model)

    def _learner(self, model: str):  # type: ignore[no-untyped-def]
        def learned(replica: Replica, hashes: list[int]) -> None:
            self._pending.append(encode(model, replica.replica_id, hashes))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

        return learned

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        batch = bytearray()
        for record in pending:
            if batch and len(batch) + len(record) > MAX_DATAGRAM:
                self._send(bytes(batch))
                batch.clear()
            batch += record
        if batch:
            self._send(bytes(batch))

    def _send(self, datagram: bytes) -> None:
        if self._sock is None:
            return
        for peer in self.peers:
            try:
                self._sock.sendto(datagram, peer)
                self.num_sent += 1
            except OSError:  # not listening yet, replaced, or its queue is full
                self.num_dropped += 1

    def _receive(self) -> None:
        assert self._sock is not None
        while True:
            try:
                datagram = self._sock.recv(MAX_DATAGRAM + 1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("index sharing: %s", exc)
                return
            self.num_received += 1
            self._apply(datagram)

    def _apply(self, datagram: bytes) -> None:
        policies = self.gateway.dispatcher.replica_policies
        replicas = {r.replica_id: r for r in self.gateway.replica_set.replicas()}
        for model, replica_id, hashes in decode(datagram):
            policy = policies.get(model)
            inner = getattr(policy, "policy", policy)
            replica = replicas.get(replica_id)
            if isinstance(inner, PrefixRouting) and replica is not None:
                inner.learn_from_peer(replica, hashes)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
