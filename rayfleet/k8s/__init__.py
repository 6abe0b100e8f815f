"""KubeRay and monitoring manifests rendered from fleet.yaml."""
