"""The simulated host's physics (issue 10 §2) and the profiles beyond the seeds (§3), on the pure model.

Each test shows one effect that moves the optimum or an OOM cliff: context-dependent decode cost,
attention's quadratic prefill term, SGLang's admission and retraction, NCCL by message size and
interconnect, prefill CUDA graphs, and the version boundaries engine-audit.md corrected.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from runners.simhost import texts
from runners.simhost.engine import BatchEngine, SimRequest
from runners.simhost.launch import SimLaunch
from runners.simhost.model import Outcome, Workload, evaluate, plan_startup, predict_from_argv
from runners.simhost.nccl import allreduce_us
from runners.simhost.profile import shipped_profile
from tests.simhost.test_model import predict as model_predict
from tests.simhost.test_model import prof

NVFP4 = "dsv4-flash-nvfp4-tp4-rtxpro6000"
KIMI = "kimi-k25-tp8-rtxpro6000"
LLAMA = "llama31-8b-h100"
DSV3 = "deepseek-v3-tp8-h200"
QWEN = "qwen3-32b-b200"
NEW_PROFILES = (LLAMA, DSV3, QWEN)


def predict(name: str, *flags: str, **kwargs: Any) -> Outcome:
    """The pure model's outcome for ``flags`` on a shipped profile (no ``--trust-remote-code``)."""
    return model_predict(name, *flags, trust_remote_code=False, **kwargs)


# -- engine knowledge in the simulated host (§1) ---------------------------------------------------------------


def test_num_continuous_decode_steps_has_no_effect_on_0_5_10() -> None:
    flags = ("--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32")
    wl: dict[str, Any] = {"conc": (1, 8), "requests_per_level": 16, "request_rate": 3.0, "out": 64}
    one = predict(NVFP4, *flags, "--num-continuous-decode-steps", "1", **wl).to_json_dict()
    four = predict(NVFP4, *flags, "--num-continuous-decode-steps", "4", **wl).to_json_dict()
    assert one["levels"] == four["levels"] and one["memory"] == four["memory"]
    assert four["resolved"]["num_continuous_decode_steps"] == 4  # accepted, echoed, never read


def test_cuda_graph_max_bs_decode_is_accepted_from_0_5_14() -> None:
    new = predict(
        NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs-decode", "16", version="0.5.14"
    )
    assert new.outcome == "ok" and new.memory is not None and new.memory.capture_bs == [1, 2, 4, 8, 12, 16]
    alias = SimLaunch.from_argv(["--model-path", "m", "--cuda-graph-max-bs", "24"], {}, "0.5.14")
    assert alias.cuda_graph_max_bs == 24  # the old spelling is a deprecated alias through 0.5.19
    assert texts.capture_failed_exception((0, 5, 14), "X").count("--cuda-graph-max-bs-decode") == 1


def test_bare_nccl_algo_tree_dies_on_the_logits_allgather() -> None:
    o = predict(
        NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32", env={"NCCL_ALGO": "Tree"}
    )
    assert (o.outcome, o.phase, o.exit_code) == ("nccl_error", "cuda_graph", 137)
    assert o.nccl is not None and o.nccl["allgather_error"] == (
        "Error : no algorithm/protocol available for function AllGather with datatype ncclBfloat16. "
        "NCCL_ALGO was set to Tree."
    )
    assert o.error is not None and o.error.startswith("Exception: Capture cuda graph failed: NCCL error in:")
    eager = predict(
        NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--disable-cuda-graph", env={"NCCL_ALGO": "Tree"}
    )
    assert (eager.outcome, eager.phase) == ("nccl_error", "warmup")  # no capture: the warm-up forward dies
    ok = predict(
        NVFP4,
        "--tp",
        "4",
        "--mem-fraction-static",
        "0.7",
        "--cuda-graph-max-bs",
        "32",
        env={"NCCL_ALGO": "allreduce:tree"},
    )
    assert ok.outcome == "ok"
    single = predict(LLAMA, "--mem-fraction-static", "0.8", env={"NCCL_ALGO": "Tree"})
    assert single.outcome == "ok"  # one rank: no collectives


