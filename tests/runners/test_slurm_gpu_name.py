"""The GPU a trial on a Slurm cluster ran on is the card nvidia-smi names on the job's node, not sinfo's GRES
type: the preflight on the login node sees only ``gpu`` (or ``h100``), and the export's header, the report and
MLflow would print ``gpu x 4``. A real throwaway Slurm cluster (tests/fixtures/slurm.py), the simulated host
inside the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

from runners.simhost.profile import load_profile
from search.trial.records import TrialFacts
from tests.fixtures.slurm import SlurmCluster, start_slurm
from tests.runners.test_slurm_search import inventory, make_space, search
from tests.search.overnight_kit import PROFILE, SURVIVES

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1",), gpus_per_node=8, cpus=8)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_slurm_trial_records_the_gpu_nvidia_smi_names_on_the_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    card = load_profile(PROFILE).host.gpu_name
    assert card != "gpu"
    trials = search(tmp_path, make_space(tmp_path), inventory(tmp_path, slurm), [SURVIVES], n_trials=1)
    facts = TrialFacts.from_trial(trials[0])
    assert trials[0].state == TrialState.COMPLETE, facts.reason
    assert facts.gpu_name == card
    assert slurm.run("sinfo", "-h", "-o", "%G").stdout.strip() == "gpu:8"  # all the preflight sees
