"""Fixtures shared by every tier.

The models are built offline once and cached under RAYFLEET_HOME (the user's cache
dir by default), so only the first session on a machine pays for them.

Real servers (integration tests only; tests/integration/fleet.py builds them):
- ``vllm_tiny``: one vLLM server on the tiny model for the whole session;
- ``fleet`` and ``client``: one fleet per test module, of the models the module's own
  ``fleet_models`` fixture lists, and the openai client on its gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from rayfleet.control.engine import EngineProcess
from rayfleet.models import make_demo, make_tiny
from tests.integration.fleet import RunningFleet, running_fleet, serving_engine


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
    fleet_models: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    """A real fleet of the module's ``fleet_models``, shared by the module's tests.

    Tests may kill its servers (it must recover) but never stop it; a test that stops a
    fleet starts its own with ``running_fleet``."""
    with running_fleet(tmp_path_factory.mktemp("fleet"), fleet_models) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet: RunningFleet) -> openai.OpenAI:
    return fleet.client()
