"""Carrying out `rayfleet apply` on the running fleet (the diff is control/apply.py).

    result = await apply_text(fleet, text, dry_run)
        parse and check the new file (vLLM's parser)      -> error, nothing changed
        diff = fleet_diff(running, new); refusal(diff)    -> error, nothing changed
        dry_run                                           -> the diff only
        under the fleet's apply lock, in order:
            gateway: models = old + new, policies from the new file
            added:   a Serve application each, at its initial target
            scaled:  the scaler's config and targets (same replicas, same pids)
            rolled:  blue/green per model (``roll``): green app "<model>@<n>" at the
                     model's target; wait until its replicas serve and one answers a
                     real completion; the old app is deleted and its replicas drain
            removed: its app deleted (replicas drain); the gateway forgets the model

The fleet process owns the pieces (config, scaler, gateway, apps); this module only
sequences them. A rollout that fails (the green side does not start) deletes the green
app and leaves the old one serving, and says why.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import TYPE_CHECKING

import yaml

from rayfleet.config import FleetConfig, ModelConfig, parse_fleet
from rayfleet.control.apply import ApplyResult, fleet_diff, refusal
from rayfleet.control.deploy import delete_app, failed_deployments, set_replicas
from rayfleet.control.scaling import initial_target
from rayfleet.errors import ConfigError, RayfleetError

if TYPE_CHECKING:
    from rayfleet.control.fleet import FleetProcess

SMOKE_TIMEOUT_S = 60.0


async def apply_text(fleet: FleetProcess, text: str, dry_run: bool) -> ApplyResult:
    try:
        new = await asyncio.to_thread(_parse_and_check, text)
    except (ConfigError, RayfleetError) as exc:
        return ApplyResult(error=str(exc))
    diff = fleet_diff(fleet.config, new)
    why = refusal(diff)
    if why or dry_run or diff.empty:
        return ApplyResult(diff, error=why)
    async with fleet.apply_lock:
        result = ApplyResult(diff, applied=True)
        try:
            await _apply(fleet, new, result)
        except RayfleetError as exc:
            result.applied = False
            result.error = str(exc)
        return result


def _parse_and_check(text: str) -> FleetConfig:
    from rayfleet.control.engine_args import check_engine_args

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet.yaml: not valid YAML ({exc.__class__.__name__})") from None
    config = parse_fleet(data)
    check_engine_args(config)
    return config


async def _apply(fleet: FleetProcess, new: FleetConfig, result: ApplyResult) -> None:
    diff = result.diff
    assert diff is not None
    old = fleet.config
    models = [m.name for m in old.models] + diff.added
    await fleet.reconfigure_gateway(new, models)
    fleet.scaler.reconfigure(new)
    fleet.config = new  # the scaler and the gateway read the new file from here on
    for name in diff.added:
        model = new.model(name)
        target = fleet.scaler.targets[name]
        await asyncio.to_thread(set_replicas, new, model, fleet.log_dir, target)
        fleet.apps[name] = name
        result.steps.append(f"model '{name}': deployed with {target} replica(s)")
    for name in diff.scaled:
        result.steps.append(f"model '{name}': target {fleet.scaler.targets[name]} replica(s)")
    for name in diff.rolled:
        result.steps.append(await roll(fleet, new, new.model(name)))
    for name in diff.removed:
        await asyncio.to_thread(delete_app, fleet.apps.pop(name, name))
        result.steps.append(f"model '{name}': removed; its replicas drain")
    await fleet.reconfigure_gateway(new, [m.name for m in new.models])
    fleet.state.models = [m.name for m in new.models]
    fleet.state.save()


async def roll(fleet: FleetProcess, config: FleetConfig, model: ModelConfig) -> str:
    """Blue/green: the new replicas serve before the old ones drain."""
    old_app = fleet.apps.get(model.name, model.name)
    fleet.generation += 1
    green = f"{model.name}@{fleet.generation}"
    target = max(
        fleet.scaler.targets[model.name], initial_target(model, fleet.scaler.clock.now()), 1
    )
    fleet.scaler.paused.add(model.name)
    try:
        await asyncio.to_thread(set_replicas, config, model, fleet.log_dir, target, green)
        try:
            await _wait_serving(fleet, config, model, green, target)
        except RayfleetError:
            await asyncio.to_thread(delete_app, green)
            raise
        fleet.apps[model.name] = green
        fleet.scaler.targets[model.name] = target
        await asyncio.to_thread(delete_app, old_app)
    finally:
        fleet.scaler.paused.discard(model.name)
    return f"model '{model.name}': {target} new replica(s) serving ({green}); the old ones drain"


async def _wait_serving(
    fleet: FleetProcess, config: FleetConfig, model: ModelConfig, app: str, target: int
) -> None:
    deadline = time.monotonic() + model.startup_timeout_s
    replica_set = fleet.gateway.replica_set
    while time.monotonic() < deadline:
        green = [r for r in replica_set.replicas(model.name) if r.app == app and not r.draining]
        if len(green) >= target and await asyncio.to_thread(
            _answers, green[0].url, model.name, model.engine_args.get("api_key")
        ):
            return
        failed = await asyncio.to_thread(failed_deployments, config, {model.name: app})
        if failed:
            raise RayfleetError(
                f"model '{model.name}': the new replicas failed to start: "
                f"{failed[model.name].strip().splitlines()[-1]}"
            )
        await asyncio.sleep(1.0)
    raise RayfleetError(
        f"model '{model.name}': the new replicas were not serving after "
        f"{model.startup_timeout_s:.0f} s; the old ones still serve"
    )


def _answers(url: str, served_name: str, api_key: str | None = None) -> bool:
    """One real completion (one token) passes on the replica at ``url`` (with the model's
    own vLLM ``api_key``, when it sets one)."""
    body = json.dumps({"model": served_name, "prompt": "ready?", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url + "/v1/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=SMOKE_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False
