"""``rayfleet up / status / down`` (being built)."""


def up() -> None:
    """Serve a fleet."""


def status() -> None:
    """Show the fleet."""


def down() -> None:
    """Stop the fleet."""
