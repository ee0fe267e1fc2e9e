"""A pod's status as a value: the cluster's endings are FAIL with their own verdict, never PRUNED; an exit leaves
the verdict to the server's log (where a CUDA OOM is the configuration's); a restart ends the trial."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engines import get_engine
from runners.kube.verdict import PodVerdict, Stage, read_pod, unschedulable
from runners.telemetry import FailureKind


def _pod(phase: str = "Running", *, state: dict[str, Any] | None = None, restarts: int = 0,
         last: dict[str, Any] | None = None, conditions: list[dict[str, Any]] | None = None,
         **status: Any) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "server", "restartCount": restarts, "state": state or {"running": {}}}
    if last is not None:
        cs["lastState"] = {"terminated": last}
    scheduled = [{"type": "PodScheduled", "status": "True"}]
    return {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "gpu-node-3", "containers": [{"image": "i"}]},
            "status": {"phase": phase, "podIP": "127.0.0.5", "containerStatuses": [cs],
                       "conditions": conditions if conditions is not None else scheduled, **status}}


def test_running_and_queued_and_starting() -> None:
    state = read_pod(_pod())
    assert (state.stage, state.node, state.pod_ip, state.ending) == (Stage.RUNNING, "gpu-node-3", "127.0.0.5", None)
    queued = read_pod(_pod("Pending", state={"waiting": {"reason": "ContainerCreating"}}, conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]))
    assert queued.stage is Stage.QUEUED and "Insufficient nvidia.com/gpu" in queued.pending_reason
    ending = unschedulable(queued, 600)
    assert ending.failure is not None and ending.failure.kind is FailureKind.SCHEDULER
    assert "Insufficient" in ending.failure.reason
    starting = read_pod(_pod("Pending", state={"waiting": {"reason": "ContainerCreating"}}))
    assert starting.stage is Stage.STARTING


@pytest.mark.parametrize(("pod", "verdict", "kind"), [
    (_pod("Failed", state={"terminated": {"reason": "OOMKilled", "exitCode": 137}}), PodVerdict.OOM_KILLED,
     FailureKind.INFRA),
    (_pod("Failed", state={"terminated": {"reason": "Error", "exitCode": 137}}, reason="Evicted",
          message="The node was low on resource: memory."), PodVerdict.EVICTED, FailureKind.SCHEDULER),
    (_pod(conditions=[{"type": "PodScheduled", "status": "True"},
                      {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
     PodVerdict.PREEMPTED, FailureKind.SCHEDULER),
    (_pod(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]),
     PodVerdict.NODE_LOST, FailureKind.SCHEDULER),
    (_pod("Unknown"), PodVerdict.NODE_LOST, FailureKind.SCHEDULER),
    (_pod("Pending", state={"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}),
     PodVerdict.IMAGE_PULL, FailureKind.HOST_CONFIG),
    (_pod("Pending", state={"waiting": {"reason": "CreateContainerConfigError", "message": "secret missing"}}),
     PodVerdict.CONTAINER_CONFIG, FailureKind.HOST_CONFIG),
])
def test_the_clusters_endings_fail_never_prune(pod: dict[str, Any], verdict: PodVerdict, kind: FailureKind) -> None:
    state = read_pod(pod)
    assert state.stage is Stage.ENDED and state.ending is not None
    assert state.ending.verdict is verdict
    failure = state.ending.failure
    assert failure is not None and failure.kind is kind and not failure.kind.config_caused
    assert failure.reason.startswith(f"kubernetes {verdict.value}: ")


def test_oom_killed_is_host_memory_not_cuda() -> None:
    state = read_pod(_pod("Failed", state={"terminated": {"reason": "OOMKilled", "exitCode": 137}}))
    assert state.ending is not None and state.ending.failure is not None
    assert "host memory" in state.ending.failure.reason and "not a CUDA OOM" in state.ending.failure.reason


def test_an_exit_leaves_the_verdict_to_the_log_reader() -> None:
    """A CUDA OOM is a Python exception: exit 1, the reason in the log, which the engine's reader (the same as on
    every host) calls an OOM: PRUNED."""
    state = read_pod(_pod("Failed", state={"terminated": {"reason": "Error", "exitCode": 1}}))
    assert state.ending is not None and state.ending.verdict is PodVerdict.EXITED
    assert state.ending.failure is None and state.ending.exit_code == 1
    engine = get_engine("sglang")
    parser = engine.parser()
    log = ("[2025-01-01 00:00:01] Load weight end. type=Qwen3ForCausalLM, avail mem=60.00 GB, mem usage=15.26 GB.\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 1.00 GiB is free.\n")
    for line in log.splitlines():
        parser.feed(line)
    failure = engine.classify(parser, state.ending.exit_code, log)
    assert failure.kind is FailureKind.OOM and failure.kind.config_caused


def test_a_restart_ends_the_trial_with_its_first_runs_verdict() -> None:
    oom_then_restart = _pod(restarts=1, last={"reason": "OOMKilled", "exitCode": 137})
    state = read_pod(oom_then_restart)
    assert state.stage is Stage.ENDED and state.ending is not None
    assert state.ending.verdict is PodVerdict.OOM_KILLED and state.ending.restarted
    crashed = read_pod(_pod(restarts=2, last={"reason": "Error", "exitCode": 1}), baseline_restarts=1)
    assert crashed.ending is not None and crashed.ending.verdict is PodVerdict.EXITED and crashed.ending.restarted
    assert "restarted" in crashed.ending.reason
    assert read_pod(_pod(restarts=1), baseline_restarts=1).stage is Stage.RUNNING


def test_a_delete_servetune_did_not_ask_for() -> None:
    pod = _pod()
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state = read_pod(pod)
    assert state.ending is not None and state.ending.verdict is PodVerdict.DELETED
    assert read_pod(pod, deleting=True).stage is Stage.RUNNING
