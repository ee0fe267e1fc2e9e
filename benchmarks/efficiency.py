"""Search efficiency: launches to a near-optimal configuration, and launches (and GPU time) lost to deaths.

    benchmarks/efficiency.py [--space FILE ...] [--strategies servetune,tpe,scoot,random,grid]
                             [--seeds N] [--launches N] [--json OUT]

Runs on any space file whose engine is the simulated host (default: every shipped ``spaces/*.yaml`` with
``engine.kind: sim``). The landscape is the simulated host's pure model; the optimum is taken noiselessly
by brute force over the space's grid. Every launch draws the profile's run-to-run noise.

Strategies, all through the product's trial path (``search.trial.objective.Objective`` with
``benchmarks/simeval.py``; a configuration sampled again is reused and costs no launch):

* ``servetune``: servetune's sampler and memory model: the probe first, the start-up design placed at
  the memory boundary the model is sure of, skips of configurations the model predicts die
  (``predicted_oom``, no launch), the memory margin as a constraint, and the confirmation (one more
  launch of each of the top 3, then 3 of the one chosen, whose median is reported) *inside* the launch
  budget;
* ``tpe``: Optuna's TPE with default settings over the whole space, dead launches told as PRUNED;
* ``scoot``: SCOOT's hidden-constraint method on top of it: a random-forest classifier over the
  parameters, trained on the launches so far, skips a sampled configuration it predicts infeasible with
  probability above 0.5 (scikit-learn: ``pip install -e '.[bench]'``);
* ``random``: Optuna's random sampler;
* ``grid``: the grid in the order a person would walk it (mem-fraction from high to low, then graph
  batch size up), and ``grid-shuffled``: the grid in a random order.

Per space and strategy: launches to 98% and 99.5% of the optimum (median, worst, misses: by the true value
of the configurations launched so far), share of launches that die, GPU-minutes lost on them (simulated
time to death x GPUs), predicted-OOM skips, regret of the configuration picked after the budget, and for
noisy profiles whether that pick is the best configuration launched (and whether it is within 0.5% of it,
"near best") and by how much its reported figure exceeds its true value.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from _common import ROOT, metadata
from optuna.study import StudyDirection
from optuna.trial import TrialState
from simeval import SimEvaluator

from runners.checkpoint import CheckpointFacts, parse_checkpoint
from search.spaces import engine_of
from search.strategy.confirm import CONFIRM_FINAL, MAX_FINAL, confirmation_launches
from search.strategy.distributions import distributions, inert_knobs
from search.strategy.strategy import MAX_TRIALS_PER_LAUNCH, Strategy, apply, make_sampler
from search.strategy.warm import Prior, workload_tokens
from search.trial.objective import Gate, Objective, TrialEnv, TrialFailed
from search.trial.records import TrialFacts, normal_params, records
from spaces.launch import LaunchConfig, engine_options
from spaces.schema import Space, load_space

STRATEGIES = ("servetune", "tpe", "scoot", "random", "grid", "grid-shuffled")
#: "near best": the pick's true value within this share of the best launched configuration's.
NEAR = 0.005


def sim_spaces() -> list[Path]:
    """Every shipped space on the simulated host whose objective is a metric at a level (the pure model
    answers that in-process; a rate search under an SLO needs the live server's open loop)."""
    out = []
    for path in sorted((ROOT / "spaces").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        kind = (data.get("objective") or {}).get("kind", "throughput_at")
        if (data.get("engine") or {}).get("kind") == "sim" and kind == "throughput_at":
            out.append(path)
    return out


def full_space(space: Space) -> Space:
    """The space with every knob searched, inert ones too (what plain Optuna would search)."""
    inert = inert_knobs(space.engine.kind, space.engine.version, engine_options(space))
    return space.model_copy(update={"search_inert": sorted(inert)})


def grid(space: Space) -> list[dict[str, Any]]:
    axes = []
    for name, dist in distributions(space).items():
        if isinstance(dist, optuna.distributions.FloatDistribution):
            assert dist.step is not None
            n = round((dist.high - dist.low) / dist.step) + 1
            axes.append([(name, round(dist.low + i * dist.step, 6)) for i in range(n)])
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            axes.append([(name, c) for c in dist.choices])
    return [dict(point) for point in itertools.product(*axes)]


def gpus(space: Space) -> int:
    args = space.fixed_args
    for flag in ("--tp", "--tp-size", "--tensor-parallel-size"):
        if flag in args:
            return int(args[args.index(flag) + 1])
    return 1


def read_checkpoint(space: Space) -> CheckpointFacts | None:
    """The model's checkpoint as ``servetune run``'s preflight reads it: the engine's own command, run here."""
    command = engine_of(space).checkpoint_command(sys.executable, space.model_path)
    res = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, check=False)
    return parse_checkpoint(res.stdout) if res.returncode == 0 else None


class Landscape:
    """One space: its noiseless values (cached) and optimum."""

    def __init__(self, path: Path, space: Space | None = None) -> None:
        self.path = path
        self.space = space or load_space(path)
        self.full = full_space(self.space)
        self.sim = SimEvaluator(self.space)
        self.noise_pct = self.sim.profile.timing.noise_pct
        self.gpus = gpus(self.space)
        #: what the simulated host's nvidia-smi reports (a run's preflight reads it before the probe)
        self.card_mib = float(self.sim.profile.host.memory_total_mib)
        #: the checkpoint as the preflight reads it on the host (the simulated host answers for its profile)
        self.checkpoint = read_checkpoint(self.space)

    def true_value(self, params: dict[str, Any]) -> float | None:
        return self.sim.true_value(LaunchConfig.from_params(self.space, params))

    def optimum(self) -> tuple[float, int, int]:
        points = grid(self.full)
        values = [self.true_value(p) for p in points]
        alive = [v for v in values if v is not None]
        return max(alive), len(points), len(points) - len(alive)


class Run:
    """One search: the launches it made, in order."""

    def __init__(self, land: Landscape, seed: int) -> None:
        self.land = land
        self.seed = seed
        self.evaluator = SimEvaluator(land.space, seed=seed)
        # (params, true value, measured value, died) per launch
        self.launched: list[tuple[dict[str, Any], float | None, float | None, bool]] = []
        self.skips = 0
        self.stopped_early = 0

    def launch(self, objective: Objective, study: optuna.Study, trial: optuna.Trial, gate: Gate) -> None:
        """One trial through the product's trial function, told to the study as ``servetune run`` tells it."""
        n_before = len(self.evaluator.launches)
        state, value = TrialState.COMPLETE, None
        try:
            value = objective.run(trial, None, gate)
        except optuna.TrialPruned:
            state = TrialState.PRUNED
        except TrialFailed:
            state = TrialState.FAIL
        study.tell(trial, value, state=state)
        facts = TrialFacts.from_trial(study.get_trials(deepcopy=False)[trial.number])
        if facts.predicted_oom:
            self.skips += 1
        if facts.stopped_early:
            self.stopped_early += 1
        if len(self.evaluator.launches) > n_before:
            _, _, died = self.evaluator.launches[-1]
            params = normal_params(trial.params)
            self.launched.append((params, self.land.true_value(params), value, died))


def _env(space: Space) -> TrialEnv:
    return TrialEnv(space=space, study_name="bench", artifacts_dir=Path("/nonexistent"))


def run_servetune(land: Landscape, seed: int, launches: int, priors: Sequence[Prior] = ()) -> Run:
    """servetune as ``servetune run`` drives it: :meth:`Strategy.next` says what to start (probe, design,
    sampler, screening repeats, final launches), :func:`apply` starts it, the objective runs it through the
    strategy's gate. The search budget is the launches less the confirmations. ``priors``: earlier studies to
    warm-start from."""
    run = Run(land, seed)
    strategy = Strategy(land.space, launches - confirmation_launches(), gpu_mem_mib=land.card_mib,
                        checkpoint=land.checkpoint, priors=tuple(priors))
    objective = Objective(_env(land.space), run.evaluator)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, launches))
    # The search's budget and the first confirmations fit in ``launches``; the final launches a noisy host needs
    # for an honest figure (search.strategy.confirm.finals_needed) come on top, and their cost is counted.
    while len(run.launched) < launches + MAX_FINAL - CONFIRM_FINAL:
        view = strategy.view(study)
        trial = apply(study, strategy.next(view))
        if trial is None:  # Done (nothing runs beside this loop, so never Wait)
            break
        run.launch(objective, study, trial, strategy.gate(view))
    choice = strategy.view(study).choice
    run.pick = None if choice is None else (normal_params(choice.record.params), choice.value)  # type: ignore[attr-defined]
    confirmed = choice.confirmed if choice is not None else None
    run.interval = confirmed.interval if confirmed is not None else None  # type: ignore[attr-defined]
    run.finals = confirmed.final if confirmed is not None else 0  # type: ignore[attr-defined]
    run.study = study  # type: ignore[attr-defined]
    return run


