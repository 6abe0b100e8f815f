"""fleet.yaml ``kubernetes``: how `rayfleet k8s render` lays the fleet out on KubeRay.

    kubernetes:
      name: rayfleet                # RayService name, prefix of every object
      namespace: default            # --namespace overrides
      image: registry/rayfleet:0.1  # rayfleet, Ray and vLLM installed; --image overrides
      gpus_per_node: 8              # GPUs of one node of the pool; bigger replicas refused
      node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
      node_affinity:                # required node labels of the GPU worker pods
        - {key: nvidia.com/gpu.memory, operator: Gt, values: ["70000"]}
      tolerations:
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      model_cache:                  # where local model sources live in every Ray pod
        pvc: models                 # or host_path: /mnt/models
        mount_path: /models
      upgrade_strategy: NewCluster  # NewCluster | NewClusterWithIncrementalUpgrade | None
      head: {num_cpus: 2, memory_gib: 8}
      gateway: {replicas: 2, service_type: ClusterIP, num_cpus: 2, memory_gib: 4}
      secrets: {provider_keys: rayfleet-provider-keys, api_keys: rayfleet-api-keys}

Every field has a default but ``image``, which the render asks for when neither the
file nor ``--image`` gives it. What the fields become is rayfleet/k8s/ (its package
docstring); what the render refuses is rayfleet/k8s/checks.py.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayfleet.config.base import StrictModel

UpgradeStrategy = Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"]
ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]

# RFC 1035 label, what Kubernetes asks of Service names (the RayService's head service
# is `<name>-head-svc`), kept short enough for KubeRay's suffixes.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"'{value}' is not a DNS label: lower-case letters, digits and '-', starting "
            "with a letter, at most 40 characters"
        )
    return value


class HeadConfig(StrictModel):
    """The Ray head pod: GCS, dashboard and Serve's controller; no replica runs there."""

    num_cpus: float = Field(default=2.0, gt=0, description="CPU request and limit of the head.")
    memory_gib: float = Field(default=8.0, gt=0, description="Memory of the head pod (GiB).")


class K8sGatewayConfig(StrictModel):
    """The gateway's Deployment and Service."""

    replicas: int = Field(default=2, ge=1, description="Gateway pods behind the Service.")
    service_type: ServiceType = Field(default="ClusterIP", description="The Service's type.")
    num_cpus: float = Field(default=2.0, gt=0, description="CPU request and limit per pod.")
    memory_gib: float = Field(default=4.0, gt=0, description="Memory per gateway pod (GiB).")


