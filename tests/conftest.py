"""Fixtures shared by every tier.

The models are built offline once and cached under RAYFLEET_HOME (the user's cache
dir by default), so only the first session on a machine pays for them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfleet.control.engine import EngineProcess
from rayfleet.models import make_demo, make_tiny

TINY_ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Directory of the tiny random Llama (2 layers, head_dim 64, vocab ~512)."""
    return make_tiny()


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """Directory of SmolLM2-135M-Instruct in float32."""
    return make_demo()


@pytest.fixture(scope="session")
def vllm_tiny(tiny_model: Path):
    """One real vLLM OpenAI server on the tiny model, served as ``tiny``, for the session."""
    engine = EngineProcess(str(tiny_model), "tiny", TINY_ENGINE_ARGS)
    engine.start()
    try:
        engine.wait_healthy(timeout_s=600)
        yield engine
    finally:
        engine.stop()
