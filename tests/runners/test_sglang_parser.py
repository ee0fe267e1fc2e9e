"""SGLang log parser and death classifier, on log lines in the wording of 0.5.2 ... 0.5.23.

Every line below is built from the format strings quoted in docs/sources/sglang-facts.md (§2, §3).
Log lines are kept whole, as SGLang prints them, hence the long lines.
"""

from __future__ import annotations

from typing import Any

import pytest

from runners.engines.base import LogParser
from runners.engines.sglang import SGLangEngine, SGLangLogParser
from runners.engines.sim import SimEngine
from runners.telemetry import FailureKind, Phase

TS = "[2025-11-02 10:00:00]"
TP0 = "[2025-11-02 10:00:00 TP0]"
TP1 = "[2025-11-02 10:00:00 TP1]"

TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.94 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 2.80 GiB is free. Including non-PyTorch memory, this process has 76.38 GiB memory in "
    "use. Of the allocated memory 72.10 GiB is allocated by PyTorch, with 1.20 GiB allocated in private pools "
    "(e.g., CUDA Graphs), and 1.52 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
    "See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


def feed(parser: SGLangLogParser, text: str) -> SGLangLogParser:
    for line in text.strip("\n").split("\n"):
        parser.feed(line)
    return parser


def parse(text: str) -> SGLangLogParser:
    return feed(SGLangLogParser(), text)


# ---- one line at a time ----------------------------------------------------------------------------

LINES: list[tuple[str, str, dict[str, Any], Phase]] = [
    ("0.5.2 server_args",
     f"{TS} server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tokenizer_path='meta-llama/"
     "Llama-3.1-8B-Instruct', mem_fraction_static=0.874, max_running_requests=None, max_queued_requests="
     "9223372036854775807, max_total_tokens=None, chunked_prefill_size=8192, max_prefill_tokens=16384, "
     "cuda_graph_max_bs=None, cuda_graph_bs=None, torch_compile_max_bs=32)",
     {"mem_fraction_static": 0.874, "cuda_graph_max_bs": None, "chunked_prefill_size": 8192,
      "max_running_requests": None}, Phase.STARTING),
    ("0.5.10 server_args",
     f"{TS} server_args=ServerArgs(model_path='Qwen/Qwen3-8B', mem_fraction_static=0.83, "
     "max_running_requests=128, chunked_prefill_size=8192, cuda_graph_max_bs=256, cuda_graph_bs=None, "
     "disable_piecewise_cuda_graph=False)",
     {"mem_fraction_static": 0.83, "cuda_graph_max_bs": 256, "max_running_requests": 128}, Phase.STARTING),
    ("0.5.15 server_args",
     f"{TS} server_args=ServerArgs(model_path='Qwen/Qwen3-8B', mem_fraction_static=0.7, "
     "cuda_graph_max_bs_prefill=2048, cuda_graph_max_bs_decode=32, cuda_graph_bs_decode=None)",
     {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 32}, Phase.STARTING),
    ("0.5.23 server_args dict",
     f"{TS} server_args={{'model_path': 'Qwen/Qwen3-8B', 'mem_fraction_static': 0.835, "
     "'cuda_graph_max_bs_prefill': 4096, 'cuda_graph_max_bs_decode': 160, 'chunked_prefill_size': 4096}",
     {"mem_fraction_static": 0.835, "cuda_graph_max_bs": 160, "chunked_prefill_size": 4096}, Phase.STARTING),
    ("load weight begin",
     f"{TP0} Load weight begin. avail mem=78.50 GB",
     {"avail_before_weights_gib": 78.5}, Phase.LOAD_WEIGHTS),
    ("0.5.2 load weight end",
     f"{TS} Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.08 GB.",
     {"avail_after_weights_gib": 63.42, "weights_gib": 15.08}, Phase.KV_POOL),
    ("0.5.10 load weight end",
     f"{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, "
     "mem usage=15.08 GB.",
     {"avail_after_weights_gib": 63.42, "weights_gib": 15.08}, Phase.KV_POOL),
    ("0.5.23 load weight end, quantized",
     f"{TP0} Load weight end. elapsed=9.80 s, type=Qwen3ForCausalLM, quant=fp8, avail mem=70.01 GB, "
     "mem usage=8.49 GB.",
     {"avail_after_weights_gib": 70.01, "weights_gib": 8.49}, Phase.KV_POOL),
    ("0.5.2 KV (MHA)",
     f"{TS} KV Cache is allocated. #tokens: 413465, K size: 25.24 GB, V size: 25.24 GB",
     {"kv_tokens": 413465, "kv_gib": 50.48}, Phase.KV_POOL),
    ("0.5.10 KV (MLA)",
     f"{TS} KV Cache is allocated. #tokens: 1000000, KV size: 30.50 GB",
     {"kv_tokens": 1000000, "kv_gib": 30.5}, Phase.KV_POOL),
    ("0.5.13 KV with dtype",
     f"{TP0} KV Cache is allocated. dtype: torch.bfloat16, #tokens: 200000, K size: 12.21 GB, V size: 12.21 GB",
     {"kv_tokens": 200000, "kv_gib": 24.42}, Phase.KV_POOL),
    ("0.5.23 post-capture KV sizing",
     f"{TP0} Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 500000, "
     "KV size: 61.04 GB, avail mem=3.20 GB",
     {"kv_tokens": 500000, "kv_gib": 61.04, "avail_after_kv_gib": 3.2}, Phase.STARTING),
    ("memory pool end",
     f"{TS} Memory pool end. avail mem=12.30 GB",
     {"avail_after_kv_gib": 12.3}, Phase.KV_POOL),
    ("0.5.2 capture begin",
     f"{TS} Capture cuda graph begin. This can take up to several minutes. avail mem=12.20 GB",
     {}, Phase.CUDA_GRAPH),
    ("0.5.2 capture end",
     f"{TS} Capture cuda graph end. Time elapsed: 25.31 s. mem usage=1.52 GB. avail mem=10.68 GB.",
     {"graph_gib": 1.52, "free_after_capture_gib": 10.68}, Phase.CUDA_GRAPH),
    ("0.5.10 piecewise capture end",
     f"{TS} Capture piecewise CUDA graph end. Time elapsed: 10.00 s. mem usage=0.50 GB. avail mem=10.18 GB.",
     {"graph_gib": 0.5, "free_after_capture_gib": 10.18}, Phase.CUDA_GRAPH),
    ("0.5.15 capture end",
     f"{TP0} Capture target decode CUDA graph end. elapsed=20.11 s, mem usage=1.40 GB, avail mem=10.80 GB.",
     {"graph_gib": 1.4, "free_after_capture_gib": 10.8}, Phase.CUDA_GRAPH),
    ("0.5.23 capture end with bs list",
     f"{TP0} Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=5.02 s, mem usage=0.61 GB, "
     "avail mem=11.59 GB.",
     {"graph_gib": 0.61, "free_after_capture_gib": 11.59}, Phase.CUDA_GRAPH),
    ("tqdm fragments",
     "Capturing batches (bs=160 avail_mem=12.34 GB):  10%|█         | 3/35 [00:01<00:10,  3.1it/s]\r"
     "Capturing batches (bs=152 avail_mem=12.10 GB):  13%|█▎        | 4/35 [00:01<00:09,  3.2it/s]",
     {}, Phase.CUDA_GRAPH),
    ("pool summary",
     f"{TP0} max_total_num_tokens=413465, chunked_prefill_size=8192, max_prefill_tokens=16384, "
     "max_running_requests=4096, context_len=131072, available_gpu_mem=10.68 GB",
     {"max_total_num_tokens": 413465, "chunked_prefill_size": 8192, "max_running_requests": 4096,
      "context_len": 131072}, Phase.WARMUP),
    ("uvicorn", f"{TS} INFO:     Application startup complete.", {}, Phase.WARMUP),
    ("ready", f"{TS} The server is fired up and ready to roll!", {}, Phase.READY),
]


