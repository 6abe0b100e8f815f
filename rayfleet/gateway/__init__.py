"""The OpenAI-compatible gateway."""
