"""Where rayfleet and Hugging Face keep data on this machine, resolved in one place.

- ``rayfleet_home()``: ``RAYFLEET_HOME``, else the user's cache directory
  (``~/.cache/rayfleet`` on Linux). Models, downloads, run state, logs and the doctor's
  network measurement live under it.
- ``hf_hub_cache()``: the Hugging Face hub cache, found as ``huggingface_hub`` finds it.

Standard library only at import time: the doctor pickles this module by value into its
probe, which runs on every node of a cluster (``platformdirs`` is imported on first use).
"""

from __future__ import annotations

import os
from pathlib import Path


def rayfleet_home() -> Path:
    """``RAYFLEET_HOME`` if set, else the user's cache directory."""
    env = os.environ.get("RAYFLEET_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rayfleet"))


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, with ``huggingface_hub``'s precedence: ``HF_HUB_CACHE``,
    then ``HUGGINGFACE_HUB_CACHE``, then ``$HF_HOME/hub``, then
    ``$XDG_CACHE_HOME/huggingface/hub``, then ``~/.cache/huggingface/hub``.

    An empty variable counts as unset.
    """
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return _expand(cache)
    hf_home = os.environ.get("HF_HOME")
    if not hf_home:
        cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        hf_home = os.path.join(cache_home, "huggingface")
    return _expand(hf_home) / "hub"


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))
