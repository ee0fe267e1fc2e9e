"""The correctness gate's arithmetic, and the simulated host's numerics model it is tested against end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.simhost.launch import SimLaunch
from runners.simhost.model import numerics_of
from runners.simhost.numerics import Numerics, answer
from runners.simhost.profile import NumericsSpec, load_profile
from search.trial.correctness import compare, tokens_of
from spaces.correctness import Correctness, Prompt, changes_numerics, load_prompts

ROOT = Path(__file__).resolve().parents[2]
PCIE_TP4 = ROOT / "runners/simhost/profiles/dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"


def rec(index: int, tokens: list[str], logprobs: list[float] | None = None) -> dict[str, object]:
    return {"index": index, "text": "".join(tokens), "tokens": tokens, "logprobs": logprobs, "error": None}


def test_agreement_is_the_match_up_to_the_first_divergence() -> None:
    prompts = [Prompt(prompt="a"), Prompt(prompt="b")]
    ref = [rec(0, [" x", " y", " z", " w"], [-0.1, -0.2, -0.3, -0.4]), rec(1, [" p", " q"], [-1.0, -1.0])]
    got = [rec(0, [" x", " y", " Z", " w"], [-0.2, -0.2, -5.0, -0.4]), rec(1, [" p", " q"], [-1.0, -1.0])]
    verdict = compare(ref, got, prompts, Correctness(min_agreement=0.9))
    assert verdict.agreement == pytest.approx((2 / 4 + 1) / 2)
    assert verdict.logprob_gap == pytest.approx((0.05 + 0.0) / 2)  # over the matched tokens only
    assert not verdict.passed and "agreement 0.75 < 0.9" in verdict.reason
    [wrong] = verdict.wrong
    assert wrong.index == 0 and wrong.diverged_at == 2 and wrong.got == " x y Z w"
    assert compare(ref, ref, prompts, Correctness()).passed


def test_expected_answers_give_an_accuracy() -> None:
    prompts = [Prompt(prompt="Q: 1+1? A:", expected="2"), Prompt(prompt="Q: 2+2? A:", expected="4")]
    ref = [rec(0, [" 2"]), rec(1, [" 5"])]
    verdict = compare(ref, ref, prompts, Correctness(min_accuracy=0.9))
    assert verdict.accuracy == 0.5 and not verdict.passed and "accuracy 0.50 < 0.9" in verdict.reason
    assert [w.index for w in verdict.wrong] == [1] and verdict.wrong[0].diverged_at is None


def test_a_missing_answer_counts_as_wrong_and_text_splits_into_tokens() -> None:
    prompts = [Prompt(prompt="a")]
    verdict = compare([rec(0, [" x"])], [{"index": 0, "error": "HTTP 500"}], prompts, Correctness())
    assert verdict.agreement == 0.0 and not verdict.passed
    assert tokens_of({"text": "one two  three"}) == ["one", " two", " ", " three"]


def test_the_shipped_prompts_load_and_numerics_knobs_are_named() -> None:
    prompts = Correctness().prompt_set()
    assert len(prompts) >= 12 and any(p.expected for p in prompts)
    assert load_prompts(ROOT / "spaces/data/correctness-prompts.json") == prompts
    assert changes_numerics("nccl.NCCL_PROTO") and changes_numerics("--speculative-num-steps")
    assert changes_numerics("--kv-cache-dtype") and not changes_numerics("mem_fraction_static")
    assert not changes_numerics("--schedule-policy")


def test_the_simulated_model_answers_deterministically_and_settings_change_it() -> None:
    spec = NumericsSpec()
    prompts = [p.prompt for p in Correctness().prompt_set()]
    clean = [answer(p, 24, Numerics(spec)) for p in prompts]
    assert clean == [answer(p, 24, Numerics(spec)) for p in prompts]
    assert answer("Question: What is 17 + 25? Answer:", 4, Numerics(spec)).tokens[0] == " 42"
    spec_decode = [answer(p, 24, Numerics(spec, speculative=True)) for p in prompts]
    assert [a.tokens for a in spec_decode] == [a.tokens for a in clean]  # greedy verification keeps the tokens
    corrupt = NumericsSpec(ll128_pcie_corrupt_fraction=1.0)
    assert all(a.tokens != b.tokens for a, b in zip(clean, [answer(p, 24, Numerics(corrupt, ll128_corrupts=True))
                                                            for p in prompts], strict=True))
    fp8 = [answer(p, 24, Numerics(spec, fp8_kv=True)) for p in prompts]
    gaps = [abs(x - y) for a, b in zip(clean, fp8, strict=True) for x, y in zip(a.logprobs, b.logprobs, strict=True)]
    assert spec.fp8_kv_logprob_shift * 0.5 <= sum(gaps) / len(gaps) <= spec.fp8_kv_logprob_shift * 1.5


def test_forced_ll128_corrupts_only_where_nccl_does_not_enable_it() -> None:
    profile = load_profile(PCIE_TP4)
    args = ["--model-path", "m", "--tp", "4"]
    assert numerics_of(profile, SimLaunch.from_argv(args, {"NCCL_PROTO": "LL128"})).ll128_corrupts
    assert not numerics_of(profile, SimLaunch.from_argv(args, {"NCCL_PROTO": "LL"})).ll128_corrupts
    assert not numerics_of(profile, SimLaunch.from_argv(["--model-path", "m"], {"NCCL_PROTO": "LL128"})).ll128_corrupts
    assert numerics_of(profile, SimLaunch.from_argv([*args, "--kv-cache-dtype", "fp8_e4m3"], {})).fp8_kv