@pytest.mark.parametrize(
    ("env", "flags", "outcome"),
    [
        ({"NCCL_ALGO": "NVLS"}, (), "nccl_error"),  # SGLang sets NCCL_NVLS_ENABLE=0 unless --enable-nccl-nvls
        ({"NCCL_ALGO": "NVLS"}, ("--enable-nccl-nvls",), "ok"),
        ({"NCCL_ALGO": "NVLS", "NCCL_NVLS_ENABLE": "1"}, (), "ok"),  # 0.5.5+ keeps a user value
        ({"NCCL_ALGO": "NVLS", "NCCL_PROTO": "LL"}, ("--enable-nccl-nvls",), "nccl_error"),  # Simple only
        ({"NCCL_ALGO": "NVLSTree"}, ("--enable-nccl-nvls",), "nccl_error"),  # never on one node
        ({"NCCL_ALGO": "collnet"}, (), "nccl_error"),  # not a token since 2.14
        ({"NCCL_ALGO": "allreduce:tree"}, (), "ok"),
    ],
)
def test_nccl_legality_on_nvlink(env: dict[str, str], flags: tuple[str, ...], outcome: str) -> None:
    o = predict(DSV3, "--tp", "8", "--mem-fraction-static", "0.85", *flags, env=env)
    assert o.outcome == outcome, o.error


def test_sglang_0_5_2_overwrites_a_user_nvls_enable() -> None:
    env = {"NCCL_ALGO": "NVLS", "NCCL_NVLS_ENABLE": "1"}
    assert predict(DSV3, "--tp", "8", "--mem-fraction-static", "0.85", env=env, version="0.5.2").outcome == "nccl_error"
    assert predict(DSV3, "--tp", "8", "--mem-fraction-static", "0.85", env=env, version="0.5.5").outcome == "ok"


def test_collnet_is_an_unknown_token() -> None:
    o = predict(DSV3, "--tp", "8", "--mem-fraction-static", "0.85", env={"NCCL_ALGO": "collnet"})
    assert (
        o.nccl is not None and o.nccl["error"] == 'Unrecognized element token "collnet" when parsing NCCL_ALGO=collnet'
    )


def test_version_texts_from_the_audit() -> None:
    bs = [1, 2, 4]
    assert "num_tokens_per_bs=1, bs=[1, 2, 4]" in texts.capture_begin((0, 5, 14), avail_gib=1, bs=bs)
    assert "num_tokens_per_req=1, bs=[1, 2, 4], avail" in texts.capture_begin((0, 5, 16), avail_gib=1, bs=bs)
    assert "bs=" not in texts.capture_begin((0, 5, 22), avail_gib=1, bs=bs)
    assert "bs=" not in texts.capture_end((0, 5, 21), elapsed_s=1, usage_gib=1, avail_gib=1, bs=bs)
    assert "end. bs=[1, 2, 4], elapsed=" in texts.capture_end((0, 5, 22), elapsed_s=1, usage_gib=1, avail_gib=1, bs=bs)
    assert texts.sigquit_line((0, 5, 5), running=True).startswith("SIGQUIT received.")
    assert texts.sigquit_line((0, 5, 2), running=True).startswith("Received sigquit from a child process")
    assert texts.dsv4_pool_line(max_num_reqs=256, tokens=4096).startswith(
        "Initialize DeepSeekV4TokenToKVPool with max_num_reqs=256 swa_size=32896 c4_size=1024 "
    )


# -- decode cost grows with context ---------------------------------------------------------------------------


def _spec(name: str, *flags: str) -> Any:
    plan = plan_startup(prof(name), SimLaunch.from_argv(["--model-path", "m", *flags], {}))
    assert plan.runtime is not None
    return plan.runtime


