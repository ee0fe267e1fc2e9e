"""A simulated SGLang server: ``python -m runners.simhost.server --sim-profile FILE [SGLang flags]``.

It parses SGLang's ``launch_server`` flags for the emulated version (``--sim-version`` or
``$SERVETUNE_SIM_VERSION``, default 0.5.10), replays the start-up of
:func:`runners.simhost.model.plan_startup` with SGLang's log lines on stderr, then serves SGLang's HTTP
endpoints from a continuous-batching scheduler (:mod:`runners.simhost.engine`) on ``--host``/``--port``
only. Every duration is the model's simulated time divided by ``--sim-speed`` (or
``$SERVETUNE_SIM_SPEED``); everything reported (log timestamps, ``elapsed=`` fields, throughputs) is on
that compressed clock, and ``/get_server_info`` says ``"simulated": true`` and ``"sim_speed"`` so a
client can convert back.

Death is SGLang's: the failing scheduler logs ``Scheduler hit an exception`` with the traceback, the main
process logs the SIGQUIT line (and ``kill_process_tree called`` from 0.5.13) and SIGKILLs itself, so a
shell sees 137. SIGTERM shuts down like uvicorn (exit 0) once HTTP is up and kills the process before;
``--sim-ignore-sigterm`` (or ``SERVETUNE_SIM_IGNORE_SIGTERM=1``) ignores it, holding the simulated GPU
memory until SIGKILL.

HTTP: ``/health`` (503 until warm-up is done), ``/get_server_info`` and ``/server_info``,
``/get_model_info`` and ``/model_info``, ``/v1/models``, ``/generate``, ``/v1/completions``,
``/v1/chat/completions`` (streaming as SSE ``data: {...}`` ending ``data: [DONE]``), ``/metrics`` with
``--enable-metrics``, ``/flush_cache``. Prompt length is ``sim_input_len`` if the body has it, else the
length of ``input_ids`` (or of a token-id ``prompt``), else one token per 4 characters of text.
Generation always runs to ``max_new_tokens`` (``max_tokens``), as with ``ignore_eos``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import json
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

from runners.simhost import texts
from runners.simhost.engine import Batch, BatchEngine, OomDetail, Retraction, RuntimeSpec, SimRequest
from runners.simhost.launch import BadFlag, SimLaunch, build_parser, emulated_version
from runners.simhost.model import (
    WARMUP_MAX_NEW_TOKENS,
    WARMUP_PROMPT,
    Failure,
    ResolvedArgs,
    StartupPlan,
    approx_tokens,
    oom_text,
    plan_startup,
)
from runners.simhost.profile import ProfileError, SimProfile, load_profile
from runners.simhost.state import (
    HostState,
    ProcEntry,
    default_state_dir,
    live_procs,
    process_start_time,
    remove_proc,
    write_host,
    write_proc,
)

__all__ = ["SimServer", "main"]

_SG = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
# A batch that starts late by less than this starts at its scheduled time (absorbing Python's own
# overhead between batches); a longer hiccup shifts the timeline, as a stalled GPU step would.
_CATCH_UP_S = 0.002
_WORDS = ("the", "of", "and", "a", "to", "in", "is", "that", "it", "was", "for", "on", "are", "as", "with")


# ---------------------------------------------------------------------------------------------------------
# logging
# ---------------------------------------------------------------------------------------------------------


class SimLog:
    """SGLang's ``[%Y-%m-%d %H:%M:%S TPn] message`` lines on stderr, flushed one by one."""

    def __init__(self, tp_size: int, log_level: str, http_level: str | None) -> None:
        self._lock = threading.Lock()
        self.tp_size = tp_size
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
        for rank in range(self.tp_size):
            self.line(message, rank=rank, level=level)

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        if level == "INFO" and self._http_quiet:
            return
        self._write(f"{(level + ':').ljust(9)} {message}\n")

    def raw(self, text: str) -> None:
        self._write(text if text.endswith("\n") else text + "\n")


def _repr_args(v: tuple[int, int, int], args: dict[str, Any]) -> str:
    if v >= (0, 5, 23):
        return f"server_args={args!r}"
    inner = ", ".join(f"{k}={val!r}" for k, val in args.items())
    return f"server_args=ServerArgs({inner})"