@pytest.mark.parametrize(("line", "expected", "phase"), [c[1:] for c in LINES], ids=[c[0] for c in LINES])
def test_one_line(line: str, expected: dict[str, Any], phase: Phase) -> None:
    parser = SGLangLogParser()
    parser.feed(line)
    for key, value in expected.items():
        got = getattr(parser.telemetry, key)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), key
    assert parser.phase == phase
    assert parser.fatal is None


def test_tqdm_fragments_keep_last_capture_figures() -> None:
    parser = SGLangLogParser()
    parser.feed("Capturing batches (bs=160 avail_mem=12.34 GB):  10%|█ | 3/35\r"
                "Capturing batches (bs=152 avail_mem=12.10 GB):  13%|█▎ | 4/35\r")
    assert parser.telemetry.extra["capture_last_bs"] == 152
    assert parser.telemetry.extra["capture_last_avail_gib"] == pytest.approx(12.10)


def test_ready_line_sets_ready_and_batches_set_serving_phase() -> None:
    parser = parse(f"""
{TS} Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,
{TS} The server is fired up and ready to roll!
""")
    assert parser.ready_line and parser.phase == Phase.READY
    parser.feed(f"{TS} Prefill batch [12], #new-seq: 4, #new-token: 1024, #cached-token: 0, token usage: 0.01, "
                "#running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00")
    assert parser.phase == Phase.PREFILL
    parser.feed(f"{TS} Decode batch. #running-req: 4, #token: 1100, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): 210.50, #queue-req: 0, ")
    assert parser.phase == Phase.DECODE
    parser.feed(f"{TS} Decode batch [40], #running-req: 4, #token: 1200, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): 220.00, #queue-req: 0,")
    assert parser.phase == Phase.DECODE


OOM_LINES: list[tuple[str, str, float | None, float | None, float | None]] = [
    ("torch 2.x", TORCH_OOM, 3.94, 2.80, 79.19),
    ("older torch, typo",
     "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty of "
     "15.56 GiB of which 158.62 MiB is free. Of the allocated memory 0 bytes is allocated by PyTorch",
     2.0, 158.62 / 1024, 15.56),
    ("torch 1.x",
     "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
     "14.56 GiB already allocated; 3.06 MiB free; 14.80 GiB reserved in total by PyTorch)",
     20 / 1024, 3.06 / 1024, 15.78),
    ("runtime", "RuntimeError: CUDA error: out of memory", None, None, None),
    ("nccl cuda oom", "node:1234:1234 [0] transport.cc:150 NCCL WARN Cuda failure 'out of memory'", None, None, None),
    ("cublas", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     None, None, None),
]


@pytest.mark.parametrize(("line", "tried", "free", "total"), [c[1:] for c in OOM_LINES],
                         ids=[c[0] for c in OOM_LINES])
def test_oom_texts(line: str, tried: float | None, free: float | None, total: float | None) -> None:
    parser = SGLangLogParser()
    parser.feed(line)
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.OOM
    tele = parser.telemetry
    assert tele.tried_to_allocate_gib == (pytest.approx(tried, abs=1e-4) if tried is not None else None)
    assert tele.free_at_oom_gib == (pytest.approx(free, abs=1e-4) if free is not None else None)
    assert tele.gpu_total_gib == (pytest.approx(total, abs=1e-4) if total is not None else None)
    assert tele.oom_phase == Phase.STARTING.value


