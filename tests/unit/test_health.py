"""``GET /health`` of the real gateway: 200 while every model can take a request now (a
serving replica, or requests held until one starts), 503 while a fixed-count model has
none; the body counts each model's serving replicas."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.server import start_gateway


def health(hold_s: dict[str, float]) -> tuple[int, dict[str, Any]]:
    async def main() -> tuple[int, dict[str, Any]]:
        async def no_replicas() -> list[dict[str, Any]]:
            return []

        gateway = Gateway(["chat", "embed"], no_replicas, hold_s=hold_s)
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        try:
            async with (
                aiohttp.ClientSession() as client,
                client.get(f"http://{host}:{port}/health") as response,
            ):
                return response.status, await response.json()
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_a_fixed_model_with_no_replica_is_not_ready():
    status, body = health({"chat": 30.0})
    assert status == 503
    assert body == {"status": "degraded", "models": {"chat": 0, "embed": 0}}


def test_models_that_hold_requests_until_a_replica_starts_are_ready_at_zero():
    status, body = health({"chat": 30.0, "embed": 30.0})
    assert status == 200
    assert body == {"status": "ok", "models": {"chat": 0, "embed": 0}}
