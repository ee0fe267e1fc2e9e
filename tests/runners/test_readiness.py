"""Readiness is ours, and blame only what the configuration caused: :class:`runners.server.ServerSession`
on a real local host, for every engine (SGLang, vLLM, the simulator), with stand-in servers.

* a foreign program that starts listening on the port after the launch (a vLLM that binds late, or an
  SGLang that logged its ready line) answers ``/health``: FAIL ``port_in_use``, never ready, never measured;
* our own process group holding the listening socket is ready;
* ``address already in use`` in the log: ``port_in_use``; a server stopped by a signal servetune did not
  send or that exits 0 unasked: ``stopped_from_outside``; a plain crash stays the configuration's;
* every FailureKind says whether the configuration caused it (the table below is the whole mapping).
"""

from __future__ import annotations

import shlex
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runners.engines import engine_for
from runners.errors import HostBusy
from runners.host import Host
from runners.server import ServerSession
from runners.telemetry import CONFIG_CAUSED, FailureKind
from runners.transport import LocalTransport
from spaces.launch import LaunchConfig
from tests.fixtures.ports import free_port

PROFILE = Path(__file__).resolve().parents[2] / "runners/simhost/profiles/dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"
ENGINES = {"sglang": {}, "vllm": {}, "sim": {"profile": str(PROFILE)}}
READY_LINE = {"sglang": "The server is fired up and ready to roll!", "sim": "The server is fired up and ready to roll!",
              "vllm": "INFO:     Waiting for application startup."}
_OUR_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class _Foreign(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path}")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(LocalTransport(), runs_root=str(tmp_path / "runs"))
    try:
        yield h
    finally:
        h.cleanup_orphans(grace=1)


def session(host: Host, engine: str, port: int, script: str) -> ServerSession:
    launch = LaunchConfig(engine=engine, python=sys.executable, model_path="m", port=port,
                          engine_options=ENGINES[engine])
    trial = uuid.uuid4().hex[:8]
    return ServerSession(host, engine_for(launch), launch, script="#!/usr/bin/env bash\n" + script,
                         run_dir=host.run_dir("ready", trial), run_id=f"ready-{trial}", python=sys.executable,
                         stop_grace=2, smi_interval=0)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_foreign_server_on_the_port_is_never_ready(host: Host, engine: str) -> None:
    port = free_port()
    s = session(host, engine, port, f"echo {shlex.quote(READY_LINE[engine])}\nexec sleep 60\n")  # binds late
    _Foreign.seen = []
    with s:
        foreign = ThreadingHTTPServer(("127.0.0.1", port), _Foreign)  # arrives after the pre-launch check
        threading.Thread(target=foreign.serve_forever, daemon=True).start()
        try:
            failure = s.wait_ready(20)
        finally:
            foreign.shutdown()
            foreign.server_close()
    assert failure is not None and failure.kind is FailureKind.PORT_IN_USE, failure
    assert not failure.kind.config_caused
    assert _Foreign.seen and set(_Foreign.seen) == {"GET /health"}, "nothing but the health check reached it"


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_our_own_listener_is_ready(host: Host, engine: str) -> None:
    port = free_port()
    script = (f"echo {shlex.quote(READY_LINE[engine])}\n"
              f"exec {sys.executable} -c {shlex.quote(_OUR_SERVER)} {port}\n")
    with session(host, engine, port, script) as s:
        assert s.wait_ready(20) is None


def test_a_port_held_before_the_launch_starts_nothing(host: Host) -> None:
    port = free_port()
    foreign = ThreadingHTTPServer(("127.0.0.1", port), _Foreign)
    try:
        s = session(host, "sglang", port, "exec sleep 60\n")
        with pytest.raises(HostBusy, match=f"port {port}"):
            s.start()
        assert s.ref is None
    finally:
        foreign.server_close()


@pytest.mark.parametrize(("script", "kind"), [
    ("echo 'OSError: [Errno 98] error while attempting to bind on address: address already in use'\nexit 1\n",
     FailureKind.PORT_IN_USE),
    ("echo loading\nkill -TERM $$\nsleep 5\n", FailureKind.STOPPED_FROM_OUTSIDE),
    ("echo loading\nkill -INT $$\nsleep 5\n", FailureKind.STOPPED_FROM_OUTSIDE),
    ("echo 'INFO:     Shutting down'\nexit 0\n", FailureKind.STOPPED_FROM_OUTSIDE),
    ("echo 'RuntimeError: something in the model'\nexit 1\n", FailureKind.CRASH),
], ids=["address-in-use", "sigterm", "sigint", "exit-0", "plain-crash"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_blame_goes_where_the_cause_is(host: Host, engine: str, script: str, kind: FailureKind) -> None:
    with session(host, engine, free_port(), script) as s:
        failure = s.wait_ready(20)
    assert failure is not None and failure.kind is kind, failure
    assert failure.kind.config_caused is (kind is FailureKind.CRASH)


# Whether each kind is the configuration's fault (PRUNED) or not (FAIL): the whole table.
EXPECTED = {
    "oom": True, "nccl_error": True, "bad_flag": True, "crash": True,
    "startup_timeout": False, "benchmark_timeout": False, "host_unreachable": False, "host_busy": False,
    "host_config": False, "port_in_use": False, "stopped_from_outside": False, "scheduler": False,
    "interrupted": False, "infra": False, "predicted_oom": True, "dist_init_timeout": False, "constraint": True,
    "implausible_figure": False,
}


@pytest.mark.parametrize("kind", list(FailureKind))
def test_every_failure_kind_says_whether_the_configuration_caused_it(kind: FailureKind) -> None:
    assert kind.value in EXPECTED, f"{kind} is new: add it to this table and to CONFIG_CAUSED"
    assert kind.config_caused is EXPECTED[kind.value] is CONFIG_CAUSED[kind]