FATAL_LINES: list[tuple[str, str, FailureKind]] = [
    ("scheduler exception", f"{TP0} Scheduler hit an exception: Traceback (most recent call last):",
     FailureKind.CRASH),
    ("0.5.2 sigquit", f"{TS} Received sigquit from a child process. It usually means the child failed.",
     FailureKind.CRASH),
    ("0.5.10 sigquit", f"{TS} SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
     FailureKind.CRASH),
    ("init failed", f"{TS} Initialization failed. Please see the error messages above.", FailureKind.CRASH),
    ("0.5.2 scheduler dead", f"{TS} Rank 0 scheduler is dead. Please check if there are relevant logs.",
     FailureKind.CRASH),
    ("0.5.10 scheduler died",
     "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), "
     "a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.", FailureKind.CRASH),
    ("watchdog", f"{TS} Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", FailureKind.CRASH),
    ("0.5.2 KV too small", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
     FailureKind.OOM),
    ("0.5.15 weights leave nothing",
     "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5. Raise "
     "--mem-fraction-static above 0.612 (minimum viable = 1 - available/pre = 0.6120). If using speculative "
     "decoding, draft weights are now counted.", FailureKind.OOM),
    ("nccl error",
     "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
     "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5", FailureKind.NCCL_ERROR),
    ("nccl invalid usage", "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
     FailureKind.NCCL_ERROR),
    ("unhandled cuda error", "RuntimeError: NCCL communicator: unhandled cuda error (run with NCCL_DEBUG=INFO "
     "for details)", FailureKind.NCCL_ERROR),
    ("ambiguous option",
     "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill", FailureKind.BAD_FLAG),
    ("unrecognized", "launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs-decode 16",
     FailureKind.BAD_FLAG),
    ("bad value", "launch_server.py: error: argument --mem-fraction-static: invalid float value: 'x'",
     FailureKind.BAD_FLAG),
    ("usage", "usage: launch_server.py [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]",
     FailureKind.BAD_FLAG),
]


@pytest.mark.parametrize(("line", "kind"), [c[1:] for c in FATAL_LINES], ids=[c[0] for c in FATAL_LINES])
def test_fatal_texts(line: str, kind: FailureKind) -> None:
    parser = SGLangLogParser()
    parser.feed(line)
    assert parser.fatal is not None
    assert parser.fatal.kind is kind
    assert "\n" not in parser.fatal.reason and parser.fatal.reason


def test_harmless_lines_are_not_fatal() -> None:
    parser = parse(f"""
{TS} KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.7000 -> 0.9000
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
{TS} kill_process_tree called: parent_pid=12, include_parent=False, pid=12
{TS} The memory capacity is unbalanced. Some GPUs may be occupied by other processes.
""")
    assert parser.fatal is None


def test_parser_is_a_log_parser() -> None:
    assert isinstance(SGLangLogParser(), LogParser)
    assert isinstance(SGLangEngine().parser(), LogParser)


# ---- whole logs --------------------------------------------------------------------------------------

STARTUP_0510_TP2 = f"""
{TS} server_args=ServerArgs(model_path='meta-llama/Llama-3.1-70B-Instruct', mem_fraction_static=0.83, max_running_requests=None, chunked_prefill_size=8192, cuda_graph_max_bs=256, tp_size=2)
{TP0} Init torch distributed begin.
{TP1} Init torch distributed begin.
{TP0} Init torch distributed ends. elapsed=1.02 s, mem usage=0.79 GB
{TP1} Init torch distributed ends. elapsed=1.02 s, mem usage=0.79 GB
{TP0} Load weight begin. avail mem=78.26 GB
{TP1} Load weight begin. avail mem=78.20 GB
{TP1} Load weight end. elapsed=40.11 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=45.00 GB, mem usage=33.20 GB.
{TP0} Load weight end. elapsed=40.30 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=45.10 GB, mem usage=33.16 GB.
{TP0} KV Cache is allocated. #tokens: 413465, K size: 16.00 GB, V size: 16.00 GB
{TP1} KV Cache is allocated. #tokens: 413465, K size: 16.00 GB, V size: 16.00 GB
{TP0} Memory pool end. avail mem=12.50 GB
{TP1} Memory pool end. avail mem=12.40 GB
{TP0} Capture cuda graph begin. This can take up to several minutes. avail mem=12.20 GB
{TP1} Capture cuda graph begin. This can take up to several minutes. avail mem=12.10 GB
Capturing batches (bs=256 avail_mem=12.18 GB):   0%|          | 0/36 [00:00<?, ?it/s]\rCapturing batches (bs=1 avail_mem=10.70 GB): 100%|██████████| 36/36 [00:20<00:00,  1.75it/s]
{TP0} Capture cuda graph end. Time elapsed: 25.31 s. mem usage=1.52 GB. avail mem=10.68 GB.
{TP1} Capture cuda graph end. Time elapsed: 25.40 s. mem usage=1.55 GB. avail mem=10.55 GB.
{TP0} Capture piecewise CUDA graph begin. avail mem=10.68 GB
{TP0} Capture piecewise CUDA graph end. Time elapsed: 10.00 s. mem usage=0.50 GB. avail mem=10.18 GB.
{TP1} Capture piecewise CUDA graph end. Time elapsed: 10.00 s. mem usage=0.52 GB. avail mem=10.03 GB.
{TP0} max_total_num_tokens=413465, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=131072, available_gpu_mem=10.18 GB
{TS} INFO:     Started server process [4242]
{TS} INFO:     Waiting for application startup.
{TS} INFO:     Application startup complete.
{TS} INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
{TP0} Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00
{TS} The server is fired up and ready to roll!
"""


