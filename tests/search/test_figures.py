"""The figures of search/figures.py, built from the standard trials (tests/fixtures/trials.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.outputs.figures import (
    FIGURE_IDS,
    Boundary,
    FiguresCallback,
    concurrency_curves,
    ladder_segments,
    memory_ladder,
    model_boundary,
    oom_map,
    outcome_class,
    progress_figure,
    progress_points,
    save_to_dashboard,
    study_figures,
    trial_seconds,
)
from search.spaces import load_checked_space
from search.strategy.view import StudyView
from search.trial.records import FACTS_ATTR, TrialFacts, records
from tests.fixtures.trials import build_study, level, make_trial, standard_trials

ROOT = Path(__file__).resolve().parents[2]


def marks(figure) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    """Trial numbers of the OOM map's marks, by outcome class."""
    return {t.meta["servetune_outcome"]: list(t.customdata) for t in figure.data
            if isinstance(t.meta, dict) and "servetune_outcome" in t.meta}


def test_oom_map_one_mark_per_trial_coloured_by_outcome(study: optuna.Study) -> None:
    recs = records(study)
    fig = oom_map(recs)
    assert fig.layout.xaxis.title.text == "mem_fraction_static"
    assert fig.layout.yaxis.title.text == "cuda_graph_max_bs"
    assert marks(fig) == {"ok": [0, 1], "oom:cuda_graph": [2], "oom:decode": [3], "infra": [4], "running": [5]}
    ok = next(t for t in fig.data if t.meta["servetune_outcome"] == "ok")
    assert list(ok.x) == [0.8, 0.88] and list(ok.y) == [128, 256]
    # The objective sets the size of a live mark: the best (trial 1, 2400) is the bigger one.
    assert ok.marker.size[1] > ok.marker.size[0]
    colours = {t.meta["servetune_outcome"]: t.marker.color for t in fig.data}
    assert len(set(colours.values())) == len(colours)
    assert "simulated" not in fig.layout.title.text


def test_oom_map_any_pair_and_predicted_oom(tmp_path: Path) -> None:
    st = build_study(f"sqlite:///{tmp_path / 'p.db'}", "p", standard_trials())
    # A configuration the memory model refused to launch. Its outcome is read by label: it is not a
    # FailureKind of this release (the memory-aware search adds it), so the record is built unvalidated.
    predicted = TrialFacts.model_construct(
        number=6, state=TrialState.PRUNED, outcome="predicted_oom",
        params={"mem_fraction_static": 0.95, "cuda_graph_max_bs": 256, "nccl.NCCL_ALGO": "unset"},
        reason="memory model: 1.2 GiB short in cuda_graph")
    recs = [*records(st), predicted]
    assert predicted.label == "predicted_oom" and outcome_class(recs[6]) == "predicted_oom"
    fig = oom_map(recs, x="cuda_graph_max_bs", y="nccl.NCCL_ALGO")
    assert fig.layout.xaxis.title.text == "cuda_graph_max_bs" and fig.layout.yaxis.title.text == "nccl.NCCL_ALGO"
    assert marks(fig)["predicted_oom"] == [6]
    assert sum(len(v) for v in marks(fig).values()) == 7


def test_oom_map_draws_the_predicted_boundary(study: optuna.Study) -> None:
    recs = records(study)
    # A model that predicts death above mem 0.9 - bs/2560 (0.8 at bs 256).
    fig = oom_map(recs, boundary=Boundary(lambda x, y: 0.9 - y / 2560 - x, label="model v1"))
    contour = next(t for t in fig.data if t.type == "contour")
    assert contour.name == "model v1"
    assert contour.contours.start == 0.0 and contour.contours.end == 0.0
    z = contour.z
    assert z[0][0] > 0 > z[-1][-1]  # low fraction, small bs: alive; high fraction, big bs: dead
    # A grid the model computed: the nearest point answers.
    grid = Boundary.from_grid([0.8, 0.9], [128, 256], [[1.0, -1.0], [0.5, -2.0]])
    assert grid.margin(0.81, 130) == 1.0 and grid.margin(0.89, 250) == -2.0
    assert not [t for t in oom_map(recs).data if t.type == "contour"]


