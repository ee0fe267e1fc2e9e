"""How a Kubernetes cluster is used, as the ``kubernetes:`` mapping of an inventory entry (:class:`KubeSpec`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["KubeSpec", "Toleration"]

_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


class Toleration(BaseModel):
    """One toleration of the trial's pods (the pod spec's ``tolerations`` item, Kubernetes' own field names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None  # Kubernetes' spelling

    def manifest(self) -> dict[str, object]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class KubeSpec(BaseModel):
    """A host that is a Kubernetes cluster: each trial is one pod (a server on one node) or one LeaderWorkerSet of
    the trial's nodes (a server spanning nodes), created in ``namespace`` through the user's kubeconfig
    (``context``, or the current one). The image must hold the engine and the model path the space names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(description="the container image every trial's server runs in (the engine inside it)")
    namespace: str = Field(default="default", description="where the trial's objects are created")
    context: str | None = Field(default=None, description="the kubeconfig context (None: the current one)")
    kubeconfig: str | None = Field(default=None, description="the kubeconfig file (None: $KUBECONFIG, else "
                                   "~/.kube/config)")
    gpu_resource: str = Field(default="nvidia.com/gpu", description="the extended resource a GPU is requested as")
    node_selector: dict[str, str] = Field(default_factory=dict, description="the pods' `nodeSelector`")
    tolerations: tuple[Toleration, ...] = Field(default=(), description="the pods' `tolerations`")
    cpu: str | None = Field(default=None, description="CPU request and limit of each pod (`8`, `7500m`)")
    memory: str | None = Field(default=None, description="memory request and limit of each pod (`64Gi`): the "
                               "kernel kills the container past it (`OOMKilled`, a FAIL, never a CUDA OOM)")
    shm_size: str | None = Field(default="16Gi", description="size of the in-memory `/dev/shm` volume (NCCL and "
                                 "the engines' shared memory); None: the runtime's default (64 MiB)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = Field(default=(), description="names of the secrets to pull with")
    service_account: str | None = Field(default=None, description="the pods' service account")
    priority_class: str | None = Field(default=None, description="the pods' `priorityClassName`")
    max_trials: int = Field(default=1, ge=1, le=256, description="trials run at once, each its own pod or set")
    pending_timeout: float | None = Field(default=600.0, gt=0,
                                          description="seconds a trial's pods may wait for the scheduler (apart "
                                          "from the start-up time) before the trial FAILs `scheduler` (None: as "
                                          "long as the run)")
    server_port: int = Field(default=30000, ge=1024, le=65535, description="the port the server binds in its pod")
    dist_port: int = Field(default=29500, ge=1024, le=65535,
                           description="the rendezvous port on the leader of a server spanning nodes")
    gpu_memory_mib: float | None = Field(default=None, gt=0, description="memory of one GPU of the nodes, as "
                                         "nvidia-smi's memory.total (MiB), for the memory model before any trial")

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value):
            raise ValueError(f"{value!r} is not a namespace name (lower-case letters, digits and '-', at most 63)")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"must be one image reference, got {value!r}")
        return value

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _LABEL_KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a label key ([prefix/]name, name at most 63 characters)")
            if not _LABEL_VALUE.fullmatch(text):
                raise ValueError(f"{key}: {text!r} is not a label value (at most 63 letters, digits, '-', '_', "
                                 "'.', starting and ending with a letter or digit)")
        return value

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (`8`, `500m`, `64Gi`)")
        return value

    @field_validator("gpu_resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not _LABEL_KEY.fullmatch(value) or "/" not in value:
            raise ValueError(f"{value!r} is not an extended resource name (`vendor.com/gpu`)")
        return value
