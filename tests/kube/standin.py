"""The stand-in Kubernetes API: kmock's ``KubernetesEmulator`` (PyPI ``kmock``, by kopf's author) served over real
HTTP on a free loopback port, in a thread with its own event loop, and a kubeconfig that points at it.

What the emulator does: create, get, list, watch (a real chunked watch stream), merge-patch (also of ``/status``)
and delete of any resource, kept in memory. What it does not (so servetune checks these itself, and the tests say
so): label selectors (every list and watch returns all objects: servetune keeps only objects whose labels carry
its owner), delete preconditions and the garbage collector (owner references), uids, resource versions, the
``log`` and ``exec`` subresources (exec is a websocket), and any scheduling or kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import yaml


@dataclass
class StandIn:
    url: str
    kubeconfig: Path
    handler: Any
    loop: asyncio.AbstractEventLoop


@contextlib.contextmanager
def kube_api(tmp: Path) -> Iterator[StandIn]:
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
            box.update(url=str(server.url).rstrip("/"), handler=handler, loop=asyncio.get_running_loop(),
                       stop=asyncio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="kmock", daemon=True)
    thread.start()
    assert ready.wait(30), "kmock did not start"
    config = tmp / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": box["url"]}}],
        "users": [{"name": "me", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me", "namespace": "tuning"}}],
    }))
    try:
        yield StandIn(box["url"], config, box["handler"], box["loop"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
