"""The pure model: seed incidents, SGLang's default resolution per version, flags, NCCL, texts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runners.simhost import texts
from runners.simhost.launch import BadFlag, SimLaunch
from runners.simhost.model import (
    Outcome,
    Workload,
    evaluate,
    predict_from_argv,
    resolve_args,
)
from runners.simhost.profile import ProfileError, SimProfile, load_profile, shipped_profile, shipped_profiles

DSV4 = "dsv4-flash-tp4-rtxpro6000"
NVFP4 = "dsv4-flash-nvfp4-tp4-rtxpro6000"
KIMI = "kimi-k25-tp8-rtxpro6000"


def prof(name: str) -> SimProfile:
    return load_profile(shipped_profile(name))


def predict(
    name: str,
    *flags: str,
    conc: tuple[int, ...] = (1,),
    inp: int = 256,
    out: int = 128,
    env: dict[str, str] | None = None,
    version: str = "0.5.10",
    trust_remote_code: bool = True,
    **wl: Any,
) -> Outcome:
    argv = ["--model-path", "m", *(["--trust-remote-code"] if trust_remote_code else []), *flags]
    workload = Workload(input_len=inp, output_len=out, concurrency=conc, **wl)
    return predict_from_argv(prof(name), argv, env or {}, workload, version=version)


def near(value: float | None, target: float, rel: float = 0.10) -> bool:
    return value is not None and abs(value - target) <= rel * target


# -- profiles -------------------------------------------------------------------------------------------------


def test_shipped_profiles_load() -> None:
    names = {p.stem for p in shipped_profiles()}
    assert {DSV4, NVFP4, KIMI, "llama31-8b-h100", "deepseek-v3-tp8-h200", "qwen3-32b-b200"} <= names
    for path in shipped_profiles():
        assert load_profile(path).name == path.stem


def test_bad_profile_is_one_line_error(tmp_path: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhost: {gpu_name: g}\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: host.gpu_count: Field required"):
        load_profile(bad)


# -- seeds 000 / 002 ------------------------------------------------------------------------------------------


def test_seed_000_002_mfs_085_dies_in_cuda_graph_capture() -> None:
    o = predict(
        DSV4,
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.85",
        "--cuda-graph-max-bs",
        "32",
        "--num-continuous-decode-steps",
        "4",
    )
    assert (o.outcome, o.phase, o.exit_code) == ("oom", "cuda_graph", 137)
    assert o.error is not None and o.error.startswith("Exception: Capture cuda graph failed: CUDA out of memory.")
    m = o.memory
    assert m is not None
    assert near(m.weights_gib, 36.0) and o.resolved is not None and o.resolved["kv_bytes_per_token"] == 16384
    assert near(m.free_after_pool_gib, 12.9)  # "only 12.9 GB of headroom"
    assert near(m.tried_to_allocate_gib, 10.0)  # "~10 GB of contiguous GPU memory"
    assert m.free_at_oom_gib is not None and m.tried_to_allocate_gib is not None
    assert m.free_at_oom_gib > m.tried_to_allocate_gib - 1.6  # fragmentation, not plain exhaustion
    assert all(lv.died_phase == "cuda_graph" for lv in o.levels)


def test_seed_000_002_mfs_070_starts() -> None:
    o = predict(
        DSV4,
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.70",
        "--cuda-graph-max-bs",
        "32",
        "--num-continuous-decode-steps",
        "4",
        conc=(1, 16),
    )
    assert o.outcome == "ok" and o.phase is None
    assert o.memory is not None and o.memory.capture_bs == [1, 2, 4, 8, 12, 16, 24, 32]
    assert o.memory.max_running_requests == 256
    assert all(lv.ok and lv.decode_mode == "graph" for lv in o.levels)


# -- seed 001 -------------------------------------------------------------------------------------------------


def test_seed_001_token_capacity_and_free_after_capture() -> None:
    at085 = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.85")
    at093 = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.93")
    assert at085.memory is not None and at093.memory is not None
    assert near(at085.memory.max_total_num_tokens, 116171, 0.01)
    assert near(at093.memory.max_total_num_tokens, 231120, 0.01)
    assert near(at085.memory.weights_gib, 72.33, 0.001)
    assert near(at093.memory.free_after_capture_gib, 0.82)
    assert at085.outcome == at093.outcome == "ok"  # both start; single requests are fine


def test_seed_001_burst_dies_in_prefill_at_093_and_survives_at_088() -> None:
    burst = {"conc": (150,), "inp": 200, "out": 32, "requests_per_level": 150}
    o = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.93", **burst)
    assert (o.outcome, o.phase) == ("oom", "prefill")
    assert o.levels[0].died_phase == "prefill"
    assert o.memory is not None and o.memory.free_at_oom_gib is not None and o.memory.free_at_oom_gib < 0.82
    ok = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.88", **burst)
    assert ok.outcome == "ok" and ok.levels[0].completed == 150


# -- seed 003 -------------------------------------------------------------------------------------------------


def test_seed_003_tpot_and_eager_decode_oom() -> None:
    o = predict(
        NVFP4,
        "--tp",
        "4",
        "--moe-runner-backend",
        "triton",
        "--mem-fraction-static",
        "0.70",
        "--cuda-graph-max-bs",
        "32",
        conc=(1, 16, 64),
    )
    c1, c16, c64 = o.levels
    assert near(c1.mean_tpot_ms, 84) and near(c16.mean_tpot_ms, 536)
    assert c1.ok and c16.ok and c16.decode_mode == "graph"
    assert not c64.ok and c64.died_phase == "decode"
    assert near(c64.tried_to_allocate_gib, 3.94) and near(c64.free_at_oom_gib, 2.8)
    assert (o.outcome, o.phase) == ("oom", "decode")
    assert o.memory is not None and near(o.memory.graph_gib, 10.0, 0.05)


def test_seed_003_fix_serves_c64_from_graphs() -> None:
    o = predict(
        NVFP4,
        "--tp",
        "4",
        "--moe-runner-backend",
        "triton",
        "--mem-fraction-static",
        "0.62",
        "--cuda-graph-max-bs",
        "64",
        conc=(64,),
    )
    assert o.outcome == "ok"
    assert o.levels[0].ok and o.levels[0].decode_mode == "graph"
    assert near(o.levels[0].mean_tpot_ms, 54 + 30 * 64)


def test_eager_decode_between_graph_and_oom_is_slower() -> None:
    o = predict(NVFP4, "--tp", "4", "--mem-fraction-static", "0.70", "--cuda-graph-max-bs", "32", conc=(32, 40))
    c32, c40 = o.levels
    assert c32.decode_mode == "graph" and c40.decode_mode == "eager" and c40.ok
    assert c40.mean_tpot_ms is not None and c40.mean_tpot_ms > 1.4 * (54 + 30 * 40)


# -- versions and flags ---------------------------------------------------------------------------------------


def test_cuda_graph_max_bs_is_ambiguous_from_0_5_20() -> None:
    o = predict(NVFP4, "--tp", "4", "--cuda-graph-max-bs", "16", version="0.5.20")
    assert o.outcome == "bad_flag" and o.exit_code == 2
    assert o.error == (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    ok = predict(
        NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs-decode", "16", version="0.5.20"
    )
    assert ok.outcome == "ok" and ok.memory is not None and ok.memory.capture_bs == [1, 2, 4, 8, 12, 16]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.15", "0.5.19"])
def test_old_cuda_graph_flag_is_an_alias_in_0_5_14_to_0_5_19(version: str) -> None:
    launch = SimLaunch.from_argv(["--model-path", "m", "--cuda-graph-max-bs", "24"], {}, version)
    assert launch.cuda_graph_max_bs == 24
    r = resolve_args(prof(NVFP4), launch)
    assert r.server_args["cuda_graph_max_bs_decode"] == 24 and "cuda_graph_max_bs" not in r.server_args


def test_new_cuda_graph_flag_is_unknown_before_0_5_14() -> None:
    with pytest.raises(BadFlag, match="unrecognized arguments: --cuda-graph-max-bs-decode 16"):
        SimLaunch.from_argv(["--model-path", "m", "--cuda-graph-max-bs-decode", "16"], {}, "0.5.13")


def test_flags_unknown_abbreviated_and_bad_values() -> None:
    with pytest.raises(BadFlag) as err:
        SimLaunch.from_argv(["--model-path", "m", "--no-such-flag"], {}, "0.5.10")
    assert (
        err.value.exit_code == 2 and "launch_server.py: error: unrecognized arguments: --no-such-flag" in err.value.text
    )
    abbreviated = SimLaunch.from_argv(["--model-path", "m", "--mem-fraction-s", "0.5"], {}, "0.5.10")
    assert abbreviated.mem_fraction_static == 0.5
    with pytest.raises(BadFlag, match="invalid choice: 'nvfp4'"):
        SimLaunch.from_argv(["--model-path", "m", "--kv-cache-dtype", "nvfp4"], {}, "0.5.10")
    assert (
        SimLaunch.from_argv(["--model-path", "m", "--kv-cache-dtype", "nvfp4"], {}, "0.5.23").kv_cache_dtype == "nvfp4"
    )


def test_disable_cuda_graph_deprecated_in_0_5_20_runs_eager() -> None:
    launch = SimLaunch.from_argv(["--model-path", "m", "--tp", "4", "--disable-cuda-graph"], {}, "0.5.20")
    assert launch.disable_cuda_graph and "deprecated" in launch.warnings[0]
    o = evaluate(prof(NVFP4), launch, Workload(concurrency=(8,)))
    assert o.memory is not None and o.memory.capture_bs == [] and o.memory.graph_gib == 0
    assert o.levels[0].decode_mode == "eager"


def _host(profile: SimProfile, mib: int, *, piecewise: bool = False) -> SimProfile:
    host = profile.host.model_copy(update={"memory_total_mib": mib})
    model = profile.model.model_copy(update={"attention": "mha", "piecewise_cuda_graph": piecewise})
    return profile.model_copy(update={"host": host, "model": model})


@pytest.mark.parametrize(
    ("mib", "tp", "version", "piecewise", "expected"),
    [  # sglang-facts §1.3 "Illustrative defaults"
        (81559, 1, "0.5.2", False, (0.874, 8192, None)),
        (81559, 8, "0.5.2", False, (0.831, 8192, None)),
        (81559, 1, "0.5.5", False, (0.835, 8192, 256)),
        (81559, 8, "0.5.5", False, (0.818, 8192, 512)),
        (81559, 1, "0.5.10", True, (0.83, 8192, 256)),
        (81559, 8, "0.5.10", True, (0.812, 8192, 512)),
        (143771, 1, "0.5.5", False, (0.907, 8192, 256)),
        (143771, 8, "0.5.5", False, (0.897, 8192, 512)),
        (24564, 1, "0.5.2", False, (0.879, 2048, 8)),
        (24564, 8, "0.5.2", False, (0.85, 2048, 80)),
        (24564, 1, "0.5.5", False, (0.847, 2048, 24)),
        (24564, 8, "0.5.5", False, (0.806, 2048, 80)),
        (183359, 1, "0.5.5", False, (0.857, 16384, 512)),
    ],
)
def test_defaults_follow_sglang_heuristics(
    mib: int, tp: int, version: str, piecewise: bool, expected: tuple[float, int, int | None]
) -> None:
    launch = SimLaunch.from_argv(["--model-path", "m", "--tp", str(tp)], {}, version)
    r = resolve_args(_host(prof(NVFP4), mib, piecewise=piecewise), launch)
    assert (r.mem_fraction_static, r.chunked_prefill_size, r.cuda_graph_max_bs) == expected


def test_capture_lists_per_version() -> None:
    big = prof(NVFP4)
    old = resolve_args(big, SimLaunch.from_argv(["--model-path", "m"], {}, "0.5.2"))
    assert old.capture_bs_candidates[:5] == (1, 2, 4, 8, 16) and old.capture_bs_candidates[-1] == 256
    new = resolve_args(big, SimLaunch.from_argv(["--model-path", "m", "--cuda-graph-max-bs", "64"], {}, "0.5.10"))
    assert new.capture_bs_candidates == (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)
    explicit = resolve_args(big, SimLaunch.from_argv(["--model-path", "m", "--cuda-graph-bs", "4", "1", "2"], {}))
    assert explicit.capture_bs_candidates == (1, 2, 4) and explicit.cuda_graph_max_bs == 4


def test_max_running_requests_resolution() -> None:
    kimi = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.85")
    assert kimi.memory is not None and kimi.memory.max_running_requests == 2048
    capped = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.85", "--max-running-requests", "64")
    assert capped.memory is not None and capped.memory.max_running_requests == 64
    assert capped.memory.capture_bs is not None and max(capped.memory.capture_bs) == 64


def test_kv_pool_too_small_and_weights_that_do_not_fit() -> None:
    small = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.70")
    assert (small.outcome, small.phase) == ("oom", "kv_pool")
    assert small.error == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.7"
    )
    newer = predict(KIMI, "--tp", "8", "--mem-fraction-static", "0.70", version="0.5.20")
    assert newer.error is not None and newer.error.startswith(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7."
    )
    one_gpu = predict(DSV4, "--tp", "1", "--mem-fraction-static", "0.85")
    assert (one_gpu.outcome, one_gpu.phase) == ("oom", "load_weights")
    assert one_gpu.memory is not None and one_gpu.memory.tried_to_allocate_gib is not None
    assert one_gpu.memory.tried_to_allocate_gib <= 2.0
    busy = predict_from_argv(
        prof(NVFP4),
        ["--model-path", "m", "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32"],
        {},
        Workload(),
        other_used_gib=62.0,
    )
    assert (busy.outcome, busy.phase) == ("oom", "load_weights")


def test_more_ranks_than_gpus_is_an_error() -> None:
    o = predict(KIMI, "--tp", "16")
    assert (o.outcome, o.phase) == ("error", "init")


# -- timing knobs ---------------------------------------------------------------------------------------------


def test_nccl_algo_nvls_on_pcie_fails_at_start_up_not_oom() -> None:
    o = predict(NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", env={"NCCL_ALGO": "NVLS"})
    assert (o.outcome, o.phase, o.exit_code) == ("nccl_error", "init", 137)
    assert o.error is not None and o.error.startswith("torch.distributed.DistBackendError: NCCL error")
    assert "out of memory" not in (o.error or "")
    bad = predict(NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", env={"NCCL_PROTO": "fast"})
    assert bad.outcome == "nccl_error"
    mixed = predict(
        NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32", env={"NCCL_ALGO": "NVLS,Ring"}
    )
    assert mixed.outcome == "ok"


def test_noise_is_seedable_and_small() -> None:
    argv = ["--model-path", "m", "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32"]
    launch = SimLaunch.from_argv(argv, {})
    wl = Workload(concurrency=(4,))
    a = evaluate(prof(NVFP4), launch, wl, seed=1).levels[0].mean_tpot_ms
    b = evaluate(prof(NVFP4), launch, wl, seed=1).levels[0].mean_tpot_ms
    c = evaluate(prof(NVFP4), launch, wl, seed=2).levels[0].mean_tpot_ms
    expected = evaluate(prof(NVFP4), launch, wl).levels[0].mean_tpot_ms
    assert a == b and a != c and a is not None and expected is not None
    assert abs(a - expected) / expected < 0.07


# -- texts ----------------------------------------------------------------------------------------------------


def test_format_size_matches_pytorch() -> None:
    assert texts.format_size(0) == "0 bytes"
    assert texts.format_size(1024) == "1024 bytes"
    assert texts.format_size(2048) == "2.00 KiB"
    assert texts.format_size(158.62 * 1024 * 1024) == "158.62 MiB"
    assert texts.format_size(1 << 30) == "1024.00 MiB"
    assert texts.format_size(2 * (1 << 30)) == "2.00 GiB"


def test_torch_oom_text_matches_the_allocator_format() -> None:
    text = texts.torch_oom(
        tried_gib=2.0,
        gpu=0,
        total_gib=15.56,
        free_gib=158.62 / 1024,
        process_gib=102 / 1024,
        allocated_gib=0.0,
        private_pool_gib=0.0,
        reserved_unallocated_gib=0.0,
    )
    assert text.startswith(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.56 GiB of which "
        "158.62 MiB is free. Including non-PyTorch memory, this process has 102.00 MiB memory in use. Of the "
        "allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        " to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/"
    )
    robust = re.compile(
        r"(?:torch\.(?:cuda\.)?)?OutOfMemoryError: CUDA out of memory\. Tried to allocate "
        r"([0-9.]+ (?:bytes|KiB|MiB|GiB))\. GPU (\d+) has a total capac\w+ of ([0-9.]+ \w+) of which "
        r"([0-9.]+ \w+) is free"
    )
    assert robust.search("torch.OutOfMemoryError: " + text)


def test_capture_failure_block_per_version() -> None:
    old = texts.capture_failed_exception((0, 5, 10), "X")
    new = texts.capture_failed_exception((0, 5, 20), "X")
    assert "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n" in old
    assert "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n" in old
    assert "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n" in new
    assert new.endswith("Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n")


def test_warmup_can_die_after_a_tight_capture() -> None:
    kimi = prof(KIMI)
    greedy = kimi.model_copy(update={"memory": kimi.memory.model_copy(update={"warmup_transient_gib": 0.7})})
    launch = SimLaunch.from_argv(["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.93"], {})
    o = evaluate(greedy, launch, Workload())
    assert (o.outcome, o.phase) == ("oom", "warmup")
    assert o.memory is not None and o.memory.tried_to_allocate_gib == pytest.approx(0.7)
    skipped = SimLaunch.from_argv(
        ["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.93", "--skip-server-warmup"], {}
    )
    later = evaluate(greedy, skipped, Workload())
    assert (later.outcome, later.phase) == ("oom", "prefill")  # the first real request pays for it


def test_eager_decode_need_is_continuous_in_mem_fraction_and_batch() -> None:
    """Issue 20: the failing allocation is always one the eager step really makes (its largest buffer, or one of
    its small pieces), never the whole rest of the working set at once; seed 003's figure stays."""
    from runners.simhost.engine import TRANSIENT_PIECES
    from runners.simhost.model import Workload, predict_from_argv
    from runners.simhost.profile import load_profile, shipped_profile

    profile = load_profile(shipped_profile("dsv4-flash-nvfp4-tp4-rtxpro6000"))
    mem = profile.memory
    for c in (48, 64, 96):
        total = c * mem.eager_decode_mib_per_request / 1024
        largest = total * mem.eager_largest_alloc_fraction
        piece = (total - largest) / TRANSIENT_PIECES
        for mfs in (0.66, 0.68, 0.70, 0.72, 0.74, 0.76):
            argv = ["--model-path", "m", "--tp", "4", "--mem-fraction-static", str(mfs), "--cuda-graph-max-bs", "32"]
            outcome = predict_from_argv(profile, argv, {}, Workload(concurrency=(c,)), version="0.5.10")
            if outcome.phase != "decode":
                continue
            tried = outcome.memory.tried_to_allocate_gib
            assert tried is not None and min(abs(tried - largest), abs(tried - piece)) < 1e-6, (c, mfs, tried)
            # the allocation that failed did not fit in what was free less the fragmentation allowance
            free = outcome.memory.free_at_oom_gib
            assert free is not None and free < tried + mem.fragmentation_gib + 1e-6, (c, mfs, tried, free)
    seed = predict_from_argv(profile, ["--model-path", "m", "--tp", "4", "--mem-fraction-static", "0.70",
                                       "--cuda-graph-max-bs", "32"], {}, Workload(concurrency=(64,)), version="0.5.10")
    assert seed.memory.tried_to_allocate_gib == pytest.approx(3.94, abs=0.01)
    assert seed.memory.free_at_oom_gib == pytest.approx(2.80, abs=0.05)


def test_published_figures_are_matched_or_explained() -> None:
    """benchmarks/calibration.py: every throughput and TPOT ratio in [0.8, 1.25] or a stated reason."""
    import benchmarks.calibration as calibration

    assert calibration.main([]) == 0
