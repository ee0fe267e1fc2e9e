"""``runners.engines.sglang_memory``: SGLang's default reserve, one test per release boundary.

Each test quotes the released wheel's line it follows (``pip download --no-deps sglang==X``, unzip, the file and
line named in the comment), on both sides of the boundary.
"""

from __future__ import annotations

import pytest

from runners.engines.sglang_memory import default_memory, memory_tiers, reserved_055, speculative_reserve_mib

H200 = 143771  # MiB, nvidia-smi memory.total
H100 = 81559
RTX4090 = 24564


def test_052_keeps_a_fixed_reserve_and_053_estimates_it() -> None:
    # srt/server_args.py:477@v0.5.2 (H200 tier): `reserved_mem = (12 + parallel_size / 2) * 1024`
    assert default_memory("0.5.2", H200, 8).reserved_mib == (12 + 8 / 2) * 1024
    # srt/server_args.py:639-661@v0.5.3: `reserved_mem = 512`, `+= max(self.chunked_prefill_size, 2048) * 1.5`,
    # `+= self.cuda_graph_max_bs * 2`, `+= self.tp_size * self.pp_size / 8 * 1024`,
    # `reserved_mem = max(reserved_mem, 10 * 1024)` on cards over 60 GiB; H200 TP8 tier: 8192 and 512 graphs.
    assert default_memory("0.5.3", H200, 8).reserved_mib == max(512 + 8192 * 1.5 + 512 * 2 + 8 / 8 * 1024, 10 * 1024)


def test_052_sets_8_or_80_graphs_only_below_35_gib() -> None:
    # srt/server_args.py:522-527@v0.5.2: `if gpu_mem is not None and gpu_mem < 35 * 1024:` ...
    # `self.cuda_graph_max_bs = 8` / `= 80`; otherwise cuda_graph_runner.py:174@v0.5.2 captures
    # `[1, 2, 4, 8] + list(range(16, 161, 8))`, `+= list(range(160, 257, 8))` above 90 GiB.
    assert default_memory("0.5.2", RTX4090, 2).cuda_graph_max_bs == 8
    assert default_memory("0.5.2", RTX4090, 4).cuda_graph_max_bs == 80
    assert default_memory("0.5.2", H100, 4).cuda_graph_max_bs == 160
    assert default_memory("0.5.2", H200, 8).cuda_graph_max_bs == 256


def test_055_captures_24_instead_of_16_below_35_gib() -> None:
    # srt/server_args.py:695@v0.5.4 `self.cuda_graph_max_bs = 16` (tp < 4, gpu_mem < 35 GiB);
    # srt/server_args.py@v0.5.5, same branch: `self.cuda_graph_max_bs = 24`.
    assert memory_tiers((0, 5, 4), RTX4090)[1] == 16
    assert memory_tiers((0, 5, 5), RTX4090)[1] == 24
    assert default_memory("0.5.4", RTX4090, 1).cuda_graph_max_bs == 16
    assert default_memory("0.5.5", RTX4090, 1).cuda_graph_max_bs == 24


def test_speculative_reserve_is_2_gib_then_4_then_none() -> None:
    # srt/server_args.py:669@v0.5.3 and :817@v0.5.5 `elif self.speculative_algorithm != "NGRAM":` ...
    # `reserved_mem += 2 * 1024`; srt/server_args.py:1322@v0.5.10 `reserved_mem += 4 * 1024`;
    # srt/server_args.py@v0.5.14: the speculative branch is gone.
    args = ("--speculative-algorithm", "EAGLE")
    for version, extra in (("0.5.5", 2048), ("0.5.9", 2048), ("0.5.10", 4096), ("0.5.13", 4096), ("0.5.14", 0),
                           ("0.5.23", 0)):
        plain = default_memory(version, H200, 8).reserved_mib
        spec = default_memory(version, H200, 8, fixed_args=args).reserved_mib
        # 0.5.10+ reserves prefill CUDA graphs only without speculative decoding (1.5 GiB for MLA).
        graphs = 1.5 * 1024 if version not in ("0.5.5", "0.5.9") else 0
        assert spec - plain == pytest.approx(extra - graphs if plain > 10 * 1024 else extra), version
    # srt/server_args.py:812-814@v0.5.5 `if self.speculative_algorithm == "STANDALONE":` `reserved_mem += 6 * 1024`
    assert speculative_reserve_mib((0, 5, 5), "STANDALONE") == 6 * 1024
    assert speculative_reserve_mib((0, 5, 5), "NGRAM") == 0
    # srt/server_args.py:486-492@v0.5.2: any algorithm but STANDALONE adds 2 GiB, NGRAM included.
    assert speculative_reserve_mib((0, 5, 2), "NGRAM") == 2 * 1024


def test_deepep_all_to_all_reserve_after_the_floor_from_0515() -> None:
    # srt/server_args.py@v0.5.15, after `reserved_mem = max(reserved_mem, 10 * 1024)`: "DeepEP all-to-all buffers
    # captured in the decode graph are real extra allocations" ... `reserved_mem += 2 * 1024`
    # (srt/arg_groups/memory_hook.py:404-414@v0.5.23 `reserve_for_deepep_a2a_mb`: `return 2 * 1024`).
    base = 512 + 8192 * 1.5 + 512 * 2 + 8 / 8 * 1024
    assert reserved_055(H200, 8192, 512, 8, version=(0, 5, 14), deepep_a2a=True) == base
    assert reserved_055(H200, 8192, 512, 8, version=(0, 5, 15), deepep_a2a=True) == base + 2048
    # after the floor: a reserve under 10 GiB is floored first, then the 2 GiB added
    assert reserved_055(H100, 2048, 8, 1, version=(0, 5, 20), deepep_a2a=True) == 10 * 1024 + 2048
    args = ("--moe-a2a-backend", "deepep")
    assert (default_memory("0.5.15", H200, 8, fixed_args=args).reserved_mib
            - default_memory("0.5.15", H200, 8).reserved_mib) == 2048
    assert (default_memory("0.5.14", H200, 8, fixed_args=args).reserved_mib
            == default_memory("0.5.14", H200, 8).reserved_mib)


def test_0520_moves_the_small_card_tier() -> None:
    # srt/arg_groups/memory_hook.py@v0.5.19, gpu_mem < 35 * 1024: chunked 2048, max_bs 24 / 80;
    # srt/arg_groups/memory_hook.py@v0.5.20: chunked 4096, max_bs 48 / 160.
    assert memory_tiers((0, 5, 19), RTX4090) == (2048, 24, 80)
    assert memory_tiers((0, 5, 20), RTX4090) == (4096, 48, 160)