def _frames(phase: str, arch: str) -> list[tuple[str, int, str, str]]:
    """Plausible SGLang stack frames for the place a failure happens (file, line, function, code)."""
    sched = [
        (
            f"{_SG}/managers/scheduler.py",
            3608,
            "run_scheduler_process",
            "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
        ),
        (f"{_SG}/managers/scheduler.py", 312, "__init__", "self.tp_worker = TpModelWorker("),
        (f"{_SG}/managers/tp_worker.py", 237, "__init__", "self.model_runner = ModelRunner("),
    ]
    model = arch.replace("ForCausalLM", "").replace("ForConditionalGeneration", "").lower()
    if phase == "init":
        return [
            *sched,
            (
                f"{_SG}/model_executor/model_runner.py",
                412,
                "__init__",
                "min_per_gpu_memory = self.init_torch_distributed()",
            ),
            (
                f"{_SG}/distributed/parallel_state.py",
                1471,
                "init_distributed_environment",
                "torch.distributed.all_reduce(data, group=_WORLD.device_group)",
            ),
        ]
    if phase == "load_weights":
        return [
            *sched,
            (f"{_SG}/model_executor/model_runner.py", 449, "__init__", "self.load_model()"),
            (
                f"{_SG}/model_loader/loader.py",
                625,
                "load_model",
                "model.load_weights(self._get_all_weights(model_config, model))",
            ),
            (
                f"{_SG}/models/{model}.py",
                3108,
                "load_weights",
                "weight_loader(param, loaded_weight, shard_id)",
            ),
            (f"{_SG}/layers/linear.py", 1254, "weight_loader", "param_data.copy_(loaded_weight)"),
        ]
    if phase == "kv_pool":
        return [
            *sched,
            (
                f"{_SG}/model_executor/model_runner.py",
                457,
                "__init__",
                "self.init_memory_pool(min_per_gpu_memory)",
            ),
            (
                f"{_SG}/model_executor/model_runner_kv_cache_mixin.py",
                212,
                "init_memory_pool",
                "self.req_to_token_pool = ReqToTokenPool(",
            ),
        ]
    if phase == "cuda_graph":
        return [
            *sched,
            (f"{_SG}/model_executor/model_runner.py", 466, "__init__", "self.init_device_graphs()"),
            (
                f"{_SG}/model_executor/model_runner.py",
                2461,
                "init_device_graphs",
                "self.graph_runner = graph_runners[self.device](self)",
            ),
            (f"{_SG}/model_executor/cuda_graph_runner.py", 651, "__init__", "raise Exception("),
        ]
    forward = "forward_extend" if phase in ("prefill", "warmup") else "forward_decode"
    return [
        (f"{_SG}/managers/scheduler.py", 3640, "run_scheduler_process", "scheduler.event_loop_normal()"),
        (f"{_SG}/managers/scheduler.py", 1010, "event_loop_normal", "result = self.run_batch(batch)"),
        (
            f"{_SG}/managers/scheduler.py",
            2190,
            "run_batch",
            "batch_result = self.model_worker.forward_batch_generation(model_worker_batch)",
        ),
        (f"{_SG}/model_executor/model_runner.py", 2301, forward, "return self.model.forward("),
        (f"{_SG}/models/{model}.py", 2919, "forward", "hidden_states = self.model("),
    ]


