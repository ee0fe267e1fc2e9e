"""The placement contract (:mod:`runners.placement.contract`) over every kind: process groups on the local and the
SSH transport, and Slurm job slots on a real Slurm cluster (started once for this module). The next kind adds one
parametrisation of ``make_placement``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.inventory import HostSpec
from runners.placement.contract import MakePlacement, PlacementContract
from runners.placement.protocol import Placement
from runners.placement.registry import open_placements
from tests.fixtures.slurm import SlurmCluster, start_slurm
from tests.fixtures.sshd import SshServer


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=("node1",), gpus_per_node=1)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh),
                        pytest.param("slurm", marks=[pytest.mark.slurm, pytest.mark.slow])])
def make_placement(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakePlacement]:
    runs_root = str(tmp_path / "runs")
    host_dir = str(tmp_path / "hostdir")
    if request.param == "local":
        spec = HostSpec(address="local", runs_root=runs_root, host_dir=host_dir)
    elif request.param == "ssh":
        server: SshServer = request.getfixturevalue("sshd")
        known_hosts: Path = request.getfixturevalue("known_hosts")
        spec = server.spec(known_hosts, runs_root=runs_root, host_dir=host_dir)
    else:
        cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
        spec = HostSpec.model_validate({"name": "cluster", "address": "local", "runs_root": runs_root,
                                        "env": cluster.env, "kind": "slurm",
                                        "slurm": {"poll_interval": 0.5, "max_jobs": 1}})
    made: list[Placement] = []

    def make() -> Placement:
        placement = open_placements(spec, ssh_config=None, host_dir=host_dir)[0]
        made.append(placement)
        return placement

    try:
        yield make
    finally:
        for placement in made:
            placement.close()


class TestPlacementContract(PlacementContract):
    pass