def test_decode_throughput_at_fixed_batch_falls_as_context_grows() -> None:
    spec = _spec(LLAMA, "--mem-fraction-static", "0.85")
    bs = 32
    rates = [bs / spec.decode_step_s(bs, bs * spec.attended_tokens(ctx))[0] for ctx in (1000, 4000, 16000, 64000)]
    assert all(a > b for a, b in itertools.pairwise(rates))
    assert rates[-1] < rates[0] / 5  # at 64K the KV read dominates the step
    # end to end, same batch, longer prompts: slower per token
    tpot = [
        predict(LLAMA, "--mem-fraction-static", "0.85", conc=(16,), inp=n, out=64).levels[0].mean_tpot_ms
        for n in (512, 8192, 32768)
    ]
    assert tpot[0] is not None and tpot[1] is not None and tpot[2] is not None
    assert tpot[0] < tpot[1] < tpot[2]


def test_attention_kind_sets_the_kv_read_cost() -> None:
    gqa = _spec(LLAMA, "--mem-fraction-static", "0.85")
    mla = _spec(DSV3, "--tp", "8", "--mem-fraction-static", "0.85")
    # per 1000 context tokens: 128 KiB of GQA KV at 70% of 3.35 TB/s vs a 70 KB latent at 35% of 4.8 TB/s
    assert gqa.kv_read_ms_per_ktoken == pytest.approx(131072 * 1e3 / (3350e9 * 0.7) * 1e3)
    assert mla.kv_read_ms_per_ktoken == pytest.approx(70272 * 1e3 / (4800e9 * 0.35) * 1e3)
    llama = prof(LLAMA)
    windowed = llama.model_copy(
        update={"model": llama.model.model_copy(update={"sliding_window": 4096, "window_layer_fraction": 0.5})}
    )
    plan = plan_startup(windowed, SimLaunch.from_argv(["--model-path", "m", "--mem-fraction-static", "0.85"], {}))
    assert plan.runtime is not None
    swa = plan.runtime
    assert swa.attended_tokens(2000) == 2000  # inside the window nothing changes
    assert swa.attended_tokens(64000) == pytest.approx(0.5 * 64000 + 0.5 * 4096)
    assert swa.decode_step_s(32, 32 * swa.attended_tokens(64000))[0] < gqa.decode_step_s(32, 32 * 64000)[0]


def test_prefill_has_attentions_quadratic_term() -> None:
    spec = _spec(LLAMA, "--mem-fraction-static", "0.85")
    linear = spec.prefill_s(8192, 0.0)
    quadratic = spec.prefill_s(8192, 8192 * 8192 / 2)
    assert quadratic > linear * 1.1
    # a 32K prompt (four chunks of 8192, each attending to the ones before) costs more than 4 x an 8K prompt
    ttft8 = predict(LLAMA, "--mem-fraction-static", "0.85", inp=8192, out=2).levels[0].mean_ttft_ms
    ttft32 = predict(LLAMA, "--mem-fraction-static", "0.85", inp=32768, out=2).levels[0].mean_ttft_ms
    assert ttft8 is not None and ttft32 is not None and ttft32 > 4.4 * ttft8


# -- admission and retraction ---------------------------------------------------------------------------------


def test_retraction_at_a_tight_mem_fraction_with_long_outputs() -> None:
    o = predict(LLAMA, "--mem-fraction-static", "0.25", conc=(32,), inp=1000, out=4000, requests_per_level=32)
    lv = o.levels[0]
    assert o.outcome == "ok" and lv.ok and lv.completed == 32  # retraction is not a crash
    assert lv.retracted > 0
    roomy = predict(LLAMA, "--mem-fraction-static", "0.85", conc=(32,), inp=1000, out=4000, requests_per_level=32)
    assert roomy.levels[0].retracted == 0
    assert (roomy.levels[0].output_throughput or 0) > (lv.output_throughput or 0)


def test_admission_uses_the_new_token_ratio_not_the_full_output() -> None:
    """SGLang admits against the running requests' *estimated* remaining need (x 0.7, decaying), so more
    requests run at once than a reservation of prompt + max_new_tokens allows, and the overcommit is
    paid back by retraction when the pool runs out."""
    spec = _spec(LLAMA, "--mem-fraction-static", "0.8", "--max-total-tokens", "20000")
    eng = BatchEngine(spec)
    reqs = [SimRequest(input_len=1000, max_new_tokens=4000) for _ in range(8)]
    for r in reqs:
        eng.add(r)
    t, most = 0.0, 0
    while eng.has_work():
        batch = eng.next_batch()
        assert batch is not None and batch.oom is None
        t += batch.duration_s
        eng.commit(batch, t)
        most = max(most, len(eng.running))
        assert eng.used_tokens <= spec.max_total_num_tokens
    assert most > 20000 // 5000  # a full reservation would never run more than 4
    assert eng.retracted_total > 0
    assert all(r.finished and r.generated == 4000 for r in reqs)
    assert any(r.retracted for r in reqs)


