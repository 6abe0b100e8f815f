"""KubeRay and monitoring manifests rendered from fleet.yaml (`rayfleet k8s render`).

    fleet.yaml ──load_fleet──> FleetConfig (its ``kubernetes`` section:
                               rayfleet/config/kubernetes.py)
        └─ render.render_fleet ─> checks.fleet_problem   one-line refusals
                                  rayservice.rayservice  RayService: serveConfigV2 and
                                                         the Ray cluster (workers.py
                                                         sizes the worker groups)
                                  gateway_objects        gateway Deployment and Service,
                                                         the fleet's ConfigMap
                                  monitoring_objects     PodMonitors, PrometheusRule,
                                                         dashboard ConfigMap (the rules
                                                         and dashboard: monitoring.py)
                                  checks.operator_problems  KubeRay's webhook rules
           render.write_manifests ─> DIR/{configmap,rayservice,gateway,monitoring}.yaml

At run time every pod reads the same fleet.yaml from the ConfigMap (pod.CONFIG_PATH):
Serve builds each model's application with ``rayfleet.control.serve_app:build`` in the
Ray pods, and ``rayfleet gateway`` in the gateway pods joins the head over Ray client,
reads the replica registry and proxies straight to the replicas. command.py is the CLI.
"""
