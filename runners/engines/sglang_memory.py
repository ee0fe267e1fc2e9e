"""SGLang's own default for ``--mem-fraction-static``, computed before a launch (sglang-facts §1.3).

SGLang fills in ``mem_fraction_static`` from the card's memory (``nvidia-smi --query-gpu=memory.total``,
the smallest card) by keeping a *reserve* out of the static pool for activations and CUDA-graph buffers::

    mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3)

0.5.2-0.5.4 reserve a fixed amount per memory tier and parallel size; 0.5.5 onwards estimate it from
the chunked-prefill size, the largest captured batch size and the parallel size (plus the prefill CUDA
graphs from 0.5.10). The figures are MiB, as SGLang computes them.

servetune's first launch uses this arithmetic with the reserve multiplied by a safety factor
(:data:`search.sampling.PROBE_RESERVE_FACTOR`): SGLang's reserve is an estimate, and on seed 003's host
its own default (0.85) dies in CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runners.engines.common import Version, flag_value, parse_version

__all__ = ["MemoryDefaults", "default_memory", "memory_tiers", "reserved_055", "reserved_before_055"]

#: 0.5.10+: the prefill CUDA graphs' reserve; 1.5 GiB for MLA models, ``8 MiB * len(token sizes)``
#: otherwise. Before a launch the attention kind is not known: the larger (MLA) figure is taken.
_PREFILL_GRAPH_MIB = 1.5 * 1024


@dataclass(frozen=True)
class MemoryDefaults:
    """What SGLang would fill in: the chunked-prefill size, the largest captured batch size, the reserve
    (MiB) and the resulting ``mem_fraction_static`` (before rounding to a space's grid)."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float
    mem_fraction_static: float


def memory_tiers(v: Version, gpu_mem: float) -> tuple[int, int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs for tp < 4, for tp >= 4) from 0.5.5 (§1.3 table)."""
    if gpu_mem < 20 * 1024:
        return 2048, 8, 8
    if gpu_mem < 35 * 1024:
        return (4096, 48, 160) if v >= (0, 5, 20) else (2048, 24, 80)
    if gpu_mem < 60 * 1024:
        return 4096, 32, 160
    if gpu_mem < 160 * 1024:
        return 8192, 256, 512
    return 16384, 512, 512


def reserved_before_055(gpu_mem: float, parallel: int, *, speculative: str | None = None,
                        dp_attention: bool = False) -> float:
    """The reserve (MiB) SGLang 0.5.2-0.5.4 keeps out of ``mem_fraction_static``: per memory tier and
    parallel size (tp x pp), more with speculative decoding or DP attention."""
    if gpu_mem < 35 * 1024:
        reserved = (2.8 + parallel / 10) * 1024
    elif gpu_mem < 90 * 1024:
        reserved = (9.5 + parallel / 2) * 1024
    elif gpu_mem < 160 * 1024:
        reserved = (12 + parallel / 2) * 1024
    else:
        reserved = 32 * 1024
    if speculative:
        reserved += (6 if speculative.upper() == "STANDALONE" else 2) * 1024
    if dp_attention:
        reserved += 4 * 1024
    return reserved


def reserved_055(gpu_mem: float, prefill_tokens: int, max_bs: int, parallel: int, *,
                 dp_size: int | None = None, prefill_graph_mib: float = 0.0,
                 speculative: str | None = None) -> float:
    """The reserve (MiB) SGLang 0.5.5+ keeps out of ``mem_fraction_static``: from the chunked-prefill size
    (``prefill_tokens``), the largest captured batch size and the parallel size; ``dp_size`` with DP
    attention, ``prefill_graph_mib`` for the prefill CUDA graphs (0.5.10+), more with speculative decoding."""
    reserved = 512 + max(prefill_tokens, 2048) * 1.5 + max_bs * 2 + parallel / 8 * 1024
    if dp_size is not None:
        reserved += max_bs * dp_size * 3 + (max_bs * dp_size * 1.5 if max_bs > 300 else 0)
    reserved += prefill_graph_mib
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative and speculative.upper() != "NGRAM":
        reserved += (6 if speculative.upper() == "STANDALONE" else 4) * 1024
    return reserved


def default_memory(version: str, gpu_mem_mib: float, tp_size: int, *, fixed_args: Sequence[str] = (),
                   cuda_graph_max_bs: int | None = None, reserve_factor: float = 1.0) -> MemoryDefaults:
    """SGLang ``version``'s defaults on a card of ``gpu_mem_mib`` at tensor parallel ``tp_size``, with the
    reserve multiplied by ``reserve_factor``. ``fixed_args`` may set ``--chunked-prefill-size``,
    ``--pp-size``, ``--enable-dp-attention``/``--dp-size``, ``--speculative-algorithm``; a given
    ``cuda_graph_max_bs`` replaces the tier's."""
    v = parse_version(version)
    pp = int(flag_value(fixed_args, "--pp-size", "--pipeline-parallel-size") or 1)
    ps = tp_size * pp
    chunked_arg = flag_value(fixed_args, "--chunked-prefill-size")
    if v < (0, 5, 5):
        chunked = int(chunked_arg) if chunked_arg else 2048 if gpu_mem_mib < 35 * 1024 else (
            8192 if gpu_mem_mib < 160 * 1024 else 16384)
        max_bs = cuda_graph_max_bs or (8 if tp_size < 4 else 80)
        reserved = reserved_before_055(gpu_mem_mib, ps, speculative=flag_value(fixed_args, "--speculative-algorithm"),
                                       dp_attention="--enable-dp-attention" in fixed_args)
    else:
        tier_chunked, bs_small, bs_large = memory_tiers(v, gpu_mem_mib)
        chunked = int(chunked_arg) if chunked_arg else tier_chunked
        max_bs = cuda_graph_max_bs or (bs_small if tp_size < 4 else bs_large)
        dp_attention = "--enable-dp-attention" in fixed_args
        spec = flag_value(fixed_args, "--speculative-algorithm")
        prefill_graphs = (v >= (0, 5, 10) and not dp_attention and not spec
                          and not {"--disable-piecewise-cuda-graph", "--disable-cuda-graph",
                                   "--enable-torch-compile"} & set(fixed_args))
        reserved = reserved_055(gpu_mem_mib, chunked, max_bs, ps,
                                dp_size=int(flag_value(fixed_args, "--dp-size", "--dp") or 1) if dp_attention else None,
                                prefill_graph_mib=_PREFILL_GRAPH_MIB if prefill_graphs else 0.0, speculative=spec)
    reserved *= reserve_factor
    mfs = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return MemoryDefaults(chunked, max_bs, reserved, mfs)