def test_startup_log_0510_tp2() -> None:
    phases: list[Phase] = []
    parser = SGLangLogParser()
    for line in STARTUP_0510_TP2.strip("\n").split("\n"):
        parser.feed(line)
        if not phases or phases[-1] != parser.phase:
            phases.append(parser.phase)
    assert phases == [Phase.STARTING, Phase.LOAD_WEIGHTS, Phase.KV_POOL, Phase.CUDA_GRAPH, Phase.WARMUP,
                      Phase.READY]
    assert parser.ready_line and parser.fatal is None
    t = parser.telemetry
    assert t.mem_fraction_static == 0.83
    assert t.cuda_graph_max_bs == 256
    # Figures come from TP0, the first rank that printed one, not from TP1.
    assert t.avail_before_weights_gib == 78.26
    assert (t.avail_after_weights_gib, t.weights_gib) == (45.10, 33.16)
    assert (t.kv_tokens, t.kv_gib) == (413465, 32.0)
    assert t.avail_after_kv_gib == 12.5
    assert t.graph_gib == pytest.approx(1.52 + 0.50)
    assert t.free_after_capture_gib == 10.18
    assert (t.max_total_num_tokens, t.chunked_prefill_size, t.max_running_requests, t.context_len) == (
        413465, 8192, 2048, 131072)
    assert t.extra["capture_last_bs"] == 1
    assert not t.simulated


STARTUP_0523 = f"""
{TS} server_args={{'model_path': 'Qwen/Qwen3-32B', 'mem_fraction_static': 0.9, 'cuda_graph_max_bs_decode': 256, 'cuda_graph_max_bs_prefill': 4096, 'chunked_prefill_size': 8192}}
{TS} Load weight begin. avail mem=139.20 GB
{TS} Load weight end. elapsed=20.01 s, type=Qwen3ForCausalLM, avail mem=77.90 GB, mem usage=61.30 GB.
{TS} KV Cache is allocated. dtype: torch.bfloat16, #tokens: 250000, K size: 30.52 GB, V size: 30.52 GB
{TS} Memory pool end. avail mem=15.00 GB
{TS} Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=14.80 GB
{TS} Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 12, 16], elapsed=12.30 s, mem usage=1.10 GB, avail mem=13.70 GB.
{TS} Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[256, 512, 1024], avail mem=13.70 GB
Capturing prefill shape (num_tokens=1024 avail_mem=13.60 GB): 100%|██████████| 3/3
{TS} Capture target prefill CUDA graph end. elapsed=4.00 s, mem usage=0.40 GB, avail mem=13.30 GB.
{TS} max_total_num_tokens=250000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=1024, context_len=40960, available_gpu_mem=13.30 GB
{TS} The server is fired up and ready to roll!
"""


def test_startup_log_0523_sums_decode_and_prefill_graphs() -> None:
    t = parse(STARTUP_0523).telemetry
    assert (t.mem_fraction_static, t.cuda_graph_max_bs) == (0.9, 256)
    assert t.kv_gib == pytest.approx(61.04)
    assert t.graph_gib == pytest.approx(1.5)
    assert t.free_after_capture_gib == 13.30
    assert t.extra["capture_last_tokens"] == 1024
    assert t.context_len == 40960


CAPTURE_OOM_0510 = f"""
{TS} server_args=ServerArgs(model_path='m', mem_fraction_static=0.95, cuda_graph_max_bs=512)
{TS} Load weight begin. avail mem=78.50 GB
{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.08 GB.
{TS} KV Cache is allocated. #tokens: 800000, K size: 27.00 GB, V size: 27.00 GB
{TS} Memory pool end. avail mem=4.10 GB
{TS} Capture cuda graph begin. This can take up to several minutes. avail mem=4.05 GB
Capturing batches (bs=512 avail_mem=4.00 GB):   0%|          | 0/52 [00:00<?, ?it/s]\rCapturing batches (bs=480 avail_mem=2.85 GB):   4%|▍         | 2/52 [00:02<00:50,  1.0it/s]
{TS} Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/sglang/srt/model_executor/cuda_graph_runner.py", line 648, in __init__
    self.capture()
{TORCH_OOM}

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 3600, in run_scheduler_process
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 3.94 GiB. GPU 0 has a total capacity of 79.19 GiB of which 2.80 GiB is free.
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
3. disable torch compile by not using --enable-torch-compile
4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose

{TS} Received sigquit from a child process. It usually means the child failed.
"""


def test_capture_oom_is_oom_in_cuda_graph() -> None:
    parser = parse(CAPTURE_OOM_0510)
    failure = SGLangEngine().classify(parser, 137, CAPTURE_OOM_0510)
    assert failure.kind is FailureKind.OOM
    assert failure.phase is Phase.CUDA_GRAPH
    assert failure.exit_code == 137
    assert failure.reason == "CUDA out of memory in cuda_graph: tried to allocate 3.94 GiB with 2.80 GiB free"
    t = parser.telemetry
    assert (t.tried_to_allocate_gib, t.free_at_oom_gib, t.gpu_total_gib) == (3.94, 2.8, 79.19)
    assert t.oom_phase == "cuda_graph"
    assert t.extra["capture_last_bs"] == 480
    assert t.avail_after_kv_gib == 4.1


def test_capture_failed_line_pins_phase_when_begin_line_was_missed() -> None:
    parser = parse(f"""
{TS} Memory pool end. avail mem=4.10 GB
{TORCH_OOM}
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 3.94 GiB. GPU 0 has a total capacity of 79.19 GiB of which 2.80 GiB is free.
""")
    assert parser.fatal is not None
    assert (parser.fatal.kind, parser.fatal.phase) == (FailureKind.OOM, Phase.CUDA_GRAPH)
    assert parser.telemetry.oom_phase == "cuda_graph"
    assert parser.fatal.reason.startswith("CUDA out of memory in cuda_graph:")


