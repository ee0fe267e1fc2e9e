"""NCCL rules keyed by the NCCL on the host: a space declared for NCCL 2.27 (``engine.nccl``) that searches
``NCCL_ALGO=allreduce:tree`` beside a bare ``NCCL_PROTO`` runs on a host whose torch loads 2.27, and is refused
before any trial, in one line naming the version, on a host that loads 2.31 (the simulated host's preflight
reports the NCCL its profile names, as a real host's torch would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from runners.errors import HostMisconfigured
from search.driver.hosts import local_host
from search.driver.run import RunOptions, run_search
from search.trial.records import records
from spaces.schema import load_space
from tests.search.overnight_kit import FAST, PROFILE
from tests.search.overnight_kit import make_space as kit_make_space


def space_on(wd: Path, nccl_on_host: str) -> Path:
    profile = yaml.safe_load(PROFILE.read_text())
    profile["host"]["nccl_version"] = nccl_on_host
    (wd / "profile.yaml").write_text(yaml.safe_dump(profile))
    path = kit_make_space(wd / "space.yaml", workload=FAST,
                          knobs={"nccl": {"NCCL_PROTO": ["Simple"], "NCCL_ALGO": ["allreduce:tree"]}})
    data = yaml.safe_load(path.read_text())
    data["engine"]["sim"]["profile"] = str(wd / "profile.yaml")
    data["engine"]["nccl"] = "2.27.3"
    path.write_text(yaml.safe_dump(data))
    return path


def search(wd: Path, nccl_on_host: str) -> list[object]:
    space = load_space(space_on(wd, nccl_on_host))
    host = local_host(space, runs_root=str(wd / "runs"), sim_dir=wd / "sim")
    try:
        summary = run_search(space, [host], RunOptions(
            study_name="nccl", storage_url=f"sqlite:///{wd}/s.db", artifacts_dir=wd / "artifacts", n_trials=1,
            timeout=None, seed=1, smi_interval=0.2, confirm_k=0))
    finally:
        host.close()
    return list(records(summary.study))


@pytest.mark.slow  # a real search on the simulated host
def test_the_space_runs_on_the_nccl_it_was_declared_for(tmp_path: Path) -> None:
    trials = search(tmp_path, "2.27.3")
    assert [t.state for t in trials] == [TrialState.COMPLETE]  # type: ignore[attr-defined]


@pytest.mark.slow  # a real search on the simulated host
def test_the_same_space_is_refused_on_a_host_with_nccl_2_31(tmp_path: Path) -> None:
    with pytest.raises(HostMisconfigured) as info:
        search(tmp_path, "2.31.2")
    line = str(info.value)
    assert "\n" not in line and "NCCL 2.31.2 (what local's torch loads" in line, line
    assert "NCCL_ALGO=allreduce:tree with NCCL_PROTO=Simple" in line and "write ring;allreduce:tree" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("pgid"))  # nothing launched
    import optuna

    assert optuna.get_all_study_names(f"sqlite:///{tmp_path}/s.db") == []  # no empty study left behind


def test_a_tensor_parallel_size_above_the_known_hosts_gpus_is_refused_at_load(tmp_path: Path) -> None:
    from runners.errors import ConfigError
    from search.spaces import load_checked_space

    path = space_on(tmp_path, "2.27.3")
    data = yaml.safe_load(path.read_text())
    gpus = yaml.safe_load(PROFILE.read_text())["host"]["gpu_count"]
    data["fixed_args"] = ["--tp", str(gpus * 2)]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_checked_space(path)
    line = str(info.value)
    assert "\n" not in line and f"tensor parallel size {gpus * 2} needs {gpus * 2} GPUs per node" in line, line
    data["fixed_args"] = ["--tp", str(gpus)]
    path.write_text(yaml.safe_dump(data))
    load_checked_space(path)


def test_validate_without_a_declared_version_assumes_the_newest(tmp_path: Path) -> None:
    path = space_on(tmp_path, "2.27.3")
    data = yaml.safe_load(path.read_text())
    del data["engine"]["nccl"]
    path.write_text(yaml.safe_dump(data))
    from runners.errors import ConfigError

    with pytest.raises(ConfigError, match=r"NCCL 2\.32\.3 \(assumed: the newest servetune knows"):
        load_space(path)
