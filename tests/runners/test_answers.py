"""The correctness probe (``runners/answers.py``) as the process it is on a host, against a real socket: a
server that accepts connections and never answers holds it no longer than its ``--timeout``, which bounds the
whole probe (the trial gives it the budget's benchmark timeout), not each prompt."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

ANSWERS = Path(str(resources.files("runners").joinpath("answers.py")))


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts every connection, reads the request and never answers."""
    held: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        server.close()
        for conn in held:
            conn.close()


def test_a_server_that_never_answers_holds_the_probe_no_longer_than_its_timeout(silent_server: int,
                                                                                 tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([f"prompt {i}" for i in range(6)]))
    # Six prompts: were --timeout per prompt, the probe would take 6 x 3 s; the subprocess limit below is less.
    res = subprocess.run([sys.executable, str(ANSWERS), "--base-url", f"http://127.0.0.1:{silent_server}",
                          "--prompts", str(prompts), "--timeout", "3"], capture_output=True, text=True,
                         timeout=17, check=False)
    assert res.returncode == 3, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["index"] for r in records] == list(range(6))
    assert records[0]["error"].startswith("TimeoutError") or "timed out" in records[0]["error"]
    assert records[-1]["error"] == "not asked: the probe's 3s were spent"