KV_TOO_SMALL_0510 = f"""
{TS} server_args=ServerArgs(model_path='m', mem_fraction_static=0.3, cuda_graph_max_bs=256)
{TS} Load weight begin. avail mem=78.50 GB
{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=10.00 GB, mem usage=68.50 GB.
{TS} Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/model_executor/model_runner_kv_cache_mixin.py", line 55, in init_memory_pool
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.3
{TS} Received sigquit from a child process. It usually means the child failed.
"""

KV_TOO_SMALL_0523 = f"""
{TS} server_args={{'model_path': 'm', 'mem_fraction_static': 0.5, 'cuda_graph_max_bs_decode': 256}}
{TS} Load weight begin. avail mem=78.50 GB
{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, avail mem=38.00 GB, mem usage=40.50 GB.
{TS} Scheduler hit an exception: Traceback (most recent call last):
ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5. Raise --mem-fraction-static above 0.612 (minimum viable = 1 - available/pre = 0.6120). If using speculative decoding, draft weights are now counted.
{TS} SIGQUIT received. signum=None, frame=None. It usually means one child failed.
"""


@pytest.mark.parametrize("log", [KV_TOO_SMALL_0510, KV_TOO_SMALL_0523], ids=["0.5.10", "0.5.23"])
def test_kv_pool_too_small(log: str) -> None:
    parser = parse(log)
    failure = SGLangEngine().classify(parser, -9, log)
    assert (failure.kind, failure.phase, failure.exit_code) == (FailureKind.OOM, Phase.KV_POOL, -9)
    assert failure.reason.startswith("out of memory in kv_pool: ")
    assert "mem-fraction-static" in failure.reason
    assert parser.telemetry.oom_phase == "kv_pool"


DECODE_OOM_SERVING = f"""
{TS} server_args={{'model_path': 'm', 'mem_fraction_static': 0.9, 'cuda_graph_max_bs_decode': 8}}
{TS} Load weight begin. avail mem=78.50 GB
{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, avail mem=63.00 GB, mem usage=15.50 GB.
{TS} KV Cache is allocated. dtype: torch.bfloat16, #tokens: 900000, K size: 28.00 GB, V size: 28.00 GB
{TS} Memory pool end. avail mem=1.50 GB
{TS} max_total_num_tokens=900000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=8192, available_gpu_mem=1.50 GB
{TS} The server is fired up and ready to roll!
{TS} Prefill batch [3], #new-seq: 64, #new-token: 16384, #cached-token: 0, token usage: 0.02, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00
{TS} Decode batch [120], #running-req: 64, #token: 24000, token usage: 0.03, cuda graph: False, gen throughput (token/s): 1000.00, #queue-req: 0,
{TS} Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/managers/scheduler.py", line 1200, in event_loop_overlap
  File "/sglang/srt/model_executor/model_runner.py", line 2000, in forward_decode
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 512.00 MiB is free. Of the allocated memory 76.00 GiB is allocated by PyTorch
{TS} SIGQUIT received. signum=None, frame=None. It usually means one child failed.
"""


def test_eager_decode_oom_while_serving() -> None:
    parser = parse(DECODE_OOM_SERVING)
    failure = SGLangEngine().classify(parser, 137, DECODE_OOM_SERVING)
    assert (failure.kind, failure.phase) == (FailureKind.OOM, Phase.DECODE)
    assert failure.reason == "CUDA out of memory in decode: tried to allocate 1.00 GiB with 0.50 GiB free"
    assert parser.telemetry.oom_phase == "decode"


def test_prefill_allocator_oom_while_serving() -> None:
    parser = parse(f"""
{TS} The server is fired up and ready to roll!
{TS} Decode batch. #running-req: 4, #token: 1100, token usage: 0.99, cuda graph: True, gen throughput (token/s): 210.50, #queue-req: 9,
{TS} Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: Prefill out of memory. Try to lower your batch size.
Try to allocate 8192 tokens.
""")
    assert parser.fatal is not None
    assert (parser.fatal.kind, parser.fatal.phase) == (FailureKind.OOM, Phase.PREFILL)


def test_last_batch_kind_decides_serving_oom_phase() -> None:
    parser = parse(f"""
{TS} The server is fired up and ready to roll!
{TS} Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,
{TS} Scheduler hit an exception: Traceback (most recent call last):
{TORCH_OOM}
""")
    assert parser.fatal is not None and parser.fatal.phase is Phase.PREFILL


def test_warmup_oom() -> None:
    log = f"""
{TS} max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2, context_len=8192, available_gpu_mem=0.10 GB
{TS} INFO:     Application startup complete.
{TS} Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,
{TS} Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: CUDA error: out of memory
{TS} Initialization failed. warmup error: Traceback (most recent call last):
"""
    parser = parse(log)
    assert parser.fatal is not None
    assert (parser.fatal.kind, parser.fatal.phase) == (FailureKind.OOM, Phase.WARMUP)


NCCL_LOG = f"""
{TS} server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, tp_size=2)
{TP0} Init torch distributed begin.
{TP1} Init torch distributed begin.
node:77292:77410 [1] init.cc:1701 NCCL WARN Invalid config blocking attribute value -2147483648
{TP1} Scheduler hit an exception: Traceback (most recent call last):
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:268, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
{TS} Received sigquit from a child process. It usually means the child failed.
"""


def test_nccl_failure() -> None:
    parser = parse(NCCL_LOG)
    failure = SGLangEngine().classify(parser, 137, NCCL_LOG)
    assert (failure.kind, failure.phase) == (FailureKind.NCCL_ERROR, Phase.STARTING)
    assert "NCCL" in failure.reason


