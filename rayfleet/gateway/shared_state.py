"""What the serving processes of ``gateway.workers: N`` share, in shared memory.

Two blocks, made by the fleet process (``create``) and attached by each worker
(``attach``), named in a ``PlaneSpec`` that pickles::

    counts = SharedCounts.create(num_rows=N, num_slots=S)    # the fleet process
    counts = SharedCounts.attach(spec, row=i)                 # worker i
    counts.add(slot, +1) ... counts.add(slot, -1)             # worker i's own row only
    counts.total(slot)                                        # every worker's, summed
    Columns(counts).assign(entries)   # the fleet process: a column per replica, in "slot"

``SharedCounts`` is an int64 table with one row per worker and one column per slot.
The fleet process gives each replica a slot (its requests in flight) and each model one
(requests held waiting for a replica), and sends them with the membership. A worker
writes only its own row, so no lock is needed; a row is zeroed when its worker is
replaced. Each worker's ``Replica.num_inflight`` is its own count kept exact plus the
others' as summed every ``REFRESH_S`` (ReplicaSet.refresh_shared): every policy's load
then counts the whole gateway's work.

``QuotaCells`` holds ``KEY_CELLS`` doubles per API key (request bucket level and time,
token bucket level and time, requests in flight), changed under one lock that every
worker holds a handle of (``OrphanSafeLock``: a worker killed while holding it cannot
stop the others). The buckets' times are ``time.monotonic()``, one clock for
every process of a machine. A new block is made for each version of the file (``rayfleet
apply`` rebuilds the keys, as it does in one process).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfleet.gateway.replicas import Entry

NUM_SLOTS = 4096  # replicas and models the counts can hold at once
REFRESH_S = 0.005  # how often a worker sums the other workers' counts
STALE_LOCK_S = 0.2  # a quota lock held this long was held by a worker that died
KEY_CELLS = 5  # request level, request time, token level, token time, in flight
_INT64 = 8
_DOUBLE = 8


@dataclass(frozen=True)
class CountsSpec:
    name: str
    num_rows: int
    num_slots: int


class SharedCounts:
    """Counts per slot, one row per worker; see the module's docstring."""

    def __init__(self, block: shared_memory.SharedMemory, spec: CountsSpec, row: int | None):
        self.spec = spec
        self._block = block
        self._table = _buffer(block).cast("q")
        self._rows = [
            self._table[r * spec.num_slots : (r + 1) * spec.num_slots] for r in range(spec.num_rows)
        ]
        self._mine = self._rows[row] if row is not None else None
        self._owner = row is None

    @classmethod
    def create(cls, num_rows: int, num_slots: int) -> SharedCounts:
        block = shared_memory.SharedMemory(create=True, size=num_rows * num_slots * _INT64)
        _buffer(block)[:] = bytes(block.size)
        return cls(block, CountsSpec(block.name, num_rows, num_slots), None)

    @classmethod
    def attach(cls, spec: CountsSpec, row: int) -> SharedCounts:
        return cls(_attach(spec.name), spec, row)

    def add(self, slot: int, delta: int) -> None:
        """Count ``delta`` in this worker's row (not the fleet process's: it has none)."""
        assert self._mine is not None
        self._mine[slot] += delta

    def total(self, slot: int) -> int:
        return sum(row[slot] for row in self._rows)

    def column_is_zero(self, slot: int) -> bool:
        return all(row[slot] == 0 for row in self._rows)

    def zero_row(self, row: int) -> None:
        """Forget a worker's counts: it was replaced, and its requests went with it."""
        cells = self._rows[row]
        for slot in range(self.spec.num_slots):
            cells[slot] = 0

    def close(self) -> None:
        _close(self._block, [*self._rows, self._table], unlink=self._owner)


