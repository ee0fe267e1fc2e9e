"""The manifests of a trial's server and of an export: valid by the API's schemas, owned by labels, asking
GPUs as the inventory's resource, and running the command a trial renders from its launch value."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from kubernetes_validate import ValidationError

from runners.engines import engine_for
from runners.errors import ConfigError
from runners.kube import KubeSpec, Owner, Toleration
from runners.kube import manifests as m
from runners.kube.labels import CONTROLLER, STUDY, TRIAL, label_value, object_name
from spaces.launch import LaunchConfig
from tests.kube.schemas import check

SPEC = KubeSpec(image="lmsysorg/sglang:v0.5.5", namespace="tuning", node_selector={"gpu.nvidia.com/class": "H100"},
                tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
                cpu="16", memory="128Gi")
OWNER = Owner(study="qwen3 8B on h100: a study name longer than sixty-three characters for sure", controller="c1f2",
              trial="7")


def _launch(engine: str = "sglang", tp: int = 2) -> LaunchConfig:
    return LaunchConfig(engine=engine, python="python3", model_path="Qwen/Qwen3-8B", port=30000,
                        knobs={"mem_fraction_static": 0.8} if engine == "sglang" else {"max_num_seqs": 64},
                        fixed_args=("--tp", str(tp)) if engine == "sglang"
                        else ("--tensor-parallel-size", str(tp)), env={"NCCL_DEBUG": "WARN"})


def test_one_node_pod_and_service_are_valid_and_labelled() -> None:
    launch = _launch()
    argv, env = m.one_node(engine_for(launch), launch, "0.5.5", SPEC)
    pod = m.pod("st-t7-abc123", OWNER, SPEC, argv, env, 2, health_path="/health")
    svc = m.service("st-t7-abc123", OWNER, SPEC, selector=OWNER.labels(),
                    owner_ref={"apiVersion": "v1", "kind": "Pod", "name": "st-t7-abc123", "uid": "u-1"})
    for obj in (pod, svc):
        check(obj)
        assert OWNER.owns(obj["metadata"]["labels"])
        assert obj["metadata"]["annotations"]["servetune.io/study-name"] == OWNER.study
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2", "cpu": "16", "memory": "128Gi"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["nodeSelector"] == {"gpu.nvidia.com/class": "H100"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # The server binds every address of the pod on the inventory's port: the service reaches the pod's address.
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "30000"
    assert "--mem-fraction-static" in argv and {"name": "NCCL_DEBUG", "value": "WARN"} in container["env"]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_two_node_lws_runs_one_command_with_lws_rank_address_and_size() -> None:
    launch = _launch(tp=4)
    engine = engine_for(launch)
    leader, worker, env = m.lws_commands(engine, m.in_pod(launch, SPEC), "0.5.5", 2, SPEC.dist_port)
    lws = m.leader_worker_set("st-t7-abc123", OWNER, SPEC, leader, worker, env, 2, 2, health_path="/health")
    check(lws)
    assert leader == worker  # SGLang: the same command on every rank
    assert leader[leader.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert leader[leader.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
    assert leader[leader.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):29500"
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    assert "ports" in lwt["leaderTemplate"]["spec"]["containers"][0]  # only the leader serves
    assert "ports" not in lwt["workerTemplate"]["spec"]["containers"][0]
    for key in ("leaderTemplate", "workerTemplate"):
        assert OWNER.owns(lwt[key]["metadata"]["labels"])
        assert lwt[key]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_vllm_workers_run_headless() -> None:
    launch = _launch("vllm", tp=4)
    leader, worker, _ = m.lws_commands(engine_for(launch), m.in_pod(launch, SPEC), "0.11.1", 2, SPEC.dist_port)
    assert "--headless" in worker and "--headless" not in leader
    assert leader[leader.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"


def test_tp_that_does_not_divide_over_the_nodes_is_refused() -> None:
    launch = _launch(tp=3)
    with pytest.raises(ConfigError, match="does not divide"):
        m.lws_commands(engine_for(launch), launch, "0.5.5", 2, 29500)


def test_export_deployment_is_valid() -> None:
    launch = _launch()
    argv, env = m.one_node(engine_for(launch), launch, "0.5.5", SPEC)
    dep = m.deployment("qwen3-8b", OWNER, SPEC, argv, env, 2, health_path="/health")
    check(dep)
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_the_schemas_catch_a_bad_manifest() -> None:
    """The checks can fail: a misspelt field, a wrong type, a bad LWS restart policy."""
    launch = _launch()
    argv, env = m.one_node(engine_for(launch), launch, "0.5.5", SPEC)
    pod: dict[str, Any] = m.pod("p", OWNER, SPEC, argv, env, 1)
    bad = copy.deepcopy(pod)
    bad["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(ValidationError):
        check(bad)
    bad = copy.deepcopy(pod)
    bad["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    with pytest.raises(ValidationError):
        check(bad)
    lws = m.leader_worker_set("s", OWNER, SPEC, argv, argv, env, 1, 2)
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        check(lws)


def test_labels_are_valid_values_and_distinct() -> None:
    long_a, long_b = "x" * 70 + "a", "x" * 70 + "b"
    assert label_value("ok-1") == "ok-1"
    assert label_value(long_a) != label_value(long_b)
    assert len(label_value(long_a)) <= 63
    labels = OWNER.labels()
    assert labels[TRIAL] == "7" and labels[CONTROLLER] == "c1f2" and len(labels[STUDY]) <= 63
    assert Owner("s", "other", "7").owns(labels) is False
    name = object_name(12)
    assert name.startswith("st-t12-") and len(name) <= 40 and object_name(12) != name


def test_inventory_values_are_checked() -> None:
    with pytest.raises(ValueError, match="label key"):
        KubeSpec(image="i", node_selector={"bad key": "x"})
    with pytest.raises(ValueError, match="quantity"):
        KubeSpec(image="i", memory="lots")
    with pytest.raises(ValueError, match="namespace"):
        KubeSpec(image="i", namespace="Tuning")
