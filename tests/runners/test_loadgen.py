"""The load generator against a real (small, threaded, stdlib) HTTP server streaming SSE for both APIs."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runners import loadgen
from tests.fixtures.ports import free_port

LOADGEN = Path(loadgen.__file__)


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.ttft = 0.0
        self.gap = 0.0
        self.tokens_per_chunk = 1
        self.cut_after: int | None = None
        self.sim_speed: float | None = None
        self.fail_every: int = 0
        self.piece = "ab"
        self.inflate = 1
        """How many times the tokens it sent the server claims in its counts (a lying server: 1000)."""
        """The text of one token in an OpenAI chunk ("" for tokens that decode to part of a character)."""
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path == "/get_server_info" and self.server.sim_speed is not None:
            self._json(200, {"simulated": True, "sim_speed": self.server.sim_speed, "version": "0.5.10"})
        else:
            self._json(404, {"detail": "Not Found"})

    def _chunk(self, payload: Any) -> None:
        data = ("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.arrivals.append(time.perf_counter())
            srv.bodies.append((self.path, body))
            count = len(srv.bodies)
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            if srv.fail_every and count % srv.fail_every == 0:
                self._json(500, {"error": "boom"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if self.path == "/generate":
                self._generate(body)
            else:
                self._completions(body)
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        finally:
            self._done()

    def _done(self) -> None:
        """The request stops counting as in flight: when its last token is about to be written (the client may
        send its next request as soon as it reads it, before this handler returns), or when it ends early."""
        if getattr(self, "_counted_out", False):
            return
        self._counted_out = True
        with self.server.lock:
            self.server.in_flight -= 1

    def _generate(self, body: dict[str, Any]) -> None:
        n = body["sampling_params"]["max_new_tokens"]
        prompt = len(body["input_ids"])
        time.sleep(self.server.ttft)
        done = 0
        while done < n:
            if done:
                time.sleep(self.server.gap)
            done = min(n, done + self.server.tokens_per_chunk)
            meta = {"completion_tokens": done * self.server.inflate, "prompt_tokens": prompt,
                    "finish_reason": {"type": "length", "length": n} if done >= n else None}
            if self.server.cut_after is not None and done > self.server.cut_after:
                return  # the server died mid-stream: no finish reason
            if done >= n:
                self._done()
            self._chunk({"text": "x" * done, "meta_info": meta})

    def _completions(self, body: dict[str, Any]) -> None:
        n = body["max_tokens"]
        time.sleep(self.server.ttft)
        done = 0
        while done < n:
            if done:
                time.sleep(self.server.gap)
            step = min(self.server.tokens_per_chunk, n - done)
            done += step
            if self.server.cut_after is not None and done > self.server.cut_after:
                return  # aborted: vLLM still sends [DONE], but no finish reason
            choice = {"index": 0, "text": self.server.piece * step, "finish_reason": "length" if done >= n else None}
            if done >= n:
                self._done()
            self._chunk({"choices": [choice], "usage": None})
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n * self.server.inflate}
        self._chunk({"choices": [], "usage": usage})


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    code = loadgen.main(args)
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


def common(url: str, api: str, **over: str) -> list[str]:
    opts = {"--levels": "1,4", "--requests": "3,8", "--input-len": "16", "--output-len": "5", "--warmup": "1",
            "--timeout": "20", "--vocab-size": "400", "--seed": "1", "--model": "tiny"}
    opts.update(over)
    args = ["--base-url", url, "--api", api]
    for key, value in opts.items():
        args += [key, value]
    return args


# ---- both APIs end to end ----------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_sweep_counts_tokens_and_keeps_warmup_apart(api: str, server: FakeServer, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    server.tokens_per_chunk = 2  # coalesced chunks: token counts must come from usage / meta_info
    out = tmp_path / "bench.jsonl"
    code, records = run_main(common(server.url, api, **{"--out": str(out)}), capsys)
    assert code == 0
    assert [r["max_concurrency"] for r in records] == [1, 4]
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    assert len(server.bodies) == 1 + 3 + 8  # warm-up request sent, but not counted below
    assert server.max_in_flight <= 4
    for rec, n in zip(records, (3, 8), strict=True):
        assert list(rec) == list(loadgen.RECORD_KEYS)
        assert (rec["completed"], rec["failed"], rec["num_prompts"]) == (n, 0, n)
        assert rec["total_output_tokens"] == 5 * n
        assert rec["total_input_tokens"] == 16 * n
        assert rec["output_throughput"] == pytest.approx(5 * n / rec["duration"], rel=1e-3)
        assert rec["total_throughput"] == pytest.approx(21 * n / rec["duration"], rel=1e-3)
        assert rec["errors"] == [] and rec["simulated"] is False and rec["time_scale"] == 1.0
        assert rec["backend"] == api
    path, body = server.bodies[-1]
    if api == "sglang":
        assert path == "/generate"
        assert len(body["input_ids"]) == 16 and all(0 < t < 400 for t in body["input_ids"])
        assert body["sampling_params"] == {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0.0}
    else:
        assert path == "/v1/completions"
        assert body["model"] == "tiny" and len(body["prompt"]) == 16 and body["max_tokens"] == 5
        assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    assert body["stream"] is True


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_ttft_and_tpot_from_a_paced_stream(api: str, server: FakeServer,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    server.ttft, server.gap = 0.15, 0.04
    code, records = run_main(common(server.url, api, **{"--levels": "1", "--requests": "2",
                                                        "--warmup": "0"}), capsys)
    assert code == 0
    rec = records[0]
    # Lower bounds only: the fake server sleeps that long; a loaded machine only adds to it. The arithmetic
    # of the figures is pinned by test_summary_math_on_a_deterministic_fake.
    assert rec["completed"] == 2 and rec["total_output_tokens"] == 10
    assert rec["mean_ttft_ms"] >= 150
    # TPOT is read between the first and the last token's arrival: a first token read late (a busy box)
    # shortens that span, so its bound has a margin (seen: 39.8 ms for a 40 ms gap).
    assert rec["mean_tpot_ms"] >= 40 * 0.9
    assert rec["median_itl_ms"] >= 40
    assert rec["mean_e2e_latency_ms"] >= 150 + 4 * 40
    # TPOT: the time after the first token, over the 4 tokens that followed it.
    assert rec["mean_e2e_latency_ms"] == pytest.approx(rec["mean_ttft_ms"] + 4 * rec["mean_tpot_ms"], abs=0.01)


def test_failed_requests_are_counted_with_their_errors(server: FakeServer,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    server.fail_every = 2
    code, records = run_main(common(server.url, "sglang", **{"--levels": "1", "--requests": "4",
                                                             "--warmup": "0"}), capsys)
    assert code == 0
    rec = records[0]
    assert (rec["completed"], rec["failed"]) == (2, 2)
    assert len(rec["errors"]) == 1 and rec["errors"][0].startswith("HTTP 500")


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_a_server_that_claims_more_tokens_than_asked_completes_no_request(
        api: str, server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A server claiming 1000x the tokens asked for gives no throughput: each request is failed with one line
    (the controller makes the trial FAIL ``implausible_figure`` from it), and no token of it is counted."""
    server.inflate = 1000
    code, records = run_main(common(server.url, api, **{"--levels": "1", "--requests": "3", "--warmup": "0"}),
                             capsys)
    assert code == 3
    rec = records[0]
    assert (rec["completed"], rec["failed"], rec["total_output_tokens"], rec["output_throughput"]) == (0, 3, 0, 0)
    assert rec["errors"] == [f"{loadgen.IMPLAUSIBLE}: the server reported 5000 output tokens for 5 sent or asked "
                             "(allowed: 5% + 8 more)"]


