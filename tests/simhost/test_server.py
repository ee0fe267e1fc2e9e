"""The simulated SGLang server as a real process: seed incidents end to end, signals, binding."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from runners import loadgen

DSV4 = "dsv4-flash-tp4-rtxpro6000"
NVFP4 = "dsv4-flash-nvfp4-tp4-rtxpro6000"
KIMI = "kimi-k25-tp8-rtxpro6000"
REPO = Path(__file__).resolve().parents[2]

# sglang-facts §9 regexes
LOAD_END = r"Load weight end\..*?avail mem=([0-9.]+) GB, mem usage=([0-9.]+) GB"
KV = (
    r"KV Cache (?:is allocated|VA upper bound)\.(?: dtype: [^,]+,)? #tokens: (\d+), "
    r"(?:K size: ([0-9.]+) GB, V size: ([0-9.]+) GB|KV size: ([0-9.]+) GB)"
)
# DeepSeek-V4 never logs "KV Cache is allocated" (engine-audit item 9)
DSV4_POOL = r"Initialize DeepSeekV4TokenToKVPool with max_num_reqs=256 swa_size=\d+ c4_size=\d+ "
POOL_END = r"Memory pool end\. avail mem=([0-9.]+) GB"
CAPTURE_END = r"Capture .*?graph end\b.*?mem usage=([0-9.]+) GB[,.] avail mem=([0-9.]+) GB"
SUMMARY = (
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
    r"max_running_requests=(\d+), context_len=(\d+), available_gpu_mem=([0-9.]+) GB"
)
OOM = (
    r"(?:torch\.(?:cuda\.)?)?OutOfMemoryError: CUDA out of memory\. Tried to allocate "
    r"([0-9.]+ (?:bytes|KiB|MiB|GiB))\. GPU (\d+) has a total capac\w+ of ([0-9.]+ \w+) of which ([0-9.]+ \w+) is free"
)


def gib(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"bytes": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 1024, "GiB": 1.0}[unit]


def lines_in_order(log: str, *patterns: str) -> None:
    pos = 0
    for pat in patterns:
        m = re.compile(pat).search(log, pos)
        assert m, f"{pat!r} not found after offset {pos}:\n{log[-4000:]}"
        pos = m.end()


def used_mib(simhost, gpu: int) -> int:  # type: ignore[no-untyped-def]
    done = simhost.smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(gpu))
    return int(done.stdout.strip())


# -- seeds 000 / 002 ------------------------------------------------------------------------------------------


def test_seed_000_002_capture_oom_kills_the_server(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        DSV4,
        "--model-path",
        "/models/DeepSeek-V4-Flash",
        "--trust-remote-code",
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.85",
        "--cuda-graph-max-bs",
        "32",
        "--num-continuous-decode-steps",
        "4",
    )
    assert not sp.wait_ready()
    assert sp.wait_exit() == -signal.SIGKILL
    log = sp.log()
    lines_in_order(
        log,
        r"servetune simulated host: figures are simulated, not measured \(sim_speed=500\)",
        r"server_args=ServerArgs\(model_path='/models/DeepSeek-V4-Flash'.*mem_fraction_static=0\.85",
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin\. avail mem=",
        LOAD_END,
        DSV4_POOL,
        POOL_END,
        r"TP0\] Capture cuda graph begin\. This can take up to several minutes\. avail mem=",
        r"TP0\] Scheduler hit an exception: Traceback \(most recent call last\):",
        OOM,
        r"Exception: Capture cuda graph failed: CUDA out of memory",
        r"Possible solutions:\n1\. set --mem-fraction-static to a smaller value \(e\.g\., 0\.8 or 0\.7\)\n"
        r"2\. set --cuda-graph-max-bs to a smaller value",
        r"\] Received sigquit from a child process\. It usually means the child failed\.",
    )
    assert "The server is fired up" not in log and "Uvicorn running" not in log
    assert "KV Cache is allocated" not in log
    weights = float(re.search(LOAD_END, log).group(2))  # type: ignore[union-attr]
    assert abs(weights - 36.0) < 3.6
    tried = gib(re.search(OOM, log).group(1))  # type: ignore[union-attr]
    assert 9.0 <= tried <= 11.0
    assert all(used_mib(simhost, g) == 4 for g in range(4))  # memory released on death


def test_seed_000_002_start_at_070(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        DSV4,
        "--model-path",
        "/models/DeepSeek-V4-Flash",
        "--trust-remote-code",
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.70",
        "--cuda-graph-max-bs",
        "32",
        "--num-continuous-decode-steps",
        "4",
    )
    assert sp.wait_ready()
    log = sp.log()
    lines_in_order(
        log,
        CAPTURE_END,
        SUMMARY,
        r"INFO:     Started server process \[\d+\]",
        r"INFO:     Waiting for application startup\.",
        r"INFO:     Application startup complete\.",
        r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)",
        r"POST /generate HTTP/1\.1\" 200",
        r"The server is fired up and ready to roll!",
    )
    assert sp.get("/health")[0] == 200
    info = sp.server_info()
    assert info["simulated"] is True and info["sim_speed"] == 500
    assert info["mem_fraction_static"] == 0.7 and info["cuda_graph_max_bs"] == 32
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]  # type: ignore[index]
    assert used_mib(simhost, 0) > 70_000 and used_mib(simhost, 4) == 4
    sp.proc.send_signal(signal.SIGTERM)
    assert sp.wait_exit() == 0
    assert used_mib(simhost, 0) == 4


# -- seed 001 -------------------------------------------------------------------------------------------------


def real_time_profile(tmp_path: Path, name: str) -> Path:
    """A copy of a shipped profile whose start-up takes about a second of real time; memory and serving unchanged."""
    data = yaml.safe_load((REPO / "runners" / "simhost" / "profiles" / f"{name}.yaml").read_text())
    for key in ("dist_init_s", "weight_load_s", "kv_alloc_s", "capture_base_s", "server_start_s", "warmup_s"):
        data["timing"][key] = 0.1
    data["timing"]["capture_per_graph_s"] = 0.01
    out = tmp_path / f"{name}-real-time.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def test_seed_001_kimi_capacity_and_prefill_burst(simhost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    kimi = ("--model-path", "/models/Kimi-K2.5", "--trust-remote-code", "--tp", "8")
    low = simhost.start(KIMI, *kimi, "--mem-fraction-static", "0.85", speed=3000)
    assert low.wait_ready()
    tokens = int(re.search(SUMMARY, low.log()).group(1))  # type: ignore[union-attr]
    assert abs(tokens - 116171) < 0.1 * 116171
    low.proc.send_signal(signal.SIGTERM)
    assert low.wait_exit() == 0

    # The burst runs in real time (--sim-speed 1): a 200-token prefill then lasts 74 ms of wall time, so the
    # clients' sends pile up behind it however slowly a loaded 2-core box releases them. (At --sim-speed 100 it
    # lasted 0.74 ms and a slow box fed the scheduler one request at a time.) Only the start-up durations are
    # shortened in this copy of the profile; every memory figure is the shipped one.
    simhost.profile_override = str(real_time_profile(tmp_path, KIMI))
    high = simhost.start(KIMI, *kimi, "--mem-fraction-static", "0.93", speed=1)
    assert high.wait_ready()
    summary = re.search(SUMMARY, high.log())
    assert summary is not None
    assert abs(int(summary.group(1)) - 231120) < 0.1 * 231120
    assert abs(float(summary.group(6)) - 0.82) < 0.082
    assert high.stream(200, 4).ok  # one short request is fine
    results = high.load(concurrency=150, requests=150, input_len=200, output_len=16)
    assert any(not r.ok for r in results)
    assert high.wait_exit() == -signal.SIGKILL
    log = high.log()
    lines_in_order(
        log,
        r"Prefill batch, #new-seq: \d+, #new-token: \d+,",
        r"Scheduler hit an exception: Traceback",
        r"forward_extend",
        OOM,
        r"SIGQUIT received\. signum=None, frame=None\. It usually means one child failed\.",
    )
    last_prefill = re.findall(r"Prefill batch, #new-seq: \d+, #new-token: (\d+),", log)[-1]
    assert int(last_prefill) > 1000  # a burst-sized batch, not one short request

    # The same burst, batched the same way, at 0.88.
    safe = simhost.start(KIMI, *kimi, "--mem-fraction-static", "0.88", speed=1)
    assert safe.wait_ready()
    results = safe.load(concurrency=150, requests=150, input_len=200, output_len=16)
    assert len(results) == 150 and all(r.ok and r.completion_tokens == 16 for r in results)
    assert safe.proc.poll() is None
    prefills = re.findall(r"Prefill batch, #new-seq: \d+, #new-token: (\d+),", safe.log())
    assert max(int(n) for n in prefills) >= int(
        last_prefill
    )  # it survived a batch as large as the one that killed 0.93


# -- seed 003 -------------------------------------------------------------------------------------------------

NVFP4_FLAGS = (
    "--model-path",
    "/models/DeepSeek-V4-Flash-NVFP4",
    "--trust-remote-code",
    "--tp",
    "4",
    "--moe-runner-backend",
    "triton",
)


def test_seed_003_streaming_tpot_at_sim_speed_20(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.70", "--cuda-graph-max-bs", "32", speed=20, seed=3
    )
    assert sp.wait_ready()
    info = sp.server_info()
    speed = float(info["sim_speed"])  # type: ignore[arg-type]
    noise = float(info["sim"]["noise_factor"])  # type: ignore[index]
    one = sp.load(concurrency=1, requests=3, input_len=256, output_len=128)
    sixteen = sp.load(concurrency=16, requests=16, input_len=256, output_len=128)
    assert all(r.ok for r in one + sixteen) and len(sixteen) == 16
    # The stream's own simulated times: the model's TPOT (times this run's noise factor), however busy the
    # machine is (they used to be the wall clock times the speed, 15% off on a loaded box).
    tpot1 = statistics.median(r.sim_tpot_s for r in one) * 1000
    tpot16 = statistics.median(r.sim_tpot_s for r in sixteen) * 1000
    print(f"seed 003 at --sim-speed {speed:g}: TPOT C=1 {tpot1:.1f} ms, C=16 {tpot16:.1f} ms (simulated)")
    assert abs(tpot1 - 84 * noise) <= 0.5
    assert abs(tpot16 - 534 * noise) <= 0.5
    # ... and the tokens are paced at the speed on the wall clock: never faster (a busy machine only slows them)
    assert min(r.tpot_s for r in one + sixteen) * speed * 1000 >= 0.95 * min(tpot1, tpot16)


def test_seed_003_c64_dies_in_eager_decode(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.70", "--cuda-graph-max-bs", "32", speed=25)
    assert sp.wait_ready()
    warm = sp.load(concurrency=16, requests=16, input_len=256, output_len=4)
    assert len(warm) == 16 and all(r.ok for r in warm)
    results = sp.load(concurrency=64, requests=64, input_len=256, output_len=32)
    assert not all(r.ok for r in results)
    assert sp.wait_exit() == -signal.SIGKILL
    log = sp.log()
    m = re.search(OOM, log)
    assert m is not None
    assert abs(gib(m.group(1)) - 3.94) < 0.394 and abs(gib(m.group(4)) - 2.8) < 0.28
    lines_in_order(log, r"Scheduler hit an exception: Traceback", r"forward_decode", OOM, r"SIGQUIT received\.")
    assert used_mib(simhost, 0) == 4

    fixed = simhost.start(NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.62", "--cuda-graph-max-bs", "64", speed=400)
    assert fixed.wait_ready()
    results = fixed.load(concurrency=64, requests=64, input_len=256, output_len=32)
    assert len(results) == 64 and all(r.ok for r in results)
    assert fixed.proc.poll() is None


# -- versions, NCCL, shells -----------------------------------------------------------------------------------


def test_removed_flag_is_argparse_ambiguity_exit_2(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(NVFP4, *NVFP4_FLAGS, "--cuda-graph-max-bs", "16", sim_flags=("--sim-version", "0.5.20"))
    assert sp.wait_exit() == 2
    assert (
        sp.log()
        .rstrip()
        .endswith(
            "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
        )
    )
    bad = simhost.start(NVFP4, *NVFP4_FLAGS, "--no-such-flag")
    assert bad.wait_exit() == 2
    assert "launch_server.py: error: unrecognized arguments: --no-such-flag" in bad.log()


def test_new_version_wording(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        DSV4,
        "--model-path",
        "m",
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.85",
        "--cuda-graph-max-bs-decode",
        "32",
        env={"SERVETUNE_SIM_VERSION": "0.5.20"},
    )
    assert sp.wait_exit() == -signal.SIGKILL
    lines_in_order(
        sp.log(),
        r"Load weight end\. elapsed=[0-9.]+ s, type=DeepseekV4ForCausalLM, avail mem=",
        DSV4_POOL,
        # 0.5.16-0.5.21 put bs=[...] on the begin line (engine-audit item 12)
        r"Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, "
        r"bs=\[1, 2, 4, 8, 12, 16, 24, 32\], avail mem=",
        r"2\. set --cuda-graph-max-bs-decode to a smaller value \(e\.g\., 16\)",
        r"Received sigquit from a child process",
        r"kill_process_tree called: parent_pid=\d+, include_parent=True, pid=\d+",
    )


def test_nccl_nvls_on_pcie_is_an_nccl_error_not_oom(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        NVFP4,
        *NVFP4_FLAGS,
        "--mem-fraction-static",
        "0.7",
        "--cuda-graph-max-bs",
        "32",
        env={"NCCL_ALGO": "NVLS", "NCCL_DEBUG": "WARN"},
    )
    assert sp.wait_exit() == -signal.SIGKILL
    log = sp.log()
    lines_in_order(
        log,
        r"NCCL WARN Error : no algorithm/protocol available for function AllReduce",
        r"Scheduler hit an exception: Traceback",
        r"torch\.distributed\.DistBackendError: NCCL error in: .*invalid usage",
        r"NCCL_ALGO was set to NVLS\.",
        r"Received sigquit from a child process",
    )
    assert "out of memory" not in log and "Load weight begin" not in log


def test_shell_sees_137_after_death(tmp_path: Path) -> None:
    profile = REPO / "runners" / "simhost" / "profiles" / f"{DSV4}.yaml"
    env = {**os.environ, "SERVETUNE_SIM_STATE": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
    script = (
        f"{sys.executable} -m runners.simhost.server --sim-profile {profile} --sim-speed 1000 "
        "--model-path m --tp 4 --mem-fraction-static 0.85 --cuda-graph-max-bs 32 --port 1 "
        "2>/dev/null; echo EXIT=$?"
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "EXIT=137"


def test_warmup_oom_dies_before_ready(simhost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = (REPO / "runners" / "simhost" / "profiles" / f"{NVFP4}.yaml").read_text()
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text(text.replace("warmup_transient_gib: 0.25", "warmup_transient_gib: 40.0"))
    simhost.profile_override = str(greedy)
    sp = simhost.start(NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32")
    assert not sp.wait_ready()
    assert sp.wait_exit() == -signal.SIGKILL
    log = sp.log()
    lines_in_order(
        log, r"Uvicorn running on", r"POST|Prefill batch", r"Scheduler hit an exception", OOM, r"SIGQUIT received\."
    )
    assert "ready to roll" not in log


# -- signals and binding --------------------------------------------------------------------------------------


def test_sigterm_ignoring_mode_holds_memory_until_sigkill(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        NVFP4,
        *NVFP4_FLAGS,
        "--mem-fraction-static",
        "0.7",
        "--cuda-graph-max-bs",
        "32",
        sim_flags=("--sim-ignore-sigterm",),
    )
    assert sp.wait_ready()
    held = used_mib(simhost, 0)
    assert held > 70_000
    sp.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert sp.proc.poll() is None and used_mib(simhost, 0) == held
    with pytest.raises(subprocess.TimeoutExpired):
        sp.proc.wait(timeout=0.5)
    os.killpg(sp.pid, signal.SIGKILL)
    assert sp.wait_exit() == -signal.SIGKILL
    assert used_mib(simhost, 0) == 4


def _listening(pid: int) -> list[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                found.append(cols[1])
    return found


def test_binds_only_to_the_given_host(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32", "--skip-server-warmup"
    )
    assert sp.wait_ready()
    assert _listening(sp.pid) == [f"0100007F:{sp.port:04X}"]
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", sp.port), timeout=5):
        pass
    assert sp.get("/health")[0] == 200


def test_health_is_503_until_warm_and_endpoints(simhost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Start-up in about a second, then a warm-up of 2 s real time: a window a loaded machine cannot miss.
    profile = real_time_profile(tmp_path, NVFP4)
    data = yaml.safe_load(profile.read_text())
    data["timing"]["warmup_s"] = 2.0
    profile.write_text(yaml.safe_dump(data))
    simhost.profile_override = str(profile)
    sp = simhost.start(
        NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32", "--enable-metrics", speed=1
    )
    deadline = time.monotonic() + 30
    while "Uvicorn running" not in sp.log() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sp.get("/health")[0] == 503  # warming up
    assert sp.wait_ready()
    assert sp.get("/health")[0] == 200
    assert sp.get("/server_info")[0] == 200 and sp.get("/model_info")[0] == 200
    status, body = sp.get("/v1/models")
    assert status == 200 and b'"owned_by": "sglang"' in body
    status, body = sp.get("/metrics")
    assert status == 200 and b"sglang:num_running_reqs" in body
    assert sp.get("/nope")[0] == 404


# -- issue 10: physics and engine knowledge, end to end ---------------------------------------------------------

LLAMA = "llama31-8b-h100"
RETRACT = (
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), "
    r"#new_tokens_gained: (\d+), #new_token_ratio: ([0-9.]+) -> ([0-9.]+)"
)


@pytest.mark.slow
def test_retraction_is_logged_at_a_tight_mem_fraction_with_long_outputs(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        # Speed 50: the 16 requests must all be running before the first ones finish (at 2000 times real
        # time, 3000 decode steps take a few wall-clock milliseconds, less than a loaded machine takes to
        # send them all).
        LLAMA, "--model-path", "/models/Llama-3.1-8B-Instruct", "--mem-fraction-static", "0.25", speed=50
    )
    assert sp.wait_ready()
    results = sp.load(concurrency=16, requests=16, input_len=1000, output_len=3000)
    assert all(r.ok and r.completion_tokens == 3000 for r in results)  # retracted requests still finish
    log = sp.log()
    found = re.findall(RETRACT, log)
    assert found, log[-3000:]
    retracted, gained, old, new = found[0]
    assert int(retracted) >= 1 and int(gained) > 0 and float(new) > float(old)
    assert sp.proc.poll() is None


def test_bare_nccl_algo_tree_kills_the_server_with_nccls_allgather_error(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        NVFP4,
        *NVFP4_FLAGS,
        "--mem-fraction-static",
        "0.70",
        "--cuda-graph-max-bs",
        "32",
        env={"NCCL_ALGO": "Tree", "NCCL_DEBUG": "WARN"},
    )
    assert not sp.wait_ready()
    assert sp.wait_exit() == -signal.SIGKILL
    lines_in_order(
        sp.log(),
        r"Capture cuda graph begin\.",
        r"\[0\] NCCL WARN Error : no algorithm/protocol available for function AllGather with datatype "
        r"ncclBfloat16\. NCCL_ALGO was set to Tree\.",
        r"TP0\] Scheduler hit an exception: Traceback",
        r"Exception: Capture cuda graph failed: NCCL error in: .*invalid usage",
        r"ncclInvalidUsage: This usually reflects invalid usage of NCCL library\.\nLast error:\n"
        r"Error : no algorithm/protocol available for function AllGather with datatype ncclBfloat16\. "
        r"NCCL_ALGO was set to Tree\.",
        r"Received sigquit from a child process",
    )


def test_bare_nccl_algo_tree_without_graphs_dies_at_the_warm_up_forward(simhost) -> None:  # type: ignore[no-untyped-def]
    # No graph capture to die in: the first forward (the warm-up request) runs the logits AllGather.
    sp = simhost.start(NVFP4, *NVFP4_FLAGS, "--mem-fraction-static", "0.70", "--disable-cuda-graph",
                       env={"NCCL_ALGO": "Tree"})
    assert not sp.wait_ready()
    assert sp.wait_exit() == -signal.SIGKILL
    log = sp.log()
    assert "AssertionError" not in log
    lines_in_order(log, r"Uvicorn running on", r"no algorithm/protocol available for function AllGather")


@pytest.mark.parametrize(
    ("version", "begin", "end"),
    [
        (
            "0.5.10",
            r"Capture piecewise CUDA graph begin\. avail mem=",
            r"Capture piecewise CUDA graph end\. Time elapsed:",
        ),
        (
            "0.5.15",
            r"Capture target prefill CUDA graph begin\. backend=breakable, num_tokens=\[4, 8, .*, 8192\], avail mem=",
            r"Capture target prefill CUDA graph end\. elapsed=[0-9.]+ s, mem usage=[0-9.]+ GB, avail mem=",
        ),
    ],
)
def test_prefill_cuda_graphs_are_captured_by_default(simhost, version: str, begin: str, end: str) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        LLAMA, "--model-path", "m", "--mem-fraction-static", "0.85", env={"SERVETUNE_SIM_VERSION": version}
    )
    assert sp.wait_ready()
    lines_in_order(sp.log(), KV_ANY, POOL_END, CAPTURE_END, begin, end, SUMMARY, READY_LINE)


KV_ANY = r"KV Cache is allocated\."
READY_LINE = r"The server is fired up and ready to roll!"


def test_prefill_graph_capture_oom_kills_the_server(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(
        LLAMA, "--model-path", "m", "--mem-fraction-static", "0.955", env={"SERVETUNE_SIM_VERSION": "0.5.15"}
    )
    assert not sp.wait_ready()
    assert sp.wait_exit() == -signal.SIGKILL
    lines_in_order(
        sp.log(),
        CAPTURE_END,
        r"Capture target prefill CUDA graph begin\. backend=breakable, ",
        r"Scheduler hit an exception: Traceback",
        r"Exception: Capture prefill CUDA graph failed: CUDA out of memory\. Tried to allocate",
        r"Fail when using backend: breakable for prefill runner\.\nPossible suggestions:\n"
        r"1\. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled",
        r"SIGQUIT|sigquit",
    )


def test_old_info_paths_log_a_deprecation_warning_from_0_5_9(simhost) -> None:  # type: ignore[no-untyped-def]
    sp = simhost.start(LLAMA, "--model-path", "m", "--mem-fraction-static", "0.85")
    assert sp.wait_ready()
    assert sp.get("/server_info")[0] == 200 and "deprecated" not in sp.log()
    assert sp.get("/get_server_info")[0] == 200
    assert sp.get("/get_model_info")[0] == 200
    lines_in_order(
        sp.log(),
        r"Endpoint '/get_server_info' is deprecated and will be removed in a future version\. "
        r"Please use '/server_info' instead\.",
        r"Endpoint '/get_model_info' is deprecated and will be removed in a future version\. "
        r"Please use '/model_info' instead\.",
    )
    sp.proc.send_signal(signal.SIGTERM)  # the simulated GPU is needed again
    assert sp.wait_exit() == 0
    old = simhost.start(
        LLAMA, "--model-path", "m", "--mem-fraction-static", "0.85", env={"SERVETUNE_SIM_VERSION": "0.5.5"}
    )
    assert old.wait_ready()
    assert old.get("/get_server_info")[0] == 200 and "deprecated" not in old.log()


def _loadgen(port: int, out: Path, *extra: str) -> list[dict[str, object]]:
    rc = loadgen.main(["--base-url", f"http://127.0.0.1:{port}", "--input-len", "256", "--warmup", "1",
                       "--timeout", "120", "--out", str(out), *extra])
    assert rc == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _predict(*flags: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "runners.simhost", "predict", "--sim-profile", str(REPO / "runners" / "simhost" /
         "profiles" / f"{NVFP4}.yaml"), *NVFP4_FLAGS, *flags],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    data: dict[str, object] = json.loads(done.stdout)
    return data


def test_the_load_generator_measures_the_pure_model_on_the_simulated_clock(simhost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    flags = ("--mem-fraction-static", "0.69", "--cuda-graph-max-bs", "64")
    sp = simhost.start(NVFP4, *NVFP4_FLAGS, *flags, speed=400, seed=5)
    assert sp.wait_ready()
    assert sp.server_info()["sim_clock"] is True
    records = _loadgen(sp.port, tmp_path / "r.jsonl", "--levels", "1,16,64", "--requests", "2,16,64",
                       "--output-len", "96")
    assert [r["clock"] for r in records] == ["simulated"] * 3
    model = _predict(*flags, "--sim-seed", "5", "--concurrency", "64", "--num-requests", "64",
                     "--input-len", "256", "--output-len", "96")
    expected = model["levels"][0]  # type: ignore[index]
    # the served C=64 level is the pure model's, to the rounding of the record (no wall clock in it)
    assert records[-1]["output_throughput"] == pytest.approx(expected["output_throughput"], rel=1e-3)
    assert records[-1]["mean_tpot_ms"] == pytest.approx(expected["mean_tpot_ms"], rel=1e-3)


def test_a_slow_client_moves_no_simulated_figure(simhost) -> None:  # type: ignore[no-untyped-def]
    flags = (*NVFP4_FLAGS, "--mem-fraction-static", "0.70", "--cuda-graph-max-bs", "32")
    quick = simhost.start(NVFP4, *flags, speed=400, seed=2)
    assert quick.wait_ready()
    a = quick.load(concurrency=4, requests=12, input_len=256, output_len=16)
    simhost.stop_all()  # the next server needs the simulated GPUs' memory
    slow = simhost.start(NVFP4, *flags, speed=400, seed=2)
    assert slow.wait_ready()
    b = slow.load(concurrency=4, requests=12, input_len=256, output_len=16, pause_s=0.05)
    assert all(r.ok for r in a + b) and len(a) == len(b) == 12
    # 50 ms of wall time is 20 s of simulated time at speed 400: on the wall clock the slow client's figures
    # would be far off; on the server's clock each request waits for its successor, so nothing moves.
    assert sorted(round(r.sim_ttft_s, 9) for r in a) == sorted(round(r.sim_ttft_s, 9) for r in b)
    assert sorted(round(r.sim_tpot_s, 9) for r in a) == sorted(round(r.sim_tpot_s, 9) for r in b)


def test_an_open_loop_is_placed_on_the_simulated_clock(simhost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    flags = (*NVFP4_FLAGS, "--mem-fraction-static", "0.70", "--cuda-graph-max-bs", "32")
    args = ("--levels", "8", "--requests", "16", "--output-len", "8", "--seed", "3")
    runs = []
    for extra in ((), ("--request-rate", "0.5"), ("--request-rate", "0.5")):
        sp = simhost.start(NVFP4, *flags, speed=400, seed=4)
        assert sp.wait_ready()
        runs.append(_loadgen(sp.port, tmp_path / f"r{len(runs)}.jsonl", *args, *extra)[0])
        simhost.stop_all()  # the next server needs the simulated GPUs' memory
    closed, opened = runs[0], runs[1:]
    assert all(r["clock"] == "simulated" and r["completed"] == 16 for r in [closed, *opened])
    # the same seed gives the same arrivals and the same figures, however the wall clock went
    keys = ("duration", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")
    assert [opened[0][k] for k in keys] == pytest.approx([opened[1][k] for k in keys], rel=1e-6)
    # 16 Poisson arrivals at 0.5/s span about 30 simulated seconds; the burst finishes far sooner
    assert float(opened[0]["duration"]) > 10 > float(closed["duration"])  # type: ignore[arg-type]
