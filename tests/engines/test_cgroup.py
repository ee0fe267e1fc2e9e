"""Host.start(memory_limit_bytes=...) on this machine: a memory cgroup of the server's own, the kernel's
oom_kill count read back after the death, the cgroup removed after the stop. Fails (never skips) where no
memory cgroup can be made: the OOM-kill evidence of the vLLM suite depends on it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from runners.host import Host
from tests.engines.proctree import wait_for

pytestmark = [pytest.mark.engines, pytest.mark.ssh]

HOG = "exec python3 -c \"import time; b = b'x' * (400 << 20); time.sleep(60)\"\n"


def test_memory_cgroup_oom_kill_is_evidence_and_the_cgroup_is_removed(ssh_host: Host) -> None:
    run_id = f"cgroup-{uuid.uuid4().hex[:8]}"
    run_dir = ssh_host.run_dir("engines", run_id)
    ref = ssh_host.start(run_dir, "#!/usr/bin/env bash\n" + HOG, run_id, memory_limit_bytes=128 << 20)
    cg_file = Path(ref.run_dir, "cgroup")
    assert cg_file.exists(), "the wrapper recorded no cgroup"
    version, _, path = cg_file.read_text().strip().partition(" ")
    assert version in ("1", "2") and Path(path).is_dir()
    assert wait_for(lambda: ssh_host.exit_code(ref) is not None, 30)
    assert ssh_host.exit_code(ref) == 137  # SIGKILLed by the kernel
    evidence = ssh_host.oom_evidence(ref)
    assert int(evidence["oom_kill"]) >= 1, evidence
    assert evidence["memory_limit_bytes"] == 128 << 20
    assert evidence["cgroup_version"] == int(version)
    stop = ssh_host.stop(ref, grace=5)
    assert stop.method == "gone"
    ssh_host.remove_cgroup(ref)
    assert not Path(path).exists()
    assert ssh_host.oom_evidence(ref)["oom_kill"] == evidence["oom_kill"]  # kept in the run directory


def test_no_limit_means_no_cgroup_and_no_evidence(ssh_host: Host) -> None:
    run_id = f"nocgroup-{uuid.uuid4().hex[:8]}"
    ref = ssh_host.start(ssh_host.run_dir("engines", run_id), "#!/usr/bin/env bash\nexec sleep 30\n", run_id)
    try:
        assert not Path(ref.run_dir, "cgroup").exists()
        assert ssh_host.oom_evidence(ref) == {}
    finally:
        ssh_host.stop(ref, grace=5)
    ssh_host.remove_cgroup(ref)
