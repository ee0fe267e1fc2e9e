#!/usr/bin/env python3
"""servetune's load generator: a concurrency sweep of streaming requests against one server.

Standalone on purpose: standard library only, Python 3.8+, no servetune imports. servetune copies this file
to the GPU host and runs it there with the host's python, next to the server, so network latency between
servetune and the host never enters the figures::

    python loadgen.py --base-url http://127.0.0.1:30000 --api sglang --model NAME \\
        --levels 1,16,64 --requests 4,32,128 --input-len 256 --output-len 128 --warmup 1 \\
        --timeout 600 --vocab-size 400 --seed 1 [--out results.jsonl] [--time-scale auto|FLOAT]
        [--random-range-ratio R] [--dataset sharegpt.json] [--prefix-len N --prefix-groups G]
        [--request-rate R [--burstiness B]]

For each level it sends exactly ``requests`` streaming requests with at most ``level`` in flight
(``ignore_eos``), then prints one JSON line named like ``sglang.bench_serving``'s result
(``max_concurrency``, ``output_throughput``, ``p99_ttft_ms``, ...) plus ``failed``, ``errors``, ``simulated``,
``time_scale`` and ``seed``, and appends it to ``--out``. Warm-up requests run before the sweep and are not
counted.

Workloads (``dataset_name`` in the record):

* ``random``: random token ids; lengths drawn from ``[max(int(len * R), 1), len]`` as bench_serving's
  ``--random-range-ratio`` (R = 1.0, the default here, means fixed lengths);
* ``sharegpt``: ``--dataset`` names a local file in the ShareGPT JSON shape (a list of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}``). There is no
  tokenizer on the host, so a word is one token: the prompt's words become token ids by a stable hash and the
  reply's word count is the output length. Pairs are kept as bench_serving keeps them (both at least 4
  tokens, prompt at most 1024, prompt + reply at most 2048), shuffled by the seed;
* ``generated-shared-prefix``: ``--prefix-groups`` system prompts of ``--prefix-len`` tokens; each request
  starts with one of them (round robin), followed by its own random question.

Arrivals: closed loop by default (the next request leaves when one finishes). ``--request-rate`` makes the
loop open: requests arrive as a Poisson process at that rate (or gamma-distributed gaps with
``--burstiness``, as vLLM's bench), still with at most ``level`` in flight, like bench_serving's
``--request-rate`` with ``--max-concurrency``. The schedule depends only on the seed. A burst is a level whose
request count equals its concurrency: every request leaves at once.

Clock: on a simulated host that publishes its own clock (``sim_clock`` in ``/get_server_info``), every time
is the server's simulated time read from the stream (``sim_time_s``, ``sim_arrival_s``), and each request
declares its level (``sim_level``, its request count and concurrency, the simulated time its slot was freed,
an open loop's planned offset) so the server runs exactly the batches the arrivals call for. The figures then
do not depend on how busy this machine is; the record says ``clock: simulated``. Elsewhere times are this
machine's wall clock (times ``time_scale`` for an older simulated host) and the record says ``clock: wall``.

Early look (``--early-look N --stop-file NAME``, closed loop only): once the first level's first ``N`` requests
have finished, a record of that moment is printed with ``"partial": true``: its ``output_throughput`` counts every
token streamed so far (finished requests or not) over the time so far, the rest is the finished requests'. The
caller decides; if it then creates ``NAME`` (in the working directory) while the level still runs, the level
takes no more requests, the partial figures are printed again as the level's record with ``"stopped_early":
true``, and the sweep ends there (exit 4) without waiting for the requests in flight.

Exit codes: 0 done; 2 bad arguments; 3 every request of a level failed (the server is gone): that level's
record is printed and the sweep stops; 4 stopped after the early look (``--stop-file``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import queue
import random
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

EXIT_OK = 0
EXIT_BAD_ARGS = 2
EXIT_LEVEL_FAILED = 3
EXIT_STOPPED = 4
#: A request's error when the server reported more tokens than it was asked for: more output tokens than
#: ``max_tokens`` (with ``ignore_eos`` a server gives exactly that many), or a prompt longer than the ids sent
#: (a BOS token or a chat template adds a few). Beyond :data:`TOKEN_SLACK` (a share, plus
#: :data:`TOKEN_SLACK_ABS` tokens) the figure is a lie, and the request does not count as completed.
IMPLAUSIBLE = "implausible token count"
TOKEN_SLACK = 0.05
TOKEN_SLACK_ABS = 8

MAX_ERRORS = 5

RECORD_KEYS = (
    "backend", "max_concurrency", "num_prompts", "random_input_len", "random_output_len",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
    "concurrency", "errors", "simulated", "time_scale", "clock",
    "dataset_name", "random_range_ratio", "request_rate", "burstiness", "seed",
)
"""Keys of one level's record, in order."""



