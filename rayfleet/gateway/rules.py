"""Routes: virtual model names whose target each request's facts decide.

Rules are compiled once from the config. ``Route.decide(facts, usable)`` walks the
rules in order; the first whose every condition holds and whose target is usable
wins. A rule whose target model has no healthy replica falls through to the next;
after the last rule the route's fallback provider is used, if it has one.

``facts`` is anything with ``priority_class``, ``minute_of_day()`` and
``prompt_tokens(model)`` (computed lazily, so a rule on the clock never tokenizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from rayfleet.gateway.fallback import FALLBACK_PREFIX

if TYPE_CHECKING:
    from rayfleet.config import RouteConfig, RuleConfig


class Facts(Protocol):
    priority_class: str | None

    def minute_of_day(self) -> int: ...

    def prompt_tokens(self, model: str | None) -> int: ...


def parse_clock(value: str) -> int:
    hours, minutes = value.split(":")
    return int(hours) * 60 + int(minutes)


@dataclass(frozen=True)
class DailyWindow:
    """[start, end) in minutes after midnight; start > end wraps midnight."""

    start: int
    end: int

    def contains(self, minute: int) -> bool:
        if self.start <= self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


def minute_of_day(now: datetime) -> int:
    return now.hour * 60 + now.minute


@dataclass(frozen=True)
class Rule:
    name: str
    target: str  # a model, or the provider's name when provider is set
    provider: str | None = None
    tokens_below: int | None = None
    tokens_at_least: int | None = None
    classes: frozenset[str] | None = None
    window: DailyWindow | None = None
    tokenizer: str | None = None  # model whose tokenizer counts the prompt

    @classmethod
    def from_config(cls, config: RuleConfig, route_tokenizer: str | None) -> Rule:
        provider = None
        target = config.target
        if target.startswith(FALLBACK_PREFIX):
            provider = target.removeprefix(FALLBACK_PREFIX)
        window = None
        if config.time_of_day is not None:
            window = DailyWindow(
                parse_clock(config.time_of_day.start), parse_clock(config.time_of_day.end)
            )
        return cls(
            name=config.name,
            target=target,
            provider=provider,
            tokens_below=config.prompt_tokens_below,
            tokens_at_least=config.prompt_tokens_at_least,
            classes=frozenset(config.priority_classes) if config.priority_classes else None,
            window=window,
            tokenizer=route_tokenizer if provider else target,
        )

    @property
    def counts_tokens(self) -> bool:
        return self.tokens_below is not None or self.tokens_at_least is not None

    def holds(self, facts: Facts) -> bool:
        # Cheapest conditions first: the prompt is tokenized only when the rest hold.
        if self.classes is not None and facts.priority_class not in self.classes:
            return False
        if self.window is not None and not self.window.contains(facts.minute_of_day()):
            return False
        if self.counts_tokens:
            tokens = facts.prompt_tokens(self.tokenizer)
            if self.tokens_below is not None and tokens >= self.tokens_below:
                return False
            if self.tokens_at_least is not None and tokens < self.tokens_at_least:
                return False
        return True


@dataclass(frozen=True)
class Decision:
    rule: str  # what x-rayfleet-route says
    model: str | None = None  # a model of the fleet ...
    provider: str | None = None  # ... or a fallback provider


@dataclass(frozen=True)
class Route:
    name: str
    rules: tuple[Rule, ...]
    fallback: str | None = None
    tokenizer: str | None = None

    @classmethod
    def from_config(cls, config: RouteConfig) -> Route:
        tokenizer = config.tokenizer or next(
            (r.target for r in config.rules if not r.target.startswith(FALLBACK_PREFIX)), None
        )
        rules = tuple(Rule.from_config(r, tokenizer) for r in config.rules)
        return cls(config.name, rules, config.fallback, tokenizer)

    def decide(self, facts: Facts, usable: Callable[[str], bool]) -> Decision | None:
        """The first rule that holds with a usable target, else the route's fallback."""
        for rule in self.rules:
            if not rule.holds(facts):
                continue
            if rule.provider is not None:
                return Decision(rule.name, provider=rule.provider)
            if usable(rule.target):
                return Decision(rule.name, model=rule.target)
        if self.fallback is not None:
            return Decision("fallback", provider=self.fallback)
        return None
