"""How ``rayfleet top`` shows a Frame (control/top.py), once or live.

    render(frame, every_s, error) -> a header line and one table: a model's row (bold),
                                     its replicas' rows under it
    print_once(fetch, interval_s, console)   two scrapes ``interval_s`` apart, one frame
    watch(fetch, interval_s, console)        a full-screen view (rich Live, alternate
                                             screen) refreshed every ``interval_s``

``watch`` reads keys with the terminal in cbreak mode (one key at a time, no echo):
``q`` quits. The terminal's settings and screen come back on every way out: ``q``,
Ctrl-C, SIGTERM or an error. The first scrape happens before the screen changes, so a
fleet that does not answer fails in one line on a terminal left as it was.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rayfleet.control.top import STEP_WINDOW_S, Frame, ModelView, Row, Scrape, Scrapes
from rayfleet.errors import RayfleetError

Fetch = Callable[[], Scrape]

COLUMNS = (
    "model / replica",
    "state",
    "pid",
    "in flight",
    "run",
    "wait",
    "requests",
    "req/s",
    "tok/s",
    "TTFT p50",
    "TTFT p99",
    "KV",
    "hit",
    "target",
    "window",
)


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _cells(row: Row) -> list[str]:
    return [
        row.state,
        "" if row.pid is None else str(row.pid),
        _number(row.inflight),
        _number(row.running),
        _number(row.waiting),
        _number(row.requests),
        _number(row.req_s, 1),
        _number(row.tokens_s, 1),
        _seconds(row.ttft_p50_s),
        _seconds(row.ttft_p99_s),
        _share(row.kv_usage),
        _share(row.hit_rate),
    ]


def _add_model(table: Table, view: ModelView) -> None:
    target = "-" if view.target is None else str(view.target)
    table.add_row(view.row.name, *_cells(view.row), target, view.window or "-", style="bold")
    for replica in view.replicas:
        table.add_row(f"  {replica.name}", *_cells(replica), "", "")


def frame_table(frame: Frame) -> Table:
    over = "" if frame.interval_s is None else f" over the last {frame.interval_s:.1f} s"
    table = Table(
        *COLUMNS,
        caption=(
            f"requests: answered since the gateway started; req/s, TTFT{over}; tok/s "
            f"between the steps of vLLM's counter (read by the gateway every few seconds) "
            f"in the last {STEP_WINDOW_S:g} s. TTFT p50/p99: the gateway's first-byte "
            "histogram, its buckets' increase in the interval, interpolated inside a bucket. "
            "run, wait, KV, hit: each replica's vLLM gauges as the gateway republishes them "
            "(a model: KV and hit are its replicas' mean); '-': not published or no request "
            "in the interval."
        ),
        caption_justify="left",
        expand=False,
    )
    for column in table.columns[2:13]:
        column.justify = "right"
    for view in frame.models:
        _add_model(table, view)
    return table


def render(frame: Frame, every_s: float | None = None, error: str | None = None) -> Group:
    header = Text(f"rayfleet top: fleet {frame.phase} at {frame.gateway_url}/v1", style="bold")
    if every_s is not None:
        header.append(f"   every {every_s:g} s, q quits", style="dim")
    parts: list[RenderableType] = [header]
    if error is not None:
        parts.append(Text(f"{error} (showing the last answer; retrying)", style="red"))
    parts.append(frame_table(frame))
    return Group(*parts)


def print_once(fetch: Fetch, interval_s: float, console: Console) -> None:
    """One frame, its rates over ``interval_s`` (two scrapes that far apart)."""
    scrapes = Scrapes()
    scrapes.add(fetch())
    time.sleep(interval_s)
    frame = scrapes.add(fetch())
    if not console.is_terminal:  # a file or a pipe: as wide as the table, never squeezed
        unbounded = console.options.update_width(10_000)
        needed = console.measure(frame_table(frame), options=unbounded).maximum
        console.width = max(console.width, needed)
    console.print(render(frame))


class Keys:
    """Key presses on the terminal ``fd`` in cbreak mode, its settings restored on exit;
    with ``fd`` None (not a terminal) no key ever comes."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self._saved: list[Any] | None = None

    def __enter__(self) -> Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def quit_within(self, timeout_s: float) -> bool:
        """True once ``q`` is pressed (or the terminal hangs up) within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            if self.fd is None:
                time.sleep(left_s)
                return False
            ready, _, _ = select.select([self.fd], [], [], left_s)
            if ready:
                pressed = os.read(self.fd, 64)
                if not pressed or b"q" in pressed.lower():
                    return True
        return False


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def watch(fetch: Fetch, interval_s: float, console: Console) -> None:
    """Refresh the view every ``interval_s`` until ``q`` or Ctrl-C (or SIGTERM)."""
    scrapes = Scrapes()
    frame = scrapes.add(fetch())
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with (
            Keys(fd) as keys,
            Live(
                render(frame, interval_s),
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            while not keys.quit_within(interval_s):
                try:
                    after = fetch()
                except RayfleetError as exc:
                    live.update(render(frame, interval_s, str(exc)), refresh=True)
                    continue
                frame = scrapes.add(after)
                live.update(render(frame, interval_s), refresh=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C quits, as q does; the contexts above have restored the terminal
    finally:
        signal.signal(signal.SIGTERM, previous)
