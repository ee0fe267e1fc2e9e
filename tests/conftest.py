"""Shared fixtures. Real servers start here (tests/fixtures/); helpers live next to them, not here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.postgres import PostgresCluster, start_postgres
from tests.fixtures.sshd import SshServer, make_key, start_sshd, write_known_hosts


@pytest.fixture(scope="session")
def ssh_client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ed25519 key every test sshd accepts (``.pub`` next to it)."""
    return make_key(tmp_path_factory.mktemp("ssh-client") / "id_ed25519", comment="servetune-test-client")


def _shared_sshd(tmp_path_factory: pytest.TempPathFactory, key: Path, address: str) -> Iterator[SshServer]:
    server = start_sshd(tmp_path_factory.mktemp(f"sshd-{address}"), address, key)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, ssh_client_key: Path) -> Iterator[SshServer]:
    """A real sshd on 127.0.0.1 for the whole session. Do not stop it; use ``sshd_factory`` for that."""
    yield from _shared_sshd(tmp_path_factory, ssh_client_key, "127.0.0.1")


@pytest.fixture(scope="session")
def sshd_b(tmp_path_factory: pytest.TempPathFactory, ssh_client_key: Path) -> Iterator[SshServer]:
    """A second host: sshd on 127.0.0.2."""
    yield from _shared_sshd(tmp_path_factory, ssh_client_key, "127.0.0.2")


@pytest.fixture(scope="session")
def sshd_c(tmp_path_factory: pytest.TempPathFactory, ssh_client_key: Path) -> Iterator[SshServer]:
    """A third host: sshd on 127.0.0.3."""
    yield from _shared_sshd(tmp_path_factory, ssh_client_key, "127.0.0.3")


@pytest.fixture
def sshd_factory(tmp_path: Path, ssh_client_key: Path) -> Iterator[Callable[[str], SshServer]]:
    """``sshd_factory("127.0.0.1")`` starts a throwaway sshd this test may stop and restart."""
    servers: list[SshServer] = []

    def start(address: str = "127.0.0.1") -> SshServer:
        server = start_sshd(tmp_path / f"sshd-{len(servers)}", address, ssh_client_key)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def known_hosts(tmp_path: Path, sshd: SshServer) -> Path:
    """A known_hosts file with the key of ``sshd`` (add others with ``write_known_hosts``)."""
    return write_known_hosts(tmp_path / "known_hosts", sshd)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster in a temp dir for the whole session; tests keep to their own study names."""
    cluster = start_postgres()
    try:
        yield cluster
    finally:
        cluster.stop()
