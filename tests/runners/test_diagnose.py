"""``runners.diagnose`` on the corpus under tests/data/logs/ and on pasted-log shapes built in the tests.

Each corpus case is ``<name>.log`` + ``<name>.expected.json`` (engine, outcome, phase, attempts, key memory
figures, notes the verdict must carry, the source; optionally the ``options`` a user would pass, the ``version``
and words the ``reason`` must contain). The corpus is the top-level logs plus the real pastes of ``tuning/`` and
``measuring/`` (SOURCES.md): every case keeps its label. A case with an ``xfail`` reason is a text the engines'
parsers do not handle yet; it is marked strict, so it fails the suite once the parser is fixed and the mark must go.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runners.diagnose import (
    DIAGNOSIS_KEYS,
    MEMORY_KEYS,
    OUTCOME_OK,
    OUTCOME_UNKNOWN,
    diagnose,
    diagnose_file,
    normalise,
    render_text,
)
from runners.errors import ConfigError
from runners.telemetry import FailureKind, allocation_text

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "logs"
ESC = "\x1b"


SETS = ("", "tuning", "measuring")


def corpus_cases() -> list[Any]:
    cases = []
    for sub in SETS:
        for path in sorted((CORPUS / sub).glob("*.expected.json")):
            name = f"{sub}/{path.name.removesuffix('.expected.json')}".lstrip("/")
            expected = json.loads(path.read_text())
            marks = [pytest.mark.xfail(strict=True, reason=expected["xfail"])] if expected.get("xfail") else []
            cases.append(pytest.param(name, expected, id=name, marks=marks))
    return cases


def test_corpus_is_complete() -> None:
    logs = {str(p.relative_to(CORPUS)).removesuffix(".log") for sub in SETS for p in (CORPUS / sub).glob("*.log")}
    expected = {str(p.relative_to(CORPUS)).removesuffix(".expected.json")
                for sub in SETS for p in (CORPUS / sub).glob("*.expected.json")}
    assert logs == expected
    assert len(logs) >= 20
    real = [json.loads((CORPUS / f"{name}.expected.json").read_text()) for name in sorted(logs) if "/" in name]
    assert len(real) >= 40 and all(d["source"].startswith("https://github.com/") for d in real)
    tuning = {name.split("/", 1)[1] for name in logs if name.startswith("tuning/")}
    measuring = {name.split("/", 1)[1] for name in logs if name.startswith("measuring/")}
    assert tuning and measuring and not tuning & measuring
    data = [json.loads((CORPUS / f"{name}.expected.json").read_text()) for name in sorted(logs)]
    assert {d["engine"] for d in data} == {"sglang", "vllm"}
    assert all(d["source"] for d in data)
    assert sum(d["source"].startswith("https://github.com/") for d in data) >= 8
    outcomes = {d["outcome"] for d in data}
    assert {"ok", "oom", "nccl_error", "bad_flag", "crash", "unknown"} <= outcomes
    phases = {d["phase"] for d in data if d["outcome"] == "oom"}
    assert {"kv_pool", "cuda_graph", "prefill", "decode"} <= phases
    assert "SOURCES.md" in {p.name for p in CORPUS.iterdir()}


@pytest.mark.parametrize(("name", "expected"), corpus_cases())
def test_corpus_case(name: str, expected: dict[str, Any]) -> None:
    result = diagnose_file(CORPUS / f"{name}.log", **expected.get("options", {})).to_dict()
    assert (result["engine"], result["outcome"], result["phase"], result["attempts"]) == (
        expected["engine"], expected["outcome"], expected["phase"], expected["attempts"]), result["reason"]
    if "version" in expected:
        assert result["version"] == expected["version"]
    if "reason_contains" in expected:
        assert expected["reason_contains"] in result["reason"], result["reason"]
    assert "?" not in result["bound_detail"], result["bound_detail"]
    for key, value in expected["memory"].items():
        if value == "present":
            assert result["memory"][key] is not None, key
        else:
            assert result["memory"][key] == pytest.approx(value, rel=0.01), key
    for note in expected["notes_contain"]:
        assert any(note in n for n in result["notes"]), result["notes"]
    if result["outcome"] == FailureKind.OOM.value:
        assert result["bound"] and result["bound_detail"]


def test_json_keys_are_stable_on_every_corpus_log() -> None:
    for path in sorted(p for sub in SETS for p in (CORPUS / sub).glob("*.log")):
        data = json.loads(diagnose_file(path).to_json())
        assert tuple(data) == DIAGNOSIS_KEYS, path.name
        assert tuple(data["memory"]) == MEMORY_KEYS, path.name
        assert data["outcome"] in {OUTCOME_OK, OUTCOME_UNKNOWN, *(k.value for k in FailureKind)}


# ---- shapes of pasted logs ------------------------------------------------------------------------------------

KV_POOL_OOM = (
    "[2026-01-02 03:04:05 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=10.00 GB, "
    "mem usage=60.00 GB.\n"
    "[2026-01-02 03:04:06 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: mem_fraction_static=0.5\n"
)


def test_ansi_codes_are_stripped_with_or_without_the_escape_character() -> None:
    coloured = KV_POOL_OOM.replace("[2026", f"{ESC}[32m[2026").replace("] ", f"]{ESC}[0m ", 1)
    lost_escape = KV_POOL_OOM.replace("RuntimeError", "[1;31mRuntimeError[0m")
    for text in (coloured, lost_escape):
        result = diagnose(text)
        assert (result.outcome, result.phase) == ("oom", "kv_pool")
        assert result.memory["weights_gib"] == 60.0
        assert result.bound == "mem_fraction_static"


def wrap(text: str, width: int) -> str:
    out = []
    for line in text.splitlines():
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out) + "\n"


def test_hard_wrapped_paste_is_joined_back() -> None:
    lines, _, notes = normalise(wrap(KV_POOL_OOM * 2, 80))
    assert lines == KV_POOL_OOM.splitlines() * 2
    assert any("hard-wrapped at 80 columns" in n for n in notes)
    result = diagnose(wrap(KV_POOL_OOM, 80))
    assert (result.outcome, result.phase, result.memory["weights_gib"]) == ("oom", "kv_pool", 60.0)


def test_short_unwrapped_log_is_left_alone() -> None:
    text = "INFO:     Started server process [1]\nINFO:     Waiting for application startup.\n"
    lines, numbers, notes = normalise(text)
    assert lines == text.splitlines() and numbers == [1, 2] and notes == []


def test_outer_prefixes_are_removed() -> None:
    compose = "".join(f"sglang-1  | {line}\n" for line in KV_POOL_OOM.splitlines())
    kubectl = "".join(f"2026-01-02T03:04:05.123456789Z {line}\n" for line in KV_POOL_OOM.splitlines())
    for text in (compose, kubectl):
        result = diagnose(text)
        assert (result.outcome, result.phase, result.memory["weights_gib"]) == ("oom", "kv_pool", 60.0)
        assert any("outer line prefixes" in n for n in result.notes)


def test_several_attempts_the_last_counts_and_it_says_so() -> None:
    start = "[2026-01-02 03:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.5)\n"
    ready = (start.replace("0.5", "0.8")
             + "[2026-01-02 03:10:00 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=20.00 GB, "
               "mem usage=60.00 GB.\n"
             + "[2026-01-02 03:10:09] The server is fired up and ready to roll!\n")
    text = start + KV_POOL_OOM + start + KV_POOL_OOM + ready
    result = diagnose(text)
    assert (result.outcome, result.attempts, result.memory["mem_fraction_static"]) == (OUTCOME_OK, 3, 0.8)
    assert result.attempt_first_line == 9
    assert "3 attempts in this file; verdict is for the last (from line 9)" in result.notes
    # the failed one alone
    single = diagnose(start + KV_POOL_OOM)
    assert (single.outcome, single.attempts) == ("oom", 1)


def test_head_cut_mid_run_reads_as_serving() -> None:
    text = (
        "[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 64, #token: 9000, token usage: 0.50, "
        "cuda graph: False, gen throughput (token/s): 900.00, #queue-req: 0\n"
        "[2026-01-02 03:04:06 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 1.50 GiB is free.\n"
    )
    result = diagnose(text)
    assert (result.outcome, result.phase) == ("oom", "decode")
    assert result.memory["tried_to_allocate_gib"] == 2.0 and result.memory["free_at_oom_gib"] == 1.5
    assert result.bound == "activation_headroom"
    assert any("starts mid-run" in n for n in result.notes)


def test_tail_cut_mid_start_up_is_unknown_not_a_verdict() -> None:
    text = "[2026-01-02 03:04:05 TP0] Load weight begin. avail mem=78.00 GB\n[2026-01-02 03:04:09 TP0] Load wei"
    result = diagnose(text)
    assert (result.outcome, result.phase, result.bound) == (OUTCOME_UNKNOWN, "load_weights", None)
    assert "no error and no readiness line" in result.reason


def test_exit_code_option_turns_a_silent_end_into_a_death() -> None:
    text = "[2026-01-02 03:04:05 TP0] Load weight begin. avail mem=78.00 GB\n"
    result = diagnose(text, exit_code=137)
    assert (result.outcome, result.phase) == ("crash", "load_weights")
    assert "SIGKILL" in result.reason


def test_engine_and_version_from_the_log_beat_the_options() -> None:
    vllm = "(APIServer pid=1) INFO 01-02 03:04:05 [api_server.py:1] vLLM API server version 0.11.0\n"
    result = diagnose(vllm, engine="sglang", version="0.10.2")
    assert (result.engine, result.engine_source, result.version, result.version_source) == (
        "vllm", "log", "0.11.0", "log")
    assert any("--engine sglang given" in n for n in result.notes)
    assert any("--version 0.10.2 given, but the log says 0.11.0" in n for n in result.notes)


def test_engine_and_version_from_options_or_stated_default() -> None:
    bare = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    given = diagnose(bare, engine="sglang", version="v0.5.10")
    assert (given.engine, given.engine_source, given.version, given.version_source) == (
        "sglang", "option", "0.5.10", "option")
    assert (given.outcome, given.phase) == ("oom", "kv_pool")
    default = diagnose("something happened\n")
    assert (default.engine, default.engine_source, default.version) == ("sglang", "default", None)
    assert any("does not say which engine" in n for n in default.notes)
    assert "not in the log" in render_text(default)


def test_vllm_worker_rank_prefixes_are_read() -> None:
    text = (
        "(VllmWorker rank=1 pid=903752) INFO 03-18 10:21:47 [gpu_model_runner.py:1] Model loading took "
        "7.50 GiB and 3.10 seconds\n"
        "(VllmWorker TP1 pid=903752) ERROR 03-18 10:21:50 [core.py:1] ValueError: No available memory for the "
        "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n"
    )
    result = diagnose(text)
    assert (result.engine, result.outcome, result.phase, result.memory["weights_gib"]) == (
        "vllm", "oom", "kv_pool", 7.5)
    assert result.bound == "gpu_memory_utilization"


def test_bad_input_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        diagnose("x\n", engine="tgi")
    with pytest.raises(ConfigError, match="empty"):
        diagnose(f"\n  \n{ESC}[0m\n")
    with pytest.raises(ConfigError, match="cannot read"):
        diagnose_file(tmp_path / "missing.log")


def test_render_text_shows_the_verdict_and_figures() -> None:
    text = render_text(diagnose_file(CORPUS / "sim-capture-oom.log"), source="server.log")
    lines = text.splitlines()
    assert lines[0] == "log      server.log"
    assert "outcome  oom" in lines and "phase    cuda_graph" in lines
    assert any(line.startswith("bound    graph_headroom: ") for line in lines)
    assert "         OOM tried to allocate: 10.00 GiB" in lines
    assert "         free at OOM: 10.96 GiB" in lines


# ---- the CLI and a live simulated server -------------------------------------------------------------------


def servetune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "search", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def test_cli_json_text_and_bad_input() -> None:
    done = servetune("diagnose", str(CORPUS / "sim-retry-after-capture-oom.log"), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert tuple(data) == DIAGNOSIS_KEYS and (data["outcome"], data["attempts"]) == ("ok", 2)
    done = servetune("diagnose", str(CORPUS / "vllm-max-len-pp.log"))
    assert done.returncode == 0 and "outcome  oom" in done.stdout and "bound    max_model_len:" in done.stdout
    done = servetune("diagnose", str(CORPUS / "nope.log"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"servetune: error: cannot read {CORPUS / 'nope.log'}: No such file or directory"]


@pytest.mark.slow
def test_a_live_simulated_capture_oom_is_diagnosed_from_its_log(tmp_path: Path) -> None:
    from tests.simhost.conftest import SimHostFactory

    factory = SimHostFactory(tmp_path)
    try:
        sp = factory.start("dsv4-flash-tp4-rtxpro6000", "--model-path", "m", "--tp", "4",
                           "--mem-fraction-static", "0.85", "--cuda-graph-max-bs", "32")
        assert sp.wait_exit() == -signal.SIGKILL
        result = diagnose_file(sp.log_path, exit_code=sp.proc.returncode)
    finally:
        factory.stop_all()
    assert (result.outcome, result.phase, result.simulated) == ("oom", "cuda_graph", True)
    assert result.memory["tried_to_allocate_gib"] == pytest.approx(10.0, rel=0.1)
    assert result.bound == "graph_headroom"


def test_a_clean_stop_after_serving_is_ok_and_says_so() -> None:
    text = ("vllm-1  | (APIServer pid=1) INFO 01-02 03:04:05 [api_server.py:1] vLLM API server version 0.11.0\n"
            "vllm-1  | INFO:     Application startup complete.\n"
            "vllm-1  | INFO:     Shutting down\n"
            "vllm-1  | INFO:     Application shutdown complete.\n"
            "vllm-1 exited with code 0\n")
    result = diagnose(text)
    assert (result.outcome, result.phase, result.version) == (OUTCOME_OK, "ready", "0.11.0")
    assert result.reason == "ready; stopped cleanly (last phase ready)"
    died = diagnose(text.replace("exited with code 0", "exited with code 137"))
    assert (died.outcome, died.phase) == ("crash", "ready") and "SIGKILL" in died.reason


def test_readme_examples_are_what_diagnose_prints() -> None:
    readme = (REPO / "README.md").read_text()
    examples = {"server.log": CORPUS / "sim-capture-oom.log",
                "tests/data/logs/sim-retry-after-capture-oom.log": CORPUS / "sim-retry-after-capture-oom.log"}
    for shown, path in examples.items():
        block = readme.split(f"$ servetune diagnose {shown}\n", 1)[1].split("```", 1)[0]
        assert block == render_text(diagnose_file(path), source=shown)


def test_version_banner_and_lookalikes() -> None:
    banner = ("(APIServer pid=7) INFO 04-15 07:22:41 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version "
              "0.19.1rc1.dev301+g60995c05b\n")
    assert diagnose(banner).version == "0.19.1rc1.dev301+g60995c05b"
    nccl = ("(EngineCore pid=7) ERROR 04-15 07:22:41 [core.py:1] torch.distributed.DistBackendError: NCCL error "
            "in: ProcessGroupNCCL.cpp:3699, unhandled cuda error, NCCL version 2.27.3\n")
    result = diagnose(nccl)
    assert (result.engine, result.version) == ("vllm", None)
    lines, _, _ = normalise("timeout [5m] reached [1;31mERROR[0m\n")
    assert lines == ["timeout [5m] reached ERROR"]


# ---- the classes of miss issue 21 lists, one test each (texts in the engines' wording) ---------------------------


@pytest.mark.parametrize(("text", "phase"), [
    ("RuntimeError: Decode out of memory. Try to lower your batch size.\nTry to allocate 148 tokens.\n", "decode"),
    ("RuntimeError: Prefill out of memory. Try to lower your batch size.\n", "prefill"),
    ("RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for `--max-running-requests`.\n",
     "prefill"),
])
def test_the_phase_a_tail_states_wins_over_the_parsers_state(text: str, phase: str) -> None:
    result = diagnose(text)
    assert (result.outcome, result.phase) == ("oom", phase)
    assert "?" not in result.bound_detail


@pytest.mark.parametrize(("frames", "phase"), [
    (["initialize", "load_model", "weight_loader"], "load_weights"),
    (["initialize", "init_memory_pool", "profile_max_num_token"], "kv_pool"),
    (["initialize", "init_cuda_graphs", "capture_one_batch_size"], "cuda_graph"),
])
def test_traceback_frames_name_the_phase_of_a_torch_oom(frames: list[str], phase: str) -> None:
    text = "Traceback (most recent call last):\n" + "".join(
        f'  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/x.py", line 1, in {f}\n    x()\n'
        for f in frames) + ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                            "total capacity of 79.19 GiB of which 1.50 GiB is free.\n")
    result = diagnose(text, engine="sglang")
    assert (result.outcome, result.phase) == ("oom", phase)
    assert (result.memory["tried_to_allocate_gib"], result.memory["free_at_oom_gib"]) == (2.0, 1.5)


def test_frames_printed_after_the_exception_pin_its_phase() -> None:
    text = ("ERROR 10-11 12:27:29 engine.py:157] OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB.')\n"
            "ERROR 10-11 12:27:29 engine.py:157] Traceback (most recent call last):\n"
            'ERROR 10-11 12:27:29 engine.py:157]   File "/x/vllm/engine/multiprocessing/engine.py", line 218, '
            "in run_engine_loop\n")
    result = diagnose(text, engine="vllm")
    assert (result.outcome, result.phase) == ("oom", "serving")
    assert result.memory["tried_to_allocate_gib"] == pytest.approx(138 / 1024, rel=1e-3)


def test_oom_figures_from_any_piece_of_the_sentences() -> None:
    split = ("Exception: Capture cuda graph failed: CUDA out of memory.\nTried to allocate 672.00 MiB.\n\n"
             "GPU 0 has a total capacity of 140.06 GiB of which 200.75 MiB is free.\n")
    result = diagnose(split, engine="sglang")
    assert (result.phase, result.memory["tried_to_allocate_gib"]) == ("cuda_graph", pytest.approx(0.65625))
    assert result.memory["free_at_oom_gib"] == pytest.approx(200.75 / 1024, rel=1e-3)
    assert result.reason == "CUDA out of memory in cuda_graph: tried to allocate 0.66 GiB with 0.20 GiB free"
    padded = ("[2026-04-16 01:02:09 TP1] Failed to initialize x: CUDA out of memory. Tried to allocate 24.00 MiB. "
              "GPU 1 has a total capacity of 47.37 GiB of                              which 4.31 MiB is free.\n")
    assert diagnose(padded).memory["free_at_oom_gib"] == pytest.approx(4.31 / 1024, rel=1e-3)
    allocator = ("[rank0]:[W831 11:33:27.693864196 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM "
                 "on device 0 while trying to allocate 20971520 bytes (free: 9633792, total: 84974239744).\n"
                 "torch.OutOfMemoryError: CUDA out of memory.\n")
    result = diagnose(allocator, engine="vllm")
    assert result.memory["tried_to_allocate_gib"] == pytest.approx(20971520 / 2**30, rel=1e-3)
    assert result.memory["free_at_oom_gib"] == pytest.approx(9633792 / 2**30, rel=0.01)
    cut = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a total"
    result = diagnose(cut, engine="sglang")
    assert (result.memory["tried_to_allocate_gib"], result.memory["free_at_oom_gib"]) == (0.4375, None)
    assert "free memory not in the log" in result.reason and "?" not in result.bound_detail


@pytest.mark.parametrize("line", [
    "misc/x.cc:1 NCCL WARN Error : no algorithm/protocol available for function AllGather with datatype ncclInt8.",
    "No algorithm/protocol available for function AllGather with datatype ncclInt8. NCCL_ALGO was set to tree.",
    "No algorithm/protocol nor symKernelId available for function Broadcast with datatype ncclInt8.",
])
def test_nccl_wording_of_every_release_is_an_nccl_error(line: str) -> None:
    result = diagnose(f"[2026-01-02 03:04:05 TP0] {line}\n")
    assert result.outcome == "nccl_error"


def test_an_nccl_warn_line_turns_a_bare_death_into_an_nccl_error() -> None:
    text = ("[2026-01-02 03:04:05 TP0] Init torch distributed begin.\n"
            "node:1:2 [0] NCCL INFO Bootstrap : Using eth0\n"
            "node:1:2 [0] transport/net_ib.cc:1 NCCL WARN NET/IB : Got completion with error 12, opcode 0\n"
            "[2026-01-02 03:04:09] Rank 0 scheduler is dead. Please check if there are relevant logs.\n")
    result = diagnose(text)
    assert (result.outcome, result.phase) == ("nccl_error", "starting")
    assert "NCCL WARN NET/IB : Got completion with error 12" in result.reason
    healthy = diagnose(text.replace("[2026-01-02 03:04:09] Rank 0 scheduler is dead. Please check if there are "
                                    "relevant logs.\n", ""))
    assert healthy.outcome == "unknown"  # a warning alone is no death


def test_vllm_usage_banner_and_program_error_are_a_bad_flag() -> None:
    for text in ("usage: vllm serve [model_tag] [options]\nvllm serve: error: argument --foo: expected one argument\n",
                 "usage: api_server.py [-h] [--host HOST]\napi_server.py: error: unrecognized arguments: /m\n",
                 "usage: vllm serve [model_tag] [options]\n"):
        result = diagnose(text)
        assert (result.engine, result.outcome, result.phase) == ("vllm", "bad_flag", "starting"), text


def test_vllm_route_table_is_readiness() -> None:
    text = ("(APIServer pid=1) INFO 06-02 00:52:40 [api_server.py:584] Starting vLLM server on http://0.0.0.0:8000\n"
            "(APIServer pid=1) INFO 06-02 00:52:40 [launcher.py:37] Available routes are:\n"
            "(APIServer pid=1) INFO 06-02 00:52:40 [launcher.py:46] Route: /health, Methods: GET\n")
    assert (diagnose(text).outcome, diagnose(text).phase) == ("ok", "ready")


def test_a_negative_profiled_kv_size_is_a_kv_pool_oom() -> None:
    sglang = ("[2025-07-02 07:41:58 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=21.73 GB, "
              "mem usage=166.59 GB.\n[2025-07-02 07:41:59 TP0] max_total_tokens=131072 is larger than the profiled "
              "value -561981. Use the profiled value instead.\n")
    vllm = ("(EngineCore_DP0 pid=1) INFO 02-12 08:34:25 [gpu_worker.py:360] Available KV cache memory: -3.52 GiB\n")
    for text in (sglang, vllm):
        result = diagnose(text)
        assert (result.outcome, result.phase) == ("oom", "kv_pool"), result.reason
        assert "?" not in result.bound_detail


def test_retraction_warnings_while_serving_are_a_serving_server() -> None:
    for line in ("Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.1919",
                 "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000"):
        result = diagnose("".join(f"[2025-03-07 21:49:{s} TP{s % 8}] {line}\n" for s in range(10, 14)))
        assert (result.outcome, result.phase) == ("ok", "decode")
        assert any("starts mid-run" in n for n in result.notes)


def test_the_reason_is_the_exception_not_the_raise_statement() -> None:
    text = ('  File "/x/sglang/srt/distributed/device_communicators/pynccl_wrapper.py", line 350, in NCCL_CHECK\n'
            '    raise RuntimeError(f"NCCL error: {error_str}")\n'
            "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)\n")
    result = diagnose(text, engine="sglang")
    assert result.outcome == "nccl_error"
    assert "unhandled system error" in result.reason and "error_str" not in result.reason


@pytest.mark.parametrize(("version", "advice", "not_advice"), [
    ("0.9.2", "--max-num-seqs", "--max-cudagraph-capture-size"),
    ("0.11.0", "--cuda-graph-sizes", "--max-cudagraph-capture-size"),
    ("0.11.1", "--max-cudagraph-capture-size", "--cuda-graph-sizes"),
])
def test_vllm_capture_advice_names_only_the_releases_own_flag(version: str, advice: str, not_advice: str) -> None:
    text = (f"INFO 03-27 10:29:00 [api_server.py:1] vLLM API server version {version}\n"
            "INFO 03-27 10:29:03 [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)\n"
            "ERROR 03-27 10:29:13 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB."
            " GPU 6 has a total capacity of 44.53 GiB of which 448.00 KiB is free.\n")
    result = diagnose(text)
    assert (result.version, result.bound) == (version, "graph_headroom")
    assert advice in result.bound_detail and not_advice not in result.bound_detail


@pytest.mark.parametrize(("version", "flag"), [("0.5.10", "--cuda-graph-max-bs or"),
                                               ("0.5.20", "--cuda-graph-max-bs-decode")])
def test_sglang_capture_advice_follows_the_release(version: str, flag: str) -> None:
    text = (f"sglang=={version}\n[2026-01-02 03:04:05 TP0] Capture cuda graph begin. avail mem=10.00 GB\n"
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 1.50 GiB is free.\n")
    result = diagnose(text)
    assert result.bound == "graph_headroom" and flag.split()[0] in result.bound_detail
    if version == "0.5.20":
        assert "--cuda-graph-max-bs " not in result.bound_detail and "--cuda-graph-max-bs)" not in result.bound_detail


def test_paste_shapes_html_colour_markdown_quote_indent_and_localised_journal() -> None:
    base = ("(EngineCore_DP0 pid=7) INFO 02-12 08:34:25 [gpu_worker.py:360] Available KV cache memory: 12.57 GiB\n"
            "(EngineCore_DP0 pid=7) INFO 02-12 08:34:25 [kv_cache_utils.py:1307] GPU KV cache size: 53,136 tokens\n")
    shapes = {
        "html": base.replace("(EngineCore_DP0 pid=7)", '<font color="#2AA1B3"><b>(EngineCore_DP0 pid=7)</b></font>'),
        "quote": "".join(f"> {line}\n" for line in base.splitlines()),
        "indent": "".join(f"        {line}\n" for line in base.splitlines()),
        "journal": "".join(f"авг 18 14:15:04 llm python3[28059]: {line}\n" for line in base.splitlines()),
    }
    for shape, text in shapes.items():
        result = diagnose(text)
        assert (result.engine, result.memory["kv_gib"], result.memory["kv_tokens"]) == ("vllm", 12.57, 53136), shape


def test_an_allocation_that_fits_the_free_total_is_said_to_fail_for_want_of_one_block() -> None:
    # seed 000: 10.00 GiB asked with 10.96 GiB free: PyTorch's "free" counts every free byte, in pieces
    result = diagnose_file(CORPUS / "sim-capture-oom.log")
    assert result.reason == ("CUDA out of memory in cuda_graph: tried to allocate 10.00 GiB with 10.96 GiB free, "
                             "but the largest free block is smaller (fragmentation)")
    assert "largest free block is smaller" in result.bound_detail
    # more asked than free in all: no word of fragmentation
    assert allocation_text(3.94, 2.80) == "tried to allocate 3.94 GiB with 2.80 GiB free"
