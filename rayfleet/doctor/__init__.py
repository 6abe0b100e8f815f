"""rayfleet doctor."""
