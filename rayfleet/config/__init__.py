"""fleet.yaml, validated (see rayfleet/config/fleet.py)."""

from rayfleet.config.fleet import *  # noqa: F403
from rayfleet.config.fleet import _describe, _did_you_mean  # noqa: F401
