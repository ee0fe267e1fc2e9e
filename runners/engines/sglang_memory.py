"""SGLang's own default for ``--mem-fraction-static``, computed before a launch, release by release.

SGLang fills in ``mem_fraction_static`` from the card's memory (``nvidia-smi --query-gpu=memory.total``,
the smallest card) by keeping a *reserve* out of the static pool for activations and CUDA-graph buffers::

    mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3)

How the reserve is computed changed over the releases; each boundary below was read in the released wheel
(``pip download --no-deps sglang==X``; ``srt/server_args.py``, from 0.5.19 ``srt/arg_groups/memory_hook.py``)
and ``tests/runners/test_sglang_memory.py`` quotes the line of each:

* 0.5.2: a fixed reserve per memory tier and parallel size; chunked prefill 2k/8k/16k; ``cuda_graph_max_bs``
  8 (TP < 4) or 80 only on cards below 35 GiB, else the graph runner's own list up to 160.
* 0.5.3: the reserve is estimated from the chunked-prefill size, the largest captured batch size and the
  parallel size, after a per-tier table of both (``memory_tiers``); speculative decoding adds 2 GiB.
* 0.5.5: the < 35 GiB tier captures 24 (TP < 4) instead of 16.
* 0.5.10: prefill CUDA graphs reserve (on by default, engine-audit #8); speculative decoding adds 4 GiB.
* 0.5.14: no speculative reserve any more.
* 0.5.15: the DeepEP all-to-all buffers add 2 GiB after the 10 GiB floor.
* 0.5.20: the < 35 GiB tier moves to chunked 4096 and 48 / 160 graphs.

The figures are MiB, as SGLang computes them. servetune's first launch uses this arithmetic with the reserve
multiplied by a safety factor (:data:`search.sampling.PROBE_RESERVE_FACTOR`): SGLang's reserve is an estimate, and
on seed 003's host its own default (0.85) dies in CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runners.engines.common import Version, flag_value, parse_version

__all__ = [
    "DEEPEP_A2A_RESERVE_SINCE", "ESTIMATED_RESERVE_SINCE", "MemoryDefaults", "default_memory", "memory_tiers",
    "reserved_055", "reserved_before_055", "speculative_reserve_mib",
]

ESTIMATED_RESERVE_SINCE: Version = (0, 5, 3)
"""First release that estimates the reserve (``reserved_mem = 512`` + activations + graphs, server_args.py:639
@v0.5.3); 0.5.2 keeps a fixed one per tier (server_args.py:468@v0.5.2)."""
PREFILL_GRAPHS_SINCE: Version = (0, 5, 10)
DEEPEP_A2A_RESERVE_SINCE: Version = (0, 5, 15)
"""First release that adds the DeepEP all-to-all reserve after the floor (server_args.py@v0.5.15, "DeepEP
all-to-all buffers captured in the decode graph are real extra allocations")."""

#: 0.5.10+: the prefill CUDA graphs' reserve; 1.5 GiB for MLA models, ``8 MiB * len(token sizes)``
#: otherwise. Before a launch the attention kind is not known: the larger (MLA) figure is taken.
_PREFILL_GRAPH_MIB = 1.5 * 1024

#: (first release, last release, MiB) an EAGLE-style draft adds to the reserve; STANDALONE adds 6 GiB in the
#: same releases and NGRAM nothing; from 0.5.14 nothing at all.
_SPECULATIVE_MIB: tuple[tuple[Version, Version, float], ...] = (
    ((0, 0, 0), (0, 5, 9), 2 * 1024),
    ((0, 5, 10), (0, 5, 13), 4 * 1024),
)


@dataclass(frozen=True)
class MemoryDefaults:
    """What SGLang would fill in: the chunked-prefill size, the largest captured batch size, the reserve
    (MiB) and the resulting ``mem_fraction_static`` (before rounding to a space's grid)."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float
    mem_fraction_static: float


def memory_tiers(v: Version, gpu_mem: float) -> tuple[int, int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs for tp < 4, for tp >= 4) from 0.5.3 (the release's tier table)."""
    if gpu_mem < 20 * 1024:
        return 2048, 8, 8
    if gpu_mem < 35 * 1024:
        if v >= (0, 5, 20):
            return 4096, 48, 160
        return (2048, 24, 80) if v >= (0, 5, 5) else (2048, 16, 80)
    if gpu_mem < 60 * 1024:
        return 4096, 32, 160
    if gpu_mem < 160 * 1024:
        return 8192, 256, 512
    return 16384, 512, 512


def speculative_reserve_mib(v: Version, speculative: str | None) -> float:
    """What speculative decoding adds to the reserve (MiB) in release ``v``."""
    if not speculative or (speculative.upper() == "NGRAM" and v >= ESTIMATED_RESERVE_SINCE):
        return 0.0
    for low, high, mib in _SPECULATIVE_MIB:
        if low <= v <= high:
            return 6 * 1024 if speculative.upper() == "STANDALONE" else mib
    return 0.0


def reserved_before_055(gpu_mem: float, parallel: int, *, speculative: str | None = None,
                        dp_attention: bool = False) -> float:
    """The reserve (MiB) SGLang 0.5.2 keeps out of ``mem_fraction_static``: per memory tier and parallel size
    (tp x pp), more with speculative decoding or DP attention (the name keeps the boundary servetune first used;
    the estimated reserve starts at :data:`ESTIMATED_RESERVE_SINCE`)."""
    if gpu_mem < 35 * 1024:
        reserved = (2.8 + parallel / 10) * 1024
    elif gpu_mem < 90 * 1024:
        reserved = (9.5 + parallel / 2) * 1024
    elif gpu_mem < 160 * 1024:
        reserved = (12 + parallel / 2) * 1024
    else:
        reserved = 32 * 1024
    reserved += speculative_reserve_mib((0, 5, 2), speculative)
    if dp_attention:
        reserved += 4 * 1024
    return reserved


def reserved_055(gpu_mem: float, prefill_tokens: int, max_bs: int, parallel: int, *,
                 version: Version = (0, 5, 10), dp_size: int | None = None, prefill_graph_mib: float = 0.0,
                 speculative: str | None = None, deepep_a2a: bool = False) -> float:
    """The reserve (MiB) SGLang 0.5.3+ keeps out of ``mem_fraction_static``: from the chunked-prefill size
    (``prefill_tokens``), the largest captured batch size and the parallel size; ``dp_size`` with DP attention,
    ``prefill_graph_mib`` for the prefill CUDA graphs (0.5.10+), the speculative draft as ``version`` has it, and
    the DeepEP all-to-all buffers (``deepep_a2a``, 0.5.15+) after the 10 GiB floor."""
    reserved = 512 + max(prefill_tokens, 2048) * 1.5 + max_bs * 2 + parallel / 8 * 1024
    if dp_size is not None:
        reserved += max_bs * dp_size * 3 + (max_bs * dp_size * 1.5 if max_bs > 300 else 0)
    reserved += prefill_graph_mib
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if deepep_a2a and version >= DEEPEP_A2A_RESERVE_SINCE:
        reserved += 2 * 1024
    return reserved + speculative_reserve_mib(version, speculative)


def _runner_max_bs_052(gpu_mem: float, tp_size: int) -> int:
    """0.5.2's largest captured batch size by default: server_args sets 8 / 80 only below 35 GiB
    (server_args.py:522@v0.5.2 ``if gpu_mem is not None and gpu_mem < 35 * 1024``); above, cuda_graph_runner.py's
    own list runs to 160, to 256 above 90 GiB and to 512 above 160 GB (cuda_graph_runner.py:174-190@v0.5.2)."""
    if gpu_mem < 35 * 1024:
        return 8 if tp_size < 4 else 80
    if gpu_mem > 160 * 1000:
        return 512
    return 256 if gpu_mem > 90 * 1024 else 160


def default_memory(version: str, gpu_mem_mib: float, tp_size: int, *, fixed_args: Sequence[str] = (),
                   cuda_graph_max_bs: int | None = None, reserve_factor: float = 1.0) -> MemoryDefaults:
    """SGLang ``version``'s defaults on a card of ``gpu_mem_mib`` at tensor parallel ``tp_size``, with the
    reserve multiplied by ``reserve_factor``. ``fixed_args`` may set ``--chunked-prefill-size``,
    ``--pp-size``, ``--enable-dp-attention``/``--dp-size``, ``--speculative-algorithm``,
    ``--moe-a2a-backend``; a given ``cuda_graph_max_bs`` replaces the tier's."""
    v = parse_version(version)
    pp = int(flag_value(fixed_args, "--pp-size", "--pipeline-parallel-size") or 1)
    ps = tp_size * pp
    chunked_arg = flag_value(fixed_args, "--chunked-prefill-size")
    spec = flag_value(fixed_args, "--speculative-algorithm")
    dp_attention = "--enable-dp-attention" in fixed_args
    if v < ESTIMATED_RESERVE_SINCE:
        chunked = int(chunked_arg) if chunked_arg else 2048 if gpu_mem_mib < 35 * 1024 else (
            8192 if gpu_mem_mib < 160 * 1024 else 16384)
        max_bs = cuda_graph_max_bs or _runner_max_bs_052(gpu_mem_mib, tp_size)
        reserved = reserved_before_055(gpu_mem_mib, ps, speculative=spec, dp_attention=dp_attention)
    else:
        tier_chunked, bs_small, bs_large = memory_tiers(v, gpu_mem_mib)
        chunked = int(chunked_arg) if chunked_arg else tier_chunked
        max_bs = cuda_graph_max_bs or (bs_small if tp_size < 4 else bs_large)
        prefill_graphs = (v >= PREFILL_GRAPHS_SINCE and not dp_attention and not spec
                          and not {"--disable-piecewise-cuda-graph", "--disable-cuda-graph",
                                   "--enable-torch-compile"} & set(fixed_args))
        deepep = (flag_value(fixed_args, "--moe-a2a-backend") == "deepep"
                  and "--disable-cuda-graph" not in fixed_args)
        reserved = reserved_055(gpu_mem_mib, chunked, max_bs, ps, version=v,
                                dp_size=int(flag_value(fixed_args, "--dp-size", "--dp") or 1) if dp_attention else None,
                                prefill_graph_mib=_PREFILL_GRAPH_MIB if prefill_graphs else 0.0, speculative=spec,
                                deepep_a2a=deepep)
    reserved *= reserve_factor
    mfs = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return MemoryDefaults(chunked, max_bs, reserved, mfs)
