"""The objects a trial's server is, as plain manifests (the dicts ``kubectl apply`` and the API take).

* A server on one node: a :func:`pod` (``restartPolicy: Never``: a second launch is never a trial's) and a
  :func:`service` in front of it, owned by the pod (the garbage collector deletes it with the pod).
* A server spanning nodes: one :func:`leader_worker_set` of ``size`` pods. The leader and the workers run the
  same command, rendered from the launch value with LeaderWorkerSet's environment in place of the rank, the
  head's address and the node count (``$(LWS_WORKER_INDEX)``, ``$(LWS_LEADER_ADDRESS)``, ``$(LWS_GROUP_SIZE)``:
  the kubelet expands them from the variables LWS puts in every pod, as LWS's own SGLang example does); only
  the leader declares the serving port, and the service selects the leader alone.
* ``servetune export --format k8s``: :func:`deployment` plus :func:`service` for one node, the same LWS for more.

Every object carries the owner's labels (:mod:`runners.kube.labels`); GPUs are asked as the extended resource
the inventory names (``nvidia.com/gpu``), with its node selector and tolerations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runners.engines.base import Engine, LaunchLike
from runners.engines.nodes import render_nodes
from runners.engines.script import render
from runners.kube.labels import ROLE, Owner
from runners.kube.spec import KubeSpec

__all__ = ["CONTAINER", "LWS_API", "LWS_GROUP_SIZE", "LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_WORKER_LABEL",
           "deployment", "in_pod", "leader_worker_set", "lws_commands", "pod", "pod_spec", "service"]

CONTAINER = "server"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_GROUP_SIZE = "$(LWS_GROUP_SIZE)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
LWS_WORKER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
"""The label LWS puts on each pod of a group: ``0`` on the leader (LWS v0.10.0 ``leaderworkerset_types.go``)."""
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


class _InPod:
    """``launch`` as it runs in a pod: bound on every address of the pod (the service reaches it at the pod's
    address, not at loopback) and on the inventory's port (a :class:`LaunchLike`)."""

    def __init__(self, launch: LaunchLike, port: int, python: str | None) -> None:
        self.engine = launch.engine
        self.python = python or launch.python
        self.model_path = launch.model_path
        self.host = "0.0.0.0"
        self.port = port
        self.knobs = launch.knobs
        self.flags = launch.flags
        self.fixed_args = launch.fixed_args
        self.env = launch.env
        self.engine_options = launch.engine_options


def in_pod(launch: LaunchLike, spec: KubeSpec, python: str | None = None) -> LaunchLike:
    return _InPod(launch, spec.server_port, python)


def lws_commands(engine: Engine, launch: LaunchLike, version: str, size: int, dist_port: int
                 ) -> tuple[list[str], list[str], dict[str, str]]:
    """``(leader argv, worker argv, env)`` of a server over ``size`` nodes, rendered by the same
    :func:`~runners.engines.nodes.render_nodes` every multi-node trial uses, with LWS's variables for the head's
    address, the rank and the node count."""
    ranks = render_nodes(engine, launch, version, [LWS_LEADER_ADDRESS] * size, dist_port)

    def with_lws(argv: Sequence[str], rank: int) -> list[str]:
        out: list[str] = []
        after = ""
        for arg in argv:
            if after in ("--node-rank", "-r") and arg == str(rank):
                out.append(LWS_WORKER_INDEX)
            elif after in ("--nnodes", "-n") and arg == str(size):
                out.append(LWS_GROUP_SIZE)
            else:
                out.append(arg)
            after = arg
        return out

    return with_lws(ranks[0].argv, 0), with_lws(ranks[-1].argv, size - 1), dict(ranks[0].env)


def _meta(name: str, owner: Owner, role: str | None = None) -> dict[str, Any]:
    labels = owner.labels()
    if role:
        labels[ROLE] = role
    return {"name": name, "labels": labels, "annotations": owner.annotations()}


def _resources(spec: KubeSpec, gpus: int) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpus > 0:
        limits[spec.gpu_resource] = str(int(gpus))
    if spec.cpu:
        limits["cpu"] = spec.cpu
    if spec.memory:
        limits["memory"] = spec.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = dict(limits)
        out["requests"] = dict(limits)
    return out


