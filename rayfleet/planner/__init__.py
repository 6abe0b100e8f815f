"""rayfleet planner."""
