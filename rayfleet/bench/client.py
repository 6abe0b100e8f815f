"""The request loop: send streamed OpenAI requests and time every chunk.

Definitions match vLLM's serving benchmark, so numbers compare:
- TTFT: from sending the request to the first streamed chunk that carries a choice.
- ITL: the gaps between consecutive chunks that carry a choice.
- E2E latency: from sending to the last chunk that carries a choice.
- Output tokens: ``usage.completion_tokens`` when the server reports it (the bench asks
  for it with ``stream_options.include_usage``), else the number of chunks with a choice.

SSE parsing is minimal on purpose (one core must drive thousands of streams): a chunk is
classified by looking for ``"choices":[{`` in its bytes; only the usage chunk and error
events are decoded as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rayfleet.bench.datasets import Prompt

REPLICA_HEADER = "x-rayfleet-replica"
CHOICE_MARKERS = (b'"choices":[{', b'"choices": [{')
_USAGE_MARKERS = (b'"usage":{', b'"usage": {')
_ERROR_BODY_BYTES = 300


@dataclass(frozen=True)
class Target:
    """Where and how to send requests."""

    base_url: str
    endpoint: str = "/v1/completions"
    model: str = ""
    ignore_eos: bool = False
    request_timeout_s: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint

    @property
    def is_chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")


@dataclass
class RequestResult:
    """What one request did. Times are ``time.perf_counter()`` seconds (one clock per machine)."""

    ok: bool = False
    status: int = 0
    error: str = ""
    scheduled_s: float = 0.0
    start_s: float = 0.0
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    replica: str = ""
    text: str = ""  # the answer's text, kept only when asked (a chat session's turns)

    @property
    def error_kind(self) -> str:
        """The key of this failure in the error breakdown: the HTTP status or the failure."""
        return (
            str(self.status)
            if self.status not in (0, 200)
            else (self.error.split(":")[0] or "error")
        )


def request_body(target: Target, prompt: Prompt) -> dict[str, Any]:
    """The JSON body of a streamed completions or chat request."""
    body: dict[str, Any] = {
        "model": target.model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.is_chat:
        history = prompt.messages or (("user", prompt.text),)
        body["messages"] = [{"role": role, "content": content} for role, content in history]
        body["max_completion_tokens"] = prompt.num_output_tokens
    else:
        body["prompt"] = prompt.text
        body["max_tokens"] = prompt.num_output_tokens
    if target.ignore_eos:
        body["ignore_eos"] = True
    return body


def request_headers(target: Target) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    api_key = os.environ.get("OPENAI_API_KEY")
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(target.headers)
    return headers


def open_session(
    max_concurrency: int | None, max_connections: int | None = None
) -> aiohttp.ClientSession:
    """One pooled session for a whole run: as many connections as requests in flight, or
    at most ``max_connections`` (a request over it waits in the pool, and its wait counts
    in its time to first token, as an application's would)."""
    limits = [n for n in (max_concurrency, max_connections) if n]
    connector = aiohttp.TCPConnector(limit=min(limits, default=0), keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def send_request(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: Prompt,
    headers: dict[str, str],
    keep_text: bool = False,
) -> RequestResult:
    """Send one streamed request and time it, keeping the answer's text in ``text`` when
    ``keep_text``. Never raises for a failed request."""
    result = RequestResult(num_input_tokens=prompt.num_input_tokens)
    payload = json.dumps(request_body(target, prompt)).encode()
    result.start_s = time.perf_counter()
    try:
        async with asyncio.timeout(target.request_timeout_s):
            async with session.post(target.url, data=payload, headers=headers) as response:
                result.status = response.status
                result.replica = response.headers.get(REPLICA_HEADER, "")
                if response.status != 200:
                    body = await response.content.read(_ERROR_BODY_BYTES)
                    result.error = f"HTTP {response.status}: {body.decode(errors='replace')}"
                    return result
                await read_stream(response, result, keep_text)
    except TimeoutError:
        result.error = f"timeout: no end of stream after {target.request_timeout_s:g}s"
    except aiohttp.ClientError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def read_stream(
    response: aiohttp.ClientResponse, result: RequestResult, keep_text: bool = False
) -> None:
    """Time each SSE event of ``response`` into ``result``, and gather its text when
    ``keep_text`` (which decodes every chunk: kept off the plain path)."""
    num_chunks = 0
    last_s = result.start_s
    pending = b""
    pieces: list[str] = []
    async for data in response.content.iter_any():
        now_s = time.perf_counter()
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            has_choice = any(marker in line for marker in CHOICE_MARKERS)
            if has_choice:
                if num_chunks == 0:
                    result.ttft_s = now_s - result.start_s
                else:
                    result.itl_s.append(now_s - last_s)
                last_s = now_s
                num_chunks += 1
                if keep_text:
                    pieces.append(choice_text(line))
            if any(marker in line for marker in _USAGE_MARKERS) or (
                not has_choice and b'"error"' in line
            ):
                read_event(line, result)
    if result.error:
        return
    if num_chunks == 0:
        result.error = "empty stream: no chunk with a choice arrived"
        return
    result.e2e_s = last_s - result.start_s
    result.text = "".join(pieces)
    if not result.num_output_tokens:
        result.num_output_tokens = num_chunks
    result.ok = True


def choice_text(line: bytes) -> str:
    """The text one streamed chunk adds: a chat delta's content or a completion's text."""
    try:
        choice = json.loads(line[5:])["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return piece if isinstance(piece, str) else ""


def read_event(line: bytes, result: RequestResult) -> None:
    """Decode a usage chunk or an error event into ``result``."""
    try:
        event = json.loads(line[5:])
    except ValueError:
        return
    if error := event.get("error"):
        message = error.get("message", error) if isinstance(error, dict) else error
        result.error = f"stream error: {message}"
        return
    usage = event.get("usage") or {}
    if usage.get("completion_tokens"):
        result.num_output_tokens = usage["completion_tokens"]
    if usage.get("prompt_tokens"):
        result.num_input_tokens = usage["prompt_tokens"]


async def _first_model(base_url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(base_url.rstrip("/") + "/v1/models") as response,
    ):
        response.raise_for_status()
        body = await response.json()
    return str(body["data"][0]["id"])


def first_model(base_url: str) -> str | None:
    """The first model the endpoint lists at ``/v1/models``, or None when it lists none."""
    try:
        return asyncio.run(_first_model(base_url))
    except (aiohttp.ClientError, KeyError, IndexError, TypeError, ValueError, TimeoutError):
        return None


async def _send_alone(target: Target, prompt: Prompt) -> RequestResult:
    async with open_session(1) as session:
        return await send_request(session, target, prompt, request_headers(target))


def send_one(target: Target, prompt: Prompt) -> RequestResult:
    """Send one request outside any run (the check before a run)."""
    return asyncio.run(_send_alone(target, prompt))
