"""Every command servetune renders passes the released engine's own argument parser (``make test-engines``).

For each SGLang release servetune spells flags for and each vLLM release of engine-audit.md, the release's wheel
(``pip download --no-deps``, cached in ``~/.cache/servetune/wheels``) is unpacked and its own module builds the
parser: ``ServerArgs.add_cli_args`` (SGLang), ``make_arg_parser`` (vLLM). The module cannot be installed with its
GPU dependencies here, so it is imported from the unpacked wheel in a CPU-only venv
(``~/.cache/servetune/release-parsers``: torch CPU and the pure-Python libraries, the transformers the release
pins in an overlay) with the CUDA-only modules it imports stubbed (``release_argparse.py``). Every knob value of
every shipped space is rendered by the engine's own ``argv`` and parsed; the spellings servetune refuses for a
release must be refused by it too. A failure names the release and the flag.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners.engines.nodes import render_nodes
from runners.engines.sglang import SGLangEngine
from runners.engines.vllm import MULTI_NODE_SINCE, VLLMEngine
from spaces.launch import LaunchConfig
from spaces.schema import BoolChoices, FloatRange, IntChoices, Space, load_space

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SERVETUNE_CACHE", Path.home() / ".cache" / "servetune"))
WHEELS = CACHE / "wheels"
HOME = CACHE / "release-parsers"
RUNNER = Path(__file__).with_name("release_argparse.py")

SGLANG_RELEASES = ("0.5.2", "0.5.5", "0.5.10", "0.5.14", "0.5.20", "0.5.23")
VLLM_RELEASES = ("0.10.2", "0.11.0", "0.11.1", "0.33.0")  # engine-audit.md: the vLLM releases read
VENV_PACKAGES = (
    "torch==2.13.0+cpu", "pydantic", "openai", "openai-harmony", "pybase64", "orjson", "psutil", "msgspec", "numpy",
    "requests", "fastapi", "uvicorn", "pyyaml", "pyzmq", "aiohttp", "packaging", "pillow", "tqdm",
    "partial_json_parser", "regex", "cachetools", "sentencepiece", "blake3", "py-cpuinfo", "protobuf",
    "prometheus_client", "prometheus-fastapi-instrumentator", "tiktoken", "diskcache", "lark", "filelock", "gguf",
    "six", "einops", "cloudpickle", "watchfiles", "python-json-logger", "cbor2", "setproctitle", "jsonschema",
    "ijson", "scipy", "interegular", "apache-tvm-ffi", "dill", "triton",
)
"""The CPU-only venv: torch from this machine kind's local wheel store, the libraries both engines import."""
NO_DEPS_PACKAGES = ("mistral_common", "llguidance", "outlines_core", "lm-format-enforcer", "compressed-tensors")
"""Libraries installed without their dependencies (they would pull a CUDA torch)."""


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        pytest.fail(f"pip install {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")


@pytest.fixture(scope="session")
def parser_python() -> Path:
    """The release-parser venv's python (created once; reused while its package list is unchanged)."""
    venv = HOME / "venv"
    python = venv / "bin" / "python"
    stamp = venv / "servetune-packages.txt"
    wanted = "\n".join((*VENV_PACKAGES, "--no-deps", *NO_DEPS_PACKAGES))
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
        _pip(python, *VENV_PACKAGES)
        _pip(python, "--no-deps", *NO_DEPS_PACKAGES)
        stamp.write_text(wanted)
    return python


def _wheel(engine: str, version: str) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"{engine}-{version}-*.whl"))
    if not found:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{engine}=={version}",
                               "-d", str(WHEELS)], capture_output=True, text=True, timeout=1800, check=False)
        found = sorted(WHEELS.glob(f"{engine}-{version}-*.whl"))
        if not found:
            pytest.fail(f"cannot download {engine}=={version}: {done.stderr.strip()[-1000:]}")
    return found[0]


def _requirement(wheel: Path, name: str) -> str | None:
    """The release's own requirement on ``name`` (``Requires-Dist`` of its wheel), without extras' markers."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        for line in zf.read(meta).decode().splitlines():
            m = re.match(rf"Requires-Dist: ({re.escape(name)}\s*[<>=!~][^;]*)", line, re.IGNORECASE)
            if m:
                return m.group(1).replace(" ", "")
    return None


def release_dirs(engine: str, version: str, python: Path) -> tuple[Path, Path]:
    """(the package unpacked from the wheel, an overlay with the transformers/xgrammar the release pins)."""
    wheel = _wheel(engine, version)
    target = HOME / f"{engine}-{version}"
    if not (target / engine / "__init__.py").exists():
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith(f"{engine}/") and n.endswith((".py", ".json"))]
            zf.extractall(target, members)
    overlay = HOME / f"{engine}-{version}-overlay"
    if not (overlay / "transformers").exists():
        transformers = _requirement(wheel, "transformers") or "transformers"
        if not re.search(r"<|==", transformers):
            transformers += ",<5"  # an open lower bound from before transformers 5 existed
        _pip(python, "--target", str(overlay), transformers)
        xgrammar = _requirement(wheel, "xgrammar")
        if xgrammar:
            _pip(python, "--target", str(overlay), "--no-deps", "--upgrade", xgrammar)
    return target, overlay


def parse_with_release(engine: str, version: str, argvs: list[list[str]], python: Path) -> list[dict[str, Any]]:
    """Each argv through the release's own parser: ``{"ok": bool, "error": str}`` per argv."""
    release, overlay = release_dirs(engine, version, python)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([str(python), str(RUNNER), str(release), str(overlay), engine], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=900, check=False, env=env)
    if done.returncode != 0:
        pytest.fail(f"{engine} {version}: its parser could not be built: {done.stderr.strip()[-3000:]}")
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])["results"]
    return results


