"""Unit tier: no Ray. Any test here that starts Ray fails loudly."""

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise RuntimeError("unit tests must not start Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)
