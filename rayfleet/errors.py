"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""


class RayfleetError(Exception):
    """A failure with a message that says what was wrong and what to do."""

    exit_code = 2


class ConfigError(RayfleetError):
    """fleet.yaml (or another input file) is invalid."""
