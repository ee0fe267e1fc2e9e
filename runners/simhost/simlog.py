"""What the simulated server prints: SGLang's log lines (``[%Y-%m-%d %H:%M:%S TPn] message`` on stderr),
uvicorn's lines, and the tracebacks a dying SGLang scheduler logs."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

SG_SOURCE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
"""Where the tracebacks say SGLang's files are (a typical install)."""


class SimLog:
    """SGLang's ``[%Y-%m-%d %H:%M:%S TPn] message`` lines on stderr, flushed one by one."""

    def __init__(self, tp_size: int, log_level: str, http_level: str | None, *, first_rank: int = 0,
                 local_ranks: int | None = None) -> None:
        self._lock = threading.Lock()
        self.tp_size = tp_size
        self.first_rank = first_rank
        """This node's first TP rank (a server spanning nodes: node R prints ranks R x local .. on)."""
        self.local_ranks = tp_size if local_ranks is None else local_ranks
        self._quiet = log_level.lower() in ("warning", "error", "critical")
        self._http_quiet = (http_level or log_level).lower() in ("warning", "error", "critical")

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def line(self, message: str, rank: int | None = None, level: str = "info") -> None:
        if level == "info" and self._quiet:
            return
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        prefix = f"[{ts} TP{rank}]" if rank is not None and self.tp_size > 1 else f"[{ts}]"
        self._write(f"{prefix} {message}\n")

    def ranks(self, message: str, level: str = "info") -> None:
        for rank in range(self.first_rank, self.first_rank + self.local_ranks):
            self.line(message, rank=rank, level=level)

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        if level == "INFO" and self._http_quiet:
            return
        self._write(f"{(level + ':').ljust(9)} {message}\n")

    def raw(self, text: str) -> None:
        self._write(text if text.endswith("\n") else text + "\n")



def server_args_line(v: tuple[int, int, int], args: dict[str, Any]) -> str:
    """The first line SGLang logs: its server args, as a dict from 0.5.23 and as ``ServerArgs(...)`` before."""
    if v >= (0, 5, 23):
        return f"server_args={args!r}"
    inner = ", ".join(f"{k}={val!r}" for k, val in args.items())
    return f"server_args=ServerArgs({inner})"



def _frames(phase: str, arch: str) -> list[tuple[str, int, str, str]]:
    """Plausible SGLang stack frames for the place a failure happens (file, line, function, code)."""
    sched = [
        (
            f"{SG_SOURCE}/managers/scheduler.py",
            3608,
            "run_scheduler_process",
            "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
        ),
        (f"{SG_SOURCE}/managers/scheduler.py", 312, "__init__", "self.tp_worker = TpModelWorker("),
        (f"{SG_SOURCE}/managers/tp_worker.py", 237, "__init__", "self.model_runner = ModelRunner("),
    ]
    model = arch.replace("ForCausalLM", "").replace("ForConditionalGeneration", "").lower()
    if phase == "init":
        return [
            *sched,
            (
                f"{SG_SOURCE}/model_executor/model_runner.py",
                412,
                "__init__",
                "min_per_gpu_memory = self.init_torch_distributed()",
            ),
            (
                f"{SG_SOURCE}/distributed/parallel_state.py",
                1471,
                "init_distributed_environment",
                "torch.distributed.all_reduce(data, group=_WORLD.device_group)",
            ),
        ]
    if phase == "load_weights":
        return [
            *sched,
            (f"{SG_SOURCE}/model_executor/model_runner.py", 449, "__init__", "self.load_model()"),
            (
                f"{SG_SOURCE}/model_loader/loader.py",
                625,
                "load_model",
                "model.load_weights(self._get_all_weights(model_config, model))",
            ),
            (
                f"{SG_SOURCE}/models/{model}.py",
                3108,
                "load_weights",
                "weight_loader(param, loaded_weight, shard_id)",
            ),
            (f"{SG_SOURCE}/layers/linear.py", 1254, "weight_loader", "param_data.copy_(loaded_weight)"),
        ]
    if phase == "kv_pool":
        return [
            *sched,
            (
                f"{SG_SOURCE}/model_executor/model_runner.py",
                457,
                "__init__",
                "self.init_memory_pool(min_per_gpu_memory)",
            ),
            (
                f"{SG_SOURCE}/model_executor/model_runner_kv_cache_mixin.py",
                212,
                "init_memory_pool",
                "self.req_to_token_pool = ReqToTokenPool(",
            ),
        ]
    if phase == "cuda_graph":
        return [
            *sched,
            (f"{SG_SOURCE}/model_executor/model_runner.py", 466, "__init__", "self.init_device_graphs()"),
            (
                f"{SG_SOURCE}/model_executor/model_runner.py",
                2461,
                "init_device_graphs",
                "self.graph_runner = graph_runners[self.device](self)",
            ),
            (f"{SG_SOURCE}/model_executor/cuda_graph_runner.py", 651, "__init__", "raise Exception("),
        ]
    forward = "forward_extend" if phase in ("prefill", "warmup") else "forward_decode"
    return [
        (f"{SG_SOURCE}/managers/scheduler.py", 3640, "run_scheduler_process", "scheduler.event_loop_normal()"),
        (f"{SG_SOURCE}/managers/scheduler.py", 1010, "event_loop_normal", "result = self.run_batch(batch)"),
        (
            f"{SG_SOURCE}/managers/scheduler.py",
            2190,
            "run_batch",
            "batch_result = self.model_worker.forward_batch_generation(model_worker_batch)",
        ),
        (f"{SG_SOURCE}/model_executor/model_runner.py", 2301, forward, "return self.model.forward("),
        (f"{SG_SOURCE}/models/{model}.py", 2919, "forward", "hidden_states = self.model("),
    ]


def traceback(phase: str, arch: str, exception: str) -> str:
    """The traceback a rank prints for ``exception`` raised in ``phase`` (after ``Scheduler hit an exception: ``)."""
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in _frames(phase, arch):
        lines.append(f'  File "{path}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    return "\n".join(lines) + "\n" + exception
