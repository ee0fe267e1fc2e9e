"""``pareto`` end to end: the shipped space through ``servetune run`` on the simulated host (real processes and
HTTP), then ``servetune export --pick``.

The search's trials are queued so the outcomes are known: an OOM in graph capture (PRUNED, no values), a
configuration capped at 4 running requests (low latency, low throughput) and one capped at 16 (the other end
of the front); the confirmation stage then repeats the front's configuration nearest its ideal point.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.telemetry import FailureKind
from search.storage import create_or_load, open_storage, open_study
from search.trial.records import records
from tests.fixtures.ports import free_port
from tests.search.overnight_kit import cli

ROOT = Path(__file__).resolve().parents[2]
METRICS = ["output_throughput", "p99_tpot_ms"]
OOM = {"mem_fraction_static": 0.84, "cuda_graph_max_bs": 48, "max_running_requests": None}
TIGHT = {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 48, "max_running_requests": 4}
WIDE = {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 48, "max_running_requests": 16}


@pytest.mark.slow  # a real search of four launches on the simulated host (about 20 s)
def test_the_shipped_pareto_space_runs_and_exports_a_pick(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "spaces" / "sim-pareto.yaml").read_text())
    data["port"] = free_port()
    data["engine"]["sim"]["profile"] = str(ROOT / "runners" / "simhost" / "profiles" /
                                           "dsv4-flash-nvfp4-tp4-rtxpro6000.yaml")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path}/servetune.db"
    queued = create_or_load(open_storage(url), "pareto", directions=["maximize", "minimize"], metric_names=METRICS)
    for params in (OOM, TIGHT, WIDE):
        queued.enqueue_trial(params)
    run = cli("run", str(space), "--study", "pareto", "--storage", url, "--n-trials", "3", "--no-mlflow",
              "--no-live", "--confirm-top", "1", "--confirm-repeats", "1", cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr

    study = open_study(url, "pareto")
    recs = records(study)
    assert [(r.state, r.confirmation_of) for r in recs] == [
        (TrialState.PRUNED, None), (TrialState.COMPLETE, None), (TrialState.COMPLETE, None),
        (TrialState.COMPLETE, 1)]  # the knee of a two-point front is a tie, and the lower number wins it
    assert recs[0].outcome == FailureKind.OOM and recs[0].values is None
    for rec in recs[1:]:
        (row,) = rec.levels
        assert rec.values == [row.output_throughput, row.p99_tpot_ms] and row.max_concurrency == 32
        assert rec.objective_metrics == METRICS and rec.simulated
    # one Optuna study with two directions; its trials carry no intermediate values (Optuna keeps none there)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"] and study.metric_names == METRICS
    assert [t.intermediate_values for t in study.trials] == [{}] * 4
    assert "front: 2 configuration(s) (maximize output_throughput, minimize p99_tpot_ms): trials 1, 2" in run.stdout
    assert "knee: trial 1," in run.stdout
    assert 'id="servetune-pareto-front"' in (tmp_path / "artifacts" / "pareto" / "report.html").read_text()

    out = tmp_path / "serve.sh"
    export = cli("export", "--study", "pareto", "--storage", url, "--pick", "p99_tpot_ms<=400", "-o", str(out),
                 cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    script = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)], check=False).returncode == 0
    medians = [statistics.median(v) for v in zip(recs[1].values or [], recs[3].values or [], strict=True)]
    assert "# servetune export: study pareto, trial 1\n" in script
    assert "# picked by: --pick p99_tpot_ms<=400 (then the best on the first metric)\n" in script
    assert (f"# picked figures: output_throughput={medians[0]:.2f}, p99_tpot_ms={medians[1]:.2f} (median of 2 "
            "launches)\n") in script
    assert "--max-running-requests 4" in script

    bad = cli("export", "--study", "pareto", "--storage", url, "--pick", "p99_tpot_ms=<400", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == ("servetune: error: --pick: 'p99_tpot_ms=<400' is not 'knee' or METRIC<=NUMBER "
                          "(or >=, <, >)\n")
