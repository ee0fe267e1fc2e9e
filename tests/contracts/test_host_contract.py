"""One contract for :class:`runners.host.Host`, run on the local transport and on SSH through a real sshd.

Every test gets ``make_host``: a factory of fresh Host objects (a new one is what a restarted controller
would have) sharing one runs_root, on the transport of the parameter.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from runners.errors import CommandTimeout, HostBusy, NotOurProcess
from runners.host import Host, Lease, RunRef
from runners.inventory import HostSpec, open_host
from runners.transport import LineStream
from tests.fixtures.ports import free_port
from tests.fixtures.procs import gone, wait_for
from tests.fixtures.sshd import SshServer

MakeHost = Callable[[], Host]


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def make_host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeHost]:
    runs_root = str(tmp_path / "runs")
    host_dir = str(tmp_path / "hostdir")  # this test's own leases and claim (tests run side by side)
    if request.param == "local":
        spec = HostSpec(address="local", runs_root=runs_root, host_dir=host_dir)
    else:
        server: SshServer = request.getfixturevalue("sshd")
        known_hosts: Path = request.getfixturevalue("known_hosts")
        spec = server.spec(known_hosts, runs_root=runs_root, host_dir=host_dir)
    made: list[Host] = []

    def make() -> Host:
        host = open_host(spec, ssh_config=None)
        made.append(host)
        return host

    try:
        yield make
    finally:
        # Whatever a failed test left running under its runs_root is stopped by its recorded group.
        open_host(HostSpec(address="local", name=spec.name, runs_root=runs_root, host_dir=host_dir)).cleanup_orphans(grace=1)
        for host in made:
            host.close()


def _first_line_with(stream: LineStream, text: str) -> str:
    try:
        for line in stream:
            if text in line:
                return line
        raise AssertionError(f"stream ended before a line with {text!r}")
    finally:
        stream.close()


def _start(host: Host, script: str, *, trial: str | None = None) -> RunRef:
    trial = trial or uuid.uuid4().hex[:8]
    return host.start(host.run_dir("contract", trial), script, run_id=f"run-{trial}")


LONG_SERVER = "echo ready; exec sleep 60\n"
TERM_IGNORING_SERVER = "trap '' TERM\necho ready\nwhile :; do sleep 0.1; done\n"


class TestHostContract:
    # ---- run ------------------------------------------------------------------------------------

    def test_run_returns_stdout_stderr_and_exit_code(self, make_host: MakeHost) -> None:
        res = make_host().run("echo out; echo err >&2; exit 3")
        assert (res.rc, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)

    def test_run_feeds_stdin_and_quotes_the_command(self, make_host: MakeHost) -> None:
        host = make_host()
        res = host.transport.run("tr a-z A-Z; echo \"$1\" 'single' $((1+1))", stdin=b"abc\n")
        assert res.ok
        assert res.stdout == "ABC\n single 2\n"

    def test_run_exports_host_env(self, make_host: MakeHost) -> None:
        host = make_host()
        host.env["SERVETUNE_TEST_VALUE"] = "a b'c"
        assert host.run('printf %s "$SERVETUNE_TEST_VALUE"').stdout == "a b'c"

    def test_run_timeout_raises_and_the_command_is_killed(self, make_host: MakeHost, tmp_path: Path) -> None:
        pidfile = tmp_path / "pid"
        with pytest.raises(CommandTimeout):
            make_host().run(f"echo $$ > {pidfile}; exec sleep 300", timeout=5.0)
        pid = int(pidfile.read_text())
        assert wait_for(lambda: gone(pid))

    def test_a_timeout_is_one_line_without_the_environment_or_a_scripts_text(self, make_host: MakeHost,
                                                                              tmp_path: Path) -> None:
        host = make_host()
        host.env["SERVETUNE_TEST_VALUE"] = "exported"
        with pytest.raises(CommandTimeout) as ran:
            host.run("exec sleep 300\n# a second line of shell text", timeout=2.0)
        assert "\n" not in str(ran.value) and "'exec sleep 300 ...'" in str(ran.value)
        assert "exported" not in str(ran.value) and "second line" not in str(ran.value)
        # A shipped script that hangs (a claim whose lock another process holds, told to wait 300 s) is named.
        lock = tmp_path / "gpus" / "claim.lock"
        lock.parent.mkdir()
        locker = subprocess.Popen(["flock", "--exclusive", str(lock), "sleep", "300"], start_new_session=True)
        try:
            assert wait_for(lambda: subprocess.run(["flock", "--nonblock", str(lock), "true"],
                                                   check=False).returncode == 1)
            with pytest.raises(CommandTimeout) as hung:
                host.run_script("claim.sh", str(lock.parent), "me", 30, 300, timeout=2.0)
        finally:
            os.killpg(locker.pid, signal.SIGKILL)
            locker.wait(10)
        assert str(hung.value) == f"the host script claim.sh did not finish within 2s on {host.name}"

    # ---- stream ---------------------------------------------------------------------------------

    def test_stream_yields_lines_and_exit_code(self, make_host: MakeHost) -> None:
        stream = make_host().stream("echo one; echo; echo 'three  spaced'; printf 'no newline'; exit 5")
        assert list(stream) == ["one", "", "three  spaced", "no newline"]
        assert stream.exit_code == 5

    def test_stream_is_live_and_close_stops_the_command(self, make_host: MakeHost) -> None:
        stream = make_host().stream("echo $$; exec sleep 30")
        pid = int(next(iter(stream)))
        assert not gone(pid), "the first line arrived while the command still ran"
        stream.close()
        assert stream.exit_code is None
        assert wait_for(lambda: gone(pid))

    # ---- put ------------------------------------------------------------------------------------

    def test_put_writes_with_mode_and_replaces_atomically(self, make_host: MakeHost, tmp_path: Path) -> None:
        host = make_host()
        target = tmp_path / "dir" / "file.sh"
        target.parent.mkdir()
        host.transport.put(str(target), b"first\n", mode=0o755)
        assert target.read_bytes() == b"first\n"
        assert target.stat().st_mode & 0o777 == 0o755
        host.transport.put(str(target), b"second\n", mode=0o600)
        assert target.read_bytes() == b"second\n"
        assert target.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in target.parent.iterdir()] == ["file.sh"], "no temporary file left behind"

    # ---- servers --------------------------------------------------------------------------------

    def test_detached_server_log_is_followed_and_exit_code_captured(self, make_host: MakeHost) -> None:
        host = make_host()
        ref = _start(host, "echo starting\nsleep 0.3\necho 'ready to roll'\nexit 7\n")
        stream = host.follow(ref)
        lines = list(stream)
        assert lines[:2] == ["starting", "ready to roll"]
        assert stream.exit_code == 0
        assert host.exit_code(ref) == 7
        assert not host.alive(ref)
        assert host.read(ref.log_path) == "starting\nready to roll\n"

    def test_stop_sends_term_and_verifies_the_group_is_gone(self, make_host: MakeHost) -> None:
        host = make_host()
        ref = _start(host, LONG_SERVER)
        _first_line_with(host.follow(ref), "ready")
        members = host.members(ref)
        assert ref.pgid in members
        result = host.stop(ref, grace=5)
        assert result.method == "term" and not result.resent_term
        assert result.survivors == ()
        assert host.members(ref) == []
        assert all(gone(pid) for pid in members)

    def test_stop_resends_term_to_a_server_that_ignores_the_first(self, make_host: MakeHost) -> None:
        host = make_host()
        # The first SIGTERM only clears the trap (as vLLM's API server ignores one during start-up); the
        # one re-sent at half the grace ends the server.
        ref = _start(host, "trap 'trap - TERM' TERM\necho ready\nwhile :; do sleep 0.1; done\n")
        _first_line_with(host.follow(ref), "ready")
        result = host.stop(ref, grace=2.0)
        assert result.method == "term" and result.resent_term, result
        assert host.members(ref) == []

    def test_stop_kills_a_server_that_ignores_sigterm(self, make_host: MakeHost) -> None:
        host = make_host()
        ref = _start(host, TERM_IGNORING_SERVER)
        _first_line_with(host.follow(ref), "ready")
        members = host.members(ref)
        assert ref.pgid in members
        result = host.stop(ref, grace=1.0)
        assert result.method == "kill"
        assert host.members(ref) == []
        assert all(gone(pid) for pid in members)

    def test_stop_of_a_finished_server_reports_gone(self, make_host: MakeHost) -> None:
        host = make_host()
        ref = _start(host, "exit 0\n")
        list(host.follow(ref))
        result = host.stop(ref, grace=1)
        assert result.method == "gone" and not result.resent_term

    def test_stop_refuses_a_foreign_process_group(self, make_host: MakeHost, tmp_path: Path) -> None:
        host = make_host()
        res = host.run("setsid sleep 60 < /dev/null > /dev/null 2>&1 & echo $!")
        pid = int(res.stdout.strip())
        try:
            with pytest.raises(NotOurProcess):
                host.stop(RunRef(str(tmp_path), pid, "run-not-this-one"), grace=1)
            assert not gone(pid), "a foreign group must not be signalled"
        finally:
            os.kill(pid, signal.SIGKILL)  # our own test process, by its PID
        assert wait_for(lambda: gone(pid))

    def test_stop_refuses_a_server_of_another_run(self, make_host: MakeHost) -> None:
        host = make_host()
        ref = _start(host, LONG_SERVER)
        with pytest.raises(NotOurProcess):
            host.stop(RunRef(ref.run_dir, ref.pgid, "run-someone-else"), grace=1)
        assert host.alive(ref)
        assert host.stop(ref, grace=5).method == "term"

    def test_orphans_are_found_and_cleaned_by_a_new_controller(self, make_host: MakeHost) -> None:
        first = make_host()
        running = _start(first, LONG_SERVER, trial="running")
        finished = _start(first, "exit 0\n", trial="finished")
        list(first.follow(finished))
        members = first.members(running)
        assert running.pgid in members
        first.close()  # the controller goes away; the server stays

        second = make_host()
        assert second.orphans() == [running]
        other = Host(second.transport, runs_root=second.runs_root, host_dir=second.host_dir)
        other.name = "some-other-host"
        assert other.orphans() == [], "orphans are kept per host name"

        assert second.cleanup_orphans(grace=5) == [running]
        assert second.members(running) == []
        assert all(gone(pid) for pid in members)
        assert second.orphans() == []

    # ---- leases, claims and the port ------------------------------------------------------------

    def test_a_live_controllers_server_is_never_an_orphan(self, make_host: MakeHost) -> None:
        a, b = make_host(), make_host()
        a.controller_id, b.controller_id = "ctl-a", "ctl-b"
        a.renew_lease(_lease("ctl-a", ttl=60))
        ref = _start(a, LONG_SERVER, trial="a-running")
        assert b.orphans() == [], "ctl-a holds a live lease: its server is its trial, not an orphan"
        assert b.cleanup_orphans(grace=1) == []
        assert a.alive(ref)
        assert a.orphans() == [ref], "a controller's own leftover is its orphan"

        a.renew_lease(_lease("ctl-a", ttl=0))  # expires at once (the host's clock moves on)
        assert wait_for(lambda: b.orphans() == [ref], timeout=5)
        assert b.cleanup_orphans(grace=5) == [ref]
        assert not a.alive(ref)

    def test_a_lease_of_a_gone_process_on_this_machine_is_not_live(self, make_host: MakeHost) -> None:
        host = make_host()
        dead = _lease("ctl-dead", ttl=600, pid=_dead_pid())
        host.renew_lease(dead)
        assert [lease.controller for lease in host.live_leases()] == []
        elsewhere = _lease("ctl-far", ttl=600, pid=_dead_pid(), machine="another-machine")
        host.renew_lease(elsewhere)
        assert [lease.controller for lease in host.live_leases()] == ["ctl-far"]  # only expiry tells

    def test_controllers_take_turns_with_the_claim(self, make_host: MakeHost) -> None:
        a, b = make_host(), make_host()
        a.controller_id, b.controller_id = "ctl-a", "ctl-b"
        for host in (a, b):
            host.renew_lease(_lease(host.controller_id, ttl=60))
        assert a.claim().ok and a.claim().ok, "a claim is re-entrant for its holder"
        held = b.claim()
        assert not held.ok and held.holder is not None and held.holder.controller == "ctl-a"
        assert "ctl-a" in held.reason and "study s" in held.reason
        assert b.holder() == held.holder
        a.release_claim()
        assert b.claim().ok and not a.claim().ok
        b.drop_lease("ctl-b")  # dropping the lease gives the claim back
        assert a.claim().ok

    def test_the_claim_of_an_expired_controller_is_taken_over(self, make_host: MakeHost) -> None:
        a, b = make_host(), make_host()
        a.controller_id, b.controller_id = "ctl-a", "ctl-b"
        a.renew_lease(_lease("ctl-a", ttl=0))
        assert a.claim().ok
        assert wait_for(lambda: b.claim().ok, timeout=5)

    def test_two_runs_roots_share_one_claim_per_gpu_set(self, make_host: MakeHost, tmp_path: Path) -> None:
        """Two controllers (two users' default runs roots) on one host: one claim, wherever runs live."""
        a = make_host()
        b = Host(a.transport, runs_root=str(tmp_path / "other-user-runs"), host_dir=a.host_dir)
        a.controller_id, b.controller_id = "ctl-a", "ctl-b"
        for host in (a, b):
            host.renew_lease(_lease(host.controller_id, ttl=60))
        assert a.gpu_dir() == b.gpu_dir() and a.gpu_dir().startswith(a.host_dir + "/gpus-")
        assert a.claim().ok
        held = b.claim()
        assert not held.ok and held.holder is not None and held.holder.controller == "ctl-a"
        assert {lease.controller for lease in b.live_leases()} == {"ctl-a", "ctl-b"}
        # Shared by every Unix user: the host_dir is sticky and world-writable, the GPU set's folder writable.
        assert os.stat(a.host_dir).st_mode & 0o7777 == 0o1777
        for sub in ("", "/leases", "/queue"):
            assert os.stat(a.gpu_dir() + sub).st_mode & 0o777 == 0o777

    def test_another_pid_namespace_is_never_taken_for_dead_by_its_pid(self, make_host: MakeHost) -> None:
        """Same machine (and host name), another PID namespace (a container with host networking): its PID
        means nothing here, so only its lease's expiry tells; its claim and its servers are left alone."""
        a, b = make_host(), make_host()
        a.controller_id, b.controller_id = "ctl-in-container", "ctl-b"
        dead_here = _dead_pid()
        a.renew_lease(_lease("ctl-in-container", ttl=600, pid=dead_here, pid_ns="pid:[4026500001]"))
        assert a.claim().ok
        ref = _start(a, LONG_SERVER, trial="container-running")
        assert [lease.controller for lease in b.live_leases()] == ["ctl-in-container"]
        assert not b.claim().ok, "a live lease of another namespace holds its claim"
        assert b.orphans() == [] and a.alive(ref), "its server is its trial, not an orphan"
        # The same PID in *this* namespace, with another start time: a reused PID, so the lease is dead.
        a.renew_lease(_lease("ctl-in-container", ttl=600, pid=os.getpid(), start=1))
        assert b.live_leases() == []
        assert b.claim().ok
        assert b.cleanup_orphans(grace=5) == [ref]

    def test_lease_files_are_data(self, make_host: MakeHost, caplog: pytest.LogCaptureFixture) -> None:
        """A lease file of the wrong shape is ignored with one line naming it; the host stays usable."""
        host = make_host()
        host.controller_id = "ctl-me"
        host.renew_lease(_lease("ctl-me", ttl=60))
        folder = host.gpu_dir() + "/leases"
        good = json.loads(host.run(f"cat {shlex.quote(folder)}/ctl-me.json").stdout)
        bad = {
            "string-heartbeat": {**good, "controller": "string-heartbeat", "heartbeat": "soon"},
            "null-ttl": {**good, "controller": "null-ttl", "ttl": None},
            "huge-pid": {**good, "controller": "huge-pid", "pid": 10**30},
            "bool-pid": {**good, "controller": "bool-pid", "pid": True},
            "long-ttl": {**good, "controller": "long-ttl", "ttl": 10**9},
            "renamed": {**good, "controller": "someone-else"},
            "a-list": [1, 2],
            "escapes": {**good, "controller": "escapes", "study": "\x1b]0;pwned\x07\x1b[2J"},
        }
        for name, data in bad.items():
            host.put(f"{folder}/{name}.json", json.dumps(data).encode())
        host.put(f"{folder}/not-json.json", b"\x1b]0;pwned\x07{{{")
        with caplog.at_level(logging.WARNING, logger="servetune"):
            assert [lease.controller for lease in host.live_leases()] == ["ctl-me"]
            assert host.claim().ok
            host.live_leases()  # said once per file, not at every look
        lines = [r.getMessage() for r in caplog.records if "ignored lease file" in r.getMessage()]
        assert len(lines) == len(bad) + 1, lines
        assert all(line.isprintable() for line in lines), "nothing from the host reaches the terminal raw"
        assert any("string-heartbeat.json" in line and "heartbeat is str, not a number" in line for line in lines)
        assert any("null-ttl.json" in line and "ttl is null" in line for line in lines)
        assert any("huge-pid.json" in line and "pid is" in line for line in lines)

    def test_a_heartbeat_in_the_hosts_future_is_capped(self, make_host: MakeHost,
                                                        caplog: pytest.LogCaptureFixture) -> None:
        """A heartbeat a year ahead (a clock stepped back, a forged file) holds the host for one ttl, not a year."""
        a, b = make_host(), make_host()
        a.controller_id, b.controller_id = "ctl-future", "ctl-b"
        a.renew_lease(_lease("ctl-future", ttl=2, machine="another-machine"))
        assert a.claim().ok
        path = f"{a.gpu_dir()}/leases/ctl-future.json"
        data = json.loads(a.run(f"cat {shlex.quote(path)}").stdout)
        data["heartbeat"] += 365 * 86400
        a.put(path, json.dumps(data).encode())
        with caplog.at_level(logging.WARNING, logger="servetune"):
            now, leases = b.leases()
        assert [lease.heartbeat for lease in leases] == [now], "capped at the host's now"
        assert any("in the host's future" in r.getMessage() and "ctl-future.json" in r.getMessage()
                   for r in caplog.records)
        assert json.loads(a.run(f"cat {shlex.quote(path)}").stdout)["heartbeat"] <= now + 1, "in the file too"
        assert not b.claim().ok, "live until its (capped) lease expires"
        assert wait_for(lambda: b.claim().ok, timeout=60), "then the claim is taken over"

    def test_waiting_controllers_are_served_first_come_first_served(self, make_host: MakeHost) -> None:
        a, b, c = make_host(), make_host(), make_host()
        for host, name in ((a, "ctl-a"), (b, "ctl-b"), (c, "ctl-c")):
            host.controller_id = name
            host.renew_lease(_lease(name, ttl=60))
        assert a.claim().ok
        assert not b.claim().ok  # b queues first
        assert not c.claim().ok  # then c
        a.release_claim()
        later = c.claim()
        assert not later.ok and "ctl-b" in later.reason and "waited" in later.reason, later.reason
        assert not a.claim().ok, "the one that let go goes to the end of the line"
        assert b.claim().ok
        b.release_claim()
        assert not a.claim().ok, "c has waited longer than a"
        assert c.claim().ok
        c.release_claim()
        assert a.claim().ok
        a.release_claim()
        # A waiting controller that is gone (its lease dropped) loses its place.
        assert a.claim().ok
        assert not b.claim().ok
        b.drop_lease("ctl-b")
        a.release_claim()
        assert c.claim().ok

    def test_port_holder_tells_ours_from_foreign(self, make_host: MakeHost) -> None:
        host = make_host()
        port = free_port()
        assert host.port_holder(port) == "free"
        host.require_port_free(port)
        with socket.socket() as foreign:
            foreign.bind(("127.0.0.1", port))
            foreign.listen()
            assert host.port_holder(port) == "foreign"
            with pytest.raises(HostBusy, match=f"port {port}"):
                host.require_port_free(port)
        ref = _start(host, f"exec {sys.executable} -c {shlex.quote(_LISTENER.format(port=port))}\n")
        assert wait_for(lambda: host.port_holder(port, ref) == "ours", timeout=60)
        assert host.port_holder(port) == "foreign", "without the run, any listener is someone else's"
        host.stop(ref, grace=5)


_LISTENER = "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"


def _lease(controller: str, *, ttl: float, pid: int | None = None, machine: str | None = None,
           pid_ns: str | None = None, start: int | None = None) -> Lease:
    """A lease of this process (its machine, PID namespace and start time) but for what is given."""
    lease = Lease.of_this_process(controller, "s", "sqlite:///x.db", ttl)
    if pid is not None:
        lease = replace(lease, pid=pid, start=0)
    if start is not None:
        lease = replace(lease, start=start)
    return replace(lease, machine=lease.machine if machine is None else machine,
                   pid_ns=lease.pid_ns if pid_ns is None else pid_ns)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