class ModelCacheConfig(StrictModel):
    """A volume holding model files, mounted in every Ray pod at ``mount_path``."""

    pvc: str | None = Field(default=None, description="PersistentVolumeClaim to mount.")
    host_path: str | None = Field(default=None, description="Directory of each node to mount.")
    mount_path: str = Field(
        default="/models",
        description="Where the volume appears; a model source that is a local path lies "
        "under it. HF_HOME is <mount_path>/huggingface, so hub downloads are kept.",
    )
    read_only: bool = Field(default=False, description="Mount read-only (no hub downloads).")

    @field_validator("mount_path", "host_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"'{value}' is not an absolute path")
        return None if value is None else (value.rstrip("/") or "/")

    @model_validator(mode="after")
    def _one_volume(self) -> ModelCacheConfig:
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError("give exactly one of pvc and host_path")
        return self


class SecretsConfig(StrictModel):
    """Secrets the manifests reference by name; the render never reads or writes keys."""

    provider_keys: str = Field(
        default="rayfleet-provider-keys",
        description="Secret with one key per gateway.fallback.providers[].api_key_env, "
        "named like the variable; the gateway gets each as that variable.",
    )
    api_keys: str = Field(
        default="rayfleet-api-keys",
        description="Secret with one key per gateway.api_keys[].key_file, named like the "
        "file; mounted in the gateway at api_keys_dir.",
    )
    api_keys_dir: str = Field(
        default="/etc/rayfleet-keys",
        description="Where the api_keys Secret is mounted; every key_file lies directly in it.",
    )

    @field_validator("api_keys_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") in ("", "/etc/rayfleet"):
            raise ValueError(f"'{value}' must be an absolute directory other than /etc/rayfleet")
        return value.rstrip("/")


class NodeRequirement(StrictModel):
    """One term of the GPU pods' required node affinity (Kubernetes' matchExpressions)."""

    key: str = Field(min_length=1, description="Node label, e.g. nvidia.com/gpu.product.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = "In"
    values: list[str] = Field(default_factory=list, description="Label values to compare with.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeRequirement:
        wanted = {"Exists": 0, "DoesNotExist": 0, "Gt": 1, "Lt": 1}.get(self.operator)
        if wanted is not None and len(self.values) != wanted:
            raise ValueError(f"operator {self.operator} takes {wanted} value(s)")
        if wanted is None and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        return self


class Toleration(StrictModel):
    """A taint the GPU worker pods tolerate (Kubernetes' Toleration)."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class IncrementalUpgradeConfig(StrictModel):
    """How NewClusterWithIncrementalUpgrade moves traffic (KubeRay's clusterUpgradeOptions)."""

    gateway_class_name: str = Field(min_length=1, description="Gateway API class to use.")
    interval_s: int = Field(default=60, ge=1, description="Seconds between two steps.")
    step_size_percent: int = Field(default=25, ge=1, le=100, description="Traffic per step.")
    max_surge_percent: int = Field(
        default=100, ge=1, le=100, description="Extra capacity the new cluster may add per step."
    )


class KubernetesConfig(StrictModel):
    """The KubeRay layout `rayfleet k8s render` writes for this fleet."""

    name: str = Field(default="rayfleet", description="RayService name, prefix of every object.")
    namespace: str = Field(default="default", description="Namespace of every object.")
    image: str | None = Field(
        default=None,
        description="Image of the Ray pods and the gateway, with rayfleet, Ray and vLLM "
        "installed (the same versions on every pod).",
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        description="GPUs one node of the GPU pool has; a replica needing more per node is "
        "refused (default: no limit, each worker pod asks for what its replica needs).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the GPU worker pods require."
    )
    node_affinity: list[NodeRequirement] = Field(
        default_factory=list, description="Required node affinity of the GPU worker pods."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the GPU worker pods tolerate."
    )
    model_cache: ModelCacheConfig | None = Field(
        default=None, description="Volume with model files in every Ray pod (none by default)."
    )
    shm_gib: float | None = Field(
        default=None,
        gt=0,
        description="Size of /dev/shm in worker pods (default: 30% of the pod's memory, "
        "at least 2 GiB).",
    )
    upgrade_strategy: UpgradeStrategy = Field(
        default="NewCluster",
        description="How KubeRay rolls a changed RayService: a new cluster, switched over "
        "when ready; the same, traffic moved in steps (needs Gateway API); None: in place.",
    )
    head: HeadConfig = Field(default_factory=HeadConfig)
    gateway: K8sGatewayConfig = Field(default_factory=K8sGatewayConfig)
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)

    incremental_upgrade: IncrementalUpgradeConfig | None = Field(
        default=None,
        description="Steps of a NewClusterWithIncrementalUpgrade (required with it only).",
    )

    @field_validator("name", "namespace")
    @classmethod
    def _label(cls, value: str) -> str:
        return _dns_label(value)

    @model_validator(mode="after")
    def _steps_with_incremental(self) -> KubernetesConfig:
        incremental = self.upgrade_strategy == "NewClusterWithIncrementalUpgrade"
        if incremental != (self.incremental_upgrade is not None):
            raise ValueError(
                "incremental_upgrade is given exactly when upgrade_strategy is "
                f"NewClusterWithIncrementalUpgrade (upgrade_strategy is {self.upgrade_strategy})"
            )
        return self
