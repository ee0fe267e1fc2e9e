"""Exact SGLang / PyTorch / NCCL / uvicorn texts the simulated host prints, per emulated version.

Every string here follows sglang-facts (§2 start-up lines, §3 fatal paths); where the facts leave a
release range open, the older checked release's wording is used. Functions return message bodies; the
server adds the ``[%Y-%m-%d %H:%M:%S TPn] `` prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

from runners.simhost.launch import Version

__all__ = [
    "capture_begin",
    "capture_end",
    "capture_failed_exception",
    "decode_batch",
    "dist_init_end",
    "format_size",
    "kv_allocated",
    "kv_too_small",
    "load_weight_end",
    "nccl_remote_error",
    "pool_summary",
    "prefill_batch",
    "sigquit_line",
    "torch_oom",
]

GIB = float(1 << 30)

# sglang-facts §3.4 (0.5.2 ... 0.5.13 and 0.5.15 ... 0.5.23). Trailing space after "choose" is real.
_POSSIBLE_SOLUTIONS_OLD = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
_POSSIBLE_SOLUTIONS_NEW = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def format_size(nbytes: float) -> str:
    """PyTorch's ``format_size`` (c10/core/CachingDeviceAllocator.h): 2 decimals, bytes/KiB/MiB/GiB."""
    size = int(max(nbytes, 0))
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def torch_oom(
    *,
    tried_gib: float,
    gpu: int,
    total_gib: float,
    free_gib: float,
    process_gib: float,
    allocated_gib: float,
    private_pool_gib: float,
    reserved_unallocated_gib: float,
    others: Sequence[tuple[int, float]] = (),
) -> str:
    """The CUDA caching allocator's OutOfMemoryError message (without the exception class name)."""
    proc_info = "".join(f"Process {pid} has {format_size(gib * GIB)} memory in use. " for pid, gib in others)
    proc_info += f"Including non-PyTorch memory, this process has {format_size(process_gib * GIB)} memory in use. "
    private = (
        f"with {format_size(private_pool_gib * GIB)} allocated in private pools (e.g., CUDA Graphs), "
        if private_pool_gib > 0
        else ""
    )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried_gib * GIB)}. "
        f"GPU {gpu} has a total capacity of {format_size(total_gib * GIB)} "
        f"of which {format_size(free_gib * GIB)} is free. {proc_info}"
        f"Of the allocated memory {format_size(allocated_gib * GIB)} is allocated by PyTorch, {private}"
        f"and {format_size(reserved_unallocated_gib * GIB)} is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )


def dist_init_end(v: Version, elapsed_s: float, mem_usage_gib: float) -> str:
    if v >= (0, 5, 10):
        return f"Init torch distributed ends. elapsed={elapsed_s:.2f} s, mem usage={mem_usage_gib:.2f} GB"
    return f"Init torch distributed ends. mem usage={mem_usage_gib:.2f} GB"


def load_weight_end(v: Version, *, elapsed_s: float, arch: str, dtype: str, avail_gib: float, usage_gib: float) -> str:
    if v >= (0, 5, 10):
        return (
            f"Load weight end. elapsed={elapsed_s:.2f} s, type={arch}, avail mem={avail_gib:.2f} GB, "
            f"mem usage={usage_gib:.2f} GB."
        )
    return (
        f"Load weight end. type={arch}, dtype=torch.{dtype}, avail mem={avail_gib:.2f} GB, "
        f"mem usage={usage_gib:.2f} GB."
    )


def kv_allocated(v: Version, *, tokens: int, kv_gib: float, mla: bool, dtype: str) -> str:
    sizes = f"KV size: {kv_gib:.2f} GB" if mla else f"K size: {kv_gib / 2:.2f} GB, V size: {kv_gib / 2:.2f} GB"
    if v >= (0, 5, 13):
        return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, {sizes}"
    return f"KV Cache is allocated. #tokens: {tokens}, {sizes}"


def kv_too_small(v: Version, mfs: float) -> str:
    """The exception line (class: message) when the KV pool would hold no token (sglang-facts §3.2)."""
    if v >= (0, 5, 10):
        return (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mfs}"
        )
    if v >= (0, 5, 5):
        return (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: self.server_args.mem_fraction_static={mfs}"
        )
    return "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def weights_leave_no_kv(mfs: float, minimum: float) -> str:
    """0.5.15+ check before sizing the pool (sglang-facts §3.2)."""
    return (
        f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}. "
        f"Raise --mem-fraction-static above {minimum:.3f} (minimum viable = 1 - available/pre = "
        f"{minimum:.4f}). If using speculative decoding, draft weights are now counted."
    )