# ---- the HTTP APIs -----------------------------------------------------------------------------------


class BenchApi:
    """One HTTP API the load generator speaks: the streaming request it sends, and what a streamed chunk
    says (tokens, usage, finish reason). :data:`APIS` names each by its ``--api`` value."""

    name = ""
    path = ""

    def body(self, model: str, prompt: list[int], output_len: int) -> dict[str, Any]:
        raise NotImplementedError

    def finish_reason(self, chunk: dict[str, Any]) -> Any:
        """The finish reason a chunk reports, or None (still streaming)."""
        raise NotImplementedError

    def read_chunk(self, chunk: dict[str, Any], reported: int | None) -> tuple[int, bool, int | None, int | None]:
        """(tokens this chunk carries, whether that count is exact, cumulative completion tokens if reported,
        prompt tokens if reported)."""
        raise NotImplementedError


class SGLangApi(BenchApi):
    """SGLang's native ``POST /generate``: chunks carry ``meta_info`` with exact token counts."""

    name = "sglang"
    path = "/generate"

    def body(self, model: str, prompt: list[int], output_len: int) -> dict[str, Any]:
        return {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }

    def finish_reason(self, chunk: dict[str, Any]) -> Any:
        meta = chunk.get("meta_info")
        return (meta.get("finish_reason") if isinstance(meta, dict) else None) or None

    def read_chunk(self, chunk: dict[str, Any], reported: int | None) -> tuple[int, bool, int | None, int | None]:
        meta = chunk.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        completion = meta.get("completion_tokens")
        prompt_tokens = meta.get("prompt_tokens")
        prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) else None
        if isinstance(completion, int) and not isinstance(completion, bool):
            return completion - (reported or 0), True, completion, prompt_tokens
        carries = bool(chunk.get("text")) or bool(chunk.get("output_ids"))
        return (1 if carries else 0), False, None, prompt_tokens


class OpenAIApi(BenchApi):
    """The OpenAI-compatible ``POST /v1/completions`` (vLLM; SGLang serves it too), usage in the last chunk."""

    name = "openai"
    path = "/v1/completions"

    def body(self, model: str, prompt: list[int], output_len: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model:
            body["model"] = model
        return body

    def finish_reason(self, chunk: dict[str, Any]) -> Any:
        choices = chunk.get("choices")
        reason = choices[0].get("finish_reason") if isinstance(choices, list) and choices and \
            isinstance(choices[0], dict) else None
        return reason or None

    def read_chunk(self, chunk: dict[str, Any], reported: int | None) -> tuple[int, bool, int | None, int | None]:
        usage = chunk.get("usage")
        completion = prompt_tokens = None
        if isinstance(usage, dict):
            c, p = usage.get("completion_tokens"), usage.get("prompt_tokens")
            completion = c if isinstance(c, int) else None
            prompt_tokens = p if isinstance(p, int) else None
        choices = chunk.get("choices")
        # OpenAI chunks do not say how many tokens they carry (vLLM may coalesce); the usage chunk does. A chunk
        # with a choice counts as an arrival even when its text is empty, as vLLM's bench counts it: tokens
        # that decode to part of a character arrive with no text, and a reply made only of them is still one.
        has_choice = isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)
        return (1 if has_choice else 0), False, completion, prompt_tokens


APIS: dict[str, BenchApi] = {api.name: api for api in (SGLangApi(), OpenAIApi())}
"""The APIs by ``--api`` name."""


# ---- one request -----------------------------------------------------------------------------------


class RequestResult:
    """One streamed request. Times in seconds: the wall clock of this machine, or the server's simulated
    clock when ``sim_arrival`` is set (then ``sim_end`` is the simulated time of its last chunk)."""

    __slots__ = ("e2e", "error", "input_tokens", "itl", "ok", "output_tokens", "sim_arrival", "sim_end", "ttft")

    def __init__(self) -> None:
        self.ok = False
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.e2e = 0.0
        self.output_tokens = 0
        self.input_tokens = 0
        self.error = ""
        self.sim_arrival: float | None = None
        self.sim_end: float | None = None


def _sim_times(chunk: dict[str, Any]) -> tuple[float, float] | None:
    """(simulated time of the chunk, of the request's arrival) a simulated host put in a chunk, or None."""
    meta = chunk.get("meta_info")
    src = meta if isinstance(meta, dict) and "sim_time_s" in meta else chunk
    t, arrival = src.get("sim_time_s"), src.get("sim_arrival_s")
    if isinstance(t, (int, float)) and isinstance(arrival, (int, float)) and \
            not isinstance(t, bool) and not isinstance(arrival, bool):
        return float(t), float(arrival)
    return None


