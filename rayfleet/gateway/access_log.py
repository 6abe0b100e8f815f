"""The gateway's request log: one JSON line per API request, and the request id.

    open_access_log(path) -> writer   the fleet process: lines appended to ``path``
    close_access_log(writer)
    install(app)                      before the app starts: the outermost middleware and
                                      a response-prepare hook
    each request:  request id         the client's ``x-request-id`` when it is 1-128
                                      printable ASCII characters without spaces, else a
                                      new one (32 hex digits: the process's random
                                      64 bits, then a count); on every answer's headers,
                                      errors and streams included, and sent to the replica
                   note_admission     (dispatch.py) the model and route rule it went to
                   note_answer        (attempt.py) time to first byte, and the usage of a
                                      response that ended whole (found by a byte search
                                      at its end: response_end.py)
                   one line           to each open writer (line_writer.py), once the
                                      answer has ended (or the client left: status 499,
                                      unless it had read a stream's [DONE])

A line (keys absent when unknown; never the prompt, the answer or a key)::

    {"time": "2026-01-05T10:00:00.123Z", "request_id": "...", "path": "/v1/completions",
     "model": "tiny", "route": "long_prompts", "replica": "tiny#a1b2",
     "status": 200, "ttft_s": 0.041, "duration_s": 0.532, "prompt_tokens": 12,
     "completion_tokens": 64, "error": "no_healthy_replica"}

``replica`` is the ``x-rayfleet-replica`` of the answer: a replica id, ``fallback:<provider>``
or ``gateway``; ``error`` is the code of an error the gateway answered itself.

The fleet process writes the log to ``access.log`` in its run's log directory
(``open_access_log``). A line costs about 3 us of the gateway's CPU on the 2-core
machine: formatted by hand (json's string escaping, the date worked out once a second)
and written in batches (line_writer.py); through ``logging``, with ``json.dumps`` and a
write and flush each, it cost 11 us. With no writer open (a bare ``Gateway``) a request
pays a list's truth test.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rayfleet.gateway.errors import GATEWAY_REPLICA, REPLICA_HEADER
from rayfleet.gateway.line_writer import LineWriter
from rayfleet.gateway.response_end import Usage
from rayfleet.gateway.upstream import Exchange
from rayfleet.gateway.validate import INPUT_FIELDS

if TYPE_CHECKING:
    from rayfleet.gateway.admission import Admission

_quoted = json.encoder.encode_basestring_ascii  # as json.dumps writes a string

REQUEST_ID_HEADER = "x-request-id"
_CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _RequestIds:
    """Ids unique across processes and restarts without a system call each (uuid4 reads
    the kernel's random source every time): 64 random bits a process, then a count."""

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)  # a forked worker gets its own

    def renew(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.count = itertools.count()

    def next(self) -> str:
        return f"{self.prefix}{next(self.count):016x}"


_ids = _RequestIds()


@dataclass
class RequestRecord:
    """What the gateway learns about one request, for its log line."""

    request_id: str
    started: float  # time.perf_counter()
    model: str | None = None
    route: str | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    delivered: tuple[int, str] | None = None  # (status, replica) of a stream the client
    # had whole before it closed (it read [DONE]), though the handler was cancelled


RECORD = web.RequestKey("rayfleet_access_record", RequestRecord)


def install(app: web.Application) -> None:
    """Give every answer of ``app`` a request id, and log its API requests."""
    app.middlewares.insert(0, middleware)
    app.on_response_prepare.append(_add_request_id)


def request_id(request: web.Request) -> str:
    """This request's id: the client's, when acceptable, else one made for it."""
    record: RequestRecord | None = request.get(RECORD)
    if record is not None:
        return record.request_id
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _CLIENT_ID.fullmatch(given) else _ids.next()


def note_admission(request: web.Request, admission: Admission) -> None:
    record: RequestRecord | None = request.get(RECORD)
    if record is not None:
        record.model = admission.requested
        record.route = admission.route_rule


def wants_usage(request: web.Request) -> bool:
    """Whether ``note_answer`` would log the token counts of an answer to ``request``."""
    return RECORD in request and bool(_writers)


def note_answer(
    request: web.Request, exchange: Exchange, started: float, usage: Usage | None
) -> None:
    """Time to first byte and, for an answer that ended whole, its token counts (``usage``,
    read once by attempt.py for this log and the replica policy)."""
    record: RequestRecord | None = request.get(RECORD)
    if record is None:
        return
    if exchange.first_byte_at:
        record.ttft_s = exchange.first_byte_at - started
    if usage is not None:
        record.prompt_tokens = usage.prompt_tokens
        record.completion_tokens = usage.completion_tokens


def note_delivered(request: web.Request, status: int, replica: str) -> None:
    """The client closed after a stream's last event: log its status, not 499."""
    record: RequestRecord | None = request.get(RECORD)
    if record is not None:
        record.delivered = (status, replica)


def open_access_log(path: Path | None) -> LineWriter:
    """Write the request log to ``path`` (appended, one JSON line per request), or to
    standard output when None (in a container, where the platform collects it), until
    ``close_access_log`` of the writer returned."""
    writer = LineWriter.to_stdout() if path is None else LineWriter.to_file(path)
    _writers.append(writer)
    return writer


def close_access_log(writer: LineWriter) -> None:
    """Stop writing the request log to ``writer``; its lines held are written first."""
    if writer in _writers:
        _writers.remove(writer)
    writer.close()


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    record = RequestRecord(request_id(request), time.perf_counter())
    request[RECORD] = record
    if request.path not in INPUT_FIELDS:
        return await handler(request)
    try:
        response = await handler(request)
    except asyncio.CancelledError:  # the client left; aiohttp cancelled the handler
        from rayfleet.gateway.attempt import CLIENT_CLOSED

        status = CLIENT_CLOSED if record.delivered is None else record.delivered[0]
        _write(record, request.path, status, None)
        raise
    except Exception:
        _write(record, request.path, 500, None)
        raise
    _write(record, request.path, response.status, response)
    return response


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer, whole or streamed, gets the id before its head is sent."""
    record: RequestRecord | None = request.get(RECORD)
    if record is not None:
        response.headers[REQUEST_ID_HEADER] = record.request_id


def _write(
    record: RequestRecord, path: str, status: int, response: web.StreamResponse | None
) -> None:
    if not _writers:
        return
    if response is not None:
        replica = response.headers.get(REPLICA_HEADER)
    else:
        replica = record.delivered[1] if record.delivered is not None else None
    error = None
    if replica == GATEWAY_REPLICA and isinstance(response, web.Response):
        error = _error_code(response.body)
    line = _line(record, path, status, replica, error)
    for writer in _writers:
        writer.add(line)


def _line(
    record: RequestRecord, path: str, status: int, replica: str | None, error: str | None
) -> str:
    """The JSON line, keys in the documented order; strings through json's own escaping."""
    parts = [f'{{"time":"{_clock.now()}","request_id":{_quoted(record.request_id)}']
    parts.append(f',"path":{_quoted(path)}')
    if record.model is not None:
        parts.append(f',"model":{_quoted(record.model)}')
    if record.route is not None:
        parts.append(f',"route":{_quoted(record.route)}')
    if replica is not None:
        parts.append(f',"replica":{_quoted(replica)}')
    parts.append(f',"status":{status}')
    if record.ttft_s is not None:
        parts.append(f',"ttft_s":{round(record.ttft_s, 6)!r}')
    parts.append(f',"duration_s":{round(time.perf_counter() - record.started, 6)!r}')
    if record.prompt_tokens is not None:
        parts.append(f',"prompt_tokens":{int(record.prompt_tokens)}')
    if record.completion_tokens is not None:
        parts.append(f',"completion_tokens":{int(record.completion_tokens)}')
    if error is not None:
        parts.append(f',"error":{_quoted(error)}')
    parts.append("}")
    return "".join(parts)


class _Clock:
    """The wall clock as the log's ``time`` (UTC, milliseconds), the date and time of
    day worked out once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1000):03d}Z"


_clock = _Clock()
_writers: list[LineWriter] = []  # the request log's targets open in this process


def _error_code(body: Any) -> str | None:
    """The ``error.code`` of an OpenAI error body the gateway wrote itself."""
    if not isinstance(body, bytes):
        return None
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code) if code is not None else None
