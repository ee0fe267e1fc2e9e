"""The API calls of a trial against the stand-in API over real HTTP (kmock): every manifest sent is checked by the
schemas first; only the owner's objects are listed, watched and deleted, also when the server ignores the label
selector (kmock does); the API's errors are servetune's."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from runners.errors import ConfigError, HostUnreachable
from runners.kube import KubeSpec, Owner
from runners.kube import manifests as m
from runners.kube.client import KubeClient
from tests.kube.schemas import check
from tests.kube.standin import StandIn, kube_api

ME = Owner(study="s1", controller="ctl-me", trial="3")
OTHER_CONTROLLER = Owner(study="s1", controller="ctl-other", trial="3")


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with kube_api(tmp_path) as standin:
        yield standin


def _spec(standin: StandIn) -> KubeSpec:
    return KubeSpec(image="sim:latest", namespace="tuning", kubeconfig=str(standin.kubeconfig), shm_size=None)


def _pod(owner: Owner, name: str, spec: KubeSpec) -> dict[str, Any]:
    manifest = m.pod(name, owner, spec, ["python", "-m", "runners.simhost"], {}, 1)
    check(manifest)
    return manifest


def test_only_the_owners_objects_are_listed_and_deleted(api: StandIn) -> None:
    spec = _spec(api)
    kube = KubeClient.from_spec(spec)
    kube.create(_pod(ME, "st-t3-aaaaaa", spec))
    kube.create(_pod(OTHER_CONTROLLER, "st-t3-bbbbbb", spec))  # another controller's trial 3 of the same study
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses"},
                 "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    svc = m.service("st-t3-aaaaaa", ME, spec, selector=ME.labels())
    check(svc)
    kube.create(svc)
    raw = kube._request("GET", "/api/v1/namespaces/tuning/pods", query=[("labelSelector", ME.selector())])
    assert len(raw["items"]) == 3  # the stand-in ignores the selector ...
    assert [p["metadata"]["name"] for p in kube.owned("Pod", ME)] == ["st-t3-aaaaaa"]  # ... servetune does not
    assert sorted(kube.delete_owned(ME)) == ["Pod/st-t3-aaaaaa", "Service/st-t3-aaaaaa"]
    left = kube._request("GET", "/api/v1/namespaces/tuning/pods")["items"]
    assert sorted(p["metadata"]["name"] for p in left) == ["someone-elses", "st-t3-bbbbbb"]
    assert kube.owned("Service", ME) == [] and kube.delete_owned(ME) == []


def test_an_api_that_is_gone_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: x, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: x, user: u}}]\n")
    kube = KubeClient.from_spec(KubeSpec(image="i", kubeconfig=str(config)))
    kube.api.configuration.retries = 0
    kube.api.rest_client.pool_manager.connection_pool_kw["retries"] = False
    with pytest.raises(HostUnreachable, match="cannot be reached"):
        kube.owned("Pod", ME)


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load the kubeconfig"):
        KubeClient.from_spec(KubeSpec(image="i", kubeconfig=str(tmp_path / "none")))
