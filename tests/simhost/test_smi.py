"""nvidia-smi of the simulated host: CSV formats of sglang-facts §7, live memory, the PATH shim."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from runners.simhost.__main__ import install_smi
from runners.simhost.profile import shipped_profile
from runners.simhost.smi import render
from runners.simhost.state import HostState, read_host, write_host
from tests.fixtures.hog import start_hog, stop_hog

NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
GPU_Q = "--query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu"


def _host(state: Path) -> HostState:
    install_smi(shipped_profile("dsv4-flash-nvfp4-tp4-rtxpro6000"), state, state / "bin")
    host = read_host(state)
    assert host is not None
    return host


def test_query_gpu_nounits_is_bare_csv(tmp_path: Path) -> None:
    _host(tmp_path)
    out, code = render([GPU_Q, "--format=csv,noheader,nounits"], tmp_path)
    assert code == 0
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 9
    assert lines[0] == f"0, {NAME}, 97887, 4, 97883, 0"
    shape = re.compile(r"^\d+, [^,]+, \d+, \d+, \d+, \d+$")  # sglang-facts §7
    assert all(shape.match(line) for line in lines[:-1])


def test_query_gpu_with_header_and_units(tmp_path: Path) -> None:
    _host(tmp_path)
    out, _ = render([GPU_Q, "--format=csv"], tmp_path)
    lines = out.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]"
    assert lines[1] == f"0, {NAME}, 97887 MiB, 4 MiB, 97883 MiB, 0 %"
    total, code = render(["--query-gpu=memory.total", "--format=csv,noheader,nounits"], tmp_path)
    assert code == 0
    assert total == "97887\n" * 8  # one bare number per GPU, as SGLang's own parser wants


def test_compute_apps_empty_then_listed_then_released_on_kill(tmp_path: Path) -> None:
    host = _host(tmp_path)
    q = "--query-compute-apps=pid,used_memory,gpu_uuid"
    assert render([q, "--format=csv,noheader,nounits"], tmp_path) == ("", 0)
    hog = start_hog(tmp_path, 20480, "1,2")
    try:
        out, _ = render([q, "--format=csv,noheader,nounits"], tmp_path)
        assert out == f"{hog.pid}, 20480, {host.uuids[1]}\n{hog.pid}, 20480, {host.uuids[2]}\n"
        with_units, _ = render(["--query-compute-apps=pid,used_memory", "--format=csv"], tmp_path)
        assert with_units == f"pid, used_gpu_memory [MiB]\n{hog.pid}, 20480 MiB\n{hog.pid}, 20480 MiB\n"
        used, _ = render(["--query-gpu=memory.used,memory.free", "--format=csv,noheader,nounits", "-i", "1"], tmp_path)
        assert used == "20484, 77403\n"
        os.killpg(hog.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while render([q, "--format=csv,noheader,nounits"], tmp_path)[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        # not reaped yet: a zombie holds no memory
        assert render([q, "--format=csv,noheader,nounits"], tmp_path) == ("", 0)
        assert render(["--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "1"], tmp_path)[0] == "4\n"
    finally:
        stop_hog(hog)


def test_hog_sigterm_releases(tmp_path: Path) -> None:
    _host(tmp_path)
    hog = start_hog(tmp_path, 1000, "0")
    try:
        hog.send_signal(signal.SIGTERM)
        assert hog.wait(timeout=10) == 0
        assert render(["--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"], tmp_path)[0] == "4\n"
    finally:
        stop_hog(hog)


def test_errors(tmp_path: Path) -> None:
    out, code = render([GPU_Q, "--format=csv"], tmp_path)
    assert code == 9 and "couldn't communicate with the NVIDIA driver" in out
    _host(tmp_path)
    out, code = render(["--query-gpu=index,bogus", "--format=csv"], tmp_path)
    assert code == 2 and out.startswith('Field "bogus" is not a valid field to query.')
    assert render(["-L"], tmp_path)[0].startswith(f"GPU 0: {NAME} (UUID: GPU-")


def test_install_smi_shim_on_path_from_anywhere(tmp_path: Path) -> None:
    state = tmp_path / "state"
    shim = install_smi(shipped_profile("kimi-k25-tp8-rtxpro6000"), state, tmp_path / "bin")
    assert shim == tmp_path / "bin" / "nvidia-smi" and os.access(shim, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SERVETUNE_SIM_STATE")}
    env["PATH"] = f"{shim.parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.splitlines() == [f"{i}, 97887" for i in range(8)]


def test_write_host_is_idempotent(tmp_path: Path) -> None:
    host = _host(tmp_path)
    before = (tmp_path / "host.json").stat().st_mtime_ns
    write_host(tmp_path, host)
    assert (tmp_path / "host.json").stat().st_mtime_ns == before