def test_the_oom_map_draws_the_study_memory_models_boundary(tmp_path: Path) -> None:
    def ok(mfs: float, cgbs: int, cap: float, graph: float, value: float, start: float) -> optuna.trial.FrozenTrial:
        return make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=cgbs, value=value, start_min=start,
                          levels=[level(1, 10.0), level(16, value)],
                          memory={"gpu_total_gib": 79.19, "avail_before_weights_gib": 75.0, "weights_gib": 15.3,
                                  "kv_gib": mfs * 75.0 - 15.8, "graph_gib": graph, "free_after_capture_gib": cap})

    trials = [ok(0.70, 64, 20.4, 2.1, 2000.0, 0), ok(0.80, 128, 12.4, 2.6, 2100.0, 5),
              make_trial(state=TrialState.PRUNED, mfs=0.93, cgbs=256, outcome="oom", phase="cuda_graph", start_min=10,
                         memory={"gpu_total_gib": 79.19, "avail_before_weights_gib": 75.0, "weights_gib": 15.3,
                                 "tried_to_allocate_gib": 3.94, "free_at_oom_gib": 2.8})]
    study = build_study(f"sqlite:///{tmp_path / 'm.db'}", "m", trials)
    view = StudyView.of(study, space=load_checked_space(ROOT / "spaces" / "demo-sim.yaml"))
    boundary = model_boundary(view)
    assert boundary is not None
    assert boundary.margin(0.70, 64) > 0 > boundary.margin(0.93, 256)  # lives where it lived, dies where it died
    contour = next(t for t in study_figures(view)["servetune-oom-map"].data if t.type == "contour")
    assert contour.name == "memory model: predicted OOM boundary"
    # without the space (no model) or before the model has figures: no boundary, nothing drawn
    assert model_boundary(StudyView.of(study)) is None
    assert not [t for t in study_figures(StudyView.of(study))["servetune-oom-map"].data if t.type == "contour"]


def test_memory_ladder_of_the_best_and_the_last_oom(study: optuna.Study) -> None:
    view = StudyView.of(study)
    recs = view.records
    assert view.choice is not None and view.choice.number == 1
    fig = memory_ladder(recs, chosen=view.choice.number)
    bars = {t.name: list(t.x) for t in fig.data if t.type == "bar"}
    labels = list(fig.data[0].y)
    assert labels == ["trial 1<br>(best)", "trial 3<br>(OOM in decode)"]
    assert bars["KV pool"] == [46.0, 0.0] and bars["graph pool"] == [3.4, 0.0]
    assert bars["free after capture"] == [0.82, 1.2]
    total = next(t for t in fig.data if t.name == "GPU total")
    assert list(total.x) == [79.19, 79.19]
    peak = next(t for t in fig.data if t.name == "peak under load (smi)")
    assert list(peak.y) == ["trial 3<br>(OOM in decode)"] and peak.x[0] == pytest.approx(80900 / 1024)
    # With every figure known, "other" is what the GPU's total leaves.
    segments = ladder_segments(recs[0])
    assert segments["other_gib"] == pytest.approx(79.19 - 15.3 - 40.2 - 2.1 - 4.1)
    assert list(memory_ladder(recs, [0]).data[0].y) == ["trial 0<br>(ok)"]
    # Trial 2 died in graph capture asking 3.94 GiB with 2.80 GiB free: the failed allocation starts where
    # the free memory did and ends past the GPU's total.
    failed = next(t for t in memory_ladder(recs, [2]).data if t.name == "failed allocation")
    assert failed.base[0] == pytest.approx(79.19 - 2.8) and failed.x[0] == 3.94


def test_an_oom_trial_is_drawn_as_it_stood_when_it_died() -> None:
    # Died in eager decode: 16.99 GiB free after capture, 2.80 GiB free at the OOM, 3.94 GiB asked. nvidia-smi's
    # only sample was taken while the weights loaded (18 GiB): below the 76.39 GiB the OOM message implies.
    trial = make_trial(state=TrialState.PRUNED, mfs=0.7, cgbs=64, outcome="oom", phase="decode",
                       reason="CUDA out of memory in decode: tried to allocate 3.94 GiB with 2.80 GiB free",
                       memory={"gpu_total_gib": 79.19, "weights_gib": 15.3, "kv_gib": 40.0, "graph_gib": 3.0,
                               "free_after_capture_gib": 16.99, "tried_to_allocate_gib": 3.94,
                               "free_at_oom_gib": 2.8, "smi_peak_used_mib": 18 * 1024.0})
    rec = TrialFacts.from_trial(trial)
    seg = ladder_segments(rec)
    assert "free_after_capture_gib" not in seg
    assert seg["in_use_at_oom_gib"] == pytest.approx(16.99 - 2.8) and seg["free_at_oom_gib"] == 2.8
    assert sum(seg.values()) == pytest.approx(79.19)
    fig = memory_ladder([rec], [rec.number])
    bars = {t.name: list(t.x) for t in fig.data if t.type == "bar"}
    # the failed allocation starts where the free memory at the OOM starts: the end of the stacked bars
    # before the "free at death" segment, and runs past the total by what did not fit
    failed = next(t for t in fig.data if t.name == "failed allocation")
    before_free = sum(v[0] for k, v in bars.items() if k not in ("free at death", "failed allocation"))
    assert failed.base[0] == pytest.approx(before_free) == pytest.approx(79.19 - 2.8)
    assert not [t for t in fig.data if t.name == "peak under load (smi)"]
    death = next(t for t in fig.data if t.name == "in use (OOM message)")
    assert death.x[0] == pytest.approx(79.19 - 2.8)
    note = fig.layout.title.text
    assert "died in decode: tried to allocate 3.94 GiB with 2.80 GiB free" in note and "missed the death" in note
    # a fragmented heap: less asked than was free in all
    frag = make_trial(state=TrialState.PRUNED, mfs=0.72, cgbs=64, outcome="oom", phase="decode",
                      memory={"gpu_total_gib": 79.19, "tried_to_allocate_gib": 0.87, "free_at_oom_gib": 1.78})
    frag_rec = TrialFacts.from_trial(frag)
    text = memory_ladder([frag_rec], [frag_rec.number]).layout.title.text
    assert "largest free block is smaller (fragmentation)" in text and "no nvidia-smi sample under load" in text


