"""The few Kubernetes API calls a trial makes, through the official ``kubernetes`` client and the user's kubeconfig:
create an object, list, watch and delete *the owner's* objects. Objects travel as the API's JSON (dicts), so the
manifests of :mod:`runners.kube.manifests` go out as they are checked, and LeaderWorkerSets need no generated model.

Ownership: :meth:`KubeClient.owned` lists by the owner's label selector and keeps only the objects whose labels
carry the owner (a server that ignored the selector would otherwise hand back anyone's); :meth:`KubeClient.delete_owned`
deletes only those, each by the name the API listed with its uid as a precondition. Foreign errors are mapped
into :mod:`runners.errors` here, at the one boundary that talks to the API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import stream as k8s_stream
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from runners.errors import AuthError, ConfigError, HostMisconfigured, HostUnreachable, RunnerError
from runners.kube.labels import Owner
from runners.kube.spec import KubeSpec

__all__ = ["KINDS", "KubeClient"]

#: The kinds a trial creates, with their collection path under a namespace; deleted in this order.
KINDS: dict[str, str] = {
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}
_T = TypeVar("_T")


class KubeClient:
    """One namespace of one cluster, as ``name`` (the inventory entry) sees it."""

    def __init__(self, api: k8s.ApiClient, namespace: str, *, name: str = "kubernetes",
                 timeout: float = 30.0) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.timeout = timeout

    @classmethod
    def from_spec(cls, spec: KubeSpec, *, name: str = "kubernetes") -> KubeClient:
        """A client from the user's kubeconfig (``spec.kubeconfig`` or ``$KUBECONFIG``/``~/.kube/config``) and
        context; a missing or broken kubeconfig is a one-line ConfigError."""
        try:
            api = k8s_config.new_client_from_config(config_file=spec.kubeconfig, context=spec.context)
        except (ConfigException, OSError) as exc:
            raise ConfigError(f"{name}: cannot load the kubeconfig: {str(exc).splitlines()[0]} (fix: kubeconfig: "
                              "or context: in the inventory entry, or $KUBECONFIG)") from None
        return cls(api, spec.namespace, name=name)

    # ---- the boundary -------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except ApiException as exc:
            raise self._mapped(what, exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise HostUnreachable(f"{self.name}: {what}: the API server cannot be reached ({exc})",
                                  host=self.name) from None

    def _mapped(self, what: str, exc: ApiException) -> RunnerError:
        status = int(exc.status or 0)
        detail = _message(exc)
        if status in (401, 403):
            return AuthError(f"{self.name}: {what}: {status} {detail} (fix: the kubeconfig's credentials or the "
                             f"RBAC of namespace {self.namespace})", host=self.name)
        if status == 404 and "leaderworkerset" in what.lower():
            return HostMisconfigured(f"{self.name}: {what}: the LeaderWorkerSet API is not installed (fix: install "
                                     "LWS, kubernetes-sigs/lws, or run one-node trials only)", host=self.name,
                                     fault="no_lws")
        if status in (400, 422):
            return HostMisconfigured(f"{self.name}: {what}: the API refused it: {detail}", host=self.name,
                                     fault="kube_rejected")
        if status >= 500 or status == 0:
            return HostUnreachable(f"{self.name}: {what}: {status} {detail}", host=self.name)
        return RunnerError(f"{self.name}: {what}: {status} {detail}", host=self.name)

    def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                 body: Any = None) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            response = self.api.rest_client.request(
                method, self.api.configuration.host + path + _query(query),
                headers={"Accept": "application/json", "Content-Type": "application/json",
                         **_auth(self.api)},
                body=body, _request_timeout=self.timeout)
            data = response.read()
            if not 200 <= response.status < 300:
                raise ApiException(http_resp=response)
            text = data.decode() if data else "{}"
            loaded = json.loads(text) if text.strip() else {}
            return loaded if isinstance(loaded, dict) else {}
        return self._call(f"{method} {path}", go)

    # ---- objects ------------------------------------------------------------------------------------

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``manifest`` in the namespace; the object as the API stored it."""
        path = KINDS[str(manifest["kind"])].format(ns=self.namespace)
        return self._request("POST", path, body=dict(manifest))

    def owned(self, kind: str, owner: Owner) -> list[dict[str, Any]]:
        """The owner's objects of ``kind``: listed by its selector, then checked label by label."""
        path = KINDS[kind].format(ns=self.namespace)
        listed = self._request("GET", path, query=[("labelSelector", owner.selector())])
        return [item for item in listed.get("items") or ()
                if owner.owns((item.get("metadata") or {}).get("labels"))]

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """One object by the name the API gave it (None when gone)."""
        try:
            return self._request("GET", KINDS[kind].format(ns=self.namespace) + f"/{name}")
        except RunnerError as exc:
            if " 404 " in str(exc) or str(exc).endswith(" 404"):
                return None
            raise

    def delete_owned(self, owner: Owner, *, grace_s: int = 15) -> list[str]:
        """Delete every object of the owner (sets first: their pods go with them), each by its listed name with
        its uid as a precondition; ``kind/name`` of each deleted. An object already gone is no error."""
        gone: list[str] = []
        for kind in KINDS:
            try:
                items = self.owned(kind, owner)
            except HostMisconfigured:
                continue  # no LWS API: there is no set to delete
            for item in items:
                meta = item.get("metadata") or {}
                options: dict[str, Any] = {"gracePeriodSeconds": grace_s, "propagationPolicy": "Background"}
                if meta.get("uid"):
                    options["preconditions"] = {"uid": meta["uid"]}
                try:
                    self._request("DELETE", KINDS[kind].format(ns=self.namespace) + f"/{meta['name']}",
                                  body=options)
                except RunnerError as exc:
                    if "404" not in str(exc) and "409" not in str(exc):
                        raise
                gone.append(f"{kind}/{meta['name']}")
        return gone

    def watch_pods(self, owner: Owner, stop: threading.Event, *, timeout_s: int = 30) -> Iterator[dict[str, Any]]:
        """The owner's pods as the API changes them (each event's object, as JSON), until ``stop`` is set; the
        watch is re-opened when the server ends it, and an object of anyone else is skipped."""
        core = k8s.CoreV1Api(self.api)
        while not stop.is_set():
            watcher = k8s_watch.Watch()
            stream = watcher.stream(core.list_namespaced_pod, self.namespace, label_selector=owner.selector(),
                                    timeout_seconds=timeout_s)
            try:
                while not stop.is_set():
                    event = self._call("watch pods", lambda s=stream: next(s, None))  # type: ignore[misc]
                    if event is None:
                        break  # the server ended this window: open the next
                    obj = event.get("raw_object") or {}
                    if owner.owns((obj.get("metadata") or {}).get("labels")):
                        yield {"type": event.get("type"), "object": obj}
            finally:
                watcher.stop()

    def exec(self, pod: str, argv: list[str], *, container: str = "server") -> str:
        """``argv`` run in the pod's container (the API's exec, over a websocket, as ``kubectl exec``); its
        stdout. nvidia-smi inside the container is read this way, by the same parsers as on any host."""
        core = k8s.CoreV1Api(self.api)
        return str(self._call(f"exec in pod {pod}", lambda: k8s_stream.stream(
            core.connect_get_namespaced_pod_exec, pod, self.namespace, command=argv, container=container,
            stderr=False, stdin=False, stdout=True, tty=False, _request_timeout=self.timeout)))

    def log_lines(self, pod: str, *, container: str = "server", previous: bool = False) -> Iterator[str]:
        """The container's log, followed line by line until the container ends (``kubectl logs -f``);
        ``previous``: the run before the last restart's."""
        core = k8s.CoreV1Api(self.api)
        response = self._call(f"logs of pod {pod}", lambda: core.read_namespaced_pod_log(
            pod, self.namespace, container=container, follow=not previous, previous=previous,
            _preload_content=False))
        buffer = b""
        for chunk in response.stream(4096):  # type: ignore[attr-defined]  # _preload_content=False: the raw response
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")
        if buffer:
            yield buffer.decode(errors="replace")


def _query(query: list[tuple[str, str]] | None) -> str:
    if not query:
        return ""
    return "?" + urlencode(query)


def _auth(api: k8s.ApiClient) -> dict[str, str]:
    key = api.configuration.api_key.get("authorization") or api.configuration.api_key.get("BearerToken")
    if not key:
        return {}
    prefix = api.configuration.api_key_prefix.get("authorization", "")
    return {"Authorization": f"{prefix} {key}".strip()}


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or "").strip()[:300]
