"""fleet.yaml, validated: one pydantic model per section, one-line errors.

    fleet.py     FleetConfig (cluster, gateway, models) and its cross-section checks;
                 load_fleet / parse_fleet / default_fleet; derived engine arguments
    models.py    ModelConfig: one model served as a group of identical replicas (models[])
    cluster.py   ClusterConfig: the Ray address, placement deadline
    shape.py     whether a model's replica shape (executor, nodes, GPUs) holds its
                 engine; gpus.py the GPU rule
    gateway.py   GatewayConfig and its policies: limits, fallback providers, priority
                 classes, API keys, replica protection
    route_rules.py  RouteConfig, RuleConfig, TimeWindow: virtual model names and the
                 ordered rules that pick their target (gateway.routes)
    routing.py   RoutingConfig: the replica policy of a model (models[].routing)
    autoscaling.py  AutoscalingConfig and ScheduleWindow: a model's replica bounds,
                 load target and weekly windows (models[].autoscaling, .schedules)
    kubernetes.py  KubernetesConfig: the KubeRay layout `rayfleet k8s render` writes
    messages.py  a validation error as one line: field path, reason, "did you mean"
    base.py      StrictModel, the base of every section (unknown keys are errors)

Everything a caller needs is importable from ``rayfleet.config``. Nothing here imports
Ray or vLLM; the check of engine arguments against vLLM's parser is in
rayfleet/control/engine_args.py.
"""

from rayfleet.config.autoscaling import AutoscalingConfig, ScheduleWindow
from rayfleet.config.cluster import ClusterConfig
from rayfleet.config.fleet import DerivedArg, FleetConfig, default_fleet, load_fleet, parse_fleet
from rayfleet.config.gateway import (
    ApiKeyConfig,
    FallbackConfig,
    GatewayConfig,
    LimitsConfig,
    PriorityClassConfig,
    ProviderConfig,
    ReplicaProtectionConfig,
)
from rayfleet.config.kubernetes import KubernetesConfig
from rayfleet.config.messages import did_you_mean
from rayfleet.config.models import ModelConfig
from rayfleet.config.route_rules import RouteConfig, RuleConfig, TimeWindow
from rayfleet.config.routing import RoutingConfig

__all__ = [
    "ApiKeyConfig",
    "AutoscalingConfig",
    "ClusterConfig",
    "DerivedArg",
    "FallbackConfig",
    "FleetConfig",
    "GatewayConfig",
    "KubernetesConfig",
    "LimitsConfig",
    "ModelConfig",
    "PriorityClassConfig",
    "ProviderConfig",
    "ReplicaProtectionConfig",
    "RouteConfig",
    "RoutingConfig",
    "RuleConfig",
    "ScheduleWindow",
    "TimeWindow",
    "default_fleet",
    "did_you_mean",
    "load_fleet",
    "parse_fleet",
]
