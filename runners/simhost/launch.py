"""SGLang launch flags for the emulated version, parsed into a frozen :class:`SimLaunch`.

The parser is a real ``argparse.ArgumentParser`` with ``allow_abbrev`` on, like SGLang's, so unique
prefixes work and ambiguous ones fail with argparse's own text and exit code 2. Which flags exist
depends on the emulated SGLang version (sglang-facts §1.1-1.2):

* up to 0.5.13: ``--cuda-graph-max-bs``, ``--cuda-graph-bs``, ``--disable-cuda-graph`` (and from 0.5.10
  ``--disable-piecewise-cuda-graph``, ``--piecewise-cuda-graph-max-tokens``);
* 0.5.14 - 0.5.19: the ``-decode``/``-prefill`` flags, with the old ones kept as deprecated aliases
  (engine-audit item 6: the new flags appear in 0.5.14, not 0.5.15);
* 0.5.20 and later: the old ``--cuda-graph-max-bs``/``--cuda-graph-bs`` are gone, so
  ``--cuda-graph-max-bs 16`` is an *ambiguous option* (it prefixes ``--cuda-graph-max-bs-decode`` and
  ``--cuda-graph-max-bs-prefill``).

A version between two releases that sglang-facts checked behaves like the older checked release.
Flags that only matter to a real engine (``--dtype``, ``--quantization`` ...) are accepted and echoed
back in ``/get_server_info`` without effect.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "DEFAULT_VERSION",
    "BadFlag",
    "SimLaunch",
    "Version",
    "build_parser",
    "emulated_version",
    "parse_version",
    "relevant_env",
]

Version = tuple[int, int, int]
DEFAULT_VERSION = "0.5.10"
ENV_VERSION = "SERVETUNE_SIM_VERSION"

# First release (as checked in sglang-facts) with each behaviour.
V_NEW_CG_FLAGS: Version = (0, 5, 14)  # --cuda-graph-max-bs-decode & co. (engine-audit item 6)
V_OLD_CG_GONE: Version = (0, 5, 20)  # --cuda-graph-max-bs / --cuda-graph-bs removed
V_HUMAN_INT: Version = (0, 5, 10)
V_PROG_SERVE: Version = (0, 5, 20)

_KV_DTYPES: list[tuple[Version, list[str]]] = [
    ((0, 5, 23), ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]),
    ((0, 5, 10), ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]),
    ((0, 0, 0), ["auto", "fp8_e5m2", "fp8_e4m3"]),
]
_ATTN: list[tuple[Version, list[str]]] = [
    (
        (0, 5, 23),
        [
            "triton",
            "torch_native",
            "flex_attention",
            "dsa",
            "nsa",
            "qsa",
            "dsv4",
            "compressed",
            "fa3",
            "fa4",
            "flashinfer",
            "llada2_cfg_flashinfer",
            "flashmla",
            "trtllm_mla",
            "cutedsl_mla",
            "tokenspeed_mla",
            "trtllm_mha",
            "hpc_ops",
            "minicpm_flashattn",
            "minicpm_flashinfer",
            "aiter",
            "wave",
            "intel_amx",
            "ascend",
            "intel_xpu",
        ],
    ),
    (
        (0, 5, 10),
        [
            "triton",
            "torch_native",
            "flex_attention",
            "nsa",
            "cutlass_mla",
            "fa3",
            "fa4",
            "flashinfer",
            "flashmla",
            "trtllm_mla",
            "trtllm_mha",
            "dual_chunk_flash_attn",
            "aiter",
            "wave",
            "intel_amx",
            "ascend",
            "intel_xpu",
        ],
    ),
    (
        (0, 0, 0),
        [
            "triton",
            "torch_native",
            "cutlass_mla",
            "fa3",
            "flashinfer",
            "flashmla",
            "trtllm_mla",
            "trtllm_mha",
            "dual_chunk_flash_attn",
            "hybrid_linear_attn",
            "aiter",
            "wave",
            "intel_amx",
            "ascend",
        ],
    ),
]
_MOE: list[tuple[Version, list[str]]] = [
    (
        (0, 5, 23),
        [
            "auto",
            "deep_gemm",
            "triton",
            "triton_kernel",
            "flashinfer_trtllm",
            "flashinfer_trtllm_routed",
            "flashinfer_cutlass",
            "flashinfer_mxfp4",
            "flashinfer_cutedsl",
            "cutlass",
            "experimental_sgl_trtllm",
            "flashinfer_megamoe",
            "aiter",
            "marlin",
            "humming",
            "experimental_sgl_marlin",
            "lora_cutedsl",
            "lora_triton",
            "lora_marlin",
            "hpc_ops",
            "megamoe",
            "intel_xpu",
        ],
    ),
    (
        (0, 5, 10),
        [
            "auto",
            "deep_gemm",
            "triton",
            "triton_kernel",
            "flashinfer_trtllm",
            "flashinfer_trtllm_routed",
            "flashinfer_cutlass",
            "flashinfer_mxfp4",
            "flashinfer_cutedsl",
            "cutlass",
        ],
    ),
    (
        (0, 0, 0),
        ["auto", "triton", "triton_kernel", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_mxfp4"],
    ),
]

_ENV_PREFIXES = ("NCCL_", "SGLANG_", "PYTORCH_CUDA_ALLOC_CONF")


class BadFlag(Exception):
    """The command line is rejected the way argparse rejects it: ``text`` is what goes to stderr."""

    def __init__(self, text: str, exit_code: int = 2) -> None:
        super().__init__(text.strip().splitlines()[-1] if text.strip() else "bad flag")
        self.text = text
        self.exit_code = exit_code


def parse_version(text: str) -> Version:
    """``"0.5.10"`` (also ``v0.5.10``, ``0.5.10.post1``) -> ``(0, 5, 10)``."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", text.strip())
    if not m:
        raise ValueError(f"not an SGLang version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def emulated_version(cli: str | None, env: Mapping[str, str]) -> str:
    """The SGLang version to emulate: ``--sim-version``, else ``$SERVETUNE_SIM_VERSION``, else the default.

    Raises ``ValueError`` (from :func:`parse_version`) if it is not a version.
    """
    version = cli or env.get(ENV_VERSION) or DEFAULT_VERSION
    parse_version(version)
    return version


def _prog(v: Version) -> str:
    """argparse's ``prog`` for the emulated version: the name in usage and error lines."""
    return "sglang serve" if v >= V_PROG_SERVE else "launch_server.py"


def _choices(table: list[tuple[Version, list[str]]], v: Version) -> list[str]:
    for since, names in table:
        if v >= since:
            return names
    return table[-1][1]


def _human_int(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise ValueError(text)
    mult = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3}[m.group(2).lower()]
    return int(m.group(1)) * mult


_human_int.__name__ = "human_readable_int"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors can be raised as :class:`BadFlag` instead of exiting."""

    def __init__(self, *args: Any, raise_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._raise_errors = raise_errors

    def error(self, message: str) -> NoReturn:
        if self._raise_errors:
            raise BadFlag(f"{self.format_usage()}{self.prog}: error: {message}\n")
        super().error(message)


@cache
def _refusing_parser(version: str) -> argparse.ArgumentParser:
    """The ``raise_errors`` parser of ``version``, built once (building it is most of a pure-model call; a parse
    leaves the parser as it was: every default is an immutable value)."""
    return build_parser(version, raise_errors=True)


def build_parser(
    version: str = DEFAULT_VERSION, *, raise_errors: bool = False, sim_flags: bool = False
) -> argparse.ArgumentParser:
    """The ``launch_server`` parser of the emulated SGLang ``version``.

    ``sim_flags`` adds the simulator's own ``--sim-*`` flags (hidden from usage); ``raise_errors``
    turns argparse errors into :class:`BadFlag` rather than printing and exiting 2.
    """
    v = parse_version(version)
    p = _Parser(prog=_prog(v), raise_errors=raise_errors, add_help=not raise_errors)
    hint = _human_int if v >= V_HUMAN_INT else int

    a = p.add_argument
    a("--model-path", "--model", dest="model_path", type=str, required=True)
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto")
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--dtype", type=str, default="auto")
    a("--quantization", type=str, default=None)
    a("--revision", type=str, default=None)
    a("--download-dir", type=str, default=None)
    a("--context-length", type=int, default=None)
    a("--is-embedding", action="store_true")
    a("--served-model-name", type=str, default=None)
    a("--chat-template", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    a("--tool-call-parser", type=str, default=None)
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", type=str, default=None)
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=hint, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=hint, default=16384)
    a("--schedule-policy", type=str, default="fcfs")
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=None)
    a("--tensor-parallel-size", "--tp-size", "--tp", dest="tp_size", type=int, default=1)
    a("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
    a("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
    a("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    a("--dist-timeout", type=int, default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--kv-cache-dtype", type=str, default="auto", choices=_choices(_KV_DTYPES, v))
    a("--attention-backend", type=str, default=None, choices=_choices(_ATTN, v))
    a("--moe-runner-backend", type=str, default="auto", choices=_choices(_MOE, v))
    a("--random-seed", type=int, default=None)
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--log-requests", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--enable-metrics", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    a("--skip-server-warmup", action="store_true")
    a("--disable-radix-cache", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--stream-interval", type=int, default=1)
    a("--num-continuous-decode-steps", type=int, default=1)
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-symm-mem", action="store_true")
    a("--enable-nccl-nvls", action="store_true")
    a("--enable-hierarchical-cache", action="store_true")
    a("--hicache-ratio", type=float, default=2.0)
    a("--hicache-size", type=int, default=0)
    a("--swa-full-tokens-ratio", type=float, default=0.8)
    a("--speculative-algorithm", type=str, default=None)
    a("--speculative-draft-model-path", type=str, default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--cpu-offload-gb", type=int, default=0)
    a("--json-model-override-args", type=str, default="{}")

    if v < V_NEW_CG_FLAGS:
        a("--cuda-graph-max-bs", type=int, default=None)
        a("--cuda-graph-bs", type=int, nargs="+", default=None)
        a("--disable-cuda-graph", action="store_true")
        if v >= (0, 5, 10):
            a("--disable-piecewise-cuda-graph", action="store_true")
            a("--piecewise-cuda-graph-max-tokens", type=int, default=None)
        elif v >= (0, 5, 5):
            a("--enable-piecewise-cuda-graph", action="store_true")
    else:
        a("--cuda-graph-backend-decode", type=str, default="full", choices=["full", "breakable", "disabled"])
        a("--cuda-graph-backend-prefill", type=str, default="full", choices=["full", "breakable", "disabled"])
        a("--cuda-graph-max-bs-decode", type=int, default=None)
        a("--cuda-graph-max-bs-prefill", type=int, default=None)
        a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
        a("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
        a("--disable-decode-cuda-graph", action="store_true")
        a("--disable-prefill-cuda-graph", action="store_true")
        a("--disable-cuda-graph", dest="deprecated_disable_cuda_graph", action="store_true")
        if v < V_OLD_CG_GONE:
            a(
                "--cuda-graph-max-bs",
                dest="cuda_graph_max_bs_decode",
                type=int,
                help="Deprecated alias for --cuda-graph-max-bs-decode.",
            )
            a(
                "--cuda-graph-bs",
                dest="cuda_graph_bs_decode",
                type=int,
                nargs="+",
                help="Deprecated alias for --cuda-graph-bs-decode.",
            )

    _add_release_flags(p, v)
    if sim_flags:
        hidden = argparse.SUPPRESS
        a("--sim-profile", type=str, required=True, help=hidden)
        a("--sim-speed", type=float, default=None, help=hidden)
        a("--sim-version", type=str, default=None, help=hidden)
        a("--sim-seed", type=int, default=None, help=hidden)
        a("--sim-ignore-sigterm", action="store_true", default=None, help=hidden)
        a("--sim-state-dir", type=str, default=None, help=hidden)
    return p


#: SGLang's flag tables, made from each release's own parser (``runners/engines/data``, ``make flag-tables``).
_FLAG_TABLES = Path(__file__).resolve().parents[1] / "engines" / "data" / "flags-sglang.json"
_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


@cache
def _release_flags(v: Version) -> dict[str, dict[str, Any]]:
    """The flags of the tabled SGLang release that answers for ``v`` (the newest at or below it)."""
    if not _FLAG_TABLES.exists():
        return {}
    releases = json.loads(_FLAG_TABLES.read_text())["releases"]
    tabled = sorted(releases, key=parse_version)
    older = [r for r in tabled if parse_version(r) <= v] or tabled[:1]
    return dict(releases[older[-1]]["flags"]) if older else {}


def _add_release_flags(p: argparse.ArgumentParser, v: Version) -> None:
    """Every flag the real release has that the emulation does not spell out: accepted (and echoed in
    ``/get_server_info``) without effect, with the release's own type and choices, so a space may search any
    SGLang flag on the simulated host and a flag SGLang would refuse is refused here too."""
    taken = {a.dest for a in p._actions}  # argparse has no public list of its actions
    known = set(p._option_string_actions)
    for name, spec in _release_flags(v).items():
        dest = spec.get("dest") or name.lstrip("-").replace("-", "_")
        if name in known or dest in taken:
            continue
        if spec["kind"] == "switch":
            p.add_argument(name, dest=dest, action="store_true")
        elif spec["kind"] == "list":
            p.add_argument(name, dest=dest, nargs="+")
        else:
            kind = _TYPES[spec["kind"]]
            try:
                choices = [kind(c) for c in spec["choices"]] if spec.get("choices") else None
            except ValueError:
                kind, choices = str, spec["choices"]
            p.add_argument(name, dest=dest, type=kind, choices=choices)
        known.add(name)


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change the simulated run (NCCL, SGLang, allocator, GPUs)."""
    out = {k: v for k, v in env.items() if k.startswith(_ENV_PREFIXES)}
    if "CUDA_VISIBLE_DEVICES" in env:
        out["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    return dict(sorted(out.items()))


class SimLaunch(BaseModel):
    """One SGLang launch: the flags as given (``None`` where absent) plus the relevant environment.

    Defaults that SGLang derives from the GPU (mem-fraction-static, chunked prefill, CUDA-graph batch
    sizes) are *not* filled in here; :func:`runners.simhost.model.resolve_args` does that with a profile.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = DEFAULT_VERSION
    model_path: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = Field(default=1, ge=1)
    dp_size: int = Field(default=1, ge=1)
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    page_size: int | None = None
    context_length: int | None = None
    kv_cache_dtype: str = "auto"
    attention_backend: str | None = None
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph: bool = False
    disable_piecewise_cuda_graph: bool = False
    cuda_graph_max_bs_prefill: int | None = None  # prefill graphs' largest token count
    schedule_conservativeness: float = Field(default=1.0, gt=0)
    num_continuous_decode_steps: int = Field(default=1, ge=1)
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    disable_custom_all_reduce: bool = False
    skip_server_warmup: bool = False
    enable_metrics: bool = False
    log_level: str = "info"
    decode_log_interval: int = 40
    enable_dp_attention: bool = False
    speculative_algorithm: str | None = None
    nnodes: int = Field(default=1, ge=1)
    node_rank: int = Field(default=0, ge=0)
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    watchdog_timeout: float = 300.0
    env: dict[str, str] = Field(default_factory=dict)
    args: dict[str, Any] = Field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def version_tuple(self) -> Version:
        return parse_version(self.version)

    @property
    def local_ranks(self) -> int:
        """The TP x DP ranks on this node (SGLang spreads them evenly over ``--nnodes``)."""
        return max(1, self.tp_size * self.dp_size // self.nnodes)

    @property
    def first_rank(self) -> int:
        """The global TP rank of this node's first GPU."""
        return self.node_rank * self.local_ranks

    @classmethod
    def from_argv(
        cls, argv: Sequence[str], env: Mapping[str, str] | None = None, version: str = DEFAULT_VERSION
    ) -> SimLaunch:
        """Parse SGLang flags as the emulated ``version`` would; raise :class:`BadFlag` if it would refuse."""
        ns = _refusing_parser(version).parse_args(list(argv))
        return cls.from_namespace(ns, env or {}, version)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, env: Mapping[str, str], version: str) -> SimLaunch:
        v = parse_version(version)
        raw = {k: val for k, val in vars(ns).items() if not k.startswith("sim_")}
        warnings: list[str] = []
        if v < V_NEW_CG_FLAGS:
            max_bs = raw.get("cuda_graph_max_bs")
            bs = raw.get("cuda_graph_bs")
            prefill_max = raw.get("piecewise_cuda_graph_max_tokens")
            disabled = bool(raw.get("disable_cuda_graph"))
            no_piecewise = bool(raw.get("disable_piecewise_cuda_graph", False)) or (
                (0, 5, 5) <= v < (0, 5, 10) and not raw.get("enable_piecewise_cuda_graph", False)
            )
        else:
            max_bs = raw.get("cuda_graph_max_bs_decode")
            bs = raw.get("cuda_graph_bs_decode")
            prefill_max = raw.get("cuda_graph_max_bs_prefill")
            deprecated = bool(raw.pop("deprecated_disable_cuda_graph", False))
            if deprecated:
                raw["cuda_graph_backend_decode"] = "disabled"
                raw["cuda_graph_backend_prefill"] = "disabled"
                if v >= V_OLD_CG_GONE:
                    warnings.append(
                        "'--disable-cuda-graph' is deprecated and will be removed in a future "
                        "release. Use '--cuda-graph-backend-{decode,prefill}=disabled' instead."
                    )
            if raw.get("disable_decode_cuda_graph"):
                raw["cuda_graph_backend_decode"] = "disabled"
            if raw.get("disable_prefill_cuda_graph"):
                raw["cuda_graph_backend_prefill"] = "disabled"
            disabled = raw.get("cuda_graph_backend_decode") == "disabled"
            no_piecewise = raw.get("cuda_graph_backend_prefill") == "disabled"
        if v < (0, 5, 5):
            no_piecewise = True
        try:
            return cls(
                version=version,
                model_path=raw["model_path"],
                served_model_name=raw.get("served_model_name"),
                host=raw["host"],
                port=raw["port"],
                tp_size=raw["tp_size"],
                dp_size=raw["dp_size"],
                mem_fraction_static=raw["mem_fraction_static"],
                max_running_requests=raw["max_running_requests"],
                max_total_tokens=raw["max_total_tokens"],
                chunked_prefill_size=raw["chunked_prefill_size"],
                max_prefill_tokens=raw["max_prefill_tokens"],
                page_size=raw["page_size"],
                context_length=raw["context_length"],
                kv_cache_dtype=raw["kv_cache_dtype"],
                attention_backend=raw["attention_backend"],
                cuda_graph_max_bs=max_bs,
                cuda_graph_bs=tuple(bs) if bs else None,
                disable_cuda_graph=disabled,
                disable_piecewise_cuda_graph=no_piecewise,
                cuda_graph_max_bs_prefill=prefill_max,
                schedule_conservativeness=raw["schedule_conservativeness"],
                num_continuous_decode_steps=max(1, raw["num_continuous_decode_steps"]),
                enable_torch_compile=raw["enable_torch_compile"],
                torch_compile_max_bs=raw["torch_compile_max_bs"],
                disable_custom_all_reduce=raw["disable_custom_all_reduce"],
                skip_server_warmup=raw["skip_server_warmup"],
                enable_metrics=raw["enable_metrics"],
                log_level=raw["log_level"],
                decode_log_interval=raw["decode_log_interval"],
                enable_dp_attention=raw["enable_dp_attention"],
                speculative_algorithm=raw["speculative_algorithm"],
                nnodes=raw["nnodes"],
                node_rank=raw["node_rank"],
                dist_init_addr=raw["dist_init_addr"],
                dist_timeout=raw["dist_timeout"],
                watchdog_timeout=raw["watchdog_timeout"],
                env=relevant_env(env),
                args=raw,
                warnings=tuple(warnings),
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            flag = "--" + str(err["loc"][0]).replace("_", "-")
            raise BadFlag(f"{_prog(v)}: error: argument {flag}: {err['msg']}\n") from exc
