"""Where the simulated ranks of a multi-node server meet: torch.distributed's TCP store, in miniature.

Rank 0 (the head) listens on ``--dist-init-addr`` and waits for every other node's rank to connect; each rank
says how much GPU memory other processes hold on its node, and once all have joined the head answers with the
largest, because SGLang sizes the KV pool from the smallest free memory of any rank
(``get_available_gpu_memory(..., distributed=True)`` all-reduces the MIN over the world group, 0.5.x
``srt/model_executor/model_runner.py``). A rank that does not come within the timeout fails as torch fails:
the head with ``DistStoreError: Timed out after N seconds waiting for clients. J/W clients joined.``, a rank
that cannot reach the head with ``DistNetworkError: The client socket has timed out after Nms while trying to
connect to (host, port).``

After the meeting each rank keeps its connection open: a peer that dies closes it, and :meth:`Rendezvous.watch`
tells the rank, as NCCL's proxy does when a remote process exits.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Rendezvous", "RendezvousError", "parse_addr"]


class RendezvousError(Exception):
    """The meeting failed; ``str(exc)`` is the exception line torch prints."""


def parse_addr(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest.lstrip(":"))
    host, _, port = text.rpartition(":")
    return host, int(port)


@dataclass
class Rendezvous:
    """One node's side of the meeting: ``nnodes`` nodes of ``ranks_per_node`` ranks, this one ``rank``."""

    addr: str
    nnodes: int
    rank: int
    ranks_per_node: int
    timeout_s: float
    """Real seconds (the simulated ``--dist-timeout`` divided by the speed)."""
    shown_timeout_s: int
    """The timeout as torch reports it (simulated seconds)."""

    def __post_init__(self) -> None:
        self._peers: list[socket.socket] = []
        self._up: list[threading.Event] = []
        self._server: socket.socket | None = None

    def join(self, others_gib: float) -> float:
        """Meet every other node; return the largest GiB other processes hold on any node's GPUs."""
        if self.rank == 0:
            return self._host(others_gib)
        return self._visit(others_gib)

    def _host(self, others_gib: float) -> float:
        host, port = parse_addr(self.addr)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((host, port))
        except OSError as exc:
            server.close()
            raise RendezvousError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                f"address. port: {port}, useIpv6: {int(family == socket.AF_INET6)}, code: -{exc.errno}, "
                f"name: {_errno_name(exc.errno)}, message: {(exc.strerror or str(exc)).lower()}") from None
        server.listen(self.nnodes)
        self._server = server
        deadline = time.monotonic() + self.timeout_s
        worst = others_gib
        joined: set[int] = set()
        while len(joined) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                world = self.nnodes * self.ranks_per_node
                count = (len(joined) + 1) * self.ranks_per_node
                raise RendezvousError(
                    f"torch.distributed.DistStoreError: Timed out after {self.shown_timeout_s + 1} seconds waiting "
                    f"for clients. {count}/{world} clients joined.")
            server.settimeout(min(left, 0.5))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(max(left, 0.1))
            try:
                hello = json.loads(conn.makefile("r").readline())
            except (OSError, ValueError):
                conn.close()
                continue
            joined.add(int(hello["rank"]))
            worst = max(worst, float(hello["others_gib"]))
            conn.settimeout(None)
            self._peers.append(conn)
        for conn in self._peers:
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps({"world_others_gib": worst}) + "\n").encode())
        return worst

    def _visit(self, others_gib: float) -> float:
        host, port = parse_addr(self.addr)
        deadline = time.monotonic() + self.timeout_s
        conn: socket.socket | None = None
        while conn is None:
            try:
                conn = socket.create_connection((host, port), timeout=1.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise RendezvousError(
                        f"torch.distributed.DistNetworkError: The client socket has timed out after "
                        f"{self.shown_timeout_s * 1000}ms while trying to connect to ({host}, {port}).") from None
                time.sleep(0.05)
        conn.sendall((json.dumps({"rank": self.rank, "others_gib": others_gib}) + "\n").encode())
        conn.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            reply = conn.makefile("r").readline()
            worst = float(json.loads(reply)["world_others_gib"])
        except (OSError, ValueError, KeyError):
            conn.close()
            raise RendezvousError(f"torch.distributed.DistStoreError: wait timeout after {self.shown_timeout_s * 1000}"
                                  "ms, keys: /default_pg/0//cuda//0") from None
        conn.settimeout(None)
        self._peers.append(conn)
        return worst

    def watch(self, on_lost: Callable[[], None]) -> None:
        """Call ``on_lost`` (once, from a thread) when a peer's connection closes: that node's process died."""
        fired = threading.Event()

        def wait(conn: socket.socket, up: threading.Event) -> None:
            with contextlib.suppress(OSError):
                while data := conn.recv(4096):
                    if b"up" in data:
                        up.set()
            if not fired.is_set():
                fired.set()
                on_lost()

        for conn in self._peers:
            up = threading.Event()
            self._up.append(up)
            threading.Thread(target=wait, args=(conn, up), name="sim-peer", daemon=True).start()

    def started(self) -> None:
        """This node finished its start-up: tell the head (ranks >= 1), or wait until every node has (the head,
        whose ranks' start-up collectives need every rank). A node that died never says so: the head then
        waits until :meth:`watch`'s ``on_lost`` ends it."""
        if self.rank:
            for conn in self._peers:
                with contextlib.suppress(OSError):
                    conn.sendall(b"up\n")
            return
        for up in self._up:
            up.wait()


def _errno_name(errno: int | None) -> str:
    return {98: "EADDRINUSE", 99: "EADDRNOTAVAIL", 13: "EACCES"}.get(errno or 0, "UNKNOWN")
