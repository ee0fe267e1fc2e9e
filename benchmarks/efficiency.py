"""Search efficiency: how many server launches servetune's sampler needs to find a near-optimal config.

The landscape is the simulated host's pure model (``runners.simhost.model``) for the demo space (seed 003:
DeepSeek-V4-Flash NVFP4 TP4, output throughput at C=64, OOM anywhere = pruned). The true optimum comes
from evaluating every point of the space's grid. Each search then runs Optuna's ask/tell with servetune's
own sampling (``search.sampling.sample``) and sampler settings (TPE, 8 start-up trials) against random
search, over several seeds. A configuration sampled again is reused, as servetune does, so it costs no
launch. Printed: launches to reach 98% and 99.5% of the optimum (median and worst over seeds), the best fraction of
the optimum found within the launch budget, and the share of launches that died of OOM.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import optuna
from _common import ROOT, metadata

from runners.engines.sglang import SGLangEngine
from runners.simhost.model import Workload, predict_from_argv
from runners.simhost.profile import load_profile
from search.sampling import distributions, sample
from spaces.launch import LaunchConfig
from spaces.schema import load_space

VERSION = "0.5.10"


class Landscape:
    def __init__(self) -> None:
        self.space = load_space(ROOT / "spaces" / "demo-sim.yaml")
        assert self.space.engine.sim is not None
        self.profile = load_profile(Path(self.space.engine.sim.profile))
        w = self.space.workload
        target = self.space.target_level
        self.workload = Workload(input_len=w.input_len, output_len=w.output_len, concurrency=(target,),
                                 requests_per_level=w.requests()[w.concurrency.index(target)])
        self.engine = SGLangEngine()
        self.cache: dict[tuple[Any, ...], float | None] = {}

    def value(self, params: dict[str, Any]) -> float | None:
        """Output throughput at the target level, or None when the server dies (OOM or other)."""
        key = tuple(sorted(params.items()))
        if key not in self.cache:
            launch = LaunchConfig.from_params(self.space, params)
            argv = self.engine.argv(launch.model_copy(update={"engine": "sglang"}), VERSION)[3:]
            out = predict_from_argv(self.profile, argv, launch.env, self.workload, version=VERSION)
            level = out.levels[0] if out.levels else None
            ok = out.outcome == "ok" and level is not None and level.ok
            self.cache[key] = level.output_throughput if ok and level is not None else None
        return self.cache[key]

    def grid(self) -> list[dict[str, Any]]:
        axes = []
        for name, dist in distributions(self.space).items():
            if isinstance(dist, optuna.distributions.FloatDistribution):
                assert dist.step is not None
                n = round((dist.high - dist.low) / dist.step) + 1
                axes.append([(name, round(dist.low + i * dist.step, 6)) for i in range(n)])
            else:
                assert isinstance(dist, optuna.distributions.CategoricalDistribution)
                axes.append([(name, c) for c in dist.choices])
        return [dict(point) for point in itertools.product(*axes)]


def search(land: Landscape, sampler: optuna.samplers.BaseSampler, launches: int, optimum: float) -> dict[str, Any]:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: set[tuple[Any, ...]] = set()
    best, ooms = 0.0, 0
    reached: dict[float, int | None] = {0.98: None, 0.995: None}
    trials = 0
    while len(seen) < launches and trials < launches * 20:
        trials += 1
        trial = study.ask()
        params = sample(trial, land.space)
        key = tuple(sorted(params.items()))
        value = land.value(params)
        if key not in seen:
            seen.add(key)
            ooms += value is None
            if value is not None and value > best:
                best = value
            for bar in reached:
                if reached[bar] is None and best >= bar * optimum:
                    reached[bar] = len(seen)
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
    return {"reached": reached, "best_fraction": best / optimum, "oom_share": ooms / max(len(seen), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--launches", type=int, default=30)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    land = Landscape()
    grid = land.grid()
    values = [land.value(p) for p in grid]
    alive = [v for v in values if v is not None]
    optimum = max(alive)
    near = sum(1 for v in alive if v >= 0.98 * optimum)
    print(json.dumps(metadata()))
    dead = len(grid) - len(alive)
    print(f"landscape: {len(grid)} configurations, {dead} die ({dead / len(grid):.0%}), "
          f"optimum {optimum:.2f} tok/s (simulated), {near} within 2% of it ({near / len(grid):.1%})")
    samplers = {
        "servetune (TPE)": lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=8),
        "random": lambda s: optuna.samplers.RandomSampler(seed=s),
    }
    for name, make in samplers.items():
        runs = [search(land, make(seed), args.launches, optimum) for seed in range(args.seeds)]
        parts = []
        for bar in (0.98, 0.995):
            reached = [r["reached"][bar] for r in runs if r["reached"][bar] is not None]
            misses = sum(1 for r in runs if r["reached"][bar] is None)
            med = statistics.median(reached) if reached else float("nan")
            worst = max(reached) if reached else float("nan")
            parts.append(f"to {bar:.1%}: median {med:g}, worst {worst:g}, missed {misses}/{args.seeds}")
        frac = statistics.median(r["best_fraction"] for r in runs)
        oom = statistics.fmean(r["oom_share"] for r in runs)
        print(f"{name:16s} launches {'; '.join(parts)}; best within {args.launches} launches: median "
              f"{frac:.1%} of optimum; launches that died: {oom:.0%}")

if __name__ == "__main__":
    main()
