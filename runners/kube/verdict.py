"""What a pod's status says about a trial's server, as values: :func:`read_pod` turns one pod (the API's JSON)
into a :class:`PodState`, and its :class:`Ending` says whether the cluster ended the server.

The cluster's endings are FAIL, never PRUNED (the configuration did not cause them), each with its own
:class:`PodVerdict` in the reason:

========================  =============================================================  ===================
verdict                   seen as                                                        failure kind
========================  =============================================================  ===================
``oom_killed``            ``terminated.reason: OOMKilled``: the kernel killed the         ``infra``
                          container for host memory (its memory limit), not a CUDA OOM
``evicted``               ``status.reason: Evicted``, or ``DisruptionTarget`` by the      ``scheduler``
                          eviction API or the kubelet
``preempted``             ``DisruptionTarget`` ``PreemptionByScheduler``                  ``scheduler``
``node_lost``             phase ``Unknown``, ``reason: NodeLost``, ``DisruptionTarget``   ``scheduler``
                          ``DeletionByTaintManager``
``image_pull``            ``waiting.reason``: ``ImagePullBackOff``, ``InvalidImageName``,  ``host_config``
                          ``ErrImageNeverPull``
``container_config``      ``waiting.reason``: ``CreateContainerConfigError``,             ``host_config``
                          ``CreateContainerError``
``restarted``             ``restartCount`` above the trial's start (its last run ended    the last run's own
                          the trial: OOMKilled as above, an exit as an exit)               verdict
``deleted``               a ``deletionTimestamp`` servetune did not set, or the pod gone  ``scheduler``
``unschedulable``         ``PodScheduled: False`` past the pending timeout                ``scheduler``
========================  =============================================================  ===================

A container that exited by itself (``terminated`` with an exit code, reason ``Error`` or ``Completed``) is
``exited`` with no failure: the server's log decides, through the same engine reader every trial uses (a CUDA
OOM there is the configuration's, PRUNED).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runners.telemetry import Failure, FailureKind, Phase

__all__ = ["Ending", "PodState", "PodVerdict", "Stage", "read_pod"]


class PodVerdict(StrEnum):
    """How a trial's pod ended, as Kubernetes says it."""

    EXITED = "exited"
    OOM_KILLED = "oom_killed"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    IMAGE_PULL = "image_pull"
    CONTAINER_CONFIG = "container_config"
    RESTARTED = "restarted"
    DELETED = "deleted"
    UNSCHEDULABLE = "unschedulable"


#: The failure kind of each verdict the cluster caused (EXITED: the log decides).
KINDS: dict[PodVerdict, FailureKind] = {
    PodVerdict.OOM_KILLED: FailureKind.INFRA,
    PodVerdict.EVICTED: FailureKind.SCHEDULER,
    PodVerdict.PREEMPTED: FailureKind.SCHEDULER,
    PodVerdict.NODE_LOST: FailureKind.SCHEDULER,
    PodVerdict.IMAGE_PULL: FailureKind.HOST_CONFIG,
    PodVerdict.CONTAINER_CONFIG: FailureKind.HOST_CONFIG,
    PodVerdict.DELETED: FailureKind.SCHEDULER,
    PodVerdict.UNSCHEDULABLE: FailureKind.SCHEDULER,
}
assert all(not kind.config_caused for kind in KINDS.values()), "the cluster's endings are never PRUNED"


