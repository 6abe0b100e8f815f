"""Caps on one request (OWASP API4), and the rate limits of API keys.

``Limits`` is one model's caps, resolved from ``gateway.limits`` and the model's
entry in ``gateway.model_limits``. ``check_request`` enforces them on a parsed body
and clamps ``max_tokens`` when configured to. ``TokenBucket`` is the arithmetic of
per-key rates: ``take(amount, now)`` returns 0 when admitted, else the seconds to
wait. ``KeyQuota`` combines a key's request rate, token rate and concurrency.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import MutableSequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayfleet.gateway.errors import RequestError

if TYPE_CHECKING:
    from rayfleet.config import LimitsConfig

MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = None
    max_tokens_action: str = "reject"
    max_n: int | None = None
    max_body_bytes: int | None = None
    max_messages: int | None = None
    check_context: bool = True

    @classmethod
    def resolve(cls, base: LimitsConfig, override: LimitsConfig | None = None) -> Limits:
        """``gateway.limits`` with the fields ``override`` sets explicitly on top."""
        values = base.model_dump()
        if override is not None:
            values.update({name: getattr(override, name) for name in override.model_fields_set})
        return cls(**values)


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    for name in MAX_TOKENS_FIELDS:
        value = body.get(name)
        if isinstance(value, int):
            return value
    return None


def num_items(path: str, body: dict[str, Any]) -> int:
    """How many messages (chat) or prompts (completions, embeddings) the request holds."""
    field_name = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}.get(
        path, "input"
    )
    value = body.get(field_name)
    if isinstance(value, list) and not (value and isinstance(value[0], int)):
        return len(value)
    return 1


def check_body_size(limits: Limits, num_bytes: int, model: str) -> None:
    if limits.max_body_bytes is not None and num_bytes > limits.max_body_bytes:
        raise RequestError(
            413,
            f"Request body is {num_bytes} bytes; the limit for '{model}' is "
            f"{limits.max_body_bytes} bytes.",
            code="body_too_large",
            reason="body_too_large",
        )


def check_request(limits: Limits, body: dict[str, Any], num_items: int, model: str) -> bool:
    """Enforce max_tokens, n and message caps; True when the body was clamped."""
    clamped = False
    if limits.max_tokens is not None:
        for name in MAX_TOKENS_FIELDS:
            value = body.get(name)
            if value is None or value <= limits.max_tokens:
                continue
            if limits.max_tokens_action == "clamp":
                body[name] = limits.max_tokens
                clamped = True
            else:
                raise RequestError(
                    400,
                    f"{name} is {value}; the limit for '{model}' is {limits.max_tokens}. "
                    f"Ask for at most {limits.max_tokens} tokens.",
                    param=name,
                    code="max_tokens_over_limit",
                    reason="limit_max_tokens",
                )
    n = body.get("n")
    if limits.max_n is not None and n is not None and n > limits.max_n:
        raise RequestError(
            400,
            f"n is {n}; the limit for '{model}' is {limits.max_n}.",
            param="n",
            code="n_over_limit",
            reason="limit_n",
        )
    if limits.max_messages is not None and num_items > limits.max_messages:
        raise RequestError(
            400,
            f"The request has {num_items} messages; the limit for '{model}' is "
            f"{limits.max_messages}.",
            param="messages",
            code="too_many_messages",
            reason="limit_messages",
        )
    return clamped


def check_context(model: str, context: int, prompt_tokens: int, max_tokens: int | None) -> None:
    wanted = prompt_tokens + (max_tokens or 0)
    if wanted > context or prompt_tokens >= context:
        asked = f"{prompt_tokens} prompt tokens" + (
            f" plus max_tokens {max_tokens} = {wanted} tokens" if max_tokens else ""
        )
        raise RequestError(
            400,
            f"This model's maximum context length is {context} tokens; the request asks for "
            f"{asked}. Shorten the prompt or lower max_tokens.",
            param="max_tokens" if max_tokens else "messages",
            code="context_length_exceeded",
            reason="context_length",
        )


class TokenBucket:
    """``capacity`` units, refilled at ``capacity`` per ``period_s``.

    Its level and the time of that level are two cells of ``cells`` from ``at``: a list
    of its own, or memory that the gateway's worker processes share (shared_state.py)."""

    __slots__ = ("_at", "_cells", "capacity", "rate_per_s")

    def __init__(
        self,
        capacity: float,
        period_s: float = 60.0,
        now: float = 0.0,
        cells: MutableSequence[float] | None = None,
        at: int = 0,
    ):
        self.capacity = float(capacity)
        self.rate_per_s = capacity / period_s
        self._cells: MutableSequence[float] = cells if cells is not None else [self.capacity, now]
        self._at = at if cells is not None else 0

    @property
    def level(self) -> float:
        return self._cells[self._at]

    @property
    def updated(self) -> float:
        return self._cells[self._at + 1]

    def _refill(self, now: float) -> None:
        cells, at = self._cells, self._at
        if now > cells[at + 1]:
            cells[at] = min(self.capacity, cells[at] + (now - cells[at + 1]) * self.rate_per_s)
            cells[at + 1] = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` can be taken (0: now; inf: never, it exceeds capacity)."""
        self._refill(now)
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate_per_s)

    def take(self, amount: float, now: float) -> float:
        """Take ``amount`` and return 0, or take nothing and return the seconds to wait."""
        wait = self.wait_s(amount, now)
        if wait == 0.0:
            self._cells[self._at] -= amount
        return wait

    def give_back(self, amount: float, now: float) -> None:
        """Return ``amount`` taken earlier, up to the capacity."""
        self._refill(now)
        self._cells[self._at] = min(self.capacity, self.level + amount)


class KeyQuota:
    """One API key's request rate, token rate and concurrency.

    Alone, its state is its own. Under ``gateway.workers`` its state is the key's
    ``KEY_CELLS`` shared cells (``cells``: request bucket, token bucket, requests in
    flight), changed under ``lock``, the workers' one lock, so that every worker counts
    against the same quota."""

    def __init__(
        self,
        name: str,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        max_concurrent: int | None = None,
        now: float = 0.0,
        cells: MutableSequence[float] | None = None,
        lock: AbstractContextManager[Any] | None = None,
    ):
        self.name = name
        self.requests = (
            TokenBucket(requests_per_minute, 60.0, now, cells, 0) if requests_per_minute else None
        )
        self.tokens = (
            TokenBucket(tokens_per_minute, 60.0, now, cells, 2) if tokens_per_minute else None
        )
        self.max_concurrent = max_concurrent
        self._cells: MutableSequence[float] = cells if cells is not None else [0.0] * 5
        self._lock = lock if lock is not None else contextlib.nullcontext()

    @property
    def num_inflight(self) -> int:
        return int(self._cells[4])

    @property
    def counts_tokens(self) -> bool:
        return self.tokens is not None

    def refuse_early(self, now: float) -> None:
        """Raise the 429 that ``admit`` would, when it needs no look at the body: the
        key's concurrency is full or its request rate spent. Takes nothing. A flooding
        key is refused before its body is read or parsed."""
        with self._lock:
            self._check_concurrency()
            if self.requests is not None:
                wait = self.requests.wait_s(1, now)
                if wait > 0:
                    raise self._over("requests per minute", wait, self.requests.capacity)

    def admit(self, num_tokens: int, now: float) -> None:
        """Count one request in, or raise a 429 with the seconds to wait."""
        with self._lock:
            self._admit(num_tokens, now)

    def _admit(self, num_tokens: int, now: float) -> None:
        self._check_concurrency()
        waits = []
        if self.requests is not None:
            waits.append(
                ("requests per minute", self.requests.wait_s(1, now), self.requests.capacity)
            )
        if self.tokens is not None:
            waits.append(
                ("tokens per minute", self.tokens.wait_s(num_tokens, now), self.tokens.capacity)
            )
        for what, wait, cap in waits:
            if wait == math.inf:
                raise _rate_limited(
                    f"The request needs {num_tokens} tokens, more than API key '{self.name}' "
                    f"may use per minute ({cap:.0f}). Lower max_tokens or shorten the prompt.",
                    60.0,
                    "tokens",
                )
            if wait > 0:
                raise self._over(what, wait, cap)
        if self.requests is not None:
            self.requests.take(1, now)
        if self.tokens is not None:
            self.tokens.take(num_tokens, now)
        self._cells[4] += 1

    def _check_concurrency(self) -> None:
        if self.max_concurrent is not None and self.num_inflight >= self.max_concurrent:
            raise _rate_limited(
                f"API key '{self.name}' already has {self.num_inflight} requests in flight "
                f"(limit {self.max_concurrent}).",
                1.0,
                "concurrency",
            )

    def _over(self, what: str, wait_s: float, cap: float) -> RequestError:
        return _rate_limited(
            f"API key '{self.name}' is over its limit of {cap:.0f} {what}.",
            wait_s,
            what.split()[0],
        )

    def release(self) -> None:
        with self._lock:
            self._cells[4] -= 1

    def refund(self, num_tokens: int, now: float) -> None:
        """Give back what ``admit`` took of the rates (one request, ``num_tokens``
        tokens): the request was answered without any replica or provider doing work
        for it. Its place in flight is ``release``'s."""
        with self._lock:
            if self.requests is not None:
                self.requests.give_back(1, now)
            if self.tokens is not None:
                self.tokens.give_back(num_tokens, now)


def _rate_limited(message: str, wait_s: float, what: str) -> RequestError:
    retry_after = max(1, math.ceil(wait_s))
    return RequestError(
        429,
        f"{message} Retry after {retry_after} s.",
        code="rate_limit_exceeded",
        reason=f"rate_limited_{what}",
        headers={"Retry-After": str(retry_after)},
    )