def capture_begin(v: Version, *, avail_gib: float, bs: Sequence[int]) -> str:
    """Decode capture begin line (engine-audit item 12: ``num_tokens_per_bs`` with ``bs`` on the begin line
    in 0.5.14-0.5.15, ``num_tokens_per_req`` with ``bs`` on the begin line in 0.5.16-0.5.21, ``bs`` on the
    end line from 0.5.22)."""
    if v >= (0, 5, 22):
        return (
            f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem={avail_gib:.2f} GB"
        )
    if v >= (0, 5, 16):
        return (
            f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs={list(bs)}, "
            f"avail mem={avail_gib:.2f} GB"
        )
    if v >= (0, 5, 14):
        return (
            f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs={list(bs)}, "
            f"avail mem={avail_gib:.2f} GB"
        )
    return f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail_gib:.2f} GB"


def capture_end(v: Version, *, elapsed_s: float, usage_gib: float, avail_gib: float, bs: Sequence[int]) -> str:
    if v >= (0, 5, 22):
        return (
            f"Capture target decode CUDA graph end. bs={list(bs)}, elapsed={elapsed_s:.2f} s, "
            f"mem usage={usage_gib:.2f} GB, avail mem={avail_gib:.2f} GB."
        )
    if v >= (0, 5, 14):
        return (
            f"Capture target decode CUDA graph end. elapsed={elapsed_s:.2f} s, mem usage={usage_gib:.2f} GB, "
            f"avail mem={avail_gib:.2f} GB."
        )
    return (
        f"Capture cuda graph end. Time elapsed: {elapsed_s:.2f} s. mem usage={usage_gib:.2f} GB. "
        f"avail mem={avail_gib:.2f} GB."
    )


def prefill_backend(v: Version) -> str:
    """The default prefill CUDA-graph backend (``cuda_graph_config.py:default_prefill_backend``)."""
    if v >= (0, 5, 15):
        return "breakable"
    if v >= (0, 5, 14):
        return "tc_piecewise"
    return "piecewise"


def prefill_capture_begin(v: Version, *, avail_gib: float, tokens: Sequence[int]) -> str:
    """0.5.10-0.5.13 ``Capture piecewise CUDA graph begin``; 0.5.14+ ``Capture target prefill CUDA graph begin``."""
    if v >= (0, 5, 14):
        return (
            f"Capture target prefill CUDA graph begin. backend={prefill_backend(v)}, num_tokens={list(tokens)}, "
            f"avail mem={avail_gib:.2f} GB"
        )
    return f"Capture piecewise CUDA graph begin. avail mem={avail_gib:.2f} GB"


def prefill_capture_end(v: Version, *, elapsed_s: float, usage_gib: float, avail_gib: float) -> str:
    if v >= (0, 5, 14):
        return (
            f"Capture target prefill CUDA graph end. elapsed={elapsed_s:.2f} s, mem usage={usage_gib:.2f} GB, "
            f"avail mem={avail_gib:.2f} GB."
        )
    return (
        f"Capture piecewise CUDA graph end. Time elapsed: {elapsed_s:.2f} s. mem usage={usage_gib:.2f} GB. "
        f"avail mem={avail_gib:.2f} GB."
    )


def capture_failed_exception(v: Version, oom_text: str) -> str:
    """``Exception: Capture cuda graph failed: ...`` with the version's Possible-solutions block (the
    ``-decode`` wording from 0.5.14, engine-audit item 13)."""
    block = _POSSIBLE_SOLUTIONS_NEW if v >= (0, 5, 14) else _POSSIBLE_SOLUTIONS_OLD
    return f"Exception: Capture cuda graph failed: {oom_text}\n{block}"