# ---- the commands servetune renders ---------------------------------------------------------------------------


def knob_values(spec: Any) -> list[Any]:
    if isinstance(spec, FloatRange):
        step = spec.step or round((spec.high - spec.low) / 4, 6) or 1.0
        values, x = [], spec.low
        while x <= spec.high + 1e-9:
            values.append(round(x, 4))
            x += step
        return values
    if isinstance(spec, IntChoices):
        return [c for c in spec.choices if c is not None]
    if isinstance(spec, BoolChoices):
        return list(spec.choices)
    return []


def shipped_spaces(kinds: set[str]) -> Iterator[Space]:
    for path in sorted((ROOT / "spaces").glob("*.yaml")):
        space = load_space(path)
        if space.engine.kind in kinds:
            yield space


def rendered(engine: SGLangEngine | VLLMEngine, kinds: set[str], version: str) -> list[tuple[str, list[str]]]:
    """(what it is, argv after the module, ``serve`` dropped) for every knob value of every shipped space of ``kinds``."""
    out: list[tuple[str, list[str]]] = []
    for space in shipped_spaces(kinds):
        searched = {k: v for k, v in space.knobs.searched().items() if not k.startswith("nccl.")}
        for knob, spec in searched.items():
            if knob in getattr(engine, "env_knobs", {}):
                continue
            for value in knob_values(spec):
                launch = LaunchConfig(engine=engine.name, python="python3", model_path="/models/m", port=30000,
                                      knobs={knob: value}, fixed_args=tuple(space.fixed_args))
                argv = engine.argv(launch, version)[3:]
                out.append((f"{space.name}: {knob}={value}", argv[1:] if argv[:1] == ["serve"] else argv))
    return out


def rendered_nodes(engine: SGLangEngine | VLLMEngine, version: str, tp_flag: str) -> list[tuple[str, list[str]]]:
    """(what it is, argv after the module, ``serve`` dropped) for each rank of a two-node server."""
    launch = LaunchConfig(engine=engine.name, python="python3", model_path="/models/m", port=30000, knobs={},
                          fixed_args=(tp_flag, "16"), nodes=2)
    out = []
    for rank, node in enumerate(render_nodes(engine, launch, version, ["127.0.0.2", "127.0.0.3"], 29500)):
        argv = node.argv[3:]
        out.append((f"two nodes, rank {rank}", argv[1:] if argv[:1] == ["serve"] else argv))
    return out


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_sglang_release_parses_every_rendered_command(version: str, parser_python: Path) -> None:
    commands = rendered(SGLangEngine(), {"sglang", "sim"}, version) + rendered_nodes(SGLangEngine(), version, "--tp")
    assert commands
    v = tuple(int(x) for x in version.split("."))
    refused = (["--model-path", "/models/m", "--cuda-graph-max-bs", "32"] if v >= (0, 5, 20) else
               ["--model-path", "/models/m", "--cuda-graph-max-bs-decode", "32"] if v < (0, 5, 14) else None)
    argvs = [argv for _, argv in commands] + ([refused] if refused else [])
    results = parse_with_release("sglang", version, argvs, parser_python)
    for (what, argv), result in zip(commands, results, strict=False):
        assert result["ok"], f"SGLang {version} refuses {what} ({' '.join(argv)}): {result.get('error')}"
    if refused:
        assert not results[-1]["ok"], f"SGLang {version} accepts {refused[2]}, which servetune refuses for it"


@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_vllm_release_parses_every_rendered_command(version: str, parser_python: Path) -> None:
    commands = rendered(VLLMEngine(), {"vllm"}, version)
    if tuple(int(x) for x in version.split(".")) >= MULTI_NODE_SINCE:
        commands += rendered_nodes(VLLMEngine(), version, "--tensor-parallel-size")
    assert commands
    v = tuple(int(x) for x in version.split("."))
    refused = (["--model", "/models/m", "--max-cudagraph-capture-size", "64"] if v < (0, 11, 1) else
               ["--model", "/models/m", "--cuda-graph-sizes", "64"] if v >= (0, 33, 0) else None)
    argvs = [argv for _, argv in commands] + ([refused] if refused else [])
    results = parse_with_release("vllm", version, argvs, parser_python)
    for (what, argv), result in zip(commands, results, strict=False):
        assert result["ok"], f"vLLM {version} refuses {what} ({' '.join(argv)}): {result.get('error')}"
    if refused:
        assert not results[-1]["ok"], f"vLLM {version} accepts {refused[2]}, which servetune refuses for it"
