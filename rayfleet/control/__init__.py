"""Control plane: replicas on Ray Serve, the registry, up/status/down."""
