"""SSHTransport against real sshd instances on loopback: keys, host keys, errors, drops and reconnects.

What every transport must do (run, stream, put, servers) is in tests/contracts/test_host_contract.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from runners.errors import AuthError, ConfigError, HostBusy, HostKeyError, HostUnreachable, RunnerError
from runners.host import Host, HostInfo, RunRef
from runners.inventory import open_host
from runners.server import BenchPlan
from runners.ssh import SSHTransport, ssh_errors
from runners.telemetry import FailureKind
from tests.fixtures.hog import start_hog, stop_hog
from tests.fixtures.procs import alive, gone, wait_for
from tests.fixtures.sshd import SshServer, make_key, public_line, write_known_hosts
from tests.runners.test_events import _session

pytestmark = pytest.mark.ssh

REPO = Path(__file__).resolve().parents[2]
SshdFactory = Callable[[str], SshServer]


@pytest.fixture
def closing() -> Iterator[Callable[[SSHTransport], SSHTransport]]:
    """Register transports to close at teardown."""
    opened: list[SSHTransport] = []

    def add(t: SSHTransport) -> SSHTransport:
        opened.append(t)
        return t

    yield add
    for t in opened:
        t.close()


# ---- the error boundary -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("foreign", "expected"),
    [
        (NoValidConnectionsError({("127.0.0.1", 22): OSError(111, "refused")}), HostUnreachable),
        (TimeoutError("timed out"), HostUnreachable),  # socket.timeout
        (ConnectionRefusedError(111, "refused"), HostUnreachable),
        (EOFError(), HostUnreachable),
        (SSHException("Error reading SSH protocol banner"), HostUnreachable),
        (OSError(113, "No route to host"), HostUnreachable),
        (AuthenticationException("Authentication failed."), AuthError),
    ],
)
def test_ssh_errors_maps_foreign_errors(foreign: BaseException, expected: type[RunnerError]) -> None:
    with pytest.raises(expected) as info, ssh_errors("gpu-a"):
        raise foreign
    assert not isinstance(info.value, (OSError, SSHException))
    assert info.value.host == "gpu-a"
    assert info.value.__cause__ is foreign


def test_ssh_errors_maps_bad_host_key(tmp_path: Path) -> None:
    a = paramiko.PKey.from_path(make_key(tmp_path / "a"))
    b = paramiko.PKey.from_path(make_key(tmp_path / "b"))
    with pytest.raises(HostKeyError, match="host key for gpu-a has changed"), ssh_errors("gpu-a"):
        raise BadHostKeyException("gpu-a", a, b)


# ---- keys and config ----------------------------------------------------------------------------


def test_unknown_host_key_is_refused_by_default(sshd: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        sshd.transport(empty).run("true")
    msg = str(info.value)
    assert f"unknown host key for {sshd.known_hosts_name}" in msg
    assert "accept_new_host_key" in msg and "ssh-keyscan" in msg
    assert empty.read_text() == ""


def test_unknown_host_key_is_added_with_the_opt_in(
    sshd: SshServer, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    known = tmp_path / "new" / "known_hosts"  # neither the file nor its directory exist yet
    t = closing(sshd.transport(known, accept_new_host_key=True))
    assert t.run("echo ok").stdout == "ok\n"
    assert known.read_text().split() == sshd.known_hosts_line.split()
    assert known.stat().st_mode & 0o777 == 0o600
    # From now on the key is known: the default policy connects.
    assert closing(sshd.transport(known)).run("echo again").stdout == "again\n"


def test_changed_host_key_is_refused_even_with_the_opt_in(sshd: SshServer, tmp_path: Path) -> None:
    other = make_key(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd.known_hosts_name} {public_line(other)}\n")
    before = known.read_text()
    for accept in (False, True):
        with pytest.raises(HostKeyError, match=r"host key for .* has changed") as info:
            sshd.transport(known, accept_new_host_key=accept).run("true")
        assert "ssh-keygen -R" in str(info.value)
    assert known.read_text() == before


def test_hashed_known_hosts_entries_are_understood(
    sshd: SshServer, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd)
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert sshd.address not in known.read_text()
    assert closing(sshd.transport(known)).run("echo ok").stdout == "ok\n"


def test_wrong_client_key_is_an_auth_error(sshd: SshServer, known_hosts: Path, tmp_path: Path) -> None:
    wrong = make_key(tmp_path / "wrong_key")
    with pytest.raises(AuthError, match="no key was accepted"):
        sshd.transport(known_hosts, key_file=str(wrong)).run("true")


def test_missing_key_file_is_an_auth_error(sshd: SshServer, known_hosts: Path, tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="not found"):
        sshd.transport(known_hosts, key_file=str(tmp_path / "nope")).run("true")


def test_agent_key_is_used(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    closing: Callable[[SSHTransport], SSHTransport],
) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        assert wait_for(sock.exists, 5)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", str(sshd.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        t = closing(sshd.transport(known_hosts, key_file=None, use_agent=True))
        assert t.run("echo via agent").stdout == "via agent\n"
    finally:
        agent.terminate()
        agent.wait(5)


def test_ssh_config_supplies_hostname_port_user_and_identity(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-alias\n  HostName {sshd.address}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    t = closing(
        SSHTransport("gpu-alias", ssh_config=str(config), known_hosts=str(known_hosts), use_agent=False)
    )
    assert t.run("echo $SSH_CONNECTION").stdout.split()[2:] == [sshd.address, str(sshd.port)]


def test_unparsable_ssh_config_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host x\n  Port\n")
    with pytest.raises(ConfigError, match="cannot read ssh config"):
        SSHTransport("x", ssh_config=str(config))


def test_proxy_jump_goes_through_the_jump_host(
    sshd_factory: SshdFactory, sshd_c: SshServer, tmp_path: Path,
    closing: Callable[[SSHTransport], SSHTransport],
) -> None:
    jump = sshd_factory("127.0.0.2")
    known = write_known_hosts(tmp_path / "known_hosts", jump, sshd_c)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host target\n  HostName {sshd_c.address}\n  Port {sshd_c.port}\n"
        f"  ProxyJump {jump.user}@{jump.address}:{jump.port}\n"
        f"Host *\n  IdentityFile {sshd_c.client_key}\n"
    )
    t = closing(SSHTransport("target", ssh_config=str(config), known_hosts=str(known), use_agent=False))
    assert t.run("echo $SSH_CONNECTION").stdout.split()[2:] == [sshd_c.address, str(sshd_c.port)]
    assert jump.sessions(), "the connection is carried by the jump host"
    jump.stop()  # dropping the jump host drops the connection behind it
    with pytest.raises(HostUnreachable):
        t.run("true")


# ---- unreachable, drops and reconnects ----------------------------------------------------------


def test_stopped_sshd_is_host_unreachable(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    server = sshd_factory("127.0.0.1")
    known = write_known_hosts(tmp_path / "known_hosts", server)
    server.stop()
    with pytest.raises(HostUnreachable) as info:
        server.transport(known).run("true")
    assert not isinstance(info.value, OSError)
    assert isinstance(info.value.__cause__, OSError)


def test_silent_server_is_a_connect_timeout(tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts TCP, never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        t = SSHTransport("127.0.0.1", port=listener.getsockname()[1], known_hosts=str(tmp_path / "kh"),
                         ssh_config=None, use_agent=False, connect_timeout=0.3)
        with pytest.raises(HostUnreachable):
            t.run("true")


def test_reconnects_once_sshd_is_back(
    sshd_factory: SshdFactory, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    server = sshd_factory("127.0.0.1")
    t = closing(server.transport(write_known_hosts(tmp_path / "known_hosts", server)))
    assert t.run("echo one").stdout == "one\n"
    server.stop()  # down for a while: the connection drops and new ones are refused
    with pytest.raises(HostUnreachable):
        t.run("true")
    with pytest.raises(HostUnreachable):
        t.put(str(tmp_path / "x"), b"x")
    server.start()
    assert t.run("echo two").stdout == "two\n"
    t.put(str(tmp_path / "x"), b"x")
    assert (tmp_path / "x").read_bytes() == b"x"


def test_drop_during_a_command_is_host_unreachable(
    sshd_factory: SshdFactory, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    server = sshd_factory("127.0.0.1")
    t = closing(server.transport(write_known_hosts(tmp_path / "known_hosts", server)))
    marker = tmp_path / "started"
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            t.run(f"touch {marker}; sleep 20", timeout=30)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    assert wait_for(marker.exists)
    server.drop_sessions()
    worker.join(10)
    assert not worker.is_alive()
    assert isinstance(outcome[0], HostUnreachable)


def test_stream_ends_without_exit_code_when_the_connection_drops(
    sshd_factory: SshdFactory, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    server = sshd_factory("127.0.0.1")
    t = closing(server.transport(write_known_hosts(tmp_path / "known_hosts", server)))
    stream = t.stream("echo $$; exec sleep 30")
    lines = iter(stream)
    pid = int(next(lines))
    server.drop_sessions()
    assert list(lines) == []
    assert stream.exit_code is None
    assert wait_for(lambda: gone(pid)), "the pty hangs up the remote command"
    stream.close()


def test_detached_server_survives_a_drop_and_is_cleaned_after_reconnecting(
    sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory("127.0.0.1")
    known = write_known_hosts(tmp_path / "known_hosts", server)
    spec = server.spec(known, runs_root=str(tmp_path / "runs"))
    host = open_host(spec, ssh_config=None)
    ref = host.start(host.run_dir("study", "trial-1"), "echo ready; exec sleep 60\n", run_id="run-1")
    members = host.members(ref)
    assert ref.pgid in members
    try:
        server.stop()  # connection dropped, sshd down
        with pytest.raises(HostUnreachable):
            host.orphans()
        assert all(alive(p) for p in members), "the detached server outlives the connection"
        server.start()
        later = open_host(spec, ssh_config=None)  # a new controller
        assert later.cleanup_orphans(grace=5) == [ref]
        assert later.members(ref) == []
        assert not any(alive(p) for p in members)
        later.close()
        # The first Host reconnects by itself, too.
        assert host.orphans() == []
    finally:
        for p in members:
            if alive(p):
                os.kill(p, signal.SIGKILL)  # only if the test failed; these are our own PIDs
        host.close()


def test_put_into_a_missing_directory_is_a_runner_error(
    sshd: SshServer, known_hosts: Path, tmp_path: Path, closing: Callable[[SSHTransport], SSHTransport]
) -> None:
    t = closing(sshd.transport(known_hosts))
    with pytest.raises(RunnerError, match="cannot write") as info:
        t.put(str(tmp_path / "missing" / "f"), b"x")
    assert not isinstance(info.value, HostUnreachable)
    assert t.run("echo still usable").ok


# ---- several hosts, busy GPUs --------------------------------------------------------------------


def test_two_hosts_run_servers_at_the_same_time(sshd_b: SshServer, sshd_c: SshServer, tmp_path: Path) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_b, sshd_c)
    hosts = [
        open_host(s.spec(known, runs_root=str(tmp_path / f"runs-{s.address}")), ssh_config=None)
        for s in (sshd_b, sshd_c)
    ]
    refs: list[RunRef] = []
    try:
        for host in hosts:
            script = "echo ready; exec sleep 60\n"
            refs.append(host.start(host.run_dir("s", "t"), script, run_id=f"r-{host.name}"))
        assert all(h.alive(r) for h, r in zip(hosts, refs, strict=True))
        assert refs[0].pgid != refs[1].pgid
        assert hosts[0].orphans() == [refs[0]] and hosts[1].orphans() == [refs[1]]
        assert hosts[0].transport.run("echo $SSH_CONNECTION").stdout.split()[2] == sshd_b.address
        assert hosts[1].transport.run("echo $SSH_CONNECTION").stdout.split()[2] == sshd_c.address
    finally:
        for host, ref in zip(hosts, refs, strict=False):
            host.stop(ref, grace=5)
        for host in hosts:
            host.close()
    assert not any(h.alive(r) for h, r in zip(hosts, refs, strict=True))


def _sim_smi(tmp_path: Path, label: str) -> dict[str, str]:
    """Install the simulated nvidia-smi for one host; returns the Host env that uses it."""
    profile = sorted((REPO / "runners" / "simhost" / "profiles").glob("*.yaml"))[0]
    state, bindir = tmp_path / f"sim-state-{label}", tmp_path / f"sim-bin-{label}"
    subprocess.run(
        [sys.executable, "-m", "runners.simhost", "install-smi", "--sim-profile", str(profile),
         "--state-dir", str(state), "--bin-dir", str(bindir)],
        check=True, cwd=REPO, capture_output=True,
    )
    assert os.access(bindir / "nvidia-smi", os.X_OK)
    return {"PATH": f"{bindir}:$PATH", "SERVETUNE_SIM_STATE": str(state)}


def _preflight(host: Host) -> HostInfo:
    return host.preflight("sglang", sys.executable, "echo 0.5.2")


def test_a_foreign_gpu_process_makes_only_its_host_busy(
    sshd_b: SshServer, sshd_c: SshServer, tmp_path: Path
) -> None:
    known = write_known_hosts(tmp_path / "known_hosts", sshd_b, sshd_c)
    busy_env, free_env = _sim_smi(tmp_path, "b"), _sim_smi(tmp_path, "c")
    busy = open_host(sshd_b.spec(known, env=busy_env, runs_root=str(tmp_path / "runs-b")), ssh_config=None)
    free = open_host(sshd_c.spec(known, env=free_env, runs_root=str(tmp_path / "runs-c")), ssh_config=None)
    assert not _preflight(busy).busy
    hog = start_hog(busy_env["SERVETUNE_SIM_STATE"], 20000)
    try:
        info = _preflight(busy)
        assert info.busy
        assert str(hog.pid) in info.reason
        with pytest.raises(HostBusy, match="busy"):
            busy.require_free(info)
        other = _preflight(free)
        assert not other.busy
        free.require_free(other)
        stop_hog(hog)
        assert busy.compute_apps() == [], "a gone process no longer holds GPU memory"
    finally:
        stop_hog(hog)
        busy.close()
        free.close()


def test_ssh_code_and_fixtures_name_only_loopback_addresses() -> None:
    files = ["runners/ssh.py", "runners/inventory.py", "tests/fixtures/sshd.py", "tests/runners/test_ssh.py",
             "tests/contracts/test_host_contract.py"]
    for name in files:
        for addr in re.findall(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", (REPO / name).read_text()):
            assert addr.startswith("127."), f"{name}: {addr}"


def test_a_host_key_that_changes_mid_run_is_a_permanent_host_fault_at_once(sshd: SshServer, tmp_path: Path) -> None:
    """A real sshd, a real simulated server started through it: once it is ready the host's key no longer matches
    known_hosts (the host reinstalled) and the connection drops. The reconnect's key error is the session's
    failure, ``host_config`` with the ``ssh-keygen -R`` line (a permanent fault: the host is dropped at once),
    never ``host_unreachable`` (a transient one, retried every cooldown)."""
    known = write_known_hosts(tmp_path / "known_hosts", sshd)
    host = open_host(sshd.spec(known, name="rekeyed", runs_root=str(tmp_path / "runs")), ssh_config=None)
    session = _session(host, tmp_path, {"mem_fraction_static": 0.7, "cuda_graph_max_bs": 8}, [])
    try:
        session.start()
        assert session.wait_ready(120) is None
        known.write_text(f"{sshd.known_hosts_name} {public_line(make_key(tmp_path / 'other_host_key'))}\n")
        host.transport.close()  # the connection drops; the next one meets the other key
        plan = BenchPlan(api=session.engine.bench_api, levels=(1,), requests=(2,), input_len=32, output_len=8,
                         warmup=0, model="m", timeout=60)
        result = session.benchmark(plan, timeout=120)
        assert result.failure is not None and result.failure.kind is FailureKind.HOST_CONFIG, result.failure
        assert "has changed" in result.failure.reason and "ssh-keygen -R" in result.failure.reason
        assert "\n" not in result.failure.reason
    finally:
        write_known_hosts(known, sshd)
        host.transport.close()
        with contextlib.suppress(RunnerError):
            session.stop()
        host.cleanup_orphans(grace=1)