class Target:
    """Where the server listens: ``http(s)://host:port[/prefix]``."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must look like http://HOST:PORT, got {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class Progress:
    """Output tokens streamed so far in one level by every request, finished or not, and when: the early look's
    throughput (a level's finished requests alone undercount it while many are in flight)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.start = time.perf_counter()
        self.tokens = 0
        self.wall_only = False
        self.first_arrival: float | None = None
        self.last_sim: float | None = None

    def add(self, tokens: int, times: tuple[float, float] | None) -> None:
        """``tokens`` more arrived, at ``times`` (simulated time of the chunk, of its request's arrival) or None."""
        with self._lock:
            self.tokens += tokens
            if times is None:
                self.wall_only = True
                return
            self.last_sim = times[0] if self.last_sim is None else max(self.last_sim, times[0])
            self.first_arrival = times[1] if self.first_arrival is None else min(self.first_arrival, times[1])

    @staticmethod
    def note(progress: Progress | None, tokens: int, times: tuple[float, float] | None) -> None:
        """Tell ``progress`` (if any) of ``tokens``."""
        if progress is not None:
            progress.add(tokens, times)

    def rate(self, time_scale: float) -> float:
        """Output tokens per second so far: on the server's simulated clock when every chunk carried it."""
        with self._lock:
            if not self.wall_only and self.last_sim is not None and self.first_arrival is not None:
                seconds = self.last_sim - self.first_arrival
            else:
                seconds = (time.perf_counter() - self.start) * time_scale
            return self.tokens / seconds if seconds > 0 else 0.0


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _StreamEnded(Exception):
    """The stream failed mid-way; the message is the request's error."""


def _chunks(resp: http.client.HTTPResponse, deadline: float, timeout: float) -> Iterator[tuple[float, dict[str, Any]]]:
    """``(arrival time, JSON chunk)`` for each server-sent event up to ``[DONE]``. Raises _StreamEnded on a
    timeout or an error event."""
    while True:
        raw = resp.readline()
        if not raw:
            return
        now = time.perf_counter()
        if now > deadline:
            raise _StreamEnded(f"timeout after {timeout:g}s")
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise _StreamEnded(f"server error: {msg}"[:300])
        yield now, chunk


def stream_request(target: Target, api: BenchApi, model: str, prompt: list[int], output_len: int,
                   timeout: float, hint: dict[str, Any] | None = None,
                   progress: Progress | None = None) -> RequestResult:
    """Send one streaming request and time it. Never raises: a failure is ``ok=False`` with ``error``.

    ``hint``: the simulated host's level fields to add to the body (see the module doc); when every chunk
    carries the server's simulated times the result's times are those. ``progress``: told of every token."""
    result = RequestResult()
    result.input_tokens = len(prompt)
    start = time.perf_counter()
    last_token_at = start
    chunk_tokens = 0
    reported_tokens: int | None = None
    finish_reason: Any = None
    sim: list[tuple[float, int, bool]] = []  # (simulated time, tokens, exact) per chunk with tokens
    sim_ok = hint is not None
    conn = target.connect(timeout)
    try:
        body = dict(api.body(model, prompt, output_len), **(hint or {}))
        conn.request("POST", target.prefix + api.path, body=json.dumps(body).encode("utf-8"),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace").strip()
            result.error = f"HTTP {resp.status}: {detail}"[:300]
            return result
        for now, chunk in _chunks(resp, start + timeout, timeout):
            finish_reason = api.finish_reason(chunk) or finish_reason
            new_tokens, exact, completion, prompt_tokens = api.read_chunk(chunk, reported_tokens)
            if prompt_tokens is not None:
                result.input_tokens = prompt_tokens
            if completion is not None:
                reported_tokens = completion
            times = _sim_times(chunk) if sim_ok else None
            if times is not None:
                result.sim_arrival, result.sim_end = times[1], times[0]
            if new_tokens <= 0:
                continue
            Progress.note(progress, new_tokens, times)
            if times is None:
                sim_ok = False
            else:
                sim.append((times[0], new_tokens, exact))
            if result.ttft is None:
                result.ttft = now - start
            else:
                gap = now - last_token_at
                # SGLang says how many tokens a chunk carries: spread the gap like bench_serving does.
                result.itl.extend([gap / new_tokens] * new_tokens if exact else [gap])
            last_token_at = now
            chunk_tokens += new_tokens
    except _StreamEnded as exc:
        result.error = str(exc)
        return result
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result.error = _error_text(exc)[:300]
        return result
    finally:
        conn.close()
    result.e2e = time.perf_counter() - start
    result.output_tokens = reported_tokens if reported_tokens is not None else chunk_tokens
    if sim_ok and sim and result.sim_arrival is not None:
        _on_sim_clock(result, sim)
    else:
        result.sim_arrival = result.sim_end = None
    return _completed(result, finish_reason, output_len, len(prompt))


def _implausible(reported: int, asked: int, what: str) -> str:
    """The error line when ``reported`` tokens exceed the ``asked`` ones beyond the slack, else ""."""
    if reported <= asked * (1 + TOKEN_SLACK) + TOKEN_SLACK_ABS:
        return ""
    return (f"{IMPLAUSIBLE}: the server reported {reported} {what} tokens for {asked} sent or asked (allowed: "
            f"{TOKEN_SLACK:.0%} + {TOKEN_SLACK_ABS} more)")


def _on_sim_clock(result: RequestResult, sim: list[tuple[float, int, bool]]) -> None:
    """Replace a result's wall-clock times by the server's simulated ones (chunks: time, tokens, exact)."""
    arrival = result.sim_arrival or 0.0
    result.ttft = sim[0][0] - arrival
    result.itl = []
    for i in range(1, len(sim)):  # Python 3.8: no itertools.pairwise
        now, n, exact = sim[i]
        gap = now - sim[i - 1][0]
        result.itl.extend([gap / n] * n if exact else [gap])
    result.sim_end = sim[-1][0]
    result.e2e = result.sim_end - arrival


def _completed(result: RequestResult, finish_reason: Any, asked: int, sent: int) -> RequestResult:
    """``result`` marked ok, or with the error that says why a stream that ended is not a completed request
    (``asked``: the output tokens asked for; ``sent``: the prompt's tokens)."""
    lie = _implausible(result.output_tokens, asked, "output") or _implausible(result.input_tokens, sent, "prompt")
    if lie:
        result.error = lie
        return result
    if result.ttft is None or result.output_tokens <= 0:
        result.error = "no tokens in the response stream"
        return result
    if finish_reason is None:
        # A stream cut short (the server died, or aborted the request) ends without a finish reason;
        # vLLM even sends [DONE] after an abort. Its tokens are not a completed request.
        result.error = f"stream ended after {result.output_tokens} tokens without a finish reason"
        return result
    result.ok = True
    return result


# ---- statistics ------------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    k = (len(ordered) - 1) * pct / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _stats(record: dict[str, Any], name: str, seconds: list[float]) -> None:
    if seconds:
        record["mean_" + name] = round(sum(seconds) / len(seconds) * 1000.0, 4)
        record["median_" + name] = round(percentile(seconds, 50) * 1000.0, 4)
        record["p99_" + name] = round(percentile(seconds, 99) * 1000.0, 4)
    else:
        record["mean_" + name] = record["median_" + name] = record["p99_" + name] = None


def sim_duration(results: list[RequestResult]) -> float | None:
    """A level's duration on the server's simulated clock (first arrival to last chunk), or None when a
    completed request was not timed on it."""
    ok = [r for r in results if r.ok]
    if not ok or any(r.sim_arrival is None or r.sim_end is None for r in ok):
        return None
    timed = [r for r in results if r.sim_arrival is not None and r.sim_end is not None]
    return max(r.sim_end or 0.0 for r in timed) - min(r.sim_arrival or 0.0 for r in timed)


def summarize(results: list[RequestResult], duration: float, *, level: int, api: str, input_len: int,
              output_len: int, time_scale: float = 1.0, simulated: bool = False,
              meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One level's record from its requests: on the server's simulated clock when every completed request
    was timed on it, else on the wall clock with every time multiplied by ``time_scale``."""
    ok = [r for r in results if r.ok]
    on_sim = sim_duration(results)
    clock = "simulated" if on_sim is not None else "wall"
    duration = on_sim if on_sim is not None else duration * time_scale
    scale = 1.0 if on_sim is not None else time_scale
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    errors: list[str] = []
    for r in results:
        if not r.ok and r.error and r.error not in errors and len(errors) < MAX_ERRORS:
            errors.append(r.error)
    record: dict[str, Any] = {
        "backend": api,
        "max_concurrency": level,
        "num_prompts": len(results),
        "random_input_len": input_len,
        "random_output_len": output_len,
        "duration": round(duration, 6),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
    }
    per_s = 1.0 / duration if duration > 0 else 0.0
    record["request_throughput"] = round(len(ok) * per_s, 6)
    record["input_throughput"] = round(total_in * per_s, 6)
    record["output_throughput"] = round(total_out * per_s, 6)
    record["total_throughput"] = round((total_in + total_out) * per_s, 6)
    _stats(record, "e2e_latency_ms", [r.e2e * scale for r in ok])
    _stats(record, "ttft_ms", [r.ttft * scale for r in ok if r.ttft is not None])
    _stats(record, "tpot_ms", [(r.e2e - r.ttft) * scale / (r.output_tokens - 1)
                               for r in ok if r.ttft is not None and r.output_tokens > 1])
    _stats(record, "itl_ms", [gap * scale for r in ok for gap in r.itl])
    record["concurrency"] = round(sum(r.e2e * scale for r in ok) * per_s, 4)
    record["errors"] = errors
    record["simulated"] = simulated
    record["time_scale"] = time_scale
    record["clock"] = clock
    record.update(dict(WORKLOAD_DEFAULTS, **(meta or {})))
    return {key: record[key] for key in RECORD_KEYS}


WORKLOAD_DEFAULTS: dict[str, Any] = {
    "dataset_name": "random", "random_range_ratio": 1.0, "request_rate": None, "burstiness": 1.0, "seed": None,
}
"""What a record says of its workload when the caller gives nothing (a closed loop of fixed lengths)."""


# ---- sweep -----------------------------------------------------------------------------------------


def _random_ids(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    low = 1 if vocab_size > 1 else 0
    return [rng.randrange(low, max(vocab_size, low + 1)) for _ in range(length)]


def draw_len(rng: random.Random, length: int, ratio: float) -> int:
    """A length from ``[max(int(length * ratio), 1), length]`` (bench_serving's ``--random-range-ratio``)."""
    return rng.randint(max(int(length * ratio), 1), length)


def word_ids(text: str, vocab_size: int) -> list[int]:
    """A text's words as token ids by a stable hash (the same ids on every host and Python)."""
    span = max(vocab_size - 1, 1)
    return [1 + zlib.crc32(word.encode("utf-8")) % span for word in text.split()]


def load_sharegpt(path: str) -> list[tuple[str, str]]:
    """(prompt, reply) pairs of a ShareGPT-shaped JSON file, kept as bench_serving keeps them.

    Raises ValueError with one line when the file is not that shape or keeps no pair."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    pairs = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = str(first.get("value", "")), str(second.get("value", ""))
        n_in, n_out = len(prompt.split()), len(reply.split())
        if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
            continue
        pairs.append((prompt, reply))
    if not pairs:
        raise ValueError(f"{path}: no conversation with a prompt and a reply of 4 to 2048 words")
    return pairs


class Workload:
    """What each request asks: its prompt token ids and its output length, drawn from one seeded stream."""

    def __init__(self, args: argparse.Namespace, rng: random.Random) -> None:
        self.args = args
        self.rng = rng
        self.pairs: list[tuple[list[int], int]] = []
        if args.dataset:
            pairs = list(getattr(args, "dataset_pairs", None) or load_sharegpt(args.dataset))
            rng.shuffle(pairs)
            self.pairs = [(word_ids(p, args.vocab_size), len(r.split())) for p, r in pairs]
        self.prefixes = [_random_ids(rng, args.prefix_len, args.vocab_size) for _ in range(args.prefix_groups)] \
            if args.prefix_len else []
        self.drawn = 0

    @property
    def name(self) -> str:
        if self.pairs:
            return "sharegpt"
        return "generated-shared-prefix" if self.prefixes else "random"

    def requests(self, count: int) -> list[tuple[list[int], int]]:
        """The next ``count`` requests as (prompt ids, output length)."""
        a = self.args
        out = []
        for _ in range(count):
            index, self.drawn = self.drawn, self.drawn + 1
            if self.pairs:
                out.append(self.pairs[index % len(self.pairs)])
                continue
            prompt = _random_ids(self.rng, draw_len(self.rng, a.input_len, a.random_range_ratio), a.vocab_size)
            if self.prefixes:
                prompt = self.prefixes[index % len(self.prefixes)] + prompt
            out.append((prompt, max(draw_len(self.rng, a.output_len, a.random_range_ratio), 1)))
        return out

    def meta(self) -> dict[str, Any]:
        a = self.args
        return {"dataset_name": self.name, "random_range_ratio": a.random_range_ratio,
                "request_rate": a.request_rate, "burstiness": a.burstiness, "seed": a.seed}


def arrival_offsets(rng: random.Random, count: int, rate: float | None, burstiness: float = 1.0) -> list[float]:
    """When each of ``count`` requests arrives, in seconds after the first: all at 0 without a rate, else
    gaps drawn from a gamma distribution of mean ``1/rate`` (``burstiness`` 1 = Poisson arrivals)."""
    if rate is None or count == 0:
        return [0.0] * count
    offsets, now = [0.0], 0.0
    for _ in range(count - 1):
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        offsets.append(now)
    return offsets


class Look:
    """The early look at one level: once ``after`` of its requests have finished, ``on_first`` is called with
    them (in the worker that finished the last one); setting :attr:`stop` ends the level."""

    def __init__(self, after: int, on_first: Callable[[list[RequestResult]], None]) -> None:
        self.after = after
        self.on_first = on_first
        self.progress = Progress()
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._done: list[RequestResult] = []

    def finished(self, result: RequestResult) -> None:
        with self._lock:
            self._done.append(result)
            first = list(self._done) if len(self._done) == self.after else None
        if first is not None:
            self.on_first(first)


def run_level(target: Target, api: BenchApi, model: str, requests: list[tuple[list[int], int]] | list[list[int]],
              level: int, output_len: int, timeout: float,
              offsets: list[float] | None = None, sim_clock: bool = False,
              look: Look | None = None) -> tuple[list[RequestResult], float]:
    """Send every request with at most ``level`` in flight; the results (in request order) and wall time.

    ``requests`` are (prompt ids, output length) pairs, or bare prompts that all ask ``output_len``. Without
    ``offsets`` the loop is closed (a request leaves as soon as a slot is free); with them, request ``i``
    leaves ``offsets[i]`` seconds after the start, or later if ``level`` requests are still in flight.

    ``sim_clock``: the server is a simulated host with its own clock; each request declares the level, the
    simulated time its slot was freed, and its planned offset (in the server's time), and leaves as soon as
    a slot is free: the server places it on its clock (see the module doc).

    ``look`` (closed loop only): told once its first requests have finished; once its ``stop`` is set, no
    request leaves and the level returns without waiting for those in flight (they are "not run")."""
    jobs = [r if isinstance(r, tuple) else (r, output_len) for r in requests]
    results: list[RequestResult | None] = [None] * len(jobs)
    level_hint: dict[str, Any] | None = None
    if sim_clock:
        level_hint = {"sim_level": uuid.uuid4().hex, "sim_level_requests": len(jobs),
                      "sim_level_concurrency": max(1, level)}

    def one(index: int, after: float | None = None) -> RequestResult:
        prompt, n_out = jobs[index]
        hint = None
        if level_hint is not None:
            hint = dict(level_hint, sim_after_s=after,
                        sim_offset_s=offsets[index] if offsets is not None else None)
        result = stream_request(target, api, model, prompt, n_out, timeout, hint,
                                look.progress if look is not None else None)
        results[index] = result
        if look is not None:
            look.finished(result)
        return result

    start = time.perf_counter()
    stop = look.stop if look is not None else None
    if offsets is None:
        threads = _closed_loop(len(jobs), level, one, stop)
    elif sim_clock:
        threads = _sim_open_loop(len(jobs), level, one)
    else:
        threads = _open_loop(offsets[:len(jobs)], level, one, start)
    for t in threads:
        while t.is_alive() and not (stop is not None and stop.is_set()):
            t.join(0.05)
    duration = time.perf_counter() - start
    done: list[RequestResult] = []
    for r in results:
        if r is None:
            r = RequestResult()
            r.error = "request was not run"
        done.append(r)
    return done, duration


def _closed_loop(count: int, level: int, one: Callable[[int, float | None], RequestResult],
                 stop: threading.Event | None = None) -> list[threading.Thread]:
    """Start ``level`` workers that each take the next request as soon as theirs is done (passing on the
    simulated time it ended, when the server gave one), until ``stop`` is set."""
    lock = threading.Lock()
    cursor = [0]

    def worker() -> None:
        after: float | None = None
        while stop is None or not stop.is_set():
            with lock:
                index = cursor[0]
                if index >= count:
                    return
                cursor[0] += 1
            after = one(index, after).sim_end

    threads = [threading.Thread(target=worker, name=f"loadgen-{i}", daemon=True)
               for i in range(max(1, min(level, count)))]
    for t in threads:
        t.start()
    return threads


def _sim_open_loop(count: int, level: int, one: Callable[[int, float | None], RequestResult]) -> list[threading.Thread]:
    """An open loop on a simulated host's clock: request ``i`` leaves as soon as a slot is free, saying when
    (in simulated time) that slot was freed; the server holds it until its planned arrival."""
    freed: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    for _ in range(max(1, level)):
        freed.put(None)

    def send(index: int, after: float | None) -> None:
        freed.put(one(index, after).sim_end)

    threads = []
    for index in range(count):
        after = freed.get()
        t = threading.Thread(target=send, args=(index, after), name=f"loadgen-{index}", daemon=True)
        t.start()
        threads.append(t)
    return threads


def _open_loop(offsets: list[float], level: int, one: Callable[[int, float | None], RequestResult],
               start: float) -> list[threading.Thread]:
    """Send request ``i`` at ``start + offsets[i]`` (or later, while ``level`` requests are in flight)."""
    slots = threading.BoundedSemaphore(max(1, level))

    def send(index: int) -> None:
        try:
            one(index, None)
        finally:
            slots.release()

    threads = []
    for index, offset in enumerate(offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        slots.acquire()
        t = threading.Thread(target=send, args=(index,), name=f"loadgen-{index}", daemon=True)
        t.start()
        threads.append(t)
    return threads


def server_info(target: Target, timeout: float = 10.0) -> dict[str, Any] | None:
    """``GET /get_server_info`` (or ``/server_info``) as a dict, None when neither answers JSON."""
    for path in ("/get_server_info", "/server_info"):
        conn = target.connect(timeout)
        try:
            conn.request("GET", target.prefix + path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                continue
            data = json.loads(body.decode("utf-8", "replace"))
            if isinstance(data, dict):
                return data
        except (OSError, http.client.HTTPException, ValueError):
            continue
        finally:
            conn.close()
    return None


def has_sim_clock(info: dict[str, Any] | None) -> bool:
    """Whether the server is a simulated host that streams its own clock's times (``sim_clock``)."""
    return info is not None and info.get("simulated") is True and info.get("sim_clock") is True


def detect_time_scale(info: dict[str, Any] | None) -> tuple[float, bool]:
    """(factor, simulated): a simulated host running ``sim_speed`` times faster than real time."""
    if not info or info.get("simulated") is not True:
        return 1.0, False
    speed = info.get("sim_speed")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed <= 0:
        return 1.0, True
    return float(speed), True


class Sweep:
    """A whole run: warm-up, then one level after another until done or a level fails entirely."""

    def __init__(self, args: argparse.Namespace, out: Any = None) -> None:
        self.args = args
        self.target = Target(args.base_url)
        self.api = APIS[args.api]
        self.out = out if out is not None else sys.stdout
        self.rng = random.Random(args.seed)
        self.partial: dict[str, Any] | None = None
        self._emit_lock = threading.Lock()

    def time_scale(self) -> tuple[float, bool, bool]:
        """(time scale, simulated, the server's own simulated clock)."""
        if self.args.time_scale == "auto":
            info = server_info(self.target, min(10.0, self.args.timeout))
            return (*detect_time_scale(info), has_sim_clock(info))
        factor = float(self.args.time_scale)
        return factor, factor != 1.0, False

    def run(self) -> int:
        a = self.args
        scale, simulated, sim_clock = self.time_scale()
        # The warm-up draws from its own stream, so the measured requests are the same with or without it.
        warm = Workload(a, random.Random(f"{a.seed}-warmup"))
        workload = Workload(a, self.rng)
        if a.warmup > 0:
            results, _ = run_level(self.target, self.api, a.model, warm.requests(a.warmup), 1, a.output_len,
                                   a.timeout, sim_clock=sim_clock)
            errors = sorted({r.error for r in results if not r.ok})[:MAX_ERRORS]
            sys.stderr.write(json.dumps({"warmup": len(results), "ok": sum(r.ok for r in results),
                                         "errors": errors}) + "\n")
            sys.stderr.flush()
        for index, level in enumerate(a.levels):
            count = a.requests[index]
            jobs = workload.requests(count)
            offsets = None
            if a.request_rate is not None:
                # The schedule is in the server's time: a simulated host with its own clock takes it as is;
                # an older one, running ``scale`` times faster than real time, gets its requests ``scale``
                # times closer together.
                offsets = arrival_offsets(self.rng, count, a.request_rate, a.burstiness)
                if not sim_clock:
                    offsets = [t / scale for t in offsets]
            look = self._look(level, scale, simulated, workload) if index == 0 and a.early_look else None
            results, duration = run_level(self.target, self.api, a.model, jobs, level, a.output_len, a.timeout,
                                          offsets, sim_clock=sim_clock, look=look)
            if look is not None and look.stop.is_set() and self.partial is not None:
                self.emit(dict(self.partial, partial=False, stopped_early=True))
                return EXIT_STOPPED
            record = summarize(results, duration, level=level, api=a.api, input_len=a.input_len,
                               output_len=a.output_len, time_scale=scale, simulated=simulated,
                               meta=workload.meta())
            self.emit(record)
            if record["completed"] == 0:
                return EXIT_LEVEL_FAILED
        return EXIT_OK

    def _look(self, level: int, scale: float, simulated: bool, workload: Workload) -> Look:
        """The early look at the first level: the partial record printed, then the stop file watched."""
        a = self.args

        def on_first(first: list[RequestResult]) -> None:
            record = summarize(first, time.perf_counter() - look.progress.start, level=level, api=a.api,
                               input_len=a.input_len, output_len=a.output_len, time_scale=scale,
                               simulated=simulated, meta=workload.meta())
            record["output_throughput"] = round(look.progress.rate(scale), 6)
            self.partial = dict(record, partial=True)
            self.emit(self.partial, keep=False)
            threading.Thread(target=watch, name="loadgen-stop-file", daemon=True).start()

        def watch() -> None:
            while not look.stop.is_set():
                if os.path.exists(a.stop_file):
                    look.stop.set()
                    return
                time.sleep(0.02)

        look = Look(a.early_look, on_first)
        return look

    def emit(self, record: dict[str, Any], *, keep: bool = True) -> None:
        """Print ``record`` as one line; ``keep``: append it to ``--out`` too (a partial record is not)."""
        line = json.dumps(record)
        with self._emit_lock:
            self.out.write(line + "\n")
            self.out.flush()
        if keep and self.args.out:
            with open(self.args.out, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")


# ---- command line ----------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _time_scale(text: str) -> str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"time scale must be > 0, got {text!r}")
    return text


def _positive(kind: type) -> Any:
    return _number(kind, "a number > 0", lambda v: v > 0)


def _number(kind: type, allowed: str, ok: Callable[[Any], bool]) -> Any:
    """An argparse type: ``kind(text)`` when ``ok`` says so, else one error naming what is ``allowed``."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value
    return parse


_ratio = _number(float, "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0)
_non_negative = _number(int, "an integer >= 0", lambda v: v >= 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loadgen.py", description="Concurrency sweep of streaming requests.")
    p.add_argument("--base-url", required=True, help="http://HOST:PORT of the server")
    p.add_argument("--api", choices=tuple(APIS), default="sglang",
                   help="sglang: POST /generate; openai: POST /v1/completions")
    p.add_argument("--model", default="", help="model name for the OpenAI API")
    p.add_argument("--levels", type=_int_list, required=True, help="concurrency levels, e.g. 1,16,64")
    p.add_argument("--requests", type=_int_list, required=True,
                   help="requests per level: one per level, or one number for all")
    p.add_argument("--input-len", type=_positive(int), default=256)
    p.add_argument("--output-len", type=_positive(int), default=128)
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests before the sweep (not counted)")
    p.add_argument("--timeout", type=_positive(float), default=600.0, help="seconds per request")
    p.add_argument("--vocab-size", type=_positive(int), default=400, help="prompt token ids are below this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None, help="append each level's record to this JSONL file")
    p.add_argument("--time-scale", type=_time_scale, default="auto",
                   help="'auto' (ask the server whether it is simulated) or a factor for every time")
    p.add_argument("--random-range-ratio", type=_ratio, default=1.0,
                   help="lengths drawn from [len*R, len] (bench_serving semantics); 1.0 = fixed lengths")
    p.add_argument("--dataset", default=None, help="a local ShareGPT-shaped JSON file of prompts")
    p.add_argument("--prefix-len", type=_non_negative, default=0, help="tokens of each shared system prompt")
    p.add_argument("--prefix-groups", type=_positive(int), default=1, help="how many shared system prompts")
    p.add_argument("--early-look", type=_positive(int), default=None,
                   help="print a partial record once this many of the first level's requests have finished")
    p.add_argument("--stop-file", default="stop-level",
                   help="with --early-look: this file appearing after the partial record ends the sweep (exit 4)")
    p.add_argument("--request-rate", type=_positive(float), default=None,
                   help="open loop: requests per second (Poisson arrivals); default: closed loop")
    p.add_argument("--burstiness", type=_positive(float), default=1.0,
                   help="gamma shape of the arrival gaps (1 = Poisson; lower = burstier)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.requests) == 1:
        args.requests = args.requests * len(args.levels)
    elif len(args.requests) != len(args.levels):
        parser.error(f"--requests needs one number or one per level ({len(args.levels)} levels, "
                     f"{len(args.requests)} numbers)")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        Target(args.base_url)
    except ValueError as exc:
        parser.error(str(exc))
    if args.early_look is not None and args.request_rate is not None:
        parser.error("--early-look looks at a closed loop: give it without --request-rate")
    if args.dataset and args.prefix_len:
        parser.error("--dataset and --prefix-len are two workloads: give one")
    if args.dataset:
        try:
            args.dataset_pairs = load_sharegpt(args.dataset)
        except (OSError, ValueError) as exc:
            parser.error(f"--dataset: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_ARGS
    try:
        return Sweep(args).run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
