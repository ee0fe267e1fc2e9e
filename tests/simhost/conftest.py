"""Fixtures that start the simulated SGLang host as a real process on 127.0.0.1 and talk to it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "runners" / "simhost" / "profiles"
READY = "The server is fired up and ready to roll!"


def profile_path(name: str) -> str:
    return str(PROFILES / f"{name}.yaml")


@dataclass
class StreamResult:
    """One streamed request: TTFT and TPOT on the wall clock, and on the server's simulated clock (the
    ``sim_time_s`` of its chunks)."""

    ok: bool
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    completion_tokens: int = 0
    error: str = ""
    sim_ttft_s: float = 0.0
    sim_tpot_s: float = 0.0
    sim_end_s: float | None = None


@dataclass
class SimProc:
    """One simulated server process, started in its own session; stopped by its process group."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    state_dir: Path
    speed: float
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """True once the ready line is logged; False if the process exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY in self.log():
                return True
            if self.proc.poll() is not None:
                return READY in self.log()
            time.sleep(0.02)
        raise AssertionError(f"server neither ready nor dead after {timeout}s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def server_info(self) -> dict[str, object]:
        status, body = self.get("/get_server_info")
        assert status == 200
        data: dict[str, object] = json.loads(body)
        return data

    def stream(
        self, input_len: int, output_len: int, timeout: float = 60.0, hint: dict[str, object] | None = None
    ) -> StreamResult:
        """One streaming /v1/completions request; TTFT and TPOT measured on the wall clock and read from the
        server's simulated clock. ``hint``: the request's ``sim_level*`` fields."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        body = json.dumps(
            {
                "model": "m",
                "prompt": "x",
                "sim_input_len": input_len,
                "max_tokens": output_len,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                **(hint or {}),
            }
        )
        try:
            t0 = time.monotonic()
            conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return StreamResult(ok=False, error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
            first = last = None
            sim_first = sim_last = sim_arrival = 0.0
            usage_tokens = 0
            while True:
                line = resp.readline()
                if not line:
                    return StreamResult(ok=False, error="stream ended before [DONE]")
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:]
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    now = time.monotonic()
                    sim_last, sim_arrival = chunk["sim_time_s"], chunk["sim_arrival_s"]
                    if first is None:
                        first, sim_first = now, sim_last
                    last = now
            assert first is not None and last is not None
            per = 1 / (usage_tokens - 1) if usage_tokens > 1 else 0.0
            return StreamResult(
                ok=True,
                ttft_s=first - t0,
                tpot_s=(last - first) * per,
                completion_tokens=usage_tokens,
                sim_ttft_s=sim_first - sim_arrival,
                sim_tpot_s=(sim_last - sim_first) * per,
                sim_end_s=sim_last,
            )
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return StreamResult(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def load(
        self, concurrency: int, requests: int, input_len: int, output_len: int, pause_s: float = 0.0
    ) -> list[StreamResult]:
        """Closed-loop streaming load: ``concurrency`` clients share ``requests`` requests, declared to the
        server as one level (so its simulated clock runs the batches the pure model would). ``pause_s``: a
        slow client's wall-clock pause before each request after its first."""
        results: list[StreamResult] = []
        lock = threading.Lock()
        left = [requests]
        start = threading.Barrier(concurrency)
        level = {"sim_level": uuid.uuid4().hex, "sim_level_requests": requests, "sim_level_concurrency": concurrency}

        def client() -> None:
            start.wait(timeout=30)  # a burst, like bench_serving with --request-rate inf
            after: float | None = None
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                if after is not None and pause_s:
                    time.sleep(pause_s)  # the slow client under test, not a wait for an event
                r = self.stream(input_len, output_len, hint={**level, "sim_after_s": after})
                after = r.sim_end_s
                with lock:
                    results.append(r)
                if not r.ok:
                    return

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        return results


class SimHostFactory:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.state_dir = tmp_path / "state"
        self.procs: list[SimProc] = []
        self.profile_override: str | None = None  # a profile file used instead of the shipped one

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVETUNE_SIM", "NCCL_"))}
        env["SERVETUNE_SIM_STATE"] = str(self.state_dir)
        env["PYTHONPATH"] = str(REPO)
        env.update(extra or {})
        return env

    def start(
        self,
        profile: str,
        *flags: str,
        speed: float = 500,
        seed: int = 7,
        env: dict[str, str] | None = None,
        sim_flags: tuple[str, ...] = (),
    ) -> SimProc:
        port = free_port()
        log_path = self.tmp_path / f"server-{len(self.procs)}.log"
        cmd = [
            sys.executable,
            "-m",
            "runners.simhost.server",
            "--sim-profile",
            self.profile_override or profile_path(profile),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sim-speed",
            str(speed),
            "--sim-seed",
            str(seed),
            *sim_flags,
            *flags,
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(env), cwd=REPO, start_new_session=True
            )
        sp = SimProc(proc=proc, port=port, log_path=log_path, state_dir=self.state_dir, speed=speed)
        self.procs.append(sp)
        return sp

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runners.simhost.smi", *args],
            env=self.env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def stop_all(self) -> None:
        for sp in self.procs:
            if sp.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sp.proc.pid, signal.SIGKILL)
                sp.proc.wait(timeout=10)


@pytest.fixture
def simhost(tmp_path: Path) -> Iterator[SimHostFactory]:
    factory = SimHostFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


def log_value(log: str, pattern: str) -> str:
    m = re.search(pattern, log)
    assert m, f"{pattern!r} not in log:\n{log[-3000:]}"
    return m.group(1)
