"""External OpenAI-compatible providers: the degradation channel of the fleet.

A ``Provider`` knows its base URL, the header carrying its key (read once from
the environment variable the config names) and which names clients send map to
which of its models. ``body_for`` rewrites a request for it: its model name, and
no vLLM-only ``priority`` field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rayfleet.errors import ConfigError
from rayfleet.gateway.upstream import TimeLimits

if TYPE_CHECKING:
    from rayfleet.config import ProviderConfig

FALLBACK_PREFIX = "fallback:"


class Provider:
    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        api_key: str | None = None,
        models: dict[str, str] | None = None,
        default_model: str | None = None,
        timeout_s: float = 600.0,
    ):
        self.name = name
        self.label = FALLBACK_PREFIX + name
        self.base_url = base_url.rstrip("/")
        self.models = dict(models or {})
        self.default_model = default_model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.limits = TimeLimits(total_s=timeout_s)

    @classmethod
    def from_config(cls, config: ProviderConfig) -> Provider:
        api_key = None
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise ConfigError(
                    f"fallback provider '{config.name}': environment variable "
                    f"{config.api_key_env} is not set; export the provider's key there"
                )
        return cls(
            config.name,
            config.base_url,
            api_key=api_key,
            models=config.models,
            default_model=config.default_model,
            timeout_s=config.timeout_s,
        )

    def model_for(self, names: Iterable[str]) -> str | None:
        """The provider's model for the first of ``names`` it maps, else its default."""
        for name in names:
            if name in self.models:
                return self.models[name]
        return self.default_model

    def url(self, path: str) -> str:
        # path is "/v1/..."; base_url already ends at the provider's API root.
        return self.base_url + path.removeprefix("/v1")

    @staticmethod
    def body_for(body: dict[str, Any], model: str) -> bytes:
        out = {k: v for k, v in body.items() if k != "priority"}
        out["model"] = model
        return json.dumps(out).encode()


def first_provider(providers: list[Provider], names: Iterable[str]) -> tuple[Provider, str] | None:
    names = list(names)
    for provider in providers:
        model = provider.model_for(names)
        if model is not None:
            return provider, model
    return None
