"""The ``slurm:`` mapping of an inventory entry and the batch script rendered from it (no cluster needed):
bad input is one line naming what is wrong and what is allowed; the script carries exactly the entry's and
the trial's directives; a Slurm entry opens as its job slots."""

from __future__ import annotations

from typing import Any

import pytest

from runners.errors import ConfigError
from runners.host import Resources
from runners.inventory import parse_inventory
from runners.placement.registry import open_placements
from runners.slurm import SlurmHost, SlurmSpec, job_script
from runners.slurm.jobs import parse_comment


def _entry(**slurm: Any) -> dict[str, Any]:
    return {"hosts": [{"name": "cluster", "address": "local", "runs_root": "/shared/me/runs", "slurm": slurm}]}


def test_a_slurm_entry_opens_as_its_job_slots_without_leases() -> None:
    spec = parse_inventory(_entry(partition="gpu", max_jobs=3))[0]
    hosts = open_placements(spec)
    assert [h.name for h in hosts] == ["cluster#1", "cluster#2", "cluster#3"]
    assert all(isinstance(h, SlurmHost) and h.kind == "slurm" and h.hold is None for h in hosts)


@pytest.mark.parametrize(("slurm", "message"), [
    ({"directives": ["constraint=ib"]}, "is not one sbatch option"),
    ({"directives": ["--nodes=2"]}, "--nodes is set by servetune itself"),
    ({"directives": ["--comment=x"]}, "--comment is set by servetune itself"),
    ({"gpu_directive": "--gres=gpu:4"}, "must be one `--name=...{gpus}...` option"),
    ({"partition": "gpu a"}, "must be one word"),
    ({"max_jobs": 0}, "greater than or equal to 1"),
    ({"parition": "gpu"}, "unknown key 'parition'"),
])
def test_bad_slurm_settings_are_one_line(slurm: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="inventory") as err:
        parse_inventory(_entry(**slurm))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_batch_script_carries_the_entrys_and_the_trials_directives() -> None:
    spec = SlurmSpec(partition="gpu", account="proj1", qos="high", time_limit="02:00:00",
                     gpu_directive="--gres=gpu:h100:{gpus}", directives=("--constraint=ib", "--exclusive"))
    text = job_script(spec, Resources(nodes=2, gpus_per_node=8), run_dir="/shared/runs/s/3",
                      job_name="servetune-s-3", comment="servetune,study=s,trial=3", env={"PATH": "/opt/bin:$PATH"},
                      run_id="s-3-abc")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH ")]
    assert directives == ["--job-name=servetune-s-3", "--comment=servetune,study=s,trial=3",
                          "--chdir=/shared/runs/s/3", "--output=/shared/runs/s/3/slurm.out", "--nodes=2",
                          "--ntasks-per-node=1", "--no-requeue", "--time=02:00:00", "--gres=gpu:h100:8",
                          "--partition=gpu", "--account=proj1", "--qos=high", "--constraint=ib", "--exclusive"]
    assert 'export PATH=/opt/bin:"${PATH}"' in lines and "export SERVETUNE_RUN_ID=s-3-abc" in lines
    assert "setsid bash ./run.sh &" in text
    cpu = job_script(SlurmSpec(), Resources(nodes=1, gpus_per_node=0), run_dir="/r/s/0", job_name="j",
                     comment="c", env={}, run_id="r")
    assert not [line for line in cpu.splitlines() if "gres" in line or "partition" in line]


def test_a_run_directory_with_a_space_cannot_go_on_an_sbatch_line() -> None:
    with pytest.raises(ConfigError, match="must be one word"):
        job_script(SlurmSpec(), Resources(), run_dir="/my runs/s/0", job_name="j", comment="c", env={}, run_id="r")


def test_only_servetunes_comments_are_read() -> None:
    assert parse_comment("servetune,study=s,trial=3,controller=c1") == {"study": "s", "trial": "3",
                                                                        "controller": "c1"}
    assert parse_comment("not-servetune") == {} and parse_comment("servetuner,study=s") == {}
