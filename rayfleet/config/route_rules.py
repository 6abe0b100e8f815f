"""fleet.yaml ``gateway.routes``: virtual model names whose target rules pick per request.

``RouteConfig`` is one route, its ordered ``RuleConfig``s tried in turn; a rule's
conditions are prompt-token bounds, priority classes and a daily ``TimeWindow``
(in ``gateway.timezone``). That the classes and providers a rule names exist, and that
its token bounds leave room for a prompt, is checked by ``GatewayConfig``
(rayfleet/config/gateway.py); that its target is a model of the fleet, by ``FleetConfig``
(rayfleet/config/fleet.py). The gateway compiles these into rayfleet/gateway/rules.py.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator

from rayfleet.config.base import StrictModel


class TimeWindow(StrictModel):
    """A daily window of wall-clock time in gateway.timezone; 'from' after 'to' wraps midnight."""

    start: str = Field(alias="from", description="Start, 'HH:MM' (inclusive).")
    end: str = Field(alias="to", description="End, 'HH:MM' (exclusive).")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        parts = value.split(":")
        if (
            len(parts) == 2
            and all(p.isdigit() for p in parts)
            and int(parts[1]) < 60
            and (int(parts[0]) < 24 or (int(parts[0]) == 24 and parts[1] == "00"))
        ):
            return value
        raise ValueError(f"'{value}' is not a time of day 'HH:MM' (00:00 to 24:00)")


class RuleConfig(StrictModel):
    """One rule of a route: every condition given must hold; the first rule that holds wins."""

    name: str = Field(min_length=1, description="Shown in the x-rayfleet-route header.")
    target: str = Field(
        min_length=1, description="A model of the fleet, or 'fallback:<provider name>'."
    )
    prompt_tokens_below: int | None = Field(
        default=None,
        ge=1,
        description="Holds when the prompt has fewer tokens than this (counted "
        "with the target model's tokenizer).",
    )
    prompt_tokens_at_least: int | None = Field(
        default=None, ge=0, description="Holds when the prompt has at least this many tokens."
    )
    priority_classes: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Holds when the request's priority class is one of these.",
    )
    time_of_day: TimeWindow | None = Field(
        default=None, description="Holds inside this daily window (gateway.timezone)."
    )


class RouteConfig(StrictModel):
    """A virtual model name whose target is chosen per request by ordered rules."""

    name: str = Field(min_length=1, description="The model name clients send for this route.")
    rules: list[RuleConfig] = Field(min_length=1, description="Tried in order.")
    fallback: str | None = Field(
        default=None, description="Provider used when no rule holds or every rule's target is down."
    )
    tokenizer: str | None = Field(
        default=None,
        description="Model whose tokenizer counts prompt tokens for rules whose target "
        "is a provider (default: the first model a rule names).",
    )
