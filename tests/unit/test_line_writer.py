"""The request log's batched writer: whole lines, within its flush delay, on a pipe shared
by several processes never mixed within a line, and never an exception for a request."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from rayfleet.gateway.line_writer import FLUSH_BYTES, LineWriter, _batches


def test_a_line_from_code_outside_an_event_loop_is_written_at_once(tmp_path):
    path = tmp_path / "deep" / "access.log"
    writer = LineWriter.to_file(path)
    writer.add('{"a":1}')
    assert path.read_text() == '{"a":1}\n'
    writer.close()


def test_lines_under_a_loop_are_held_then_written_together_and_close_writes_the_rest(tmp_path):
    path = tmp_path / "access.log"
    writer = LineWriter.to_file(path)

    async def main() -> None:
        writer.add("one")
        writer.add("two")
        assert path.read_text() == ""  # held: the timer writes them
        deadline = time.monotonic() + 30
        while path.read_text() != "one\ntwo\n":
            assert time.monotonic() < deadline, path.read_text()
            await asyncio.sleep(0.005)
        writer.add("three")

    asyncio.run(main())
    assert path.read_text() == "one\ntwo\n"  # the loop ended before its timer
    writer.close()
    assert path.read_text() == "one\ntwo\nthree\n"
    writer.add("after close")
    assert path.read_text().count("\n") == 3


def test_a_full_batch_is_written_without_waiting_for_the_timer(tmp_path):
    path = tmp_path / "access.log"
    writer = LineWriter.to_file(path)
    line = "x" * 999

    async def main() -> int:
        for _ in range(FLUSH_BYTES // 1000 + 1):
            writer.add(line)
        return len(path.read_text().splitlines())

    assert asyncio.run(main()) == FLUSH_BYTES // 1000 + 1
    writer.close()


def test_a_file_rotated_away_is_followed_to_a_new_file_of_its_name(tmp_path):
    path = tmp_path / "access.log"
    writer = LineWriter.to_file(path)
    writer.add("before")
    path.rename(tmp_path / "access.log.1")  # logrotate's rename, then a new file
    writer.add("after")
    assert path.read_text() == "after\n"
    path.unlink()  # removed outright
    writer.add("later")
    writer.close()
    assert (tmp_path / "access.log.1").read_text() == "before\n"
    assert path.read_text() == "later\n"
    assert not (tmp_path / "access.log.2").exists()


def test_batches_hold_whole_lines_within_the_limit_and_a_long_line_alone():
    lines = [f"line {i} " + "y" * (i * 37 % 300) for i in range(500)] + ["z" * 9000, "end"]
    batches = _batches(lines, select.PIPE_BUF)
    assert b"".join(batches).decode().splitlines() == lines
    for batch in batches:
        assert batch.endswith(b"\n")
        assert len(batch) <= select.PIPE_BUF or batch.count(b"\n") == 1


CHILD = """
import sys
from rayfleet.gateway.line_writer import LineWriter
import asyncio
writer = LineWriter.to_stdout()
name = sys.argv[1]
async def main():
    for i in range(3000):
        writer.add(f"{name} {i:05d} " + name * 150)
        if i % 100 == 0:
            await asyncio.sleep(0)
asyncio.run(main())
writer.close()
"""


def test_processes_sharing_one_pipe_never_mix_their_lines():
    read_end, write_end = os.pipe()
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, name], stdout=write_end)
        for name in ("a", "b", "c")
    ]
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        received = pipe.read().decode()
    assert [child.wait(timeout=60) for child in children] == [0, 0, 0]
    lines = received.splitlines()
    assert len(lines) == 9000
    for line in lines:
        name, number, filler = line.split(" ")
        assert filler == name * 150 and 0 <= int(number) < 3000, line[:80]


def test_a_failed_write_drops_its_lines_with_one_warning(caplog):
    read_end, write_end = os.pipe()
    os.close(read_end)  # EPIPE for every write (Python ignores SIGPIPE)
    writer = LineWriter(write_end, owned=True)
    with caplog.at_level(logging.WARNING, logger="rayfleet.gateway"):
        writer.add("lost")
        writer.add("lost too")
        writer.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "rayfleet.gateway"]
    assert len(warnings) == 1 and "dropped" in warnings[0]


def test_stdout_is_left_open():
    writer = LineWriter.to_stdout()
    writer.close()
    os.fstat(1)  # raises if closed
    assert Path("/proc/self/fd/1").exists()