def _traceback(phase: str, arch: str, exception: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in _frames(phase, arch):
        lines.append(f'  File "{path}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    return "\n".join(lines) + "\n" + exception


# ---------------------------------------------------------------------------------------------------------
# scheduler thread
# ---------------------------------------------------------------------------------------------------------


class _Channel:
    """Tokens for one request, delivered by the scheduler when a batch ends."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()

    def put(self, n: int, finished: bool) -> None:
        self.q.put((n, finished))

    def get(self) -> tuple[int, bool]:
        return self.q.get()


class _Scheduler(threading.Thread):
    def __init__(self, server: SimServer, spec: RuntimeSpec) -> None:
        super().__init__(name="sim-scheduler", daemon=True)
        self.server = server
        self.engine = BatchEngine(spec, first_forward_done=False)
        self.spec = spec
        self.speed = server.speed
        self.inbox: queue.SimpleQueue[tuple[str, SimRequest]] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.t0 = time.monotonic()
        self.deadline = 0.0
        self.last_gen_throughput = 0.0
        self._log_tokens = 0
        self._log_t = time.monotonic()
        self._next_decode_log = server.launch.decode_log_interval
        self._busy = False

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def submit(self, req: SimRequest) -> None:
        self.inbox.put(("add", req))
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        self.inbox.put(("abort", req))
        self.wake.set()

    def _drain(self) -> None:
        while True:
            try:
                op, req = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self.engine.add(req)
            else:
                self.engine.abort(req)

    def run(self) -> None:
        while True:
            self.wake.clear()
            self._drain()
            batch = self.engine.next_batch()
            if batch is None:
                if self._busy:
                    self._busy = False
                    self.server.set_util(0)
                self.wake.wait(timeout=1.0)
                continue
            if not self._busy:
                self._busy = True
                self.server.set_util(100)
            wall = batch.duration_s / self.speed
            if batch.kind == "prefill":  # SGLang logs a prefill batch when it forms it, before running it
                self._log_prefill(batch, wall)
            if self.server.first_forward_failure is not None:
                self.server.die_first_forward(self.server.first_forward_failure)
            if batch.retraction is not None:
                self._log_retraction(batch.retraction)
            if batch.oom is not None:
                self.server.die_runtime(batch)
            self.server.note_transient(batch, self.spec)
            end = self._wait_out(wall)
            emissions = self.engine.commit(batch, (end - self.t0) * self.speed)
            for em in emissions:
                if isinstance(em.request.sink, _Channel):
                    em.request.sink.put(em.new_tokens, em.finished)
            if batch.kind == "decode":
                self._log_decode(batch)

    def _log_retraction(self, rt: Retraction) -> None:
        self.server.log.line(
            texts.retract_line(
                self.server.v,
                retracted=len(rt.requests),
                gained=rt.tokens_gained,
                old_ratio=rt.old_ratio,
                new_ratio=rt.new_ratio,
            ),
            rank=0,
            level="warning" if self.server.v >= (0, 5, 10) else "info",
        )

    def _wait_out(self, wall: float) -> float:
        """Sleep until a batch of ``wall`` seconds, started at the previous batch's end when that is recent,
        is done; return its end (monotonic clock)."""
        now = time.monotonic()
        start = self.deadline if now - _CATCH_UP_S < self.deadline <= now else now
        end = start + wall
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self.deadline = end
        return end

    def _log_prefill(self, batch: Batch, wall: float) -> None:
        eng = self.engine
        queued = len(eng.waiting) - sum(1 for r, _ in batch.prefill if r is not eng.chunked)
        self.server.log.line(
            texts.prefill_batch(
                self.server.v,
                new_seq=len(batch.prefill),
                new_token=batch.new_tokens,
                usage=eng.token_usage,
                running=len(eng.running),
                queued=max(queued, 0),
                throughput=batch.new_tokens / max(wall, 1e-9),
            ),
            rank=0,
        )

    def _log_decode(self, batch: Batch) -> None:
        v = self.server.v
        eng = self.engine
        self._log_tokens += sum(n for n, _, _ in batch.decode_steps)
        if eng.decode_steps_total >= self._next_decode_log:
            now = time.monotonic()
            self.last_gen_throughput = self._log_tokens / max(now - self._log_t, 1e-9)
            self.server.log.line(
                texts.decode_batch(
                    v,
                    running=len(eng.running),
                    tokens=eng.used_tokens,
                    usage=eng.token_usage,
                    graph=batch.graph,
                    throughput=self.last_gen_throughput,
                    queued=len(eng.waiting),
                ),
                rank=0,
            )
            self._log_tokens = 0
            self._log_t = now
            interval = max(self.server.launch.decode_log_interval, 1)
            self._next_decode_log = (eng.decode_steps_total // interval + 1) * interval


# ---------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _token_text(start: int, n: int) -> str:
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in range(start, start + n))


class _Reply(NamedTuple):
    """What every response to one generation request repeats."""

    kind: str  # generate | completions | chat
    rid: str
    input_len: int
    t0: float  # time.monotonic() when the request was accepted
    created: int
    model: str


def _generate_request(body: dict[str, Any]) -> tuple[Any, Any]:
    """(max_new_tokens, prompt) of a native ``/generate`` body."""
    sp = body.get("sampling_params") or {}
    prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text", "")
    return sp.get("max_new_tokens", 128), prompt


def _completions_request(body: dict[str, Any]) -> tuple[Any, Any]:
    """(max_new_tokens, prompt) of a ``/v1/completions`` body."""
    return body.get("max_tokens", 16), body.get("prompt", "")


def _chat_request(body: dict[str, Any]) -> tuple[Any, Any]:
    """(max_new_tokens, prompt) of a ``/v1/chat/completions`` body: the messages' contents, joined."""
    max_new = body.get("max_completion_tokens") or body.get("max_tokens") or 128
    msgs = body.get("messages") or []
    return max_new, " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))


_REQUEST_PARSERS: dict[str, Callable[[dict[str, Any]], tuple[Any, Any]]] = {
    "generate": _generate_request,
    "completions": _completions_request,
    "chat": _chat_request,
}


def _input_len(body: dict[str, Any], prompt: Any) -> int:
    """``sim_input_len`` when the body gives one, else the prompt's token count."""
    if isinstance(body.get("sim_input_len"), int) and body["sim_input_len"] > 0:
        return int(body["sim_input_len"])
    if isinstance(prompt, list):
        return max(1, len(prompt))
    return approx_tokens(str(prompt))


def _whole_choice(kind: str, text: str) -> tuple[dict[str, Any], str]:
    """(the one choice, the object type) of a non-streamed OpenAI-style answer."""
    if kind == "completions":
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "matched_stop": None,
        }
        return choice, "text_completion"
    choice = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": None,
        },
        "logprobs": None,
        "finish_reason": "length",
        "matched_stop": None,
    }
    return choice, "chat.completion"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    sim: SimServer  # set on the subclass the server builds

    # -- plumbing -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        # Small SSE writes must not wait for the peer's delayed ACK (uvicorn's transports do the same).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        try:
            phrase = http.HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        self.sim.log.uvicorn(f'{host}:{port} - "{self.requestline}" {code} {phrase}')

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise _BadRequest(f"invalid JSON body: {exc}") from exc
        if not isinstance(data, dict):
            raise _BadRequest("the JSON body must be an object")
        return data

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sse(self, obj: Any) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    # -- routes ---------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        try:
            self._dispatch(path, method)
        except _BadRequest as exc:
            self._bad_request(path, exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _dispatch(self, path: str, method: str) -> None:
        """Answer with the first route whose condition holds; 404 when none does."""
        sim = self.sim
        routes: tuple[tuple[bool, Callable[[], None]], ...] = (
            (path in ("/health", "/health_generate"), lambda: self._send(200 if sim.ready.is_set() else 503, b"")),
            (
                path in ("/get_server_info", "/server_info"),
                lambda: self._info(path, "/get_server_info", "/server_info", sim.server_info),
            ),
            (
                path in ("/get_model_info", "/model_info"),
                lambda: self._info(path, "/get_model_info", "/model_info", sim.model_info),
            ),
            (path == "/v1/models", lambda: self._json(200, sim.models())),
            (
                path == "/metrics" and sim.launch.enable_metrics,
                lambda: self._send(200, sim.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"),
            ),
            (path == "/flush_cache", lambda: self._send(200, b"Cache flushed.\n", "text/plain; charset=utf-8")),
            (path == "/generate" and method in ("POST", "PUT"), lambda: self._generate("generate")),
            (path == "/v1/completions" and method == "POST", lambda: self._generate("completions")),
            (path == "/v1/chat/completions" and method == "POST", lambda: self._generate("chat")),
        )
        handler = next((h for matches, h in routes if matches), None)
        if handler is None:
            self._json(404, {"detail": "Not Found"})
        else:
            handler()

    def _info(self, path: str, old: str, new: str, payload: Callable[[], dict[str, Any]]) -> None:
        self._deprecated(path, old, new)
        self._json(200, payload())

    def _bad_request(self, path: str, exc: _BadRequest) -> None:
        """OpenAI-style error body on ``/v1/`` paths, SGLang's own elsewhere."""
        if path.startswith("/v1/"):
            self._json(
                exc.status,
                {
                    "object": "error",
                    "message": exc.message,
                    "type": "BadRequestError",
                    "param": None,
                    "code": exc.status,
                },
            )
        else:
            self._json(exc.status, {"error": {"message": exc.message}})

    def _deprecated(self, path: str, old: str, new: str) -> None:
        """From 0.5.9 each call of an old ``/get_*`` path logs a deprecation warning (engine-audit item 15)."""
        if path == old and self.sim.v >= (0, 5, 9):
            self.sim.log.line(
                f"Endpoint '{old}' is deprecated and will be removed in a future version. Please use '{new}' instead.",
                level="warning",
            )

    def _generate(self, kind: str) -> None:
        sim = self.sim
        body = self._body()
        max_new, prompt = _REQUEST_PARSERS.get(kind, _chat_request)(body)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            raise _BadRequest("batched prompts are not supported by the simulated host")
        input_len = _input_len(body, prompt)
        self._check_size(input_len, max_new)
        scheduler = sim.scheduler
        assert scheduler is not None
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        chan = _Channel()
        req = SimRequest(
            input_len=input_len,
            max_new_tokens=max_new,
            arrival_s=scheduler.sim_now(),
            is_warmup=body.get("sim_warmup") is True,
            sink=chan,
        )
        rid = str(body["rid"]) if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        t0 = time.monotonic()
        created = int(time.time())
        reply = _Reply(kind=kind, rid=rid, input_len=input_len, t0=t0, created=created, model=sim.served_name)
        scheduler.submit(req)
        if not stream:
            self._reply_whole(reply, chan)
            return
        self._reply_stream(reply, chan, req, include_usage)

    def _check_size(self, input_len: int, max_new: Any) -> None:
        """Refuse a request whose token count does not fit the context or the KV pool, as SGLang does."""
        sim = self.sim
        if not isinstance(max_new, int) or max_new < 1:
            raise _BadRequest(f"max_new_tokens must be a positive integer, got {max_new!r}")
        ctx = sim.context_len
        if input_len + max_new > ctx:
            raise _BadRequest(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {input_len + max_new} tokens: {input_len} tokens from the input "
                f"messages and {max_new} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit."
            )
        spec = sim.runtime
        assert spec is not None and sim.scheduler is not None
        if input_len + max_new > spec.max_total_num_tokens:
            raise _BadRequest(
                f"The request needs {input_len + max_new} tokens, more than the KV cache holds "
                f"({spec.max_total_num_tokens} tokens)."
            )

    def _reply_whole(self, reply: _Reply, chan: _Channel) -> None:
        """The non-streaming answer, once the request has finished."""
        kind, rid, input_len = reply.kind, reply.rid, reply.input_len
        generated = 0
        finished = False
        while not finished:
            n, finished = chan.get()
            generated += n
        text = _token_text(0, generated)
        if kind == "generate":
            self._json(
                200,
                {
                    "text": text,
                    "output_ids": list(range(1000, 1000 + generated)),
                    "meta_info": self._meta(rid, input_len, generated, True, time.monotonic() - reply.t0),
                },
            )
            return
        usage = {
            "prompt_tokens": input_len,
            "completion_tokens": generated,
            "total_tokens": input_len + generated,
            "prompt_tokens_details": None,
        }
        choice, obj = _whole_choice(kind, text)
        self._json(
            200,
            {
                "id": rid,
                "object": obj,
                "created": reply.created,
                "model": reply.model,
                "choices": [choice],
                "usage": usage,
            },
        )

    def _reply_stream(self, reply: _Reply, chan: _Channel, req: SimRequest, include_usage: bool) -> None:
        """Server-sent events, one per batch of new tokens; a client that goes away aborts the request."""
        kind = reply.kind
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        generated = 0
        finished = False
        try:
            while not finished:
                n, finished = chan.get()
                start = generated
                generated += n
                self._sse(self._stream_chunk(reply, start, n, generated, finished))
            if kind != "generate" and include_usage:
                obj = "text_completion" if kind == "completions" else "chat.completion.chunk"
                self._sse(
                    {
                        "id": reply.rid,
                        "object": obj,
                        "created": reply.created,
                        "model": reply.model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": reply.input_len,
                            "completion_tokens": generated,
                            "total_tokens": reply.input_len + generated,
                        },
                    }
                )
            self._sse(b"[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            if not finished:
                assert self.sim.scheduler is not None
                self.sim.scheduler.abort(req)
            self.close_connection = True

    def _stream_chunk(self, reply: _Reply, start: int, n: int, generated: int, finished: bool) -> dict[str, Any]:
        """One streamed event: tokens ``start`` .. ``start + n`` of ``generated`` so far."""
        if reply.kind == "generate":
            return {
                "text": _token_text(0, generated),
                "output_ids": list(range(1000, 1000 + generated)),
                "meta_info": self._meta(reply.rid, reply.input_len, generated, finished, time.monotonic() - reply.t0),
                "index": 0,
            }
        reason = "length" if finished else None
        if reply.kind == "completions":
            return {
                "id": reply.rid,
                "object": "text_completion",
                "created": reply.created,
                "model": reply.model,
                "choices": [
                    {
                        "index": 0,
                        "text": _token_text(start, n),
                        "logprobs": None,
                        "finish_reason": reason,
                        "matched_stop": None,
                    }
                ],
                "usage": None,
            }
        delta: dict[str, Any] = {"content": _token_text(start, n)}
        if start == 0:
            delta = {"role": "assistant", **delta}
        return {
            "id": reply.rid,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
            "usage": None,
        }

    @staticmethod
    def _meta(rid: str, prompt: int, generated: int, finished: bool, elapsed: float) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": generated} if finished else None,
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "cached_tokens": 0,
            "weight_version": "default",
        }
        if finished:
            meta["e2e_latency"] = elapsed
        return meta


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


# ---------------------------------------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------------------------------------


class SimServer:
    """One simulated SGLang server process (see the module docstring)."""

    def __init__(
        self,
        profile: SimProfile,
        launch: SimLaunch,
        *,
        speed: float,
        seed: int,
        state_dir: Path,
        ignore_sigterm: bool,
    ) -> None:
        self.profile = profile
        self.launch = launch
        self.speed = speed
        self.seed = seed
        self.state_dir = state_dir
        self.ignore_sigterm = ignore_sigterm
        self.v = launch.version_tuple
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid)
        self.log = SimLog(launch.tp_size, launch.log_level, launch.args.get("log_level_http"))
        self.ready = threading.Event()
        self.http_up = False
        self.plan: StartupPlan | None = None
        self.first_forward_failure: Failure | None = None
        self.runtime: RuntimeSpec | None = None
        self.scheduler: _Scheduler | None = None
        self.httpd: _HTTPServer | None = None
        self._state_lock = threading.Lock()
        self._publish_wanted = threading.Event()
        self._dying = threading.Lock()
        self._used_gib = 0.0
        self._transient_gib = 0.0
        self._util = 0
        self.gpus: list[int] = []
        self.others: dict[int, list[tuple[int, float]]] = {}
        self.context_len = profile.model.context_length
        self.served_name = launch.served_model_name or launch.model_path
        self.started_wall = time.time()

    # -- state ----------------------------------------------------------------------------------------------
    def _gpu_indices(self) -> list[int]:
        visible_env = self.launch.env.get("CUDA_VISIBLE_DEVICES")
        if visible_env is not None:
            visible = [int(x) for x in visible_env.split(",") if x.strip().isdigit()]
        else:
            visible = list(range(self.profile.host.gpu_count))
        visible = [g for g in visible if g < self.profile.host.gpu_count]
        base = int(self.launch.args.get("base_gpu_id") or 0)
        n = self.launch.tp_size * self.launch.dp_size
        return visible[base : base + n]

    def publish(self) -> None:
        """Write this process's GPU memory to the state directory now (start-up) or soon (serving)."""
        if self.scheduler is not None:
            self._publish_wanted.set()  # the scheduler thread must not wait for the file system
            return
        self._write_state()

    def _publisher(self) -> None:
        while True:
            self._publish_wanted.wait()
            self._publish_wanted.clear()
            self._write_state()

    def _write_state(self) -> None:
        if not self.gpus:
            return
        used = round((self._used_gib + self._transient_gib) * 1024)
        with self._state_lock:
            write_proc(
                self.state_dir,
                ProcEntry(
                    pid=self.pid,
                    start_time=self.start_time,
                    name=sys.executable,
                    kind="sglang-sim",
                    gpus=self.gpus,
                    used_mib={g: used for g in self.gpus},
                    util={g: self._util for g in self.gpus},
                    pgid=os.getpgid(0),
                ),
            )

    def set_used(self, gib: float) -> None:
        self._used_gib = gib
        self.publish()

    def set_util(self, percent: int) -> None:
        self._util = percent
        self.publish()

    def note_transient(self, batch: Batch, spec: RuntimeSpec) -> None:
        """The caching allocator keeps the largest working set it has seen: nvidia-smi shows it."""
        if batch.kind == "prefill":
            gib = spec.first_forward_gib + spec.prefill_gib(batch.new_tokens)
        elif not batch.graph:
            gib = spec.first_forward_gib + spec.eager_gib(max(n for n, _, _ in batch.decode_steps))
        else:
            gib = spec.first_forward_gib
        if gib > self._transient_gib + 1 / 1024:
            self._transient_gib = gib
            self.publish()

    def sleep_sim(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    # -- signals --------------------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if not self._dying.acquire(blocking=False):
            return
        if self.http_up:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn(f"Finished server process [{self.pid}]")
            if self.v >= (0, 5, 13):
                self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=False, pid={self.pid}")
            remove_proc(self.state_dir, self.pid)
            os._exit(0)
        remove_proc(self.state_dir, self.pid)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(self.pid, signum)

    # -- dying ----------------------------------------------------------------------------------------------
    def _oom_message(self, phase: str, detail: OomDetail, rank: int) -> str:
        """The traceback a rank logs after ``Scheduler hit an exception: `` for an OOM in ``phase``."""
        gpu = self.gpus[rank] if rank < len(self.gpus) else rank
        text = oom_text(detail, gpu=rank, others=self.others.get(gpu, []))
        arch = self.profile.model.architecture
        if phase != "cuda_graph":
            return _traceback(phase, arch, f"torch.OutOfMemoryError: {text}")
        runner = f"{_SG}/model_executor/cuda_graph_runner.py"
        inner = (
            "Traceback (most recent call last):\n"
            f'  File "{runner}", line 649, in __init__\n    self.capture()\n'
            f'  File "{runner}", line 741, in capture\n'
            "    ) = self.capture_one_batch_size(bs, forward, stream_idx)\n"
            f'  File "{runner}", line 880, in capture_one_batch_size\n    run_once()\n'
            f"torch.OutOfMemoryError: {text}"
        )
        outer = _traceback("cuda_graph", arch, texts.capture_failed_exception(self.v, text))
        return f"{inner}\n\nDuring handling of the above exception, another exception occurred:\n\n{outer}"

    def _die(self, messages: list[str], running: bool) -> None:
        """Log each rank's scheduler exception, the main process's SIGQUIT handling, then SIGKILL itself."""
        self._dying.acquire(blocking=False)
        for rank, message in enumerate(messages):
            self.log.line(f"Scheduler hit an exception: {message}", rank=rank, level="error")
        self.log.line(texts.sigquit_line(self.v, running=running), level="error")
        if self.v >= (0, 5, 13):
            self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=True, pid={self.pid}")
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.kill(self.pid, signal.SIGKILL)
        time.sleep(60)  # not reached: SIGKILL cannot be caught

    def _die_startup(self, failure: Failure) -> None:
        ranks = range(self.launch.tp_size)
        if failure.oom is not None and failure.stage != "prefill_graph":
            messages = [self._oom_message(failure.phase, failure.oom, r) for r in ranks]
        else:
            messages = [_traceback(failure.phase, self.profile.model.architecture, failure.message) for _ in ranks]
        self._die(messages, running=False)

    def _nccl_warn(self, plan: StartupPlan) -> None:
        """NCCL's own ``NCCL WARN`` line per rank, printed when ``NCCL_DEBUG`` asks for warnings."""
        if plan.nccl.warn and self.launch.env.get("NCCL_DEBUG", "").upper() in ("WARN", "INFO", "TRACE"):
            host = socket.gethostname()
            for rank in range(self.launch.tp_size):
                self.log.raw(f"{host}:{self.pid}:{self.pid} [{rank}] NCCL WARN {plan.nccl.warn}")

    def die_first_forward(self, failure: Failure) -> None:
        """The first forward (warm-up) dies of ``failure`` in the scheduler, e.g. NCCL's AllGather error."""
        assert self.plan is not None
        self._nccl_warn(self.plan)
        arch = self.profile.model.architecture
        self._die([_traceback("warmup", arch, failure.message) for _ in range(self.launch.tp_size)], running=True)

    def die_runtime(self, batch: Batch) -> None:
        assert batch.oom is not None
        self._die([self._oom_message(batch.phase, batch.oom, r) for r in range(self.launch.tp_size)], running=True)

    # -- start-up -------------------------------------------------------------------------------------------
    def run(self) -> int:
        self._install_signals()
        p, launch = self.profile, self.launch
        write_host(self.state_dir, HostState.from_spec(p.host, p.name))
        self.gpus = self._gpu_indices()
        self._note_others()
        other = [sum(gib for _, gib in self.others.get(g, [])) for g in self.gpus] or [0.0]
        plan = plan_startup(p, launch, other_used_gib=other, seed=self.seed)
        self.plan = plan
        fail = plan.failure
        r = plan.resolved
        assert r is not None
        self.context_len = r.context_len
        fail = self._start_init(plan, r, fail)
        self._start_weights(plan, fail)
        pool_used = self._start_kv_pool(plan, r, fail)
        self._start_decode_graphs(plan, fail, pool_used)
        self._start_prefill_graphs(plan, fail, pool_used)
        self._start_summary(plan, r, fail, pool_used)
        return self._serve(plan)

    def _note_others(self) -> None:
        """Record the memory other live simulated processes hold on this server's GPUs."""
        for entry in live_procs(self.state_dir):
            if entry.pid == self.pid:
                continue
            for g in self.gpus:
                if entry.used_mib.get(g, 0) > 0:
                    self.others.setdefault(g, []).append((entry.pid, entry.used_mib[g] / 1024))

    def _start_init(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None) -> Failure | None:
        """The server-args line, torch distributed / NCCL init; return the start-up failure (the device
        check can add one)."""
        launch, log, v, mem = self.launch, self.log, self.v, plan.memory
        log.line(f"servetune simulated host: figures are simulated, not measured (sim_speed={self.speed:g})")
        for w in launch.warnings:
            log.line(w, level="warning")
        log.line(_repr_args(v, r.server_args))
        if len(self.gpus) < launch.tp_size * launch.dp_size:
            fail = Failure(kind="error", phase="init", message="RuntimeError: CUDA error: invalid device ordinal")
        log.ranks("Init torch distributed begin.")
        self.sleep_sim(plan.durations.get("dist_init", 0.0))
        if fail is not None and fail.phase == "init":
            if fail.kind == "nccl_error":
                self._nccl_warn(plan)
            self._die_startup(fail)
        if plan.nccl.custom_allreduce_disabled_warning:
            log.ranks(
                "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
                "To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                level="warning",
            )
        self.set_used(plan.ctx_gib)
        log.ranks(texts.dist_init_end(v, plan.durations.get("dist_init", 0.0) / self.speed, plan.ctx_gib))
        assert mem.pre_load_avail_gib is not None and mem.weights_gib is not None
        if any(self.others.get(g) for g in self.gpus):
            mine = mem.pre_load_avail_gib
            log.ranks(
                f"The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                f"pre_model_load_memory={mine:.2f}, local_gpu_memory={mine:.2f}, "
                f"local_gpu_memory * 0.9={mine * 0.9:.2f}",
                level="warning",
            )
        return fail

    def _start_weights(self, plan: StartupPlan, fail: Failure | None) -> None:
        p, log, mem = self.profile, self.log, plan.memory
        assert mem.pre_load_avail_gib is not None and mem.weights_gib is not None
        log.ranks(f"Load weight begin. avail mem={mem.pre_load_avail_gib:.2f} GB")
        load_s = plan.durations.get("load_weights", 0.0)
        target = mem.weights_gib
        if fail is not None and fail.phase == "load_weights":
            assert fail.oom is not None
            load_s, target = fail.elapsed_s, fail.oom.allocated_gib
        steps = 8
        for i in range(1, steps + 1):
            self.sleep_sim(load_s / steps)
            self.set_used(plan.ctx_gib + target * i / steps)
        if fail is not None and fail.phase == "load_weights":
            self._die_startup(fail)
        assert mem.avail_after_weights_gib is not None
        log.ranks(
            texts.load_weight_end(
                self.v,
                elapsed_s=load_s / self.speed,
                arch=p.model.architecture,
                dtype=p.model.dtype,
                avail_gib=mem.avail_after_weights_gib,
                usage_gib=mem.weights_gib,
            )
        )

    def _start_kv_pool(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None) -> float:
        """The KV pool's lines; return the GiB in use once the memory pool is set up."""
        p, log, mem = self.profile, self.log, plan.memory
        self.sleep_sim(plan.durations.get("kv_pool", 0.0))
        if fail is not None and fail.phase == "kv_pool":
            self._die_startup(fail)
        assert mem.kv_tokens is not None and mem.kv_gib is not None and mem.free_after_pool_gib is not None
        assert mem.weights_gib is not None and mem.avail_after_weights_gib is not None
        for w in plan.warnings:
            log.line(w, rank=0, level="warning")
        if p.model.kv_pool == "deepseek_v4":
            assert mem.max_running_requests is not None
            log.ranks(texts.dsv4_pool_line(max_num_reqs=mem.max_running_requests, tokens=mem.kv_tokens))
        else:
            log.ranks(
                texts.kv_allocated(
                    self.v,
                    tokens=mem.kv_tokens,
                    kv_gib=mem.kv_gib,
                    mla=p.model.attention == "mla",
                    dtype=r.kv_torch_dtype,
                )
            )
        pool_used = plan.ctx_gib + mem.weights_gib + (mem.avail_after_weights_gib - mem.free_after_pool_gib)
        self.set_used(pool_used)
        log.ranks(f"Memory pool end. avail mem={mem.free_after_pool_gib:.2f} GB")
        return pool_used

    def _start_decode_graphs(self, plan: StartupPlan, fail: Failure | None, pool_used: float) -> None:
        log, v, mem = self.log, self.v, plan.memory
        assert mem.free_after_pool_gib is not None
        capture = mem.capture_bs or []
        decode_fail = fail is not None and fail.phase == "cuda_graph" and fail.stage != "prefill_graph"
        if not (capture or decode_fail):
            return
        log.ranks(texts.capture_begin(v, avail_gib=mem.free_after_pool_gib, bs=capture))
        if fail is not None and decode_fail:
            self.sleep_sim(fail.elapsed_s)
            if fail.oom is not None:
                self.set_used(pool_used + fail.oom.private_pool_gib + self.profile.memory.graph_workspace_gib)
            self._nccl_warn(plan)
            self._die_startup(fail)
        self.sleep_sim(plan.durations.get("cuda_graph", 0.0))
        assert mem.graph_gib is not None
        decode_gib = mem.graph_gib - (mem.prefill_graph_gib or 0.0)
        log.ranks(
            texts.capture_end(
                v,
                elapsed_s=plan.durations.get("cuda_graph", 0.0) / self.speed,
                usage_gib=decode_gib,
                avail_gib=mem.free_after_pool_gib - decode_gib,
                bs=capture,
            )
        )

    def _start_prefill_graphs(self, plan: StartupPlan, fail: Failure | None, pool_used: float) -> None:
        log, v, mem = self.log, self.v, plan.memory
        ptokens = mem.prefill_graph_tokens or []
        if not ptokens:
            return
        assert mem.graph_gib is not None and mem.free_after_pool_gib is not None
        decode_gib = mem.graph_gib - (mem.prefill_graph_gib or 0.0)
        before = mem.free_after_pool_gib - decode_gib
        log.ranks(texts.prefill_capture_begin(v, avail_gib=before, tokens=ptokens))
        if fail is not None and fail.stage == "prefill_graph":
            self.sleep_sim(fail.elapsed_s)
            self.set_used(pool_used + mem.graph_gib)
            if v < (0, 5, 14):
                log.ranks(f"Piecewise CUDA Graph failed with error: {fail.message.splitlines()[0]}", level="error")
            self._die_startup(fail)
        self.sleep_sim(plan.durations.get("prefill_graph", 0.0))
        log.ranks(
            texts.prefill_capture_end(
                v,
                elapsed_s=plan.durations.get("prefill_graph", 0.0) / self.speed,
                usage_gib=mem.prefill_graph_gib or 0.0,
                avail_gib=before - (mem.prefill_graph_gib or 0.0),
            )
        )

    def _start_summary(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None, pool_used: float) -> None:
        mem = plan.memory
        if fail is not None and fail.phase == "warmup":
            self.first_forward_failure = fail  # the warm-up request's first forward dies (scheduler)
        assert mem.graph_gib is not None and mem.free_after_capture_gib is not None
        self.set_used(pool_used + mem.graph_gib)
        assert mem.max_total_num_tokens is not None and mem.max_running_requests is not None
        self.log.line(
            texts.pool_summary(
                tokens=mem.max_total_num_tokens,
                chunked=r.chunked_prefill_size,
                max_prefill=r.max_prefill_tokens,
                max_running=mem.max_running_requests,
                context_len=r.context_len,
                avail_gib=mem.free_after_capture_gib,
            ),
            rank=0,
        )

    def _serve(self, plan: StartupPlan) -> int:
        """Bind the HTTP port, start the scheduler and warm-up, then wait; 1 when the port cannot be bound."""
        launch, log = self.launch, self.log
        self.runtime = plan.runtime
        assert self.runtime is not None
        self.sleep_sim(plan.durations.get("server_start", 0.0))
        handler = type("SimHandler", (_Handler,), {"sim": self})
        server_cls = _HTTPServer6 if ":" in launch.host else _HTTPServer
        try:
            self.httpd = server_cls((launch.host, launch.port), handler)
        except OSError as exc:
            log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"({launch.host!r}, {launch.port}): {(exc.strerror or str(exc)).lower()}",
                level="ERROR",
            )
            remove_proc(self.state_dir, self.pid)
            return 1
        threading.Thread(target=self._publisher, name="sim-state", daemon=True).start()
        self.scheduler = _Scheduler(self, self.runtime)
        self.scheduler.start()
        log.uvicorn(f"Started server process [{self.pid}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        shown_host = f"[{launch.host}]" if ":" in launch.host else launch.host
        log.uvicorn(f"Uvicorn running on http://{shown_host}:{launch.port} (Press CTRL+C to quit)")
        self.http_up = True
        threading.Thread(target=self.httpd.serve_forever, name="sim-http", daemon=True).start()
        if launch.skip_server_warmup:
            self._ready()
        else:
            threading.Thread(target=self._warmup, name="sim-warmup", daemon=True).start()
        while True:
            time.sleep(1.0)

    def _ready(self) -> None:
        self.ready.set()
        self.log.line("The server is fired up and ready to roll!")

    def _warmup(self) -> None:
        host = self.launch.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        info_path = "/model_info" if self.v >= (0, 5, 10) else "/get_model_info"
        plan = self.plan
        assert plan is not None
        try:
            conn = http.client.HTTPConnection(host, self.launch.port, timeout=600)
            conn.request("GET", info_path)
            conn.getresponse().read()
            self.sleep_sim(plan.durations.get("warmup", 0.0))
            body = json.dumps(
                {
                    "text": WARMUP_PROMPT,
                    "sampling_params": {"temperature": 0, "max_new_tokens": WARMUP_MAX_NEW_TOKENS},
                    "sim_warmup": True,
                }
            )
            conn.request("POST", "/generate", body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status != 200:
                raise RuntimeError(f"warm-up /generate returned {resp.status}")
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            self.log.line(f"Initialization failed. warmup error: {exc}", level="error")
            if self.v >= (0, 5, 13):
                self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=True, pid={self.pid}")
            os.kill(self.pid, signal.SIGKILL)
            return
        self._ready()

    # -- endpoint payloads ----------------------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        plan = self.plan
        assert plan is not None and plan.resolved is not None and self.runtime is not None
        mem = plan.memory
        sched = self.scheduler
        eng = sched.engine if sched else None
        state: dict[str, Any] = {
            "last_gen_throughput": sched.last_gen_throughput if sched else 0.0,
            "memory_usage": {
                "weight": round(mem.weights_gib or 0.0, 2),
                "kvcache": round(mem.kv_gib or 0.0, 2),
                "token_capacity": mem.max_total_num_tokens,
                "graph": round(mem.graph_gib or 0.0, 2),
            },
            "load": (len(eng.running) + len(eng.waiting)) if eng else 0,
        }
        if self.v >= (0, 5, 10):
            state["effective_max_running_requests_per_dp"] = mem.max_running_requests
        tokens = mem.max_total_num_tokens or 0
        return {
            **plan.resolved.server_args,
            "max_total_num_tokens": tokens,
            "max_req_input_len": max(min(self.context_len - 1, tokens - 1), 0),
            "internal_states": [state],
            "version": self.launch.version,
            "simulated": True,
            "sim_speed": self.speed,
            "sim": {
                "profile": self.profile.name,
                "seed": self.seed,
                "gpus": self.gpus,
                "capture_bs": mem.capture_bs,
                "max_running_requests": mem.max_running_requests,
                "free_after_capture_gib": mem.free_after_capture_gib,
                "noise_factor": plan.noise_factor,
                "nccl": plan.nccl.model_dump(exclude={"warn"}),
                "startup_durations_s": plan.durations,
                "started_at": self.started_wall,
            },
        }

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_path": self.launch.model_path,
            "tokenizer_path": self.launch.args.get("tokenizer_path") or self.launch.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
        if self.v >= (0, 5, 10):
            info.update(
                {
                    "has_image_understanding": False,
                    "has_audio_understanding": False,
                    "model_type": self.profile.model.architecture.lower(),
                    "architectures": [self.profile.model.architecture],
                }
            )
        return info

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.served_name,
                    "object": "model",
                    "created": int(self.started_wall),
                    "owned_by": "sglang",
                    "root": self.served_name,
                    "max_model_len": self.context_len,
                }
            ],
        }

    def metrics(self) -> str:
        sched = self.scheduler
        eng = sched.engine if sched else None
        labels = f'engine_type="unified",model_name="{self.served_name}",tp_rank="0"'
        rows = [
            ("sglang:num_running_reqs", "The number of running requests.", len(eng.running) if eng else 0),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                len(eng.waiting) if eng else 0,
            ),
            ("sglang:num_used_tokens", "The number of used tokens.", eng.used_tokens if eng else 0),
            ("sglang:token_usage", "The token usage.", eng.token_usage if eng else 0.0),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                sched.last_gen_throughput if sched else 0.0,
            ),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                self.runtime.max_total_num_tokens if self.runtime else 0,
            ),
        ]
        out = []
        for name, help_text, value in rows:
            out += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} gauge",
                f"{name}{{{labels}}} {float(value)}",
            ]
        gen = eng.tokens_generated if eng else 0
        out += [
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{model_name="{self.served_name}"}} {float(gen)}',
        ]
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-version", default=None)
    known, _ = pre.parse_known_args(args)
    try:
        version = emulated_version(known.sim_version, env)
    except ValueError as exc:
        sys.stderr.write(f"servetune simhost: {exc}\n")
        return 2
    ns = build_parser(version, sim_flags=True).parse_args(args)
    speed = ns.sim_speed if ns.sim_speed is not None else float(env.get("SERVETUNE_SIM_SPEED") or 1.0)
    if not speed > 0:
        sys.stderr.write(f"servetune simhost: --sim-speed must be > 0, got {speed}\n")
        return 2
    ignore = bool(ns.sim_ignore_sigterm) or env.get("SERVETUNE_SIM_IGNORE_SIGTERM", "") in (
        "1",
        "true",
        "yes",
    )
    seed = ns.sim_seed if ns.sim_seed is not None else random.SystemRandom().randrange(1 << 31)
    state_dir = default_state_dir(env, explicit=ns.sim_state_dir)
    try:
        profile = load_profile(ns.sim_profile)
    except ProfileError as exc:
        sys.stderr.write(f"servetune simhost: {exc}\n")
        return 1
    try:
        launch = SimLaunch.from_namespace(ns, env, version)
    except BadFlag as exc:
        sys.stderr.write(exc.text)
        return exc.exit_code
    server = SimServer(profile, launch, speed=speed, seed=seed, state_dir=state_dir, ignore_sigterm=ignore)
    return server.run()


if __name__ == "__main__":
    raise SystemExit(main())