def test_throughput_against_mem_fraction_is_a_curve_not_a_backwards_staircase() -> None:
    wl: dict[str, Any] = {"conc": (64,), "inp": 6000, "out": 256}
    fractions = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    tput = [predict(LLAMA, "--mem-fraction-static", str(m), **wl).levels[0].output_throughput or 0.0 for m in fractions]
    assert tput[-1] > 1.25 * tput[0]  # KV capacity matters for long prompts
    assert all(b >= 0.97 * a for a, b in itertools.pairwise(tput))  # never a real step backwards
    cliff = predict(LLAMA, "--mem-fraction-static", "0.97", **wl)
    assert (cliff.outcome, cliff.phase) == ("oom", "cuda_graph")


# -- NCCL by message size and interconnect --------------------------------------------------------------------


def test_a_forced_protocol_helps_or_hurts_by_message_size() -> None:
    small, large = 128 * 1024, 64 * 1024 * 1024
    ll_small, simple_small = (
        allreduce_us(small, 4, "Ring", "LL", 20, 3),
        allreduce_us(small, 4, "Ring", "Simple", 20, 3),
    )
    ll_large, simple_large = (
        allreduce_us(large, 4, "Ring", "LL", 20, 3),
        allreduce_us(large, 4, "Ring", "Simple", 20, 3),
    )
    assert ll_small < simple_small and ll_large > 1.8 * simple_large
    flags = ("--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32")
    base = predict(NVFP4, *flags, conc=(16,))
    ll = predict(NVFP4, *flags, conc=(16,), env={"NCCL_PROTO": "LL"})
    tree = predict(NVFP4, *flags, conc=(16,), env={"NCCL_ALGO": "allreduce:tree"})
    slow = predict(NVFP4, *flags, conc=(16,), env={"NCCL_P2P_DISABLE": "1"})
    tp_ll, tp_base, tp_tree, tp_slow = (r.levels[0].mean_tpot_ms or 0.0 for r in (ll, base, tree, slow))
    assert tp_ll < tp_base < tp_tree and tp_base < tp_slow  # PCIe TP4: NCCL carries decode all-reduces
    long_base = predict(NVFP4, *flags, inp=8192, out=2).levels[0].mean_ttft_ms or 0.0
    long_ll = predict(NVFP4, *flags, inp=8192, out=2, env={"NCCL_PROTO": "LL"}).levels[0].mean_ttft_ms or 0.0
    assert long_ll > long_base * 1.05  # large prefill all-reduces: LL moves half the bandwidth


def test_on_nvlink_custom_all_reduce_carries_decode_and_nccl_carries_prefill() -> None:
    flags = ("--tp", "8", "--mem-fraction-static", "0.85")
    base = predict(DSV3, *flags, conc=(32,), inp=2000, out=64)
    ll = predict(DSV3, *flags, conc=(32,), inp=2000, out=64, env={"NCCL_PROTO": "LL"})
    assert base.levels[0].mean_tpot_ms is not None and ll.levels[0].mean_tpot_ms is not None
    spec_base, spec_ll = _spec(DSV3, *flags), None
    plan = plan_startup(prof(DSV3), SimLaunch.from_argv(["--model-path", "m", *flags], {"NCCL_PROTO": "LL"}))
    spec_ll = plan.runtime
    assert spec_ll is not None
    assert spec_ll.decode_step_s(64, 0)[0] == spec_base.decode_step_s(64, 0)[0]  # custom all-reduce
    assert spec_ll.prefill_s(8192) > spec_base.prefill_s(8192) * 1.05  # 117 MB all-reduces through NCCL
    assert (ll.levels[0].mean_ttft_ms or 0) > (base.levels[0].mean_ttft_ms or 0)
    no_car = plan_startup(
        prof(DSV3),
        SimLaunch.from_argv(["--model-path", "m", *flags, "--disable-custom-all-reduce"], {"NCCL_PROTO": "LL"}),
    ).runtime
    assert no_car is not None and no_car.decode_step_s(64, 0)[0] != spec_base.decode_step_s(64, 0)[0]


