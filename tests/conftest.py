"""Fixtures shared by every tier.

The models are built offline once and cached under RAYFLEET_HOME (the user's cache
dir by default), so only the first session on a machine pays for them.

Real servers (integration tests only; tests/integration/fleet.py builds them):
- ``vllm_tiny``: one vLLM server on the tiny model for the whole session;
- ``fleet`` and ``client``: one fleet per test module, of the models the module's own
  ``fleet_models`` fixture lists, and the openai client on its gateway; modules that name
  the same ``SHARED_FLEET`` run one after another on one fleet (``FleetPool``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from rayfleet.control.engine import EngineProcess
from rayfleet.models import make_demo, make_tiny
from tests.integration.fleet import RunningFleet, running_fleet, serving_engine

SHARED_FLEET = "SHARED_FLEET"  # the module attribute naming the fleet a module shares

_session: pytest.Session | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session
    _session = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process once pytest is done, with pytest's exit status, without the
    interpreter's finalization. Every fixture has been torn down and every report written
    by now. A fresh-clone run once passed all 975 tests and then died in finalization
    (SIGSEGV in a thread jumping into freed memory, after nanobind reported triton's
    bindings leaked; triton is loaded with vLLM's modules), which failed ``make test``
    with nothing wrong in rayfleet or its tests."""
    if _session is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_session.exitstatus))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Directory of the tiny random Llama (2 layers, head_dim 64, vocab ~512)."""
    return make_tiny()


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """Directory of SmolLM2-135M-Instruct in float32."""
    return make_demo()


@pytest.fixture(scope="session")
def vllm_tiny(tiny_model: Path) -> Iterator[EngineProcess]:
    """One real vLLM OpenAI server on the tiny model, served as ``tiny``, for the session."""
    with serving_engine(tiny_model, "tiny") as engine:
        yield engine


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest,
    fleet_models: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningFleet]:
    """A real fleet of the module's ``fleet_models``, shared by the module's tests, and
    by the next modules too when they name the same ``SHARED_FLEET`` (see FleetPool).

    Tests may kill its servers (it must recover) but never stop it; a test that stops a
    fleet starts its own with ``running_fleet``."""
    shared = getattr(request.module, SHARED_FLEET, None)
    if shared is None:
        with running_fleet(tmp_path_factory.mktemp("fleet"), fleet_models) as running:
            yield running
        return
    pool: FleetPool = request.getfixturevalue("fleet_pool")
    yield pool.get(shared, fleet_models, tmp_path_factory)
    if _next_module_fleet(request) != shared:
        pool.stop()


class FleetPool:
    """The one shared fleet running now: modules with the same ``SHARED_FLEET`` (a module
    attribute naming it) run one after another (``pytest_collection_modifyitems``) and
    use one fleet, started by the first and stopped after the last. It saves a fleet's
    start (a minute or two) for each module after the first; their tests must not depend
    on what the modules before them sent (counters are read as differences)."""

    def __init__(self) -> None:
        self._name: str | None = None
        self._models: list[dict[str, Any]] = []
        self._running: RunningFleet | None = None
        self._stack = contextlib.ExitStack()

    def get(
        self, name: str, models: list[dict[str, Any]], tmp: pytest.TempPathFactory
    ) -> RunningFleet:
        if self._running is not None and self._name == name:
            assert models == self._models, f"modules sharing fleet '{name}' list other models"
            return self._running
        self.stop()
        self._running = self._stack.enter_context(running_fleet(tmp.mktemp("fleet"), models))
        self._name, self._models = name, models
        return self._running

    def stop(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._name, self._running = None, None


@pytest.fixture(scope="session")
def fleet_pool() -> Iterator[FleetPool]:
    pool = FleetPool()
    try:
        yield pool
    finally:
        pool.stop()


def _next_module_fleet(request: pytest.FixtureRequest) -> str | None:
    """The ``SHARED_FLEET`` of the module that runs after this one (None if none)."""
    modules = list(dict.fromkeys(_module(item) for item in request.session.items))
    here = modules.index(request.module)
    return getattr(modules[here + 1], SHARED_FLEET, None) if here + 1 < len(modules) else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that share a fleet run one after another, where the first of them would."""

    def group(item: pytest.Item) -> object:
        module = _module(item)
        return getattr(module, SHARED_FLEET, None) or module

    first: dict[object, int] = {}
    for index, item in enumerate(items):
        first.setdefault(group(item), index)
    items.sort(key=lambda item: first[group(item)])  # stable: each group keeps its order


def _module(item: pytest.Item) -> Any:
    return item.getparent(pytest.Module).obj  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def client(fleet: RunningFleet) -> openai.OpenAI:
    return fleet.client()