class Columns:
    """Which column of the counts each replica ("replica:<id>") and each model
    ("model:<name>") has, kept by the fleet process. A replica's column is taken back
    once the replica has left the membership and every worker's count there is zero;
    a name that finds no free column gets -1 (each worker then counts it alone)."""

    def __init__(self, counts: SharedCounts):
        self._counts = counts
        self._columns: dict[str, int] = {}
        self._free = list(range(counts.spec.num_slots - 1, -1, -1))

    def assign(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` (the registry's) each with its replica's column as ``slot``."""
        live = {f"replica:{e['replica_id']}" for e in entries}
        for name in [n for n in self._columns if n.startswith("replica:") and n not in live]:
            column = self._columns[name]
            if self._counts.column_is_zero(column):  # else requests to it are still counted
                del self._columns[name]
                self._free.append(column)
        return [{**e, "slot": self.of(f"replica:{e['replica_id']}")} for e in entries]

    def of(self, name: str) -> int:
        column = self._columns.get(name)
        if column is None:
            if not self._free:
                return -1
            column = self._columns[name] = self._free.pop()
        return column


@dataclass(frozen=True)
class QuotaSpec:
    name: str
    num_keys: int


class QuotaCells:
    """Each API key's quota state, shared; see the module's docstring."""

    def __init__(self, block: shared_memory.SharedMemory, spec: QuotaSpec, lock: Any, owner: bool):
        self.spec = spec
        self.lock = OrphanSafeLock(lock)
        self._block = block
        self._cells: memoryview[Any] = _buffer(block).cast("d")
        self._views = [
            self._cells[i * KEY_CELLS : (i + 1) * KEY_CELLS] for i in range(spec.num_keys)
        ]
        self._owner = owner

    @classmethod
    def create(cls, capacities: Sequence[tuple[float, float]], lock: Any) -> QuotaCells:
        """A block for keys with these (requests, tokens) per minute, their buckets full."""
        size = max(1, len(capacities)) * KEY_CELLS * _DOUBLE
        block = shared_memory.SharedMemory(create=True, size=size)
        cells = cls(block, QuotaSpec(block.name, len(capacities)), lock, owner=True)
        now = time.monotonic()
        for view, (requests, tokens) in zip(cells._views, capacities, strict=True):
            view[0], view[1], view[2], view[3], view[4] = requests, now, tokens, now, 0.0
        return cells

    @classmethod
    def attach(cls, spec: QuotaSpec, lock: Any) -> QuotaCells:
        """``lock``: the one a worker was started with (a multiprocessing lock passes
        to a process only as it is spawned, so every version of the block shares it)."""
        return cls(_attach(spec.name), spec, lock, owner=False)

    def of_key(self, position: int) -> memoryview[Any]:
        """The cells of the key at ``position`` in gateway.api_keys."""
        return self._views[position]

    def close(self) -> None:
        _close(self._block, [*self._views, self._cells], unlink=self._owner)


class OrphanSafeLock:
    """The workers' quota lock as a context manager that a dead holder cannot wedge.

    Its sections last microseconds, so a wait of ``STALE_LOCK_S`` means that its holder
    was killed inside one (a worker killed by a signal, which the fleet replaces): the
    lock is then released and taken over. Were the holder only slow, the cost is one
    quota update out of step, never a lock held for good or released twice."""

    def __init__(self, lock: Any):
        self._lock = lock
        self._held = False

    def __enter__(self) -> OrphanSafeLock:
        self._held = self._lock.acquire(timeout=STALE_LOCK_S)
        if not self._held:
            with contextlib.suppress(ValueError):  # released meanwhile after all
                self._lock.release()
            self._held = self._lock.acquire(timeout=STALE_LOCK_S)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            with contextlib.suppress(ValueError):  # taken over by another worker
                self._lock.release()


def _buffer(block: shared_memory.SharedMemory) -> memoryview[Any]:
    assert block.buf is not None  # open until close()
    return block.buf


def _attach(name: str) -> shared_memory.SharedMemory:
    # Attached in the process that made it or in one it spawned, which shares its
    # resource tracker: the block stays registered once, and is unlinked by its maker.
    return shared_memory.SharedMemory(name=name)


def _close(
    block: shared_memory.SharedMemory, views: list[memoryview[Any]], *, unlink: bool
) -> None:
    for view in views:
        view.release()
    with contextlib.suppress(BufferError):  # a view still held elsewhere: left to exit
        block.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