ARGPARSE_LOG = """
usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH] [--host HOST]
                    [--port PORT] [--mem-fraction-static MEM_FRACTION_STATIC]
sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill
"""


def test_argparse_ambiguous_option_exit_2() -> None:
    parser = parse(ARGPARSE_LOG)
    failure = SGLangEngine().classify(parser, 2, ARGPARSE_LOG)
    assert (failure.kind, failure.exit_code) == (FailureKind.BAD_FLAG, 2)
    assert failure.reason == (
        "SGLang rejected a flag: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill")


def test_generic_fatal_is_upgraded_by_later_oom_but_first_specific_wins() -> None:
    parser = SGLangLogParser()
    parser.feed(f"{TS} Scheduler hit an exception: Traceback (most recent call last):")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.CRASH
    parser.feed(TORCH_OOM)
    assert parser.fatal.kind is FailureKind.OOM
    parser.feed("torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled cuda error")
    parser.feed(f"{TS} Received sigquit from a child process. It usually means the child failed.")
    assert parser.fatal.kind is FailureKind.OOM


# ---- classify ----------------------------------------------------------------------------------------


def test_classify_rescans_the_tail_when_the_parser_saw_nothing() -> None:
    parser = SGLangLogParser()
    parser.feed(f"{TS} Capture cuda graph begin. This can take up to several minutes. avail mem=4.05 GB")
    failure = SGLangEngine().classify(parser, 137, f"{TS} Scheduler hit an exception: Traceback\n{TORCH_OOM}\n")
    assert (failure.kind, failure.phase) == (FailureKind.OOM, Phase.CUDA_GRAPH)
    assert parser.telemetry.tried_to_allocate_gib == 3.94
    assert parser.telemetry.oom_phase == "cuda_graph"


@pytest.mark.parametrize("code", [137, -9])
def test_sigkill_without_evidence_is_a_crash_naming_the_oom_killer(code: int) -> None:
    parser = parse(STARTUP_0510_TP2)
    failure = SGLangEngine().classify(parser, code, "")
    assert failure.kind is FailureKind.CRASH
    assert "OOM killer" in failure.reason
    assert failure.phase is Phase.READY


def test_sigkill_with_host_oom_kill_evidence_is_oom() -> None:
    parser = parse(f"{TS} Load weight begin. avail mem=78.50 GB")
    failure = SGLangEngine().classify(parser, 137, "", evidence={"oom_kill": 1})
    assert (failure.kind, failure.phase) == (FailureKind.OOM, Phase.LOAD_WEIGHTS)
    assert "host OOM killer" in failure.reason
    assert parser.telemetry.oom_phase == "load_weights"


def test_plain_exit_names_the_last_exception() -> None:
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nImportError: no module sgl_kernel"
    failure = SGLangEngine().classify(SGLangLogParser(), 1, tail)
    assert failure.kind is FailureKind.CRASH
    assert failure.reason == "server exited with code 1 in starting: ImportError: no module sgl_kernel"


def test_sim_parser_marks_telemetry_simulated() -> None:
    parser = SimEngine("profile.yaml").parser()
    parser.feed(f"{TS} Load weight begin. avail mem=78.50 GB")
    assert parser.telemetry.simulated is True
    assert parser.telemetry.avail_before_weights_gib == 78.5


def test_capture_failure_without_oom_is_a_crash_in_cuda_graph() -> None:
    parser = parse(f"""
{TS} Load weight end. elapsed=3.21 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.08 GB.
Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered
""")
    assert parser.fatal is not None
    assert (parser.fatal.kind, parser.fatal.phase) == (FailureKind.CRASH, Phase.CUDA_GRAPH)


def test_nccl_text_inside_a_generic_fatal_line_is_nccl() -> None:
    parser = parse(f"{TP1} Scheduler hit an exception: torch.distributed.DistBackendError: NCCL error in: x.cpp:1")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.NCCL_ERROR


def test_one_feed_call_with_several_lines() -> None:
    parser = SGLangLogParser()
    parser.feed(f"{TS} Load weight begin. avail mem=78.50 GB\n{TS} Memory pool end. avail mem=12.30 GB\n")
    assert (parser.telemetry.avail_before_weights_gib, parser.telemetry.avail_after_kv_gib) == (78.5, 12.3)
    assert parser.phase is Phase.KV_POOL


def test_generic_crash_reason_names_the_exception() -> None:
    log = f"""
{TS} Load weight begin. avail mem=78.50 GB
{TS} Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/model_loader/loader.py", line 300, in load_model
ValueError: Unsupported architecture: FooForCausalLM
{TS} Received sigquit from a child process. It usually means the child failed.
"""
    failure = SGLangEngine().classify(parse(log), 137, log)
    assert failure.kind is FailureKind.CRASH
    assert failure.reason == "server crashed in load_weights: ValueError: Unsupported architecture: FooForCausalLM"


def test_nccl_warn_alone_is_not_fatal() -> None:
    # NCCL_DEBUG=WARN/INFO prints WARN lines on healthy servers; only an NCCL *error* is fatal evidence.
    parser = SGLangLogParser()
    parser.feed("node:77292:77410 [1] init.cc:1701 NCCL WARN Invalid config blocking attribute value")
    assert parser.fatal is None


# ---- engine-audit.md: every real text, per release where the text differs ----------------------------------
# Each line is the release's own format string (sglang-facts errata, engine-audit.md), with figures filled in.