def pod_spec(spec: KubeSpec, argv: Sequence[str], env: Mapping[str, str], gpus: int, *, serving: bool,
             health_path: str | None, restart: str = "Never") -> dict[str, Any]:
    """The pod spec of one server process (one node of a server): one container ``server`` running ``argv``."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(argv),
        "env": [{"name": k, "value": env[k]} for k in sorted(env)],
        "resources": _resources(spec, gpus),
    }
    if serving:
        container["ports"] = [{"name": "http", "containerPort": spec.server_port, "protocol": "TCP"}]
        if health_path:
            container["readinessProbe"] = {"httpGet": {"path": health_path, "port": spec.server_port},
                                           "periodSeconds": 10, "failureThreshold": 3}
    out: dict[str, Any] = {"restartPolicy": restart, "containers": [container], "enableServiceLinks": False}
    if spec.shm_size:
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        out["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [t.manifest() for t in spec.tolerations]
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.service_account:
        out["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        out["priorityClassName"] = spec.priority_class
    return out


def pod(name: str, owner: Owner, spec: KubeSpec, argv: Sequence[str], env: Mapping[str, str], gpus: int, *,
        health_path: str | None = None) -> dict[str, Any]:
    """A one-node trial's server: a bare pod that never restarts (a restart would be a second launch)."""
    meta = {**_meta(name, owner, "server"), "namespace": spec.namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": pod_spec(spec, argv, env, gpus, serving=True, health_path=health_path)}


def service(name: str, owner: Owner, spec: KubeSpec, *, selector: Mapping[str, str],
            owner_ref: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ClusterIP service on the server's port, selecting ``selector`` (the serving pod alone); owned by
    ``owner_ref`` (``{apiVersion, kind, name, uid}`` of the pod or set) when given, so it goes with it."""
    meta = {**_meta(name, owner, "service"), "namespace": spec.namespace}
    if owner_ref is not None:
        meta["ownerReferences"] = [{**dict(owner_ref), "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": "ClusterIP", "selector": dict(selector),
                     "ports": [{"name": "http", "port": spec.server_port, "targetPort": spec.server_port,
                                "protocol": "TCP"}]}}


def deployment(name: str, owner: Owner, spec: KubeSpec, argv: Sequence[str], env: Mapping[str, str], gpus: int, *,
               health_path: str | None = None) -> dict[str, Any]:
    """The exported one-node server: a Deployment of one replica (the pod :func:`pod` would create, restarted by
    Kubernetes as a served model should be); ``Recreate``, so two servers never hold the GPUs at once."""
    labels = owner.labels()
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {**_meta(name, owner, "server"), "namespace": spec.namespace},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": {**labels, ROLE: "server"}},
                                  "spec": pod_spec(spec, argv, env, gpus, serving=True, health_path=health_path,
                                                   restart="Always")}}}


def leader_worker_set(name: str, owner: Owner, spec: KubeSpec, leader: Sequence[str], worker: Sequence[str],
                      env: Mapping[str, str], gpus: int, size: int, *, health_path: str | None = None
                      ) -> dict[str, Any]:
    """A server over ``size`` nodes as one LeaderWorkerSet group (one replica): the leader serves, the workers
    join its rendezvous. ``RecreateGroupOnPodRestart`` (LWS's default): a pod that fails takes its group with
    it, which a trial sees as the end of its server (never as a second launch)."""
    labels = owner.labels()

    def template(argv: Sequence[str], role: str, serving: bool) -> dict[str, Any]:
        return {"metadata": {"labels": {**labels, ROLE: role}, "annotations": owner.annotations()},
                "spec": pod_spec(spec, argv, env, gpus, serving=serving, health_path=health_path,
                                 restart="Always")}

    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {**_meta(name, owner, "server"), "namespace": spec.namespace},
            "spec": {"replicas": 1, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": {"size": size, "restartPolicy": "RecreateGroupOnPodRestart",
                                              "leaderTemplate": template(leader, "leader", True),
                                              "workerTemplate": template(worker, "worker", False)}}}


def one_node(engine: Engine, launch: LaunchLike, version: str, spec: KubeSpec, *, python: str | None = None
             ) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of a one-node server in a pod, by the same :func:`~runners.engines.script.render` as every
    trial."""
    rendered = render(engine, in_pod(launch, spec, python), version)
    return rendered.argv, rendered.env
