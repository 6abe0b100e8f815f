"""fleet.yaml ``cluster``: which Ray cluster runs the fleet, and how long placement may take."""

from __future__ import annotations

from pydantic import Field, field_validator

from rayfleet.config.base import StrictModel


class ClusterConfig(StrictModel):
    """Which Ray cluster runs the fleet."""

    address: str = Field(
        default="local",
        description="'local' starts an embedded Ray on this machine; 'auto' joins the Ray "
        "cluster started with `ray start`; 'ray://host:10001' connects through Ray Client.",
    )
    num_cpus: int | None = Field(
        default=None,
        ge=1,
        description="Logical CPUs of the embedded Ray (local only; default: enough "
        "for every replica).",
    )

    placement_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest `rayfleet up` waits for Ray to place a replica that spans "
        "nodes before it fails with the placement group's state.",
    )

    @field_validator("address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if value in ("local", "auto") or value.startswith("ray://") or ":" in value:
            return value
        raise ValueError(f"'{value}' is not 'local', 'auto', 'ray://host:port' or 'host:port'")
