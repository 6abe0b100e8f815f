"""Offline models: the tiny test Llama and the SmolLM2 demo model."""

from rayfleet.models.build import make_demo, make_tiny

__all__ = ["make_demo", "make_tiny"]
