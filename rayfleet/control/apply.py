"""`rayfleet apply`: what changes between the running fleet and a new fleet.yaml, and how.

    diff = fleet_diff(old, new)     pure: per model added / removed / scaled / rolled,
                                    and what cannot change while running
    diff.lines()                    the diff as a person reads it

How each change is made (by ``FleetProcess.apply``):

- **scaled** (``replicas``, ``autoscaling``, ``schedules``, ``drain_timeout_s``,
  ``startup_timeout_s``): new targets and bounds, nothing restarts (the same vLLM pids);
- **rolled** (anything a replica starts with: ``source``, ``engine_args``, resources,
  ``env``, ``nodes_per_replica`` ...): blue/green. A new Serve application starts the
  new replicas beside the old ones; once they serve (a real completion passed on one),
  the old application is deleted and its replicas drain (control/drain.py). A model
  with one replica never has zero capacity;
- **added** / **removed**: a new application / the old one deleted (its replicas drain);
- the gateway's policies are rebuilt from the new file; ``gateway.host``/``port``,
  ``cluster`` and a model's ``routing`` (the gateway keeps each model's replica policy
  and what it learned) cannot change while the fleet runs (``refusal``: one line, and
  nothing changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayfleet.config import FleetConfig, ModelConfig

# Fields whose change needs no new replica: the scaler and the gateway read them. A
# replica's deployment version leaves them out (replica.deployment_version).
SCALING_FIELDS = frozenset(
    {"replicas", "autoscaling", "schedules", "drain_timeout_s", "routing", "startup_timeout_s"}
)


@dataclass
class FleetDiff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    scaled: dict[str, list[str]] = field(default_factory=dict)  # model -> fields
    rolled: dict[str, list[str]] = field(default_factory=dict)  # model -> fields
    refused: list[str] = field(default_factory=list)  # what cannot change while running
    gateway_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.added or self.removed or self.scaled or self.rolled or self.gateway_changed
        )

    def lines(self) -> list[str]:
        shown = [f"+ model '{name}': added" for name in self.added]
        shown += [f"- model '{name}': removed (its replicas drain)" for name in self.removed]
        shown += [
            f"~ model '{name}': scaled ({', '.join(fields)}); no replica restarts"
            for name, fields in self.scaled.items()
        ]
        shown += [
            f"~ model '{name}': {', '.join(fields)} changed; rolled blue/green (new replicas "
            "serve before the old ones drain)"
            for name, fields in self.rolled.items()
        ]
        if self.gateway_changed:
            shown.append("~ gateway: policies rebuilt from the new file")
        return shown or ["no changes"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "removed": self.removed,
            "scaled": self.scaled,
            "rolled": self.rolled,
            "gateway_changed": self.gateway_changed,
            "lines": self.lines(),
        }


def fleet_diff(old: FleetConfig, new: FleetConfig) -> FleetDiff:
    diff = FleetDiff()
    old_models = {m.name: m for m in old.models}
    new_models = {m.name: m for m in new.models}
    diff.added = [name for name in new_models if name not in old_models]
    diff.removed = [name for name in old_models if name not in new_models]
    for name, model in new_models.items():
        before = old_models.get(name)
        if before is None:
            continue
        changed = _changed_fields(before, model)
        if "routing" in changed:  # the gateway keeps a model's replica policy, and its index
            diff.refused.append(f"model '{name}' routing")
        rolled = [f for f in changed if f not in SCALING_FIELDS]
        if rolled:
            diff.rolled[name] = rolled
        elif changed:
            diff.scaled[name] = changed
    if old.cluster != new.cluster:
        diff.refused.append("cluster")
    if (old.gateway.host, old.gateway.port) != (new.gateway.host, new.gateway.port):
        diff.refused.append("gateway.host / gateway.port")
    diff.gateway_changed = old.gateway != new.gateway
    return diff


def _changed_fields(old: ModelConfig, new: ModelConfig) -> list[str]:
    before, after = old.model_dump(), new.model_dump()
    return [key for key in after if before.get(key) != after[key]]


def refusal(diff: FleetDiff) -> str | None:
    """Why the new file cannot be applied to the running fleet, in one line, or None."""
    if diff.refused:
        return (
            f"{' and '.join(diff.refused)} cannot change while the fleet runs; "
            "stop it with `rayfleet down` and start it with `rayfleet up`"
        )
    return None


@dataclass
class ApplyResult:
    diff: FleetDiff | None = None
    applied: bool = False
    error: str | None = None
    steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "diff": self.diff.as_dict() if self.diff else None,
            "applied": self.applied,
            "steps": self.steps,
        }
