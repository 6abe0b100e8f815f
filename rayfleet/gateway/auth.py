"""API keys: stored only as SHA-256 hashes, looked up by the hash of what a client sends.

Make the hash of a key for fleet.yaml's ``key_sha256`` with ``rayfleet keys hash < keyfile``
(or type the key at its prompt), which calls ``hash_key``.

Keys are never logged; errors name the key's configured ``name`` only. A key sent is
hashed, then compared with every configured hash with ``hmac.compare_digest``, never
stopping at a match, so the time taken tells nothing about which or how much matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rayfleet.errors import ConfigError
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.limits import KeyQuota

if TYPE_CHECKING:
    from rayfleet.config import ApiKeyConfig
    from rayfleet.gateway.shared_state import QuotaCells


def hash_key(key: str) -> str:
    """``sha256:<hex>`` of a key, the form fleet.yaml stores."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def read_key_file(path: str) -> str:
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise ConfigError(f"api key file {path}: cannot read ({exc.strerror})") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ConfigError(f"api key file {path} is empty; put the key on its first line")
    return key


def _shared_cells(shared: QuotaCells | None, position: int) -> dict[str, Any]:
    if shared is None:
        return {}
    return {"cells": cast(MutableSequence[float], shared.of_key(position)), "lock": shared.lock}


@dataclass
class ApiKey:
    name: str
    priority_class: str | None
    models: frozenset[str] | None
    quota: KeyQuota
    hashed: str = field(repr=False, default="")

    def check_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise RequestError(
                403,
                f"API key '{self.name}' may not use model '{model}'; it may use: "
                f"{', '.join(sorted(self.models))}.",
                param="model",
                code="model_not_allowed",
                reason="forbidden_model",
            )


class KeyTable:
    """The configured keys, by hash."""

    def __init__(self, keys: list[ApiKey]):
        self._keys = list(keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    @classmethod
    def from_config(
        cls, configs: Iterable[ApiKeyConfig], shared: QuotaCells | None = None
    ) -> KeyTable:
        """The keys of ``configs``; with ``shared``, their quotas in the cells the
        gateway's worker processes share (shared_state.py), in the order of ``configs``."""
        keys = []
        for position, c in enumerate(configs):
            if c.key_sha256:
                hashed = c.key_sha256
            elif c.key_file:
                hashed = hash_key(read_key_file(c.key_file))
            else:  # the config's validation already says so
                raise ConfigError(f"api key '{c.name}': give key_sha256 or key_file")
            quota = KeyQuota(
                c.name,
                requests_per_minute=c.requests_per_minute,
                tokens_per_minute=c.tokens_per_minute,
                max_concurrent=c.max_concurrent,
                **_shared_cells(shared, position),
            )
            models = frozenset(c.models) if c.models is not None else None
            keys.append(ApiKey(c.name, c.priority_class, models, quota, hashed))
        return cls(keys)

    def authenticate(self, authorization: str | None) -> ApiKey:
        """The key of an ``Authorization: Bearer <key>`` header, or a 401."""
        if not authorization:
            raise RequestError(
                401,
                "Missing API key: send 'Authorization: Bearer <key>'.",
                code="missing_api_key",
                reason="unauthorized",
            )
        scheme, _, key = authorization.partition(" ")
        found = self._match(hash_key(key.strip()).encode())
        if found is None or scheme.lower() != "bearer":
            raise RequestError(
                401, "Incorrect API key provided.", code="invalid_api_key", reason="unauthorized"
            )
        return found

    def _match(self, hashed: bytes) -> ApiKey | None:
        found = None
        for candidate in self._keys:  # all of them, whichever matches
            if hmac.compare_digest(candidate.hashed.encode(), hashed):
                found = candidate
        return found
