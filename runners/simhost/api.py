"""The simulated server's HTTP API, as SGLang serves it: ``/health`` (503 until warm-up is done),
``/get_server_info`` and ``/server_info``, ``/get_model_info`` and ``/model_info``, ``/v1/models``, ``/generate``,
``/v1/completions``, ``/v1/chat/completions`` (streaming as SSE ``data: {...}`` ending ``data: [DONE]``),
``/metrics`` with ``--enable-metrics``, ``/flush_cache``; request sizes checked as SGLang checks them.

Prompt length is ``sim_input_len`` if the body has it, else the length of ``input_ids`` (or of a token-id
``prompt``), else one token per 4 characters of text. Generation always runs to ``max_new_tokens``
(``max_tokens``), as with ``ignore_eos``.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from runners.simhost.engine import RuntimeSpec, SimRequest
from runners.simhost.launch import SimLaunch
from runners.simhost.model import approx_tokens
from runners.simhost.numerics import Numerics, answer
from runners.simhost.scheduler import LevelHint, Scheduler, TokenChannel
from runners.simhost.simlog import SimLog

_WORDS = ("the", "of", "and", "a", "to", "in", "is", "that", "it", "was", "for", "on", "are", "as", "with")


class Served(Protocol):
    """What the HTTP API needs of the server it answers for (:class:`runners.simhost.server.SimServer`)."""

    @property
    def log(self) -> SimLog: ...
    @property
    def v(self) -> tuple[int, int, int]: ...
    @property
    def launch(self) -> SimLaunch: ...
    @property
    def ready(self) -> threading.Event: ...
    @property
    def scheduler(self) -> Scheduler | None: ...
    @property
    def runtime(self) -> RuntimeSpec | None: ...
    @property
    def served_name(self) -> str: ...
    @property
    def context_len(self) -> int: ...
    @property
    def numerics(self) -> Numerics: ...

    def server_info(self) -> dict[str, Any]: ...
    def model_info(self) -> dict[str, Any]: ...
    def models(self) -> dict[str, Any]: ...
    def metrics(self) -> str: ...


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
    prompt: str = ""
    logprobs: bool = False
    """A ``/v1/completions`` request that asked for ``logprobs``: each token's comes back (OpenAI's shape)."""


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
    sim: Served  # set on the subclass http_server builds

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
        chan = TokenChannel()
        req = SimRequest(
            input_len=input_len,
            max_new_tokens=max_new,
            is_warmup=body.get("sim_warmup") is True,
            sink=chan,
        )
        rid = str(body["rid"]) if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        t0 = time.monotonic()
        created = int(time.time())
        reply = _Reply(kind=kind, rid=rid, input_len=input_len, t0=t0, created=created, model=sim.served_name,
                       prompt=prompt if isinstance(prompt, str) else " ".join(map(str, prompt)),
                       logprobs=kind == "completions" and body.get("logprobs") not in (None, False, 0))
        scheduler.submit(req, LevelHint.from_body(body))
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

    def _reply_whole(self, reply: _Reply, chan: TokenChannel) -> None:
        """The non-streaming answer, once the request has finished."""
        kind, rid, input_len = reply.kind, reply.rid, reply.input_len
        generated = 0
        finished = False
        while not finished:
            n, finished, _ = chan.get()
            generated += n
        text = _token_text(0, generated)
        said = answer(reply.prompt, generated, self.sim.numerics) if kind == "completions" else None
        if said is not None:
            text = said.text
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
        if said is not None and reply.logprobs:
            choice["logprobs"] = {"tokens": said.tokens, "token_logprobs": said.logprobs,
                                  "top_logprobs": [{t: lp} for t, lp in zip(said.tokens, said.logprobs, strict=True)],
                                  "text_offset": [sum(len(t) for t in said.tokens[:i]) for i in range(generated)]}
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

    def _reply_stream(self, reply: _Reply, chan: TokenChannel, req: SimRequest, include_usage: bool) -> None:
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
                n, finished, sim_t = chan.get()
                start = generated
                generated += n
                chunk = self._stream_chunk(reply, start, n, generated, finished)
                # The simulated clock's time of these tokens and of the request's arrival (see
                # runners/simhost/scheduler.py): a client reading them measures the model, not this machine.
                sim_times = {"sim_time_s": sim_t, "sim_arrival_s": req.arrival_s}
                if kind == "generate":
                    chunk["meta_info"].update(sim_times)
                else:
                    chunk.update(sim_times)
                self._sse(chunk)
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



def http_server(served: Served) -> http.server.ThreadingHTTPServer:
    """A server bound to ``--host``/``--port`` that answers for ``served`` (OSError when it cannot bind)."""
    launch = served.launch
    handler = type("SimHandler", (_Handler,), {"sim": served})
    server_cls = _HTTPServer6 if ":" in launch.host else _HTTPServer
    return server_cls((launch.host, launch.port), handler)


class _DummyHealth(http.server.BaseHTTPRequestHandler):
    """SGLang's health check on ranks >= 1 of a multi-node server (``launch_dummy_health_check_server``):
    ``/health`` and ``/health_generate`` answer 200, ``/ping`` too from 0.5.5, anything else 404."""

    paths: tuple[str, ...] = ("/health", "/health_generate")
    server_version = "uvicorn"

    def do_GET(self) -> None:
        status = 200 if self.path.split("?")[0] in self.paths else 404
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # uvicorn at log_level="warning" logs no access lines


def dummy_health_server(host: str, port: int, *, ping: bool) -> http.server.ThreadingHTTPServer:
    """The health-check server a rank >= 1 binds on ``--host``/``--port`` (OSError when it cannot bind)."""
    paths = ("/health", "/health_generate", *(("/ping",) if ping else ()))
    handler = type("DummyHealth", (_DummyHealth,), {"paths": paths})
    server_cls = _HTTPServer6 if ":" in host else _HTTPServer
    return server_cls((host, port), handler)