def new_workload(space: Space) -> Space:
    """The same host, model, engine and fixed args with a new workload: prompts a quarter shorter, the same
    output length and levels. (With twice the output, decode's share moves the NCCL optimum on a PCIe host:
    no earlier configuration is then within 2%, and a warm start saves the memory launches only.)"""
    wl = space.workload
    update: dict[str, Any] = {}
    if wl.input_len is not None:
        update["input_len"] = max(16, wl.input_len * 3 // 4)
    return space.model_copy(update={"workload": wl.model_copy(update=update), "name": f"{space.name}-second"})


def warm_run(job: tuple[Path, int, int]) -> dict[str, Any]:
    """A second study on a landscape with a new workload (:func:`new_workload`), warm-started from a first
    study of the space's own workload with the same seed; and the same second study cold, for comparison."""
    path, seed, launches = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    first = run_servetune(LANDS[path], seed, launches)
    prior = Prior("first", StudyDirection.MAXIMIZE, tuple(records(first.study)),  # type: ignore[attr-defined]
                  workload_tokens(LANDS[path].space))
    second = SECOND[path]
    optimum = OPTIMA[second.path]
    out: dict[str, Any] = {"seed": seed}
    for name, priors in (("warm", [prior]), ("cold", [])):
        run = run_servetune(second, seed, launches, priors)
        row = measure(run, optimum, second.gpus, second.noise_pct > 0)
        first_true = run.launched[0][1] if run.launched else None
        row["first_launch_share"] = None if first_true is None else round(first_true / optimum, 4)
        out[name] = row
    return out


def _pick_best_measured(run: Run) -> None:
    alive = [(p, m) for p, _, m, died in run.launched if not died and m is not None]
    run.pick = max(alive, key=lambda x: x[1]) if alive else None  # type: ignore[attr-defined]


def _plain(space: Space) -> Strategy:
    """A baseline's strategy: its sampler alone over the whole space (no probe, no memory model, no repeats)."""
    return Strategy(space, None, confirm_k=0, memory_gate=False, start_design=False, early_stop=False)


def run_baseline(land: Landscape, seed: int, launches: int, kind: str) -> Run:
    run = Run(land, seed)
    space = land.full
    strategy = _plain(space)
    objective = Objective(_env(space), run.evaluator)
    sampler: optuna.samplers.BaseSampler
    sampler = optuna.samplers.RandomSampler(seed=seed) if kind == "random" else optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    rf_rng = random.Random(seed)
    while len(run.launched) < launches and len(study.trials) < launches * MAX_TRIALS_PER_LAUNCH:
        trial = study.ask()
        if kind == "scoot" and _scoot_skips(run, space, trial, rf_rng):
            run.skips += 1
            study.tell(trial, state=TrialState.PRUNED)
            continue
        run.launch(objective, study, trial, strategy.gate(strategy.view(study)))
    _pick_best_measured(run)
    return run


def _encode(space: Space, params: dict[str, Any]) -> list[float]:
    row = []
    for name, dist in distributions(space).items():
        value = params.get(name)
        if isinstance(dist, optuna.distributions.FloatDistribution):
            row.append(float(value) if value is not None else 0.0)
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            row.append(float(list(dist.choices).index(value)) if value in dist.choices else -1.0)
    return row


def _scoot_skips(run: Run, space: Space, trial: optuna.Trial, rng: random.Random) -> bool:
    """SCOOT's hidden-constraint step: P(infeasible) > 0.5 from an RF on the launches so far."""
    labels = [died for _, _, _, died in run.launched]
    if len(set(labels)) < 2:
        return False
    from sklearn.ensemble import RandomForestClassifier

    params = {}
    for name, dist in distributions(space).items():  # the sampler's proposal, without a launch
        if isinstance(dist, optuna.distributions.FloatDistribution):
            params[name] = trial.suggest_float(name, dist.low, dist.high, step=dist.step)
        else:
            assert isinstance(dist, optuna.distributions.CategoricalDistribution)
            params[name] = trial.suggest_categorical(name, list(dist.choices))
    forest = RandomForestClassifier(n_estimators=50, random_state=rng.randrange(1 << 30))
    forest.fit([_encode(space, p) for p, _, _, _ in run.launched], labels)
    classes = list(forest.classes_)
    proba = forest.predict_proba([_encode(space, params)])[0][classes.index(True)]
    return bool(proba > 0.5)


def run_grid(land: Landscape, seed: int, launches: int, shuffled: bool) -> Run:
    run = Run(land, seed)
    space = land.full
    strategy = _plain(space)
    objective = Objective(_env(space), run.evaluator)
    points = grid(space)
    if shuffled:
        random.Random(seed).shuffle(points)
    else:
        points.sort(key=lambda p: (-p.get("mem_fraction_static", 0.0), p.get("cuda_graph_max_bs", 0)))
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
    for point in points[:launches]:
        study.enqueue_trial(point)
        run.launch(objective, study, study.ask(), strategy.gate(strategy.view(study)))
    _pick_best_measured(run)
    return run


def measure(run: Run, optimum: float, gpus: int, noisy: bool) -> dict[str, Any]:
    """One run's figures: launches and GPU-minutes (each launch's simulated start-up, benchmark or time to
    death, x the GPUs it holds) to 98% and 99.5% of the optimum, and for the whole run (the answer)."""
    reached: dict[str, int | None] = {"0.98": None, "0.995": None}
    gpu_min: dict[str, float | None] = {"0.98": None, "0.995": None}
    best = 0.0
    spent = 0.0
    seconds = [sec for _, sec, _ in run.evaluator.launches]
    for i, (_, true, _, _) in enumerate(run.launched, start=1):
        best = max(best, true or 0.0)
        spent += seconds[i - 1] * gpus / 60.0
        for bar in reached:
            if reached[bar] is None and best >= float(bar) * optimum:
                reached[bar] = i
                gpu_min[bar] = round(spent, 3)
    died = [lv for lv in run.evaluator.launches if lv[2]]
    pick = getattr(run, "pick", None)
    out: dict[str, Any] = {
        "seed": run.seed, "launches": len(run.launched), "reached": reached, "gpu_minutes_to": gpu_min,
        "gpu_minutes": round(sum(seconds) * gpus / 60.0, 3),
        "died": len(died), "dead_gpu_minutes": sum(s for _, s, _ in died) * gpus / 60.0,
        "stopped_early": run.stopped_early,
        "saved_gpu_minutes": round(run.evaluator.saved_seconds * gpus / 60.0, 3),
        "skips": run.skips,
    }
    if pick is not None:
        true = run.land.true_value(pick[0]) or 0.0
        out["regret"] = 1 - true / optimum
        best_launched = max((t or 0.0) for _, t, _, d in run.launched if not d)
        out["picked_best_launched"] = true >= best_launched - 1e-9
        out["picked_near_best_launched"] = true >= (1 - NEAR) * best_launched
        out["reported_over_true"] = pick[1] / true - 1 if true else None
        out["interval"] = getattr(run, "interval", None)
        out["final_launches"] = getattr(run, "finals", 0)
    else:
        out["regret"] = 1.0
    out["noisy"] = noisy
    return out


def summarise(rows: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for bar in ("0.98", "0.995"):
        hit = [r["reached"][bar] for r in rows if r["reached"][bar] is not None]
        s[f"to_{bar}"] = {"median": statistics.median(hit) if hit else None, "worst": max(hit) if hit else None,
                          "misses": seeds - len(hit)}
        # A miss counts as the whole run's GPU-minutes (it never got there): the median is over every seed.
        cost = [r["gpu_minutes_to"][bar] if r["gpu_minutes_to"][bar] is not None else r["gpu_minutes"]
                for r in rows]
        s[f"gpu_minutes_to_{bar}"] = {"median": statistics.median(cost) if cost else None,
                                      "worst": max(cost) if cost else None}
    s["gpu_minutes_median"] = statistics.median(r["gpu_minutes"] for r in rows)
    launches = sum(r["launches"] for r in rows)
    s["died_share"] = sum(r["died"] for r in rows) / max(launches, 1)
    s["dead_gpu_minutes_per_seed"] = statistics.fmean(r["dead_gpu_minutes"] for r in rows)
    s["skips_per_seed"] = statistics.fmean(r["skips"] for r in rows)
    s["stopped_early_per_seed"] = statistics.fmean(r["stopped_early"] for r in rows)
    s["saved_gpu_minutes_per_seed"] = statistics.fmean(r["saved_gpu_minutes"] for r in rows)
    s["regret_median"] = statistics.median(r["regret"] for r in rows)
    picked = [r for r in rows if "picked_best_launched" in r]
    s["picked_best_launched"] = sum(1 for r in picked if r["picked_best_launched"])
    s["picked_near_best_launched"] = sum(1 for r in picked if r.get("picked_near_best_launched"))
    over = [r["reported_over_true"] for r in picked if r.get("reported_over_true") is not None]
    s["reported_over_true_median"] = statistics.median(over) if over else None
    s["reported_within_3pct"] = sum(1 for o in over if abs(o) <= 0.03)
    s["reported_worst"] = max(over, key=abs) if over else None
    intervals = [r["interval"] for r in picked if r.get("interval") is not None]
    s["interval_median"] = statistics.median(intervals) if intervals else None
    s["final_launches_median"] = statistics.median(r.get("final_launches", 0) for r in picked) if picked else None
    return s


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


#: The landscapes of this run, by path, built before the workers fork (each inherits them).
LANDS: dict[Path, Landscape] = {}
OPTIMA: dict[Path, float] = {}
#: Each landscape's second study (a new workload on the same host, model and engine), by the first's path.
SECOND: dict[Path, Landscape] = {}


def one_run(job: tuple[Path, str, int, int]) -> tuple[Path, str, int, dict[str, Any]]:
    """One strategy's search with one seed on one landscape, measured (a worker's unit of work)."""
    path, strategy, seed, launches = job
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = LANDS[path]
    if strategy == "servetune":
        run = run_servetune(land, seed, launches)
    elif strategy in ("grid", "grid-shuffled"):
        run = run_grid(land, seed, launches, shuffled=strategy == "grid-shuffled")
    else:
        run = run_baseline(land, seed, launches, strategy)
    return path, strategy, seed, measure(run, OPTIMA[path], land.gpus, land.noise_pct > 0)


def targets(entry: dict[str, Any]) -> dict[str, Any]:
    """Issue 25's target on one landscape: servetune's median GPU-minutes to 98% at most half of TPE's and of
    SCOOT's, with no more misses than either."""
    strategies = entry["strategies"]
    if "servetune" not in strategies:
        return {}
    ours = strategies["servetune"]["summary"]
    out: dict[str, Any] = {}
    for other in ("tpe", "scoot"):
        if other not in strategies:
            continue
        theirs = strategies[other]["summary"]
        a, b = ours["gpu_minutes_to_0.98"]["median"], theirs["gpu_minutes_to_0.98"]["median"]
        out[other] = {"ratio": None if not b else round(a / b, 3),
                      "met": bool(b) and a <= 0.5 * b and ours["to_0.98"]["misses"] <= theirs["to_0.98"]["misses"]}
    return out


def warm_summary(rows: list[dict[str, Any]], optimum: float) -> dict[str, Any]:
    """Issue 25's warm-start target on one landscape: the second study's first launch within 2% of its optimum
    in at least 8 of 10 seeds, and no launch dies; beside the same study cold."""
    out: dict[str, Any] = {"optimum": optimum, "runs": rows}
    for name in ("warm", "cold"):
        runs = [r[name] for r in rows]
        first = [r["first_launch_share"] for r in runs]
        out[name] = {
            "first_within_2pct": sum(1 for f in first if f is not None and f >= 0.98),
            "died": sum(r["died"] for r in runs),
            "to_0.98_median": statistics.median(r["reached"]["0.98"] or r["launches"] for r in runs),
            "gpu_minutes_to_0.98_median": statistics.median(
                r["gpu_minutes_to"]["0.98"] if r["gpu_minutes_to"]["0.98"] is not None else r["gpu_minutes"]
                for r in runs),
            "misses": sum(1 for r in runs if r["reached"]["0.98"] is None),
        }
        w = out[name]
        print(f"  second study, new workload, {name:4s}: first launch within 2% of optimum in "
              f"{w['first_within_2pct']}/{len(rows)} seeds, {w['died']} launches died, to 98% median "
              f"{w['to_0.98_median']:g} launches / {w['gpu_minutes_to_0.98_median']:.1f} GPU-min, "
              f"{w['misses']} misses")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", action="append", type=Path, default=None)
    parser.add_argument("--strategies", default="servetune,tpe,scoot,random,grid")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--launches", type=int, default=30)
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (at most 4)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--warm", action="store_true",
                        help="also run the warm start: a second study with a new workload, warm-started from a first")
    args = parser.parse_args()
    if not 1 <= args.jobs <= 4:
        sys.exit(f"-j {args.jobs}: give 1 to 4 worker processes")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if "grid" in strategies and "grid-shuffled" not in strategies:
        strategies.append("grid-shuffled")
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        sys.exit(f"unknown strategies: {', '.join(bad)} (known: {', '.join(STRATEGIES)})")
    paths = args.space or sim_spaces()
    report: dict[str, Any] = {"metadata": metadata(), "seeds": args.seeds, "launches": args.launches, "spaces": {}}
    print(json.dumps(report["metadata"]))
    shape: dict[Path, tuple[int, int]] = {}
    for path in paths:
        land = Landscape(path)
        if not land.space.engine.simulated:
            sys.exit(f"{path}: engine.kind is {land.space.engine.kind}, not sim")
        if land.space.objective.kind != "throughput_at":
            sys.exit(f"{path}: objective.kind is {land.space.objective.kind}; the benchmark scores throughput_at")
        optimum, n_points, n_dead = land.optimum()
        LANDS[path], OPTIMA[path], shape[path] = land, optimum, (n_points, n_dead)
    if args.warm:
        for path in paths:
            second = Landscape(path.with_name(path.stem + "-second.yaml"), new_workload(LANDS[path].space))
            SECOND[path], OPTIMA[second.path] = second, second.optimum()[0]
    jobs = [(path, strategy, seed, args.launches) for path in paths for strategy in strategies
            for seed in range(args.seeds)]
    warm_jobs = [(path, seed, args.launches) for path in paths for seed in range(args.seeds)] if args.warm else []
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(one_run, jobs, chunksize=1)
            warm_results = pool.map(warm_run, warm_jobs, chunksize=1)
    else:
        results = [one_run(job) for job in jobs]
        warm_results = [warm_run(job) for job in warm_jobs]
    rows_of: dict[tuple[Path, str], list[dict[str, Any]]] = {}
    for path, strategy, _, row in results:
        rows_of.setdefault((path, strategy), []).append(row)
    for path in paths:
        land, optimum = LANDS[path], OPTIMA[path]
        n_points, n_dead = shape[path]
        print(f"\n{path.name}: {n_points} configurations, {n_dead} die ({n_dead / n_points:.0%}), optimum "
              f"{optimum:.2f} (simulated, noiseless), noise {land.noise_pct:g}%, {land.gpus} GPUs")
        print(f"{'strategy':14s} {'to 98% med/worst/miss':>22s} {'GPU-min 98%':>11s} {'to 99.5%':>14s} "
              f"{'GPU-min all':>11s} {'died':>5s} {'dead GPU-min':>12s} {'skips':>6s} "
              f"{'stopped/saved':>13s} {'regret':>7s} "
              f"{'picked best':>11s} {'near best':>9s} {'reported/true':>13s}")
        entry: dict[str, Any] = {"optimum": optimum, "configurations": n_points, "dying": n_dead,
                                 "noise_pct": land.noise_pct, "gpus": land.gpus, "strategies": {}}
        for strategy in strategies:
            rows = sorted(rows_of[(path, strategy)], key=lambda r: r["seed"])
            s = summarise(rows, args.seeds)
            entry["strategies"][strategy] = {"summary": s, "runs": rows}
            a, b = s["to_0.98"], s["to_0.995"]
            over = s["reported_over_true_median"]
            print(f"{strategy:14s} {_fmt(a['median']):>8s}/{_fmt(a['worst'])}/{a['misses']:<6d}"
                  f" {s['gpu_minutes_to_0.98']['median']:11.1f} {_fmt(b['median']):>6s}/{_fmt(b['worst'])}/"
                  f"{b['misses']:<3d} {s['gpu_minutes_median']:11.1f} {s['died_share']:5.0%} "
                  f"{s['dead_gpu_minutes_per_seed']:12.1f} {s['skips_per_seed']:6.1f} "
                  f"{s['stopped_early_per_seed']:5.1f}/{s['saved_gpu_minutes_per_seed']:<7.1f} "
                  f"{s['regret_median']:7.2%} "
                  f"{s['picked_best_launched']:>8d}/{args.seeds} {s['picked_near_best_launched']:>6d}/{args.seeds} "
                  f"{'-' if over is None else f'{over:+.1%}':>13s}")
        st = entry["strategies"].get("servetune", {}).get("summary")
        if st is not None and st["reported_worst"] is not None:
            iv = st["interval_median"]
            print(f"  servetune's reported figure within 3% of the truth in {st['reported_within_3pct']}/{args.seeds} "
                  f"seeds (worst {st['reported_worst']:+.1%}); stated 90% interval median "
                  f"{'-' if iv is None else f'±{iv:.1%}'}; final launches median {st['final_launches_median']:g}")
        entry["targets"] = targets(entry)
        for other, t in entry["targets"].items():
            print(f"  GPU-minutes to 98%, servetune / {other}: {_fmt(t['ratio'])} "
                  f"({'met' if t['met'] else 'MISSED'}: at most 0.5 and no more misses)")
        report["spaces"][path.name] = entry
        if args.warm:
            entry["warm_start"] = warm_summary([w for w, job in zip(warm_results, warm_jobs, strict=True)
                                                if job[0] == path], OPTIMA[SECOND[path].path])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