def test_concurrency_curves_of_the_top_configurations(study: optuna.Study) -> None:
    fig = concurrency_curves(records(study), k=1)
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == 2 and all(t.name.startswith("trial 1 (1 launch):") for t in lines)
    assert list(lines[0].x) == [1, 16] and list(lines[0].y) == [190.0, 2400.0]
    assert list(lines[1].y) == [9.5, 17.0]  # p99 TPOT, ms
    assert len([t for t in concurrency_curves(records(study)).data if t.showlegend]) == 2


def test_top_configurations_list_each_configuration_once_by_its_median(tmp_path: Path) -> None:
    def launch(mfs: float, cgbs: int, value: float, start: float, **tags: object) -> optuna.trial.FrozenTrial:
        trial = make_trial(state=TrialState.COMPLETE, mfs=mfs, cgbs=cgbs, value=value, start_min=start,
                           levels=[level(1, value / 10), level(16, value)])
        trial.system_attrs = {**trial.system_attrs, FACTS_ATTR: {**trial.system_attrs[FACTS_ATTR], **tags}}
        return trial

    # trial 2's one lucky launch (2500) against trial 0's three (2200, 2230, 2160; median 2200)
    trials = [launch(0.80, 128, 2200.0, 0), launch(0.84, 64, 2100.0, 5), launch(0.86, 256, 2500.0, 10),
              launch(0.80, 128, 2230.0, 15, confirmation_of=0), launch(0.80, 128, 2160.0, 20, confirmation_of=0),
              launch(0.86, 256, 1900.0, 25, confirmation_of=2), launch(0.86, 256, 1950.0, 30, confirmation_of=2)]
    recs = records(build_study(f"sqlite:///{tmp_path / 't.db'}", "top", trials))
    fig = concurrency_curves(recs, k=5)
    named = [t.name for t in fig.data if t.showlegend]
    assert [n.split(":")[0] for n in named] == ["trial 0 (median of 3)", "trial 1 (1 launch)",
                                                "trial 2 (median of 3)"]
    top = next(t for t in fig.data if t.name == named[0])
    assert list(top.y) == [220.0, 2200.0]  # the medians per level
    # the concurrency axis ticks at the measured levels only, no minor ticks between them
    assert list(fig.layout.xaxis.tickvals) == [1, 16] and fig.layout.xaxis.minor.ticks == ""


def test_progress_best_so_far_and_deaths(study: optuna.Study) -> None:
    points = progress_points(records(study), study.direction)
    assert [p["number"] for p in points] == [0, 1, 2, 3, 4]  # the RUNNING trial has not finished
    assert [p["best"] for p in points] == [2100.0, 2400.0, 2400.0, 2400.0, 2400.0]
    assert [p["died"] for p in points] == [False, False, True, True, True]
    # GPU-minutes: wall time x the GPUs the server held (--tp 4 in the launch), not the host's count.
    assert points[0]["gpu_minutes"] == pytest.approx(300 * 4 / 60)
    assert points[-1]["gpu_minutes"] == pytest.approx((300 + 320 + 120 + 200 + 4) * 4 / 60)
    fig = progress_figure(records(study))
    dead = [t for t in fig.data if t.name == "launch that died"]
    assert [list(t.x) for t in dead] == [[3, 4, 5], [p["gpu_minutes"] for p in points if p["died"]]]