class Stage(StrEnum):
    """Where a pod is: waiting for the scheduler, starting on its node (pulling, creating), running, ended."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    ENDED = "ended"


@dataclass(frozen=True)
class Ending:
    """How a pod ended: the verdict, the container's exit code when it had one, and the failure when the cluster
    caused the end (None for ``exited``: the log decides)."""

    verdict: PodVerdict
    reason: str
    exit_code: int | None = None
    restarted: bool = False

    @property
    def failure(self) -> Failure | None:
        kind = KINDS.get(self.verdict)
        if kind is None:
            return None
        return Failure(kind, Phase.STARTING if self.verdict in (PodVerdict.IMAGE_PULL, PodVerdict.CONTAINER_CONFIG,
                                                                 PodVerdict.UNSCHEDULABLE) else None,
                       f"kubernetes {self.verdict.value}: {self.reason}", self.exit_code)


@dataclass(frozen=True)
class PodState:
    """One look at a pod: its stage, node, address, restarts and (once it ended) its :class:`Ending`."""

    name: str
    uid: str
    stage: Stage
    node: str | None
    pod_ip: str | None
    restarts: int
    ending: Ending | None
    pending_reason: str = ""


_IMAGE = ("ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG = ("CreateContainerConfigError", "CreateContainerError")
_DISRUPTION = {"PreemptionByScheduler": PodVerdict.PREEMPTED, "DeletionByTaintManager": PodVerdict.NODE_LOST,
               "EvictionByEvictionAPI": PodVerdict.EVICTED, "TerminationByKubelet": PodVerdict.EVICTED,
               "DeletionByPodGC": PodVerdict.NODE_LOST}


def _terminated(term: Mapping[str, Any], restarted: bool, count: int) -> Ending:
    code = term.get("exitCode")
    code = int(code) if isinstance(code, int) else None
    why = str(term.get("reason") or "")
    again = f" (the container restarted, restartCount {count}: the trial ends at its first run)" if restarted else ""
    if why == "OOMKilled":
        return Ending(PodVerdict.OOM_KILLED, "the kernel killed the container for host memory (OOMKilled, exit "
                      f"{code}): the pod's memory limit or the node's RAM, not a CUDA OOM{again}", code, restarted)
    message = str(term.get("message") or "").strip().splitlines()
    detail = f": {message[-1][:200]}" if message else ""
    return Ending(PodVerdict.EXITED, f"the container exited with {code} ({why or 'no reason'}){detail}{again}",
                  code, restarted)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _cluster_end(status: Mapping[str, Any], node: str | None) -> Ending | None:
    """The cluster's own ending of a pod (a disruption, an eviction, a lost node), None when there is none."""
    disruption = _condition(status, "DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        verdict = _DISRUPTION.get(str(disruption.get("reason")), PodVerdict.EVICTED)
        return Ending(verdict, f"{disruption.get('reason')}: {disruption.get('message') or 'no message'}")
    if status.get("reason") == "Evicted":
        return Ending(PodVerdict.EVICTED, f"Evicted: {status.get('message') or 'no message'}")
    if status.get("reason") == "NodeLost" or status.get("phase") == "Unknown":
        return Ending(PodVerdict.NODE_LOST, f"node {node or '?'} lost: {status.get('message') or 'phase Unknown'}")
    return None


def read_pod(pod: Mapping[str, Any], *, container: str = "server", baseline_restarts: int = 0,
             deleting: bool = False) -> PodState:
    """The state of ``pod`` (the API's JSON). ``baseline_restarts``: the container's restartCount when the trial
    began (any more is a restart, which ends the trial); ``deleting``: servetune itself asked for the delete (then
    a ``deletionTimestamp`` is no verdict)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    node = spec.get("nodeName") or None
    pod_ip = status.get("podIP") or None
    phase = status.get("phase") or "Pending"
    cs = next((c for c in status.get("containerStatuses") or () if c.get("name") == container), None) or {}
    count = int(cs.get("restartCount") or 0)
    state = cs.get("state") or {}

    def ended(verdict: PodVerdict, reason: str, code: int | None = None) -> PodState:
        return PodState(name, uid, Stage.ENDED, node, pod_ip, count, Ending(verdict, reason, code))

    scheduled = _condition(status, "PodScheduled")
    cluster = _cluster_end(status, node)
    if cluster is not None:
        return PodState(name, uid, Stage.ENDED, node, pod_ip, count, cluster)
    if count > baseline_restarts:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        end = _terminated(last, True, count)
        return PodState(name, uid, Stage.ENDED, node, pod_ip, count, end)
    if "terminated" in state:
        return PodState(name, uid, Stage.ENDED, node, pod_ip, count, _terminated(state["terminated"], False, count))
    waiting = (state.get("waiting") or {})
    why = str(waiting.get("reason") or "")
    if why in _IMAGE:
        return ended(PodVerdict.IMAGE_PULL, f"{why}: {waiting.get('message') or spec_image(spec)}")
    if why in _CONFIG:
        return ended(PodVerdict.CONTAINER_CONFIG, f"{why}: {waiting.get('message') or 'no message'}")
    if meta.get("deletionTimestamp") and not deleting:
        return ended(PodVerdict.DELETED, "the pod was deleted by someone else (servetune did not ask)")
    if phase in ("Succeeded", "Failed"):
        return ended(PodVerdict.EXITED, f"the pod {phase.lower()} ({status.get('reason') or 'no reason'})")
    if scheduled is None or scheduled.get("status") != "True":
        why_pending = ""
        if scheduled is not None:
            why_pending = f"{scheduled.get('reason') or ''}: {scheduled.get('message') or ''}".strip(": ")
        return PodState(name, uid, Stage.QUEUED, node, pod_ip, count, None, why_pending)
    if "running" in state:
        return PodState(name, uid, Stage.RUNNING, node, pod_ip, count, None)
    return PodState(name, uid, Stage.STARTING, node, pod_ip, count, None, why)


def spec_image(spec: Mapping[str, Any]) -> str:
    images = [str(c.get("image")) for c in spec.get("containers") or ()]
    return f"image {', '.join(images) or '?'}"


def unschedulable(state: PodState, waited_s: float) -> Ending:
    """The ending of a pod still queued after its pending timeout (``waited_s`` seconds)."""
    return Ending(PodVerdict.UNSCHEDULABLE, f"pod {state.name} not scheduled after {waited_s:.0f}s"
                  + (f" ({state.pending_reason})" if state.pending_reason else ""))