def prefill_capture_failed_exception(v: Version, oom_text: str) -> str:
    """A prefill-graph capture failure: 0.5.14+ ``Capture prefill CUDA graph failed`` with the backend's
    suggestions (``prefill_cuda_graph_runner.py``); 0.5.10-0.5.13 the piecewise runner's advice."""
    if v >= (0, 5, 14):
        backend = prefill_backend(v)
        first = (
            "1. change to breakable by --cuda-graph-backend-prefill=breakable\n" if backend == "tc_piecewise" else ""
        )
        n = 2 if first else 1
        hint = (
            f"{first}{n}. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
            f"{n + 1}. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
            "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)\n"
        )
        return (
            f"Exception: Capture prefill CUDA graph failed: {oom_text}\n"
            f"Fail when using backend: {backend} for prefill runner.\nPossible suggestions:\n{hint}"
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
        )
    return (
        f"torch.OutOfMemoryError: {oom_text}\n"
        "Piecewise CUDA Graph is enabled by default as an experimental feature.\n"
        "To work around this error, add --disable-piecewise-cuda-graph to your launch command.\n"
        "Please report this issue at https://github.com/sgl-project/sglang/issues/new/choose"
    )


def dsv4_pool_line(*, max_num_reqs: int, tokens: int) -> str:
    """DeepSeek-V4's pool line (``srt/mem_cache/deepseek_v4_memory_pool.py:1018@v0.5.23``); DSv4 never logs
    ``KV Cache is allocated`` (engine-audit item 9). Sizes: sliding-window slots per request, the c4
    (1/4-compressed) pool and its logical size, the c128 pool, and per-request state pools."""
    swa_size = (max_num_reqs + 1) * 128
    return (
        f"Initialize DeepSeekV4TokenToKVPool with max_num_reqs={max_num_reqs} swa_size={swa_size} "
        f"c4_size={tokens // 4} c4_logical_size={tokens} c128_size={tokens // 128} "
        f"c4_state_pool_size={max_num_reqs + 1} c128_state_pool_size={max_num_reqs + 1} "
        "unified=False unified_fp8=False"
    )


def retract_line(v: Version, *, retracted: int, gained: int, old_ratio: float, new_ratio: float) -> str:
    """``KV cache pool is full. Retract requests.`` (0.5.2 scheduler.py:1777 info; 0.5.10+ warning with
    ``#new_tokens_gained``, scheduler.py:2595)."""
    if v >= (0, 5, 10):
        return (
            f"KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, #new_tokens_gained: {gained}, "
            f"#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}"
        )
    return (
        f"KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, "
        f"#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}"
    )


def pool_summary(
    *, tokens: int, chunked: int, max_prefill: int, max_running: int, context_len: int, avail_gib: float
) -> str:
    return (
        f"max_total_num_tokens={tokens}, chunked_prefill_size={chunked}, max_prefill_tokens={max_prefill}, "
        f"max_running_requests={max_running}, context_len={context_len}, available_gpu_mem={avail_gib:.2f} GB"
    )


def sigquit_line(v: Version, *, running: bool) -> str:
    """What the main process logs when a scheduler sends SIGQUIT (sglang-facts §3.5)."""
    if running and v >= (0, 5, 5):  # engine-audit item 13
        return "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
    return "Received sigquit from a child process. It usually means the child failed."


def prefill_batch(
    v: Version, *, new_seq: int, new_token: int, usage: float, running: int, queued: int, throughput: float
) -> str:
    if v >= (0, 5, 10):
        return (
            f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: 0, "
            f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, cuda graph: False, "
            f"input throughput (token/s): {throughput:.2f}, "
        )
    return (
        f"Prefill batch. #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: 0, "
        f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, "
    )


def decode_batch(
    v: Version, *, running: int, tokens: int, usage: float, graph: bool, throughput: float, queued: int
) -> str:
    sep = "," if v >= (0, 5, 10) else "."
    return (
        f"Decode batch{sep} #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, "
        f"cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}, "
    )


def nccl_exception(reason: str, version: str) -> str:
    """The torch.distributed error a rank raises when NCCL ``version`` refuses the requested algorithm/protocol."""
    return (
        "torch.distributed.DistBackendError: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with NCCL_DEBUG=WARN for "
        f"details), NCCL version {version}\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
        "Last error:\n"
        f"{reason}"
    )


def nccl_remote_error(nccl_version: str) -> str:
    """What a rank's collective raises when a rank on another node died (torch's ``ProcessGroupNCCL``:
    ``ncclRemoteError``)."""
    return (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version "
        f"{nccl_version}\nncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.\nLast error:\nsocket.c:538 NCCL WARN Net : Connection closed by remote peer"
    )
