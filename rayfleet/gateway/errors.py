"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

REPLICA_HEADER = "x-rayfleet-replica"
GATEWAY_REPLICA = "gateway"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class RequestError(Exception):
    """A request the gateway refuses, with everything the error JSON needs."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        reason: str = "bad_request",
        headers: dict[str, str] | None = None,
        close: bool = False,
    ):
        super().__init__(message)
        self.close = close  # end the connection after the answer (a body left unread)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.reason = reason

    def response(self, replica: str = GATEWAY_REPLICA) -> web.Response:
        response = openai_error(
            self.status, self.message, param=self.param, code=self.code, replica=replica
        )
        if self.headers:
            response.headers.update(self.headers)
        if self.close:
            response.force_close()
        return response


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> dict[str, dict[str, Any]]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }


def openai_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    replica: str = GATEWAY_REPLICA,
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(status, message, param=param, code=code)),
        content_type="application/json",
        headers={REPLICA_HEADER: replica},
    )


def sse_error_event(message: str, code: str = "upstream_error", status: int = 502) -> bytes:
    """A final SSE event for a stream that broke (or timed out) after its first byte."""
    body = error_body(status, message, code=code)
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"
