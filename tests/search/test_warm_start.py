"""A study that starts from what earlier studies learned (``servetune run --warm-start``), end to end: real
``servetune`` processes launching the simulated host, one SQLite storage. A second study with a new workload on
the same cards, model, engine version and fixed args starts from the first's best configuration (no probe) and
says so; a study on another engine version does not use it and says why."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.study import StudyDirection

from search.strategy.confirm import confirmed_best
from search.strategy.design import MEMORY_KNOB
from search.strategy.warm import WARM_ATTR, WARM_USED_ATTR
from search.trial.records import records
from tests.search.overnight_kit import FAST, cli, make_space

SECOND = {**FAST, "input_len": 32, "output_len": 32}


def run(wd: Path, space: Path, study: str, *extra: str) -> str:
    res = cli("run", str(space), "--study", study, "--storage", f"sqlite:///{wd}/s.db", "--no-mlflow", "--no-live",
              "--artifacts-dir", str(wd / "artifacts"), "--confirm-top", "0", "--seed", "1", *extra, cwd=wd,
              timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def study(wd: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{wd}/s.db")


def without_memory(params: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in params.items() if k != MEMORY_KNOB}


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wd = tmp_path_factory.mktemp("warm")
    run(wd, make_space(wd / "first.yaml", safe=False), "first", "-n", "4")
    return wd


@pytest.mark.slow  # three real searches
def test_a_second_study_starts_from_the_first(first: Path) -> None:
    wd = first
    space = make_space(wd / "second.yaml", workload=SECOND, safe=False)
    out = run(wd, space, "second", "-n", "3", "--warm-start", "first")
    earlier = list(records(study(wd, "first")))
    assert "warm start from first: " in out and "same cards, model, engine version and fixed args" in out, out
    recs = list(records(study(wd, "second")))
    assert not any(r.probe for r in recs)  # no probe: the first launch is the earlier study's best
    chosen = confirmed_best(earlier, StudyDirection.MAXIMIZE)  # the first study's choice
    assert chosen is not None
    best = next(r for r in earlier if r.number == chosen.trial)
    assert recs[0].design and without_memory(recs[0].params) == without_memory(best.params)
    assert not any(r.oom for r in recs)
    assert study(wd, "second").user_attrs[WARM_ATTR]["engine_version"] == "0.5.10"
    report = (wd / "artifacts" / "second" / "report.md").read_text()
    assert "## Warm start" in report and "warm start from first" in report


@pytest.mark.slow
def test_a_study_on_another_engine_version_does_not_use_it(first: Path) -> None:
    wd = first
    space = make_space(wd / "other.yaml", workload=SECOND, safe=False)
    data = yaml.safe_load(space.read_text())
    data["engine"]["version"] = "0.5.9"
    space.write_text(yaml.safe_dump(data))
    out = run(wd, space, "other", "-n", "1", "--warm-start", "first")  # its first launch tells
    assert "not used: first: engine version 0.5.10, not 0.5.9" in out, out
    recs = list(records(study(wd, "other")))
    assert recs[0].probe  # a cold start
    assert study(wd, "other").user_attrs[WARM_USED_ATTR] == ["not used: first: engine version 0.5.10, not 0.5.9"]


@pytest.mark.slow
def test_auto_finds_the_earlier_study_in_the_same_storage(first: Path) -> None:
    wd = first
    space = make_space(wd / "auto.yaml", workload=SECOND, safe=False)
    out = run(wd, space, "auto", "-n", "1", "--warm-start", "auto")  # its first launch tells
    assert "warm start from first: " in out, out
    assert not any(r.probe for r in records(study(wd, "auto")))
