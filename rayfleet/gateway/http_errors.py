"""Every error the gateway's HTTP layer answers, in OpenAI's error JSON.

Three places produce errors before or around the gateway's handlers:

- aiohttp's router and body reader raise ``HTTPException`` (404, 405, 413):
  ``json_http_errors``, a middleware, turns them into error JSON;
- the HTTP parser refuses a request before any handler runs (a request line, a header
  or a header count over ``HTTP_LIMITS``), and an exception escaping a handler becomes
  a 500: both reach ``RequestHandler.handle_error``, which aiohttp answers in plain
  text. aiohttp offers no public hook for these, so ``GatewayRunner`` serves the app
  with a protocol whose ``handle_error`` answers 414, 431, 400 or 500 in error JSON,
  logs one line without a traceback for a client's fault, and closes the connection
  (as aiohttp does);
- a body that does not arrive: ``read_body`` gives it ``timeout_s`` in all, then
  answers 408 and closes the connection;
- headers that do not arrive (a client trickling them, or an idle keep-alive
  connection): aiohttp's keep-alive timer, which runs from the connection's start and
  from each answer and is not pushed back by incoming bytes, closes a connection that
  has no whole request within ``IDLE_TIMEOUT_S``. aiohttp's own default is 3,630 s
  (meant for a server behind a reverse proxy); the gateway is the front door.

A request line and a header have different limits on purpose: the parser reports both
as ``LineTooLong`` with the limit it hit, and the limit tells a 414 from a 431.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.typedefs import Middleware
from aiohttp.web_request import BaseRequest

from rayfleet.gateway.errors import RequestError, openai_error

log = logging.getLogger("rayfleet.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_REQUEST_LINE_BYTES = 8 * 1024
MAX_HEADER_BYTES = 16 * 1024  # one header's name or value (large bearer tokens fit)
MAX_HEADERS = 128
IDLE_TIMEOUT_S = 30.0  # no whole request 30 s after connecting or after the last answer
HTTP_LIMITS: dict[str, Any] = {
    "max_line_size": MAX_REQUEST_LINE_BYTES,
    "max_field_size": MAX_HEADER_BYTES,
    "max_headers": MAX_HEADERS,
}
_TOO_MANY_HEADERS = "Too many headers received"  # aiohttp's parser's own message


def json_http_errors(max_body_bytes: int) -> Middleware:
    """Turn aiohttp's plain-text HTTP errors (404, 405, 413) into OpenAI error JSON."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {
                404: f"Unknown endpoint {request.method} {request.path}.",
                405: f"Method {request.method} is not allowed on {request.path}.",
                413: f"Request body too large (limit {max_body_bytes} bytes).",
            }.get(exc.status, exc.reason)
            response = openai_error(exc.status, message)
            if exc.status == 413:
                response.force_close()  # the rest of the body is never read
            return response

    return middleware


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or a 408 that closes the connection when it takes over ``timeout_s``."""
    if request.content.is_eof():  # all of it came with the head: nothing to wait for
        return await request.read()
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise body_timeout(timeout_s) from None


def body_timeout(timeout_s: float) -> RequestError:
    """The 408 of a body that did not arrive in time; the connection closes after it."""
    return RequestError(
        408,
        f"The request body did not arrive within {timeout_s:g} s.",
        code="body_timeout",
        reason="body_timeout",
        close=True,
    )


def protocol_error(status: int, exc: BaseException | None) -> tuple[int, str]:
    """The status and message to answer for an error aiohttp's protocol reports."""
    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (MAX_REQUEST_LINE_BYTES,):
            return 414, f"Request line longer than {MAX_REQUEST_LINE_BYTES} bytes."
        return 431, f"A request header is longer than {MAX_HEADER_BYTES} bytes."
    if isinstance(exc, BadHttpMessage):
        if exc.message == _TOO_MANY_HEADERS:
            return 431, f"More than {MAX_HEADERS} request headers."
        return 400, f"Malformed HTTP request: {exc.message}"
    if status >= 500:
        return status, "The gateway failed to handle the request."
    return status, "Malformed HTTP request."


class _JsonErrorProtocol(web.RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # too late for an answer: aiohttp drops it
            return super().handle_error(request, status, exc, message)
        status, text = protocol_error(status, exc)
        if status >= 500:
            log.error("error handling %s %s", request.method, request.path, exc_info=exc)
        else:
            log.info("refused a malformed request from %s: %s", request.remote, text)
        response = openai_error(status, text)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _JsonErrorProtocol(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` with ``HTTP_LIMITS``, whose connections answer protocol errors
    in error JSON."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, **{**HTTP_LIMITS, **kwargs})

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state; only the protocol class differs
        return server
