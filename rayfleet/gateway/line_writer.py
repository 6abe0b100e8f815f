"""Text lines to a file or standard output, written in batches off the request's path.

    writer = LineWriter.to_file(path)     appended; LineWriter.to_stdout() for a container
    writer.add(line)                      a whole line, without its newline
    writer.close()                        what is held is written, then the file closed

The request log (access_log.py) adds one line per request. Written one by one through
``logging`` (a record, a formatter, a locked handler, a write and a flush each), a line
cost 11 us of the gateway's CPU on the 2-core machine, most of it per-line machinery;
here a line is a list append, and the lines go out together:

- ``FLUSH_AFTER_S`` after the first line that found the writer empty (a timer on the
  running event loop), or
- at once when ``FLUSH_BYTES`` are held, or when no event loop runs (a line from
  synchronous code is written before ``add`` returns), and on ``close``.

So a line reaches the file within ``FLUSH_AFTER_S`` of its request's end; a process
killed without ``close`` loses at most that much.

A file renamed away (log rotation) is followed: the next batch goes to a new file of the
name, as logging's WatchedFileHandler does, checked once a batch, not once a line.

Whole lines only: each write system call carries whole lines, at most ``select.PIPE_BUF``
bytes when the target is not a regular file, so the lines of several processes sharing
one pipe (gateway workers on a container's standard output) never interleave within a
line; a regular file is opened with ``O_APPEND``, whose writes land whole. A write that
fails (a full disk, a closed pipe) drops its lines with one warning on the gateway's log,
and the next batch tries again: the request log never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import stat
from pathlib import Path

log = logging.getLogger("rayfleet.gateway")

FLUSH_AFTER_S = 0.05
FLUSH_BYTES = 64 * 1024


class LineWriter:
    def __init__(self, fd: int, *, owned: bool, path: Path | None = None):
        self._fd = fd
        self._owned = owned  # closed with the writer (not standard output)
        self._path = path  # the file's name, followed when it is rotated
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        self._max_write = FLUSH_BYTES if regular else select.PIPE_BUF
        self._lines: list[str] = []
        self._held = 0  # characters held, about the bytes
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._warned = False
        self.closed = False

    @classmethod
    def to_file(cls, path: Path) -> LineWriter:
        return cls(_open_appending(path), owned=True, path=path)

    @classmethod
    def to_stdout(cls) -> LineWriter:
        return cls(1, owned=False)

    def add(self, line: str) -> None:
        if self.closed:
            return
        self._lines.append(line)
        self._held += len(line) + 1
        if self._held >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None or self._timer_loop is None or self._timer_loop.is_closed():
            try:
                loop = asyncio.get_running_loop()  # a getpid() each call: not for every line
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_AFTER_S, self.flush)
            self._timer_loop = loop

    def flush(self) -> None:
        """Write every line held now."""
        if self._timer is not None:
            if self._timer_loop is not None and not self._timer_loop.is_closed():
                self._timer.cancel()
            self._timer = self._timer_loop = None
        if not self._lines:
            return
        lines, self._lines, self._held = self._lines, [], 0
        if self._path is not None:
            self._follow_rotation(self._path)
        for batch in _batches(lines, self._max_write):
            self._write(batch)

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._owned:
            os.close(self._fd)

    def _follow_rotation(self, path: Path) -> None:
        """Reopen ``path`` when the file open is no longer under that name (logrotate's
        rename-and-create; its copytruncate needs nothing): one ``stat`` a batch."""
        held = os.fstat(self._fd)
        try:
            named = os.stat(path)
            if (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
                return
        except FileNotFoundError:
            pass
        try:
            fd = _open_appending(path)
        except OSError as exc:
            self._warn(f"could not reopen {path} ({exc}); writing on to the file renamed away")
            return
        os.close(self._fd)
        self._fd = fd

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._warn(f"lines dropped: {exc}")

    def _warn(self, problem: str) -> None:
        if not self._warned:  # once: a full disk would otherwise warn every batch
            self._warned = True
            log.warning("request log: %s (later failures are not logged)", problem)


def _open_appending(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _batches(lines: list[str], max_bytes: int) -> list[bytes]:
    """``lines``, newline-ended, joined into writes of at most ``max_bytes`` each (a line
    longer than that is a write of its own)."""
    data = ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
    if len(data) <= max_bytes:
        return [data]
    batches = []
    start = 0
    while start < len(data):
        end = data.rfind(b"\n", start, start + max_bytes) + 1
        if end <= start:  # one line longer than a write
            end = data.index(b"\n", start) + 1
        batches.append(data[start:end])
        start = end
    return batches
