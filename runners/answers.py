#!/usr/bin/env python3
"""servetune's correctness probe: ask a server a fixed set of prompts greedily and print its answers.

Standalone on purpose, like ``loadgen.py``: standard library only, no servetune imports; servetune copies it to
the host and runs it next to the server::

    python answers.py --base-url http://127.0.0.1:30000 --model NAME --prompts prompts.json --max-tokens 24

``prompts.json`` is a JSON list of strings. Each prompt goes to ``POST /v1/completions`` (SGLang and vLLM both
serve it) with ``temperature: 0`` and ``logprobs: 1``, one at a time, and one JSON line is printed per prompt:
``{"index", "text", "tokens", "logprobs", "error"}`` (``tokens``/``logprobs`` null where the engine gives none).
Exit codes: 0 done (some answers may carry an error), 2 bad arguments, 3 no prompt got an answer.

``--timeout`` bounds the whole probe, not each prompt: a server that accepts connections and never answers
holds it that long at most; the prompts not asked by then are answered with an error saying so.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from typing import Any
from urllib.parse import urlsplit


def ask(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float) -> dict[str, Any]:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 1,
            "stream": False, "ignore_eos": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        conn.close()
    if resp.status != 200:
        return {"error": f"HTTP {resp.status}: {raw[:300]}"}
    try:
        choice = json.loads(raw)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return {"error": f"not a completion: {raw[:300]}"}
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return {"text": choice.get("text", ""), "tokens": tokens, "logprobs": values, "error": None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--prompts", required=True)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--timeout", type=float, default=120.0)
    a = p.parse_args(argv)
    with open(a.prompts, encoding="utf-8") as fh:
        prompts = json.load(fh)
    if not isinstance(prompts, list) or not all(isinstance(x, str) for x in prompts):
        p.error("--prompts: a JSON list of strings")
    answered = 0
    deadline = time.monotonic() + a.timeout
    for index, prompt in enumerate(prompts):
        left = deadline - time.monotonic()
        if left > 0:
            got = ask(a.base_url, a.model, prompt, a.max_tokens, left)
        else:
            got = {"error": f"not asked: the probe's {a.timeout:g}s were spent"}
        answered += got.get("error") is None
        sys.stdout.write(json.dumps({"index": index, **got}) + "\n")
        sys.stdout.flush()
    return 0 if answered else 3


if __name__ == "__main__":
    sys.exit(main())
