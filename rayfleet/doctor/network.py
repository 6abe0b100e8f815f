"""Bandwidth and round-trip time between every pair of nodes, over real TCP.

One ``LinkPeer`` actor is pinned to each node. For each pair, the destination listens on
its node's IP and the source measures: first a ping-pong of small messages (round-trip
time), then one TCP stream for at most ``seconds`` or ``max_bytes`` (bandwidth, counted
by the receiver). Pairs that share no node are measured at the same time: disjoint links
do not slow each other down on a real network.

The numbers are stored in ``$RAYFLEET_HOME/doctor/network.json`` for the planner::

    {"measured_at": "<iso time>", "pairs": [{"src_node": "...", "dst_node": "...",
     "src_ip": "...", "dst_ip": "...", "gbps": 12.3, "rtt_ms": 0.2}]}

One entry per unordered pair of nodes (links are taken as symmetric).
"""

from __future__ import annotations

import datetime
import json
import socket
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rayfleet.doctor.needs import FleetNeeds
from rayfleet.doctor.result import CheckResult, Node, Status

CHUNK_BYTES = 1024 * 1024
NUM_PINGS = 20
WARN_GBPS = 10.0
FAIL_GBPS = 1.0
_PING, _BULK = b"P", b"B"


@dataclass(frozen=True)
class LinkMeasurement:
    src_node: str
    dst_node: str
    src_ip: str
    dst_ip: str
    gbps: float
    rtt_ms: float


class LinkPeer:
    """One end of the link tests: serves ping and bulk connections, and measures to others.

    Plain Python (standard library only); the doctor wraps it as a Ray actor pinned to a
    node, and the unit tests run it in-process on loopback.
    """

    def __init__(self, io_timeout_s: float = 10.0) -> None:
        self._io_timeout_s = io_timeout_s
        self._server: socket.socket | None = None

    def listen(self, host: str | None = None) -> tuple[str, int]:
        """Listen on ``host`` (default: this Ray node's IP) on a free port; return (ip, port)."""
        if host is None:
            import ray

            host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, 0))
        server.listen(8)
        self._server = server
        threading.Thread(target=self._serve, daemon=True).start()
        return host, server.getsockname()[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def measure(self, host: str, port: int, seconds: float, max_bytes: int) -> dict[str, float]:
        """Round-trip time and one-stream bandwidth from here to a peer listening at host:port."""
        return {
            "rtt_ms": self._rtt_ms(host, port),
            "gbps": self._gbps(host, port, seconds, max_bytes),
        }

    def _connect(self, host: str, port: int, mode: bytes) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=self._io_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(mode)
        return sock

    def _rtt_ms(self, host: str, port: int) -> float:
        with self._connect(host, port, _PING) as sock:
            samples = []
            for index in range(NUM_PINGS):
                started = time.perf_counter()
                sock.sendall(struct.pack("!Q", index))
                _recv_exact(sock, 8)
                samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1000

    def _gbps(self, host: str, port: int, seconds: float, max_bytes: int) -> float:
        payload = b"\0" * CHUNK_BYTES
        with self._connect(host, port, _BULK) as sock:
            started = time.perf_counter()
            sent = 0
            while sent < max_bytes and time.perf_counter() - started < seconds:
                sock.sendall(payload)
                sent += len(payload)
            sock.shutdown(socket.SHUT_WR)
            received: int = struct.unpack("!Q", _recv_exact(sock, 8))[0]
            elapsed = time.perf_counter() - started
        return received * 8 / elapsed / 1e9

    def _serve(self) -> None:
        while self._server is not None:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(self._io_timeout_s)
        with conn:
            try:
                mode = _recv_exact(conn, 1)
                if mode == _PING:
                    while message := _recv_exact(conn, 8, eof_ok=True):
                        conn.sendall(message)
                elif mode == _BULK:
                    received = 0
                    while chunk := conn.recv(CHUNK_BYTES):
                        received += len(chunk)
                    conn.sendall(struct.pack("!Q", received))
            except OSError:
                return


def _recv_exact(sock: socket.socket, size: int, eof_ok: bool = False) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            if eof_ok and not data:
                return b""
            raise ConnectionError("peer closed the connection")
        data += chunk
    return data


def pair_rounds(node_ids: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Every unordered pair exactly once, in rounds where no node appears twice."""
    ids = list(node_ids)
    if len(ids) % 2:
        ids.append("")  # a bye
    rounds = []
    for _ in range(len(ids) - 1):
        half = len(ids) // 2
        pairs = [(ids[i], ids[-1 - i]) for i in range(half)]
        rounds.append([p for p in pairs if p[0] and p[1]])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return [r for r in rounds if r]


def judge_link(link: LinkMeasurement, needs: FleetNeeds) -> tuple[Status, str]:
    cross = needs.cross_node_models
    if link.gbps < FAIL_GBPS and cross:
        return Status.FAIL, (
            f"{', '.join(cross)} span nodes and need a faster link: keep each "
            "replica on one node (pipeline parallel or independent replicas)"
        )
    if link.gbps < WARN_GBPS:
        return Status.WARN, (
            "under 10 Gbit/s: cross-node tensor parallelism will be slow; use "
            "pipeline parallel across nodes or independent replicas"
        )
    return Status.OK, ""


def link_result(src: Node, dst: Node, link: LinkMeasurement, needs: FleetNeeds) -> CheckResult:
    status, fix = judge_link(link, needs)
    value = f"{link.gbps:.1f} Gbit/s, rtt {link.rtt_ms:.2f} ms"
    return CheckResult(f"{src.label} -> {dst.label}", "network", status, value, fix)


def network_file() -> Path:
    from rayfleet._home import rayfleet_home

    return rayfleet_home() / "doctor" / "network.json"


def save_links(links: Sequence[LinkMeasurement], path: Path | None = None) -> Path:
    """Write the measured links where ``rayfleet plan --from-cluster`` reads them."""
    path = path or network_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "pairs": [
            {**asdict(link), "gbps": round(link.gbps, 3), "rtt_ms": round(link.rtt_ms, 4)}
            for link in links
        ],
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    temporary.replace(path)
    return path