def test_gpu_minutes_of_a_simulated_host_are_simulated_time() -> None:
    # 120 s of wall time at --sim-speed 100; the server started in 95.5 s of wall time (the fixture's; 9550
    # simulated s) and two levels took 30 simulated s each (the fixture's level duration)
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=100.0, simulated=True, duration_s=120,
                       levels=[level(1, 10.0), level(16, 100.0)], memory={"sim_speed": 100})
    rec = TrialFacts.from_trial(trial)
    assert trial_seconds(rec) == pytest.approx(9550 + 2 * 30.0)
    assert progress_points([rec], optuna.study.StudyDirection.MAXIMIZE)[0]["gpu_minutes"] == pytest.approx(
        (9550 + 60) * 4 / 60)
    fig = progress_figure([rec])
    assert fig.layout.xaxis2.title.text == "simulated GPU-minutes"
    assert "simulated GPU-minutes: simulated time x GPUs held" in fig.layout.title.text
    real = TrialFacts.from_trial(make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=1.0, duration_s=120))
    assert trial_seconds(real) == 120


def test_simulated_figures_say_so(tmp_path: Path) -> None:
    trial = make_trial(state=TrialState.COMPLETE, mfs=0.8, cgbs=64, value=100.0, levels=[level(16, 100.0)],
                       simulated=True)
    recs = [TrialFacts.from_trial(trial)]
    for fig in (oom_map(recs), memory_ladder(recs, chosen=0), concurrency_curves(recs), progress_figure(recs)):
        assert "(simulated)" in fig.layout.title.text


def test_figures_saved_for_the_dashboard_and_refreshed(tmp_path: Path) -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    st = build_study(f"sqlite:///{tmp_path / 'd.db'}", "d", standard_trials()[:2])
    save_to_dashboard(st, study_figures(StudyView.of(st)))
    stored = get_plotly_graph_objects(st._storage.get_study_system_attrs(st._study_id))
    assert sorted(stored) == sorted(FIGURE_IDS)
    before = json.loads(stored["servetune-oom-map"])
    assert sum(len(t["customdata"]) for t in before["data"]) == 2
    # A trial finishes: the callback replaces the figures (same ids), now with its mark.
    st.add_trial(standard_trials()[2])
    callback = FiguresCallback()
    callback(StudyView.of(st), st.trials[-1])
    assert callback.failures == 0
    stored = get_plotly_graph_objects(st._storage.get_study_system_attrs(st._study_id))
    assert sorted(stored) == sorted(FIGURE_IDS)
    after = json.loads(stored["servetune-oom-map"])
    assert sum(len(t["customdata"]) for t in after["data"]) == 3


def test_figures_callback_never_raises(tmp_path: Path) -> None:
    st = build_study(f"sqlite:///{tmp_path / 'e.db'}", "e", standard_trials()[:1])
    broken = Boundary(lambda x, y: 1 / 0)
    callback = FiguresCallback(boundary=broken)
    callback(StudyView.of(st), st.trials[0])
    assert callback.failures == 1


def test_figures_callback_in_background_draws_the_latest_state(tmp_path: Path) -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    st = build_study(f"sqlite:///{tmp_path / 'b.db'}", "b", standard_trials()[:1])
    callback = FiguresCallback(background=True)
    for trial in standard_trials()[1:5]:
        st.add_trial(trial)
        callback(StudyView.of(st), st.trials[-1])
    callback.close()
    assert callback.failures == 0 and 1 <= callback.drawn <= 4  # coalesced: never more draws than trials
    stored = get_plotly_graph_objects(st._storage.get_study_system_attrs(st._study_id))
    # After close, the figures show every trial that had finished when the last one was reported.
    assert sum(len(t["customdata"]) for t in json.loads(stored["servetune-oom-map"])["data"]) == 5
    callback.close()  # idempotent


def test_slo_ratio_is_the_limit_nearest_to_breaking() -> None:
    from search.outputs.figures import slo_ratio
    from search.trial.records import LevelResult

    rec = TrialFacts(number=0, slo_limits={"p99_ttft_ms": 2000, "p99_tpot_ms": 100, "error_rate": 0.1})
    level = LevelResult(max_concurrency=64, completed=9, failed=1, p99_ttft_ms=1000, p99_tpot_ms=80)
    assert slo_ratio(rec, level) == pytest.approx(1.0)  # 1 failed of 10: exactly at the 10% limit
    assert slo_ratio(rec, level.model_copy(update={"failed": 0})) == pytest.approx(0.8)  # TPOT nearest
    assert slo_ratio(rec, level.model_copy(update={"p99_ttft_ms": 3000})) == pytest.approx(1.5)
    assert slo_ratio(rec, level.model_copy(update={"completed": 0})) == math.inf  # nothing served
    assert slo_ratio(rec, None) == math.inf  # the server died before this rate