def test_token_counts_within_the_slack_are_believed(server: FakeServer,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    server.inflate = 2  # 10 tokens for 5 asked: within 5% + 8
    code, records = run_main(common(server.url, "openai", **{"--levels": "1", "--requests": "2", "--warmup": "0"}),
                             capsys)
    assert code == 0 and records[0]["completed"] == 2 and records[0]["total_output_tokens"] == 20


def test_time_scale_auto_reads_a_simulated_host(server: FakeServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    server.sim_speed = 10.0
    server.ttft, server.gap = 0.02, 0.005
    code, records = run_main(common(server.url, "sglang", **{"--levels": "2", "--requests": "4",
                                                             "--warmup": "0"}), capsys)
    assert code == 0
    rec = records[0]
    assert rec["simulated"] is True and rec["time_scale"] == 10.0
    assert rec["mean_ttft_ms"] >= 10 * 20  # the fake's 20 ms TTFT, times 10 (lower bound, as above)
    assert rec["duration"] >= 10 * 2 * (0.02 + 4 * 0.005)
    assert rec["output_throughput"] == pytest.approx(rec["total_output_tokens"] / rec["duration"], rel=1e-3)


def test_time_scale_auto_on_a_real_server_is_one(server: FakeServer) -> None:
    target = loadgen.Target(server.url)
    assert loadgen.detect_time_scale(loadgen.server_info(target)) == (1.0, False)


def test_all_failed_level_exits_3_after_printing_it(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    # Run the file itself, as servetune does on a host: a standalone script.
    res = subprocess.run(
        [sys.executable, str(LOADGEN), "--base-url", f"http://127.0.0.1:{port}", "--levels", "1,4",
         "--requests", "2", "--warmup", "1", "--timeout", "5"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert res.returncode == 3, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(records) == 1
    rec = records[0]
    assert (rec["max_concurrency"], rec["completed"], rec["failed"]) == (1, 0, 2)
    assert rec["errors"] and "ConnectionRefusedError" in rec["errors"][0]
    assert rec["mean_ttft_ms"] is None and rec["output_throughput"] == 0.0


@pytest.mark.parametrize("args", [
    ["--levels", "1,2", "--requests", "1,2,3"],
    ["--levels", "x"],
    ["--levels", "0"],
    ["--levels", "1", "--api", "grpc"],
    ["--levels", "1", "--time-scale", "fast"],
    ["--levels", "1", "--time-scale", "0"],
    ["--levels", "1", "--warmup", "-1"],
])
def test_bad_args_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--base-url", "http://127.0.0.1:1", "--requests", "1"]
    assert loadgen.main(base + args) == 2
    assert "error" in capsys.readouterr().err


def test_bad_base_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen.main(["--base-url", "127.0.0.1:30000", "--levels", "1", "--requests", "1"]) == 2


# ---- pure logic --------------------------------------------------------------------------------------


def fake(ttft: float, e2e: float, tokens: int, itl: list[float], prompt: int = 10) -> loadgen.RequestResult:
    r = loadgen.RequestResult()
    r.ok, r.ttft, r.e2e, r.output_tokens, r.itl, r.input_tokens = True, ttft, e2e, tokens, itl, prompt
    return r


def test_summary_math_on_a_deterministic_fake() -> None:
    failed = loadgen.RequestResult()
    failed.error = "ConnectionResetError: reset"
    results = [fake(0.1, 0.5, 5, [0.1] * 4), fake(0.3, 1.1, 9, [0.1] * 8), failed, failed]
    rec = loadgen.summarize(results, 2.0, level=2, api="sglang", input_len=10, output_len=9)
    assert (rec["completed"], rec["failed"], rec["num_prompts"]) == (2, 2, 4)
    assert (rec["total_input_tokens"], rec["total_output_tokens"]) == (20, 14)
    assert rec["request_throughput"] == 1.0
    assert (rec["input_throughput"], rec["output_throughput"], rec["total_throughput"]) == (10.0, 7.0, 17.0)
    assert rec["mean_ttft_ms"] == pytest.approx(200.0)
    assert rec["median_ttft_ms"] == pytest.approx(200.0)
    assert rec["p99_ttft_ms"] == pytest.approx(100 + 200 * 0.99)
    assert rec["mean_tpot_ms"] == pytest.approx(100.0)  # (0.5-0.1)/4 and (1.1-0.3)/8
    assert rec["mean_itl_ms"] == pytest.approx(100.0)
    assert rec["mean_e2e_latency_ms"] == pytest.approx(800.0)
    assert rec["concurrency"] == pytest.approx(0.8)
    assert rec["errors"] == ["ConnectionResetError: reset"]

    scaled = loadgen.summarize(results, 2.0, level=2, api="sglang", input_len=10, output_len=9,
                               time_scale=10.0, simulated=True)
    assert scaled["duration"] == 20.0 and scaled["output_throughput"] == 0.7
    assert scaled["mean_ttft_ms"] == pytest.approx(2000.0) and scaled["mean_tpot_ms"] == pytest.approx(1000.0)
    assert scaled["simulated"] is True and scaled["time_scale"] == 10.0


def test_one_token_outputs_have_no_tpot() -> None:
    rec = loadgen.summarize([fake(0.1, 0.1, 1, [])], 1.0, level=1, api="openai", input_len=10, output_len=1)
    assert rec["mean_tpot_ms"] is None and rec["mean_itl_ms"] is None and rec["mean_ttft_ms"] == 100.0


def test_percentile_matches_numpy_linear() -> None:
    assert loadgen.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert loadgen.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert loadgen.percentile([5.0], 99) == 5.0


def test_emit_writes_stdout_and_file(tmp_path: Path) -> None:
    args = loadgen.parse_args(["--base-url", "http://127.0.0.1:1", "--levels", "1,2,3", "--requests", "4",
                               "--out", str(tmp_path / "r.jsonl")])
    assert args.requests == [4, 4, 4]
    buf = io.StringIO()
    sweep = loadgen.Sweep(args, out=buf)
    sweep.emit({"max_concurrency": 1})
    sweep.emit({"max_concurrency": 2})
    expected = '{"max_concurrency": 1}\n{"max_concurrency": 2}\n'
    assert buf.getvalue() == (tmp_path / "r.jsonl").read_text() == expected


def test_loadgen_is_standalone_stdlib() -> None:
    tree = ast.parse(LOADGEN.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules
    ast.parse(LOADGEN.read_text(), feature_version=(3, 8))  # no syntax newer than 3.8


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_a_stream_cut_short_is_a_failed_request(server: FakeServer, api: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A dying server closes its streams after a few tokens: those requests did not complete.
    server.cut_after = 3
    code, records = run_main(common(server.url, api, **{"--levels": "2", "--requests": "2", "--warmup": "0"}),
                             capsys)
    assert code == 3
    assert records[0]["completed"] == 0 and records[0]["failed"] == 2
    assert "without a finish reason" in records[0]["errors"][0]


def test_a_reply_whose_tokens_have_no_text_yet_is_still_a_reply(server: FakeServer,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # A tiny model's greedy reply can be tokens that each decode to part of a character: vLLM streams its
    # chunks with empty text, and only `usage` says how many tokens came (as vLLM's own bench counts them).
    server.piece = ""
    code, records = run_main(common(server.url, "openai", **{"--levels": "2", "--requests": "4"}), capsys)
    assert code == 0
    (rec,) = records
    assert rec["completed"] == 4 and rec["failed"] == 0 and rec["total_output_tokens"] == 4 * 5


# ---- the early look --------------------------------------------------------------------------------


def test_early_look_prints_a_partial_record_and_the_sweep_goes_on(server: FakeServer, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    server.gap = 0.01
    out = tmp_path / "bench.jsonl"
    args = common(server.url, "sglang", **{"--levels": "4,1", "--requests": "16,2", "--out": str(out),
                                           "--early-look": "4", "--stop-file": str(tmp_path / "stop")})
    code, records = run_main(args, capsys)
    assert code == 0
    partial, *levels = records
    assert partial["partial"] is True and partial["max_concurrency"] == 4 and partial["completed"] == 4
    # Every token streamed so far counts (requests in flight too): about the level's own rate, never the
    # finished requests' alone.
    assert partial["output_throughput"] >= partial["total_output_tokens"] / partial["duration"] * 0.99
    assert [r["max_concurrency"] for r in levels] == [4, 1] and levels[0]["completed"] == 16
    assert [json.loads(line) for line in out.read_text().splitlines()] == levels  # the partial one is not kept


def test_the_stop_file_ends_the_sweep_after_the_early_look(server: FakeServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    server.gap = 0.02
    stop = tmp_path / "stop"
    stop.touch()  # the caller's verdict is already there: the look stops the level at once
    out = tmp_path / "bench.jsonl"
    args = common(server.url, "sglang", **{"--levels": "4,1", "--requests": "16,2", "--out": str(out),
                                           "--early-look": "4", "--stop-file": str(stop)})
    code, records = run_main(args, capsys)
    assert code == loadgen.EXIT_STOPPED
    partial, stopped = records
    assert stopped == dict(partial, partial=False, stopped_early=True)
    assert [json.loads(line) for line in out.read_text().splitlines()] == [stopped]
    assert len(server.bodies) < 1 + 16  # the warm-up and fewer than the level's requests: the rest never left


def test_early_look_needs_a_closed_loop(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--base-url", "http://127.0.0.1:1", "--levels", "4", "--requests", "8", "--early-look", "2",
            "--request-rate", "5"]
    assert loadgen.main(args) == 2
    assert "--early-look looks at a closed loop" in capsys.readouterr().err