AUDIT_CAPTURE: list[tuple[str, str, str, int | None, float, float]] = [
    # (release, begin line, end line, decode bs captured, graph GB, avail after)
    ("0.5.14",
     f"{TP0} Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, "
     "bs=[1, 2, 4, 8, 16, 24, 32], avail mem=12.10 GB",
     f"{TP0} Capture target decode CUDA graph end. elapsed=20.11 s, mem usage=1.40 GB, avail mem=10.70 GB.",
     32, 1.4, 10.7),
    ("0.5.20",
     f"{TP0} Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8, 16], "
     "avail mem=12.10 GB",
     f"{TP0} Capture target decode CUDA graph end. elapsed=9.00 s, mem usage=0.90 GB, avail mem=11.20 GB.",
     16, 0.9, 11.2),
    ("0.5.23",
     f"{TP0} Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=12.10 GB",
     f"{TP0} Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], elapsed=5.02 s, "
     "mem usage=0.61 GB, avail mem=11.49 GB.",
     64, 0.61, 11.49),
]


@pytest.mark.parametrize(("begin", "end", "max_bs", "graph", "avail"), [c[1:] for c in AUDIT_CAPTURE],
                         ids=[c[0] for c in AUDIT_CAPTURE])
def test_capture_wording_per_release(begin: str, end: str, max_bs: int, graph: float, avail: float) -> None:
    parser = SGLangLogParser()
    parser.feed(begin)
    assert parser.phase is Phase.CUDA_GRAPH
    parser.feed(end)
    tele = parser.telemetry
    assert (tele.graph_gib, tele.free_after_capture_gib) == (pytest.approx(graph), pytest.approx(avail))
    assert tele.extra["capture_max_bs"] == max_bs
    assert parser.fatal is None


def test_prefill_graph_lines_0514_count_with_decode() -> None:
    # Prefill CUDA graphs are on by default from 0.5.10; their memory counts with the decode graphs'.
    parser = parse(f"""
{TP0} Capture target prefill CUDA graph begin. backend=tc_piecewise, num_tokens=[512, 1024, 2048], avail mem=14.00 GB
{TP0} Capture target prefill CUDA graph end. elapsed=30.00 s, mem usage=1.90 GB, avail mem=12.10 GB.
{AUDIT_CAPTURE[0][1]}
{AUDIT_CAPTURE[0][2]}
""")
    assert parser.telemetry.graph_gib == pytest.approx(3.3)
    assert parser.telemetry.free_after_capture_gib == pytest.approx(10.7)
    assert parser.telemetry.extra["capture_max_bs"] == 32  # the prefill token list is not a batch size


@pytest.mark.parametrize(
    ("line", "max_bs"),
    [
        (f"{TS} server_args=ServerArgs(model_path='Qwen/Qwen3-8B', mem_fraction_static=0.7, "
         "cuda_graph_max_bs_decode=None, cuda_graph_bs_decode=None, cuda_graph_config=CudaGraphConfig("
         "decode=PhaseConfig(backend='full', max_bs=256, bs=[1, 2, 4, 8]), prefill=PhaseConfig(backend="
         "'tc_piecewise', max_bs=None, bs=None)))", 256),
        (f"{TS} server_args={{'model_path': 'Qwen/Qwen3-8B', 'mem_fraction_static': 0.7, "
         "'cuda_graph_max_bs_decode': None, 'cuda_graph_config': {'decode': {'backend': 'full', 'max_bs': 160, "
         "'bs': [1, 2, 4]}, 'prefill': {'backend': 'breakable', 'max_bs': None}}}", 160),
        (f"{TS} server_args=ServerArgs(model_path='Qwen/Qwen3-8B', cuda_graph_max_bs_decode=48, "
         "cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=48, bs=None)))", 48),
    ],
    ids=["0.5.14 dataclass", "0.5.23 resolved dict", "explicit flag"],
)
def test_defaulted_graph_max_bs_is_read_from_cuda_graph_config(line: str, max_bs: int) -> None:
    parser = SGLangLogParser()
    parser.feed(line)
    assert parser.telemetry.cuda_graph_max_bs == max_bs
    assert parser.telemetry.mem_fraction_static == pytest.approx(0.7) or "0.7" not in line


@pytest.mark.parametrize(
    "line",
    [
        f"{TP0} Initialize DeepSeekV4TokenToKVPool with max_num_reqs=257 swa_size=65536 c4_size=262144 "
        "c4_logical_size=1048576 c128_size=32768 c4_state_pool_size=1028 c128_state_pool_size=1028",
        f"{TP0} Initialize DeepSeekV4TokenToKVPool with max_num_reqs=257 swa_size=65536 c4_size=262144 "
        "c4_logical_size=1048576 c128_size=32768 c4_state_pool_size=1028 c128_state_pool_size=1028 "
        "unified=False unified_fp8=False",
    ],
    ids=["0.5.14", "0.5.23"],
)
def test_dsv4_pool_line_gives_kv_figures(line: str) -> None:
    # The DeepSeek-V4 pool never logs "KV Cache is allocated"; its size comes from avail mem around the pool.
    parser = parse(f"""
{TP0} Load weight end. elapsed=120.00 s, type=DeepseekV4ForCausalLM, avail mem=58.00 GB, mem usage=36.50 GB.
{line}
{TP0} Memory pool end. avail mem=18.25 GB
""")
    tele = parser.telemetry
    assert parser.phase is Phase.KV_POOL and parser.fatal is None
    assert tele.kv_gib == pytest.approx(39.75)
    assert tele.extra["dsv4_swa_size"] == 65536 and tele.extra["dsv4_c4_logical_size"] == 1048576
    assert tele.extra["dsv4_max_num_reqs"] == 257


