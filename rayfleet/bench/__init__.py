"""rayfleet bench."""