# -- prefill CUDA graphs ---------------------------------------------------------------------------------------


def test_prefill_cuda_graphs_default_on_from_0_5_10() -> None:
    on = predict(LLAMA, "--mem-fraction-static", "0.85")
    assert on.memory is not None and on.memory.prefill_graph_tokens and on.memory.prefill_graph_tokens[-1] == 8192
    assert on.memory.prefill_graph_gib is not None and on.memory.prefill_graph_gib > 1.0
    assert on.resolved is not None and on.resolved["prefill_graph_max_tokens"] == 8192
    off = predict(LLAMA, "--mem-fraction-static", "0.85", "--disable-piecewise-cuda-graph")
    old = predict(LLAMA, "--mem-fraction-static", "0.85", version="0.5.5")
    for o in (off, old):
        assert o.memory is not None and o.memory.prefill_graph_tokens == [] and o.memory.prefill_graph_gib == 0
        assert (o.memory.free_after_capture_gib or 0) > (on.memory.free_after_capture_gib or 0)
    mla = predict(DSV3, "--tp", "8", "--mem-fraction-static", "0.85")
    assert mla.memory is not None and mla.memory.prefill_graph_tokens and mla.memory.prefill_graph_tokens[-1] == 2048
    assert mla.resolved is not None
    seeds = predict(NVFP4, "--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32")
    assert seeds.memory is not None and seeds.memory.prefill_graph_tokens == []  # calibrated without them


@pytest.mark.parametrize(
    ("version", "start"),
    [
        ("0.5.10", "torch.OutOfMemoryError: CUDA out of memory."),
        ("0.5.14", "Exception: Capture prefill CUDA graph failed: CUDA out of memory."),
        ("0.5.20", "Exception: Capture prefill CUDA graph failed: CUDA out of memory."),
    ],
)
def test_prefill_graph_capture_oom(version: str, start: str) -> None:
    plan = plan_startup(
        prof(LLAMA), SimLaunch.from_argv(["--model-path", "m", "--mem-fraction-static", "0.955"], {}, version)
    )
    f = plan.failure
    assert f is not None and (f.kind, f.phase, f.stage) == ("oom", "cuda_graph", "prefill_graph")
    assert f.message.startswith(start)
    if version >= "0.5.15":
        assert "Fail when using backend: breakable for prefill runner." in f.message
    lower = predict(LLAMA, "--mem-fraction-static", "0.955", "--cuda-graph-max-bs-prefill", "1024", version="0.5.20")
    assert lower.outcome == "ok"  # a smaller prefill graph fits, as SGLang's hint says


# -- the shipped landscapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_new_profiles_start_serve_and_carry_a_calibration_note(name: str) -> None:
    p = prof(name)
    assert "Public figures" in p.calibration and p.model.num_layers > 0 and p.model.hidden_size > 0
    tp = ("--tp", "8") if name == DSV3 else ()
    o = predict(name, *tp, conc=(1, 16), inp=2000, out=64)
    assert o.outcome == "ok" and all(lv.ok for lv in o.levels)
    c1, c16 = o.levels
    assert (c16.output_throughput or 0) > 4 * (c1.output_throughput or 0)


def test_llama_single_stream_decode_matches_the_published_order_of_magnitude() -> None:
    o = predict(LLAMA, "--mem-fraction-static", "0.85", conc=(1,), inp=128, out=256)
    tok_s = 1000.0 / (o.levels[0].mean_tpot_ms or 1.0)
    assert 140 <= tok_s <= 190