SWA_0505 = f"""
{TP0} KV Cache is allocated. #tokens: 1048576, K size: 2.00 GB, V size: 2.00 GB
{TP1} KV Cache is allocated. #tokens: 1048576, K size: 2.00 GB, V size: 2.00 GB
{TP0} KV Cache is allocated. #tokens: 524288, K size: 10.00 GB, V size: 10.00 GB
{TP1} KV Cache is allocated. #tokens: 524288, K size: 10.00 GB, V size: 10.00 GB
"""


def test_swa_unlabeled_kv_lines_0505_to_0516_are_summed() -> None:
    # 0.5.5-0.5.16 print the SWA pool then the full pool, both unlabeled: the KV total is their sum.
    tele = parse(SWA_0505).telemetry
    assert tele.kv_gib == pytest.approx(24.0)
    assert tele.kv_tokens == 524288


def test_swakvpool_total_line_wins() -> None:
    tele = parse(SWA_0505 + f"{TP0} SWAKVPool mem usage: 24.0 GB, swa size: 1048576, full size: 524288\n").telemetry
    assert tele.kv_gib == pytest.approx(24.0)
    assert (tele.kv_tokens, tele.extra["swa_tokens"]) == (524288, 1048576)


def test_swa_labeled_kv_lines_from_0517() -> None:
    tele = parse(f"""
{TP0} SWA KV Cache is allocated. #tokens: 1048576, K size: 2.00 GB, V size: 2.00 GB
{TP0} Full KV Cache is allocated. #tokens: 524288, K size: 10.00 GB, V size: 10.00 GB
""").telemetry
    assert tele.kv_gib == pytest.approx(24.0)
    assert tele.kv_tokens == 524288


@pytest.mark.parametrize(("batch", "phase"), [("Decode", Phase.DECODE), ("Prefill", Phase.PREFILL)])
def test_kv_allocator_oom_is_oom_in_the_batch_phase(batch: str, phase: Phase) -> None:
    # srt/mem_cache/allocation.py:163@v0.5.23 (common.py:217@v0.5.10): an OOM, not a crash.
    parser = parse(f"""
{TS} The server is fired up and ready to roll!
{TP0} {batch} batch. #running-req: 64, #token: 120000, token usage: 0.99, gen throughput (token/s): 900.00
{TP0} Out of memory. Try to lower your batch size.
{TP0} Try to allocate 64 tokens.
{TP0} Available tokens: 12 (available_size=12 + evictable_size=0)
RuntimeError: Out of memory. Try to lower your batch size.
""")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.OOM
    assert parser.fatal.phase is phase
    assert parser.telemetry.oom_phase == phase.value


def test_capture_failure_hint_0514_keeps_the_capture_oom() -> None:
    # From 0.5.14 the hint names --cuda-graph-max-bs-decode; its lines are advice, not a rejected flag.
    parser = parse(f"""
{TP0} Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2, 4, 8], avail mem=1.10 GB
Exception: Capture cuda graph failed: {TORCH_OOM}
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)
3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose
""")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.OOM
    assert parser.fatal.phase is Phase.CUDA_GRAPH


def test_frozen_kv_mtp_capture_failure_is_in_cuda_graph() -> None:
    parser = SGLangLogParser()
    parser.phase = Phase.KV_POOL
    parser.feed("Exception: Capture frozen-KV MTP cuda graph failed: an illegal memory access was encountered")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.CRASH
    assert parser.fatal.phase is Phase.CUDA_GRAPH


@pytest.mark.parametrize(
    "line",
    [
        f"{TS} SIGQUIT received. signum=None, frame=None. It usually means one child failed.",  # 0.5.5 on
        f"{TS} Received sigquit from a child process. It usually means the child failed.",  # 0.5.2
    ],
    ids=["0.5.5", "0.5.2"],
)
def test_sigquit_while_serving_is_a_crash_in_serving(line: str) -> None:
    parser = parse(f"""
{TS} The server is fired up and ready to roll!
{TP0} Decode batch. #running-req: 8, #token: 1000, token usage: 0.01, gen throughput (token/s): 100.00
{line}
""")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.CRASH
    assert parser.fatal.phase is Phase.DECODE


def test_bare_nccl_algo_allgather_error_is_nccl() -> None:
    # NCCL >= 2.24, NCCL_ALGO=Tree, SGLang's TP logits AllGather (engine-audit #2).
    parser = parse(f"""
{TP0} Load weight end. elapsed=20.00 s, type=Qwen3ForCausalLM, avail mem=60.00 GB, mem usage=16.00 GB.
node:812:812 [0] enqueue.cc:1806 NCCL WARN Error : no algorithm/protocol available for function AllGather with datatype ncclBfloat16. NCCL_ALGO was set to Tree.
""")
    assert parser.fatal is not None and parser.fatal.kind is FailureKind.NCCL_ERROR
    assert "AllGather" in parser.fatal.reason


def test_sglang_asks_server_info_before_the_deprecated_path() -> None:
    # From 0.5.9 each /get_server_info call logs a deprecation warning (engine-audit #15).
    assert SGLangEngine().info_paths[0] == "/server_info"
    assert "/get_server_info" in SGLangEngine().info_paths


@pytest.mark.parametrize(("version", "inert"), [("0.5.2", {"num_continuous_decode_steps", "nccl.NCCL_CUMEM_ENABLE",
                                                           "nccl.NCCL_NVLS_ENABLE"}),
                                                ("0.5.5", {"num_continuous_decode_steps"}),
                                                ("0.5.23", {"num_continuous_decode_steps"}),
                                                (None, {"num_continuous_decode_steps"})])
def test_inert_knobs_per_version(version: str | None, inert: set[str]) -> None:
    assert set(SGLangEngine().inert_knobs(version)) == inert
    assert set(SimEngine("p.yaml", version=version or "0.5.10").inert_knobs(None)) >= {"num_continuous_decode_steps"}
