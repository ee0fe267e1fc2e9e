"""A Kubernetes cluster as a place to run trials' servers: one pod (a server on one node) or one LeaderWorkerSet
(a server over several nodes) per trial, created through the user's kubeconfig.

* :mod:`runners.kube.spec`: the ``kubernetes:`` mapping of an inventory entry (:class:`KubeSpec`).
* :mod:`runners.kube.labels`: the labels that say whose an object is (:class:`Owner`).
* :mod:`runners.kube.manifests`: the pod, service, deployment and LeaderWorkerSet manifests.
* :mod:`runners.kube.verdict`: a pod's status as a value (:func:`read_pod`), the cluster's endings as FAIL.
* :mod:`runners.kube.client`: the few API calls a trial makes, through the official ``kubernetes`` client.
"""

from runners.kube.labels import Owner
from runners.kube.spec import KubeSpec, Toleration
from runners.kube.verdict import Ending, PodState, PodVerdict, Stage, read_pod

__all__ = ["Ending", "KubeSpec", "Owner", "PodState", "PodVerdict", "Stage", "Toleration", "read_pod"]
