"""Where rayfleet keeps its data: models, downloads, run state."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def rayfleet_home() -> Path:
    """``RAYFLEET_HOME`` if set, else the user's cache directory."""
    env = os.environ.get("RAYFLEET_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("rayfleet"))
