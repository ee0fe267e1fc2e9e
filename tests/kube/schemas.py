"""Every manifest servetune sends or exports, checked against the schemas the API server would check it by:
Kubernetes' OpenAPI schemas (``kubernetes-validate``, strict: an unknown field is an error) for core and apps
objects, and for a LeaderWorkerSet the ``openAPIV3Schema`` of LWS's CRD, vendored in
``tests/data/kube/leaderworkerset-v1-schema.json.gz`` from kubernetes-sigs/lws v0.10.0
(``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``, tag commit
2161f38ff333f9e24d3c44adef7cd5d9787cac00), with each of its pod templates also checked as a Pod."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

KUBE_VERSION = "1.33.0"
LWS_SCHEMA = Path(__file__).resolve().parents[1] / "data" / "kube" / "leaderworkerset-v1-schema.json.gz"


@cache
def _lws_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(gzip.decompress(LWS_SCHEMA.read_bytes()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def check(manifest: dict[str, Any]) -> None:
    """Raise (kubernetes-validate's or jsonschema's error) when ``manifest`` is not a valid object."""
    if manifest.get("kind") == "LeaderWorkerSet":
        assert manifest["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        _lws_validator().validate(manifest)
        lwt = manifest["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            template = lwt[key]
            as_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **template["metadata"]},
                      "spec": template["spec"]}
            kubernetes_validate.validate(as_pod, KUBE_VERSION, strict=True)
        return
    kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
