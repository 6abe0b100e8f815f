"""The per-request values of the gateway's admission: an ``Admission`` says where one
admitted request goes (a fleet model or a fallback provider), with which body, priority
class and key. ``Policies.admit`` (policies.py) makes it, reading the request through a
``RequestFacts``; ``PriorityClass`` and ``FallbackWhen`` are the compiled settings it uses.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayfleet.gateway.auth import ApiKey
from rayfleet.gateway.fallback import Provider
from rayfleet.gateway.rules import minute_of_day
from rayfleet.gateway.tokens import Prompt, prompt_of

if TYPE_CHECKING:
    from rayfleet.gateway.policies import Policies


@dataclass(frozen=True)
class PriorityClass:
    name: str
    priority: int
    timeout_s: float | None = None
    stream_idle_timeout_s: float | None = None


@dataclass(frozen=True)
class FallbackWhen:
    on_no_replica: bool = True
    on_failure: bool = True
    max_queue_depth: int | None = None


class RequestFacts:
    """What rules and limits read from one request, each computed at most once."""

    __slots__ = ("_minute", "_policies", "_prompt", "_tokens", "body", "path", "priority_class")

    def __init__(self, path: str, body: dict[str, Any], policies: Policies):
        self.path = path
        self.body = body
        self.priority_class: str | None = None
        self._prompt: Prompt | None = None
        self._tokens: dict[str | None, int] = {}
        self._minute: int | None = None
        self._policies = policies

    @property
    def prompt(self) -> Prompt:
        if self._prompt is None:
            self._prompt = prompt_of(self.path, self.body)
        return self._prompt

    def prompt_tokens(self, model: str | None) -> int:
        count = self._tokens.get(model)
        if count is None:
            count = self._tokens[model] = self._policies.counter.count(model, self.prompt)
        return count

    def minute_of_day(self) -> int:
        if self._minute is None:
            self._minute = minute_of_day(self._policies.clock().astimezone(self._policies.zone))
        return self._minute


@dataclass
class Admission:
    """Where one admitted request goes, and the body to send there."""

    requested: str
    body: dict[str, Any]
    changed: bool = False
    model: str | None = None
    provider: Provider | None = None
    provider_model: str | None = None
    route_rule: str | None = None
    priority_class: PriorityClass | None = None
    key: ApiKey | None = None
    clamped: bool = False
    charged_tokens: int = 0  # what the key's token rate was charged for it

    @property
    def destination(self) -> str:
        """The fleet model it goes to, or the provider's label."""
        if self.model is not None:
            return self.model
        return self.provider.label if self.provider is not None else ""

    def fleet_body(self, raw: bytes) -> bytes:
        return json.dumps(self.body).encode() if self.changed else raw

    def release(self) -> None:
        if self.key is not None:
            self.key.quota.release()
            self.key = None

    def refund(self) -> None:
        """Give the key back its request and tokens: the gateway answered with nothing
        done for it (no replica, and no provider to take it)."""
        if self.key is not None:
            self.key.quota.refund(self.charged_tokens, time.monotonic())