def test_evaluate_matches_between_launch_objects() -> None:
    launch = SimLaunch.from_argv(["--model-path", "m", "--mem-fraction-static", "0.8"], {})
    a = evaluate(prof(QWEN), launch, Workload(concurrency=(4,), input_len=16000, output_len=64))
    assert a.outcome == "ok" and a.levels[0].ok


def test_ll128_forced_on_pcie_is_reported_as_unsupported() -> None:
    flags = ("--tp", "4", "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "32")
    forced = predict(NVFP4, *flags, env={"NCCL_PROTO": "LL128"})
    assert forced.nccl is not None and forced.nccl["ll128_unsupported"] is True
    unset = predict(NVFP4, *flags)
    assert unset.nccl is not None and unset.nccl["ll128_unsupported"] is False


def test_predict_cli_same_result_for_continuous_decode_steps_1_and_4(capsys: pytest.CaptureFixture[str]) -> None:
    from runners.simhost.__main__ import main

    outs = []
    for k in ("1", "4"):
        argv = ["predict", "--sim-profile", str(shipped_profile(NVFP4)), "--sim-version", "0.5.10", "--compact"]
        argv += ["--concurrency", "1,16", "--model-path", "m", "--tp", "4", "--mem-fraction-static", "0.7"]
        assert main([*argv, "--cuda-graph-max-bs", "32", "--num-continuous-decode-steps", k]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["levels"] == outs[1]["levels"] and outs[0]["outcome"] == "ok"
    assert (
        main(
            [
                "predict",
                "--sim-profile",
                str(shipped_profile(NVFP4)),
                "--sim-version",
                "0.5.14",
                "--compact",
                "--model-path",
                "m",
                "--tp",
                "4",
                "--mem-fraction-static",
                "0.7",
                "--cuda-graph-max-bs-decode",
                "16",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["outcome"] == "ok"
    assert (
        main(
            [
                "predict",
                "--sim-profile",
                str(shipped_profile(KIMI)),
                "--compact",
                "--model-path",
                "m",
                "--tp",
                "8",
                "--mem-fraction-static",
                "0.88",
                "NCCL_ALGO=Tree",
            ]
        )
        == 0
    )
    tree = json.loads(capsys.readouterr().out)
    assert tree["outcome"] == "nccl_error" and "function AllGather" in tree["nccl"]["allgather_error"]


@pytest.mark.parametrize(
    ("nccl", "algo", "proto", "dies", "words"),
    [
        ((2, 23, 4), "Tree", None, False, ""),  # before 2.24 AllGather fell back to Ring
        ((2, 27, 3), "Tree", None, True, "Error : no algorithm/protocol available for function AllGather"),
        ((2, 30, 7), "Tree", None, True, "No algorithm/protocol available for function AllGather"),
        ((2, 30, 7), "allreduce:tree", "Simple", False, ""),
        ((2, 31, 2), "allreduce:tree", "Simple", True,
         "No algorithm/protocol nor symKernelId available for function AllGather"),
        ((2, 31, 2), "allreduce:tree", None, False, ""),  # no bare NCCL_PROTO forces the other collectives
        ((2, 31, 2), "ring;allreduce:tree", "Simple", False, ""),
    ],
)
def test_the_simulated_nccl_follows_its_profile_version(nccl: tuple[int, int, int], algo: str, proto: str | None,
                                                         dies: bool, words: str) -> None:
    """The simulated host's NCCL follows the rules (and the wording) of the NCCL its profile names."""
    base = prof(DSV3)
    profile = base.model_copy(update={"host": base.host.model_copy(update={"nccl_version": ".".join(map(str, nccl))})})
    env = {"NCCL_ALGO": algo, **({"NCCL_PROTO": proto} if proto else {})}
    argv = ["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.85"]
    o = predict_from_argv(profile, argv, env, Workload(input_len=256, output_len=128, concurrency=(1,)),
                          version="0.5.10")
    assert (o.outcome == "nccl_error") is dies, o.error
    if dies:
        assert o.nccl is not None and words in (o.nccl["allgather_error"] or o.nccl["error"] or ""), o.nccl
        assert f"NCCL version {'.'.join(map(str, nccl))}" in (o.error or "")
