"""A GPU host as servetune uses it, written once on top of a :class:`~runners.transport.Transport`.

A :class:`Host` knows how to:

* run the preflight (python and engine present, engine version, nvidia-smi answers, GPUs free);
* start a server **detached** in a run directory (``<runs_root>/<study>/<trial>/``) holding the launch
  script, the server log, the process-group id and the exit code, so an SSH hiccup does not kill it;
* follow the server log live and learn its exit code the moment the process group's leader ends;
* stop it: SIGTERM to the recorded process group, SIGTERM again, then SIGKILL after a grace period,
  after checking the group is ours (``SERVETUNE_RUN_ID`` in its environment), and verify nothing is left;
* optionally run it inside a memory cgroup of its own (``memory_limit_bytes``: cgroup v2 ``memory.max``,
  or the v1 memory hierarchy where v2 has no memory controller) and read the kernel's ``oom_kill`` count
  from it after a death (:meth:`Host.oom_evidence`), so an OOM kill is told from a crash;
* hold a **lease** on the host for a controller (:class:`Lease`, one file per controller under
  ``<runs_root>/.servetune/leases``, renewed by the controller's heartbeat) and **claim** the host for one
  trial at a time (:meth:`Host.claim`), so two controllers on one host take turns;
* find servers a crashed controller left behind (run directories with a live group whose controller's
  lease has expired, or whose controller process on this machine is gone) and stop them;
* tell whether the server's port is free before a launch, and whether *our* process group holds its
  listening socket (:meth:`Host.port_holder`), from ``/proc/net/tcp`` and ``/proc/<pid>/fd``.

Nothing here ever kills by name. Every host-side script is plain bash + coreutils + procps.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from runners.errors import (
    ConfigError,
    EngineMissing,
    HostBusy,
    HostMisconfigured,
    HostUnreachable,
    NotOurProcess,
    RunnerError,
)
from runners.smi import APPS_QUERY, GPU_QUERY, ComputeApp, GpuStatus, parse_apps, parse_gpus
from runners.transport import CommandResult, LineStream, LocalTransport, Transport

RUN_ID_VAR = "SERVETUNE_RUN_ID"
#: ``Host.server_port`` for "a free loopback port for each launch" (this machine only).
ANY_FREE_PORT = 0
_SPLIT = "--servetune-apps--"

# Records the group id, runs the launch script with every stream redirected, records its exit code.
# The trap gives the wrapper a handler (not "ignore") so the server does not inherit an ignored SIGTERM,
# and so the wrapper outlives a group SIGTERM long enough to write the server's exit code.
_WRAPPER = """#!/usr/bin/env bash
# servetune run wrapper: records the process group and the server's exit code.
cd "$(dirname "$0")" || exit 97
# Opt-in memory limit: the wrapper joins a memory cgroup of its own before it starts the server, so the
# whole tree is inside. cgroup v2 where its root offers the memory controller, else the v1 memory
# hierarchy. Where neither can be written nothing is started: cgroup_error says why.
cg_join() {  # $1 limit in bytes, $2 cgroup name
  local root=/sys/fs/cgroup d
  if grep -qw memory $root/cgroup.controllers 2>/dev/null; then
    d=$root/servetune/$2
    mkdir -p $root/servetune || return 1
    for p in $root $root/servetune; do
      grep -qw memory $p/cgroup.subtree_control || echo +memory > $p/cgroup.subtree_control || return 1
    done
    mkdir -p $d && echo "$1" > $d/memory.max || return 1
    [ ! -f $d/memory.swap.max ] || echo 0 > $d/memory.swap.max || return 1
    echo $$ > $d/cgroup.procs || return 1
    echo "2 $d" > cgroup
  elif [ -f $root/memory/memory.limit_in_bytes ]; then
    d=$root/memory/servetune/$2
    mkdir -p $d && echo "$1" > $d/memory.limit_in_bytes || return 1
    [ ! -f $d/memory.memsw.limit_in_bytes ] || echo "$1" > $d/memory.memsw.limit_in_bytes 2>/dev/null
    echo $$ > $d/cgroup.procs || return 1
    echo "1 $d" > cgroup
  else
    echo "no cgroup v2 memory controller in $root/cgroup.controllers and no v1 memory hierarchy" >&2
    return 1
  fi
}
if [ -s memory_limit ]; then
  if ! cg_join $(cat memory_limit) 2> cgroup_error.tmp; then
    why=$(tail -n 1 cgroup_error.tmp)
    echo "cannot create a memory cgroup for the server (needs root and cgroup v2 memory): $why" > cgroup_error
    rm -f cgroup_error.tmp
    exit 96
  fi
  rm -f cgroup_error.tmp
fi
echo $$ > pgid.tmp && mv pgid.tmp pgid
# Per-trial scratch directories (TMPDIR and engine caches) in ./scratch, removed by servetune after the
# stop. The variables name them through a short alias, /tmp/servetune.XXXXXXXX -> ./scratch: engines bind
# unix sockets in TMPDIR, and a socket path over 107 bytes cannot be bound (vLLM: "ipc path ... is
# longer than 107 characters").
if [ -s scratch_vars ]; then
  mkdir -p scratch
  alias=$(mktemp -u /tmp/servetune.XXXXXXXX)
  if [ -n "$alias" ] && ln -s "$PWD/scratch" "$alias" 2>/dev/null; then
    echo "$alias" > scratch_alias
  else
    alias=$PWD/scratch
  fi
  for var in $(cat scratch_vars); do
    mkdir -p "scratch/$var" && export "$var=$alias/$var"
  done
fi
trap ':' TERM INT HUP
bash ./launch.sh > server.log 2>&1 < /dev/null
rc=$?
[ ! -s scratch_alias ] || rm -f "$(cat scratch_alias)"
echo $rc > exit_code.tmp && mv exit_code.tmp exit_code
"""

# Lists live (non-zombie) members of a process group and of the session of the same id.
_MEMBERS = r"""members() {
  for p in $( { pgrep -g "$1"; pgrep -s "$1"; } 2>/dev/null | sort -u ); do
    s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1)
    [ -n "$s" ] && [ "$s" != Z ] && echo "$p"
  done
}
ours() {  # is any member of group $1 tagged with run id $2?
  for p in $(members "$1"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "SERVETUNE_RUN_ID=$2" && return 0
  done
  return 1
}
"""

_STOP = (
    _MEMBERS
    + r"""pg=@PGID@; tag=@TAG@; grace_ms=@GRACE_MS@; dir=@DIR@
drop_alias() {  # the short /tmp alias of the run's scratch directory (see the wrapper), once all are gone
  a=$(cat "$dir/scratch_alias" 2>/dev/null); case $a in /tmp/servetune.*) rm -f "$a";; esac
}
if [ -z "$(members $pg)" ]; then drop_alias; echo '{"result":"gone","ms":0,"survivors":[]}'; exit 0; fi
if ! ours $pg $tag; then echo '{"result":"not_ours"}'; exit 3; fi
ms() { echo $(( $(date +%s%N) / 1000000 )); }
start=$(ms)
kill -TERM -$pg 2>/dev/null
method=term; resent=false
deadline=$(( start + grace_ms )); half=$(( start + grace_ms / 2 ))
while [ -n "$(members $pg)" ]; do
  now=$(ms)
  if [ $resent = false ] && [ $now -gt $half ]; then kill -TERM -$pg 2>/dev/null; resent=true; fi
  if [ $now -gt $deadline ]; then
    method=kill
    for p in $(members $pg); do kill -KILL $p 2>/dev/null; done
    kill -KILL -$pg 2>/dev/null
    n=0
    while [ -n "$(members $pg)" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done
    break
  fi
  sleep 0.05
done
end=$(ms)
surv=$(members $pg | paste -sd, -)
[ -n "$surv" ] || drop_alias
printf '{"result":"stopped","method":"%s","resent_term":%s,"ms":%s,"survivors":[%s]}\n' \
  $method $resent $(( end - start )) "$surv"
"""
)


# Prints the memory cgroup's evidence of run directory $1 as "key value" lines (nothing without a cgroup).
_CG_EVIDENCE = r"""cg_evidence() {
  [ -f "$1/cgroup_evidence" ] && { cat "$1/cgroup_evidence"; return 0; }
  read -r v d < "$1/cgroup" 2>/dev/null || return 0
  echo "cgroup_version $v"; echo "cgroup $d"
  [ -d "$d" ] || return 0
  if [ "$v" = 2 ]; then
    sed -n 's/^oom_kill \([0-9]*\)$/oom_kill \1/p; s/^max \([0-9]*\)$/limit_hits \1/p' "$d/memory.events"
    echo "memory_limit_bytes $(cat "$d/memory.max")"
    [ ! -f "$d/memory.peak" ] || echo "memory_peak_bytes $(cat "$d/memory.peak")"
  else
    sed -n 's/^oom_kill \([0-9]*\)$/oom_kill \1/p' "$d/memory.oom_control"
    echo "memory_limit_bytes $(cat "$d/memory.limit_in_bytes")"
    echo "memory_peak_bytes $(cat "$d/memory.max_usage_in_bytes")"
    echo "limit_hits $(cat "$d/memory.failcnt")"
  fi
}
"""


# Listening sockets: "inode" lines for port $1 (4 hex digits) from /proc/net/tcp{,6} (state 0A = LISTEN).
_LISTEN = r"""listen_inodes() {
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$1" \
    '$4 == "0A" && toupper(substr($2, length($2) - 4)) == p { print $10 }'
}
"""

# Prints "free", "ours" (a member of group $2 holds a listening socket on the port) or "foreign";
# "unknown" where /proc/net/tcp cannot be read (not Linux).
_PORT_HOLDER = (
    _MEMBERS
    + _LISTEN
    + r"""[ -r /proc/net/tcp ] || { echo unknown; exit 0; }
inodes=$(listen_inodes @PORT@)
[ -n "$inodes" ] || { echo free; exit 0; }
pg=@PGID@
if [ "$pg" -gt 0 ]; then
  for p in $(members $pg); do
    fds=$(ls -l /proc/$p/fd 2>/dev/null)
    for i in $inodes; do
      case $fds in *"socket:[$i]"*) echo ours; exit 0;; esac
    done
  done
fi
echo foreign
"""
)

LEASE_DIR = ".servetune/leases"
CLAIM_DIR = ".servetune/claim"


def new_controller_id() -> str:
    """A fresh id for one controller (one ``run_search``): this machine's name, pid and a random part."""
    return f"{_safe(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def default_controller_id() -> str:
    """The controller id of every Host of this process that no controller has named (a Host used alone)."""
    return new_controller_id()


@dataclass(frozen=True)
class Lease:
    """A controller's lease on a host: who it is and where it runs, what it works on, its last heartbeat.

    ``heartbeat`` is the host's clock (seconds since the epoch) at the last renewal and ``ttl`` how long the
    lease lasts without one; ``storage`` is the study's storage URL with any password taken out.
    """

    controller: str
    pid: int
    hostname: str
    study: str
    storage: str
    ttl: float
    heartbeat: float = 0.0

    def expired(self, host_now: float) -> bool:
        return host_now > self.heartbeat + self.ttl

    def live(self, host_now: float) -> bool:
        """Not expired, and (when its controller runs on this machine) its controller process exists."""
        if self.expired(host_now):
            return False
        if self.hostname == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True

    def describe(self) -> str:
        return f"controller {self.controller} (pid {self.pid} on {self.hostname}, study {self.study})"


@dataclass(frozen=True)
class Claim:
    """The result of :meth:`Host.claim`: ``ok`` (the host is ours for a trial) or who holds it."""

    ok: bool
    holder: Lease | None = None
    reason: str = ""


@dataclass(frozen=True)
class RunRef:
    """A server started by servetune: its run directory on the host, process group and run id."""

    run_dir: str
    pgid: int
    run_id: str

    @property
    def log_path(self) -> str:
        return f"{self.run_dir}/server.log"


@dataclass(frozen=True)
class StopResult:
    """How a stop went: ``gone`` (already dead), ``term`` or ``kill``; survivors must be empty.

    ``resent_term``: the group outlived half the grace, so SIGTERM was sent a second time.
    """

    method: str
    seconds: float
    survivors: tuple[int, ...] = ()
    resent_term: bool = False


@dataclass
class HostInfo:
    """What the preflight found on a host."""

    name: str
    python: str
    engine: str
    engine_version: str
    gpus: list[GpuStatus] = field(default_factory=list)
    apps: list[ComputeApp] = field(default_factory=list)
    busy: bool = False
    reason: str = ""

    @property
    def gpu_name(self) -> str:
        return self.gpus[0].name if self.gpus else "unknown"

    @property
    def free_mib(self) -> float:
        return sum(g.free_mib or 0.0 for g in self.gpus)


class Host:
    """One GPU host: a transport plus where runs live, extra environment and how to call nvidia-smi.

    ``env`` is exported before every command (e.g. PATH for a simulated host's nvidia-smi).
    ``busy_mib`` is how much used memory per GPU, with no compute process of ours, still counts as free.
    ``server_port``, when set, is the port servers bind on this host instead of the space's ``port``;
    :data:`ANY_FREE_PORT` (0) on this machine: a free loopback port chosen for each launch, so controllers,
    demos and test runs from different folders never fight over one port.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        runs_root: str = "~/.servetune/runs",
        env: Mapping[str, str] | None = None,
        busy_mib: float = 1024.0,
        server_port: int | None = None,
        python: str | None = None,
    ) -> None:
        self.transport = transport
        self.name = transport.name
        self.runs_root = runs_root.rstrip("/")
        self.env = dict(env or {})
        self.busy_mib = busy_mib
        self.server_port = server_port
        self.python = python  # the engine's python on this host, instead of the space's engine.python
        #: The controller this host's servers belong to; :func:`search.run.run_search` sets a fresh one.
        self.controller_id = default_controller_id()

    def launch_port(self) -> int | None:
        """The port the next server binds: None (the space's), the inventory's, or a free one just picked
        (``server_port`` 0, this machine only; a port taken between the pick and the bind is ``port_in_use``)."""
        if self.server_port != ANY_FREE_PORT:
            return self.server_port
        if not isinstance(self.transport, LocalTransport):
            raise ConfigError(f"{self.name}: server_port 0 (any free port) works only on this machine")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    # ---- commands -------------------------------------------------------------------------------

    def _prefix(self) -> str:
        exports = "".join(f"export {k}={_envquote(v)}; " for k, v in self.env.items())
        return exports

    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        return self.transport.run(self._prefix() + command, timeout=timeout)

    def stream(self, command: str) -> LineStream:
        return self.transport.stream(self._prefix() + command)

    def _path(self, path: str) -> str:
        """A host path for shell use: ``~`` expanded by the shell, the rest quoted."""
        if path.startswith("~/"):
            return '"$HOME"/' + shlex.quote(path[2:])
        return shlex.quote(path)

    def shell_path(self, path: str) -> str:
        """A host path for shell use: ``~`` expanded by the shell, the rest quoted."""
        return self._path(path)

    def resolve(self, path: str) -> str:
        """Absolute form of a host path (``~`` expanded on the host)."""
        if not path.startswith("~"):
            return path
        res = self.run(f"echo {self._path(path)}", timeout=15)
        return res.stdout.strip()

    # ---- nvidia-smi -----------------------------------------------------------------------------

    def gpus(self, *, timeout: float = 20.0) -> list[GpuStatus]:
        res = self.run(GPU_QUERY, timeout=timeout)
        if not res.ok:
            raise HostUnreachable(
                f"nvidia-smi failed on {self.name} (rc={res.rc}): {res.stderr.strip()[:200]}", host=self.name
            )
        return parse_gpus(res.stdout)

    def compute_apps(self, *, timeout: float = 20.0) -> list[ComputeApp]:
        res = self.run(APPS_QUERY, timeout=timeout)
        if not res.ok:
            raise HostUnreachable(f"nvidia-smi failed on {self.name}: {res.stderr.strip()[:200]}",
                                  host=self.name)
        return parse_apps(res.stdout)

    def gpu_state(self, *, timeout: float = 20.0) -> tuple[list[GpuStatus], list[ComputeApp]]:
        """GPUs and compute processes in one round trip."""
        res = self.run(f"{GPU_QUERY} && echo {_SPLIT} && {APPS_QUERY}", timeout=timeout)
        if not res.ok or _SPLIT not in res.stdout:
            raise HostUnreachable(
                f"nvidia-smi failed on {self.name} (rc={res.rc}): {res.stderr.strip()[:200]}", host=self.name
            )
        gpus, _, apps = res.stdout.partition(_SPLIT)
        return parse_gpus(gpus), parse_apps(apps)

    def smi_sample(self) -> tuple[float, list[GpuStatus]]:
        return time.time(), self.gpus()

    # ---- preflight ------------------------------------------------------------------------------

    def preflight(self, engine: str, python: str, version_command: str, *, timeout: float = 60.0,
                  gpus: bool = True, model_path: str | None = None, gpus_needed: int = 0) -> HostInfo:
        """Check python, engine and version, file transfer, nvidia-smi, the model path, the GPU count, and
        that the GPUs are free of foreign processes.

        A fault waiting will not fix raises :class:`HostMisconfigured` (its message names the host, the fault
        and the fix): python or engine missing (EngineMissing), python older than 3.8 (the load generator's
        floor), no SFTP subsystem, no ``nvidia-smi`` on PATH, ``model_path`` (an absolute or ``~`` path)
        missing, fewer GPUs than ``gpus_needed``. Trouble reaching the host raises HostUnreachable. A busy
        GPU is reported in the result (``busy``) so a ``hosts check`` can print it; :meth:`require_free`
        turns it into HostBusy. ``gpus=False`` (an engine that runs on the CPU) skips nvidia-smi.
        """
        res = self.run(f"{shlex.quote(python)} -c 'import sys; print(sys.version.split()[0])'",
                       timeout=timeout)
        if not res.ok:
            raise EngineMissing(f"{self.name}: python {python!r} is not usable "
                                f"({(res.stderr.strip().splitlines() or ['no output'])[-1][:160]}); fix: install "
                                "it there or set the host's python in the inventory",
                                host=self.name, fault="python_missing")
        found_py = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if _version_tuple(found_py) < (3, 8):
            raise EngineMissing(f"{self.name}: python {python!r} is {found_py or 'unknown'}, servetune needs 3.8 "
                                "or newer on the host; fix: point the host's python at a newer one",
                                host=self.name, fault="python_version")
        ver = self.run(version_command, timeout=timeout)
        if not ver.ok or not ver.stdout.strip():
            raise EngineMissing(
                f"{self.name}: engine {engine!r} not found with {python} "
                f"({(ver.stderr.strip().splitlines() or ['no output'])[-1][:160]}); fix: install it in that "
                "python or set the host's python in the inventory",
                host=self.name,
            )
        self.check_put(timeout=timeout)
        if gpus:
            smi = self.run("command -v nvidia-smi", timeout=timeout)
            if not smi.ok:
                raise HostMisconfigured(
                    f"{self.name}: nvidia-smi is not on PATH; fix: install the NVIDIA driver's utilities or "
                    "add their directory to the host's PATH (inventory env)", host=self.name,
                    fault="no_nvidia_smi")
        if model_path and model_path.startswith(("/", "~")):
            there = self.run(f"test -e {self._path(model_path)}", timeout=timeout)
            if not there.ok:
                raise HostMisconfigured(
                    f"{self.name}: model path {model_path} does not exist; fix: copy the model there or "
                    "correct model_path", host=self.name, fault="model_missing")
        found, apps = self.gpu_state(timeout=timeout) if gpus else ([], [])
        if gpus and gpus_needed > len(found):
            raise HostMisconfigured(
                f"{self.name}: {len(found)} GPU(s), the space needs {gpus_needed} (tensor parallel size); "
                "fix: use a host with enough GPUs or lower the TP size", host=self.name, fault="too_few_gpus")
        info = HostInfo(self.name, python, engine, ver.stdout.strip().splitlines()[-1].strip(), found, apps)
        self.judge_busy(info)
        return info

    def check_put(self, *, timeout: float = 30.0) -> None:
        """Write a small file into the runs root as every launch does: a transport that cannot (an sshd
        without SFTP) raises HostMisconfigured from the transport; a runs root that cannot be made, too."""
        root = self._path(self.runs_root)
        mk = self.run(f'mkdir -p {root}/.servetune && cd {root}/.servetune && pwd', timeout=timeout)
        if not mk.ok:
            raise HostMisconfigured(
                f"{self.name}: cannot create the runs root {self.runs_root} "
                f"({mk.stderr.strip()[:160]}); fix: make it writable or set runs_root", host=self.name,
                fault="runs_root")
        self.transport.put(f"{mk.stdout.strip()}/put-check", b"servetune\n")

    def judge_busy(self, info: HostInfo) -> None:
        """Mark ``info`` busy when foreign compute processes or memory are on the GPUs."""
        if info.apps:
            pids = ", ".join(str(a.pid) for a in info.apps)
            info.busy, info.reason = True, f"compute processes on the GPUs (pid {pids})"
            return
        heavy = [g for g in info.gpus if (g.used_mib or 0) > self.busy_mib]
        if heavy:
            info.busy = True
            info.reason = "GPU memory in use with no servetune server: " + ", ".join(
                f"GPU {g.index} {g.used_mib:.0f} MiB" for g in heavy
            )

    def require_free(self, info: HostInfo) -> None:
        if info.busy:
            raise HostBusy(f"{self.name} is busy: {info.reason}", host=self.name)

    def wait_gpus_free(self, *, timeout: float = 30.0, interval: float = 0.25) -> list[GpuStatus]:
        """Wait until no compute process is left and used memory is back near its baseline."""
        deadline = time.monotonic() + timeout
        while True:
            gpus, apps = self.gpu_state()
            if not apps and all((g.used_mib or 0) <= self.busy_mib for g in gpus):
                return gpus
            if time.monotonic() > deadline:
                pids = ", ".join(str(a.pid) for a in apps) or "none"
                raise HostBusy(
                    f"GPU memory on {self.name} did not return to baseline within {timeout:g}s "
                    f"(compute pids: {pids})",
                    host=self.name,
                )
            time.sleep(interval)

    # ---- servers --------------------------------------------------------------------------------

    def run_dir(self, study: str, trial: str) -> str:
        return f"{self.runs_root}/{_safe(study)}/{_safe(trial)}"

    def start(self, run_dir: str, launch_script: str, run_id: str, *, files: Mapping[str, str] | None = None,
              scratch_vars: tuple[str, ...] = ("TMPDIR",), memory_limit_bytes: int | None = None,
              timeout: float = 30.0) -> RunRef:
        """Start ``launch_script`` detached in ``run_dir`` (created fresh) and return its reference.

        Each variable in ``scratch_vars`` points at its own directory under ``run_dir/scratch`` for the
        server's whole process tree; :meth:`remove_scratch` deletes them once the server is stopped.
        ``memory_limit_bytes`` runs the tree in a memory cgroup of its own with that limit (root only;
        RunnerError when the host cannot make one); :meth:`remove_cgroup` removes it after the stop.
        """
        # One round trip: the absolute form of run_dir (as resolve() gives it), then a fresh directory there.
        mk = self.run(f'd={self._path(run_dir)}; echo "$d"; rm -rf "$d" && mkdir -p "$d"', timeout=timeout)
        abs_dir = mk.stdout.strip()
        if not mk.ok:
            raise RunnerError(f"cannot create {abs_dir} on {self.name}: {mk.stderr.strip()[:200]}",
                              host=self.name)
        self.transport.put(f"{abs_dir}/launch.sh", launch_script.encode(), mode=0o755)
        self.transport.put(f"{abs_dir}/run.sh", _WRAPPER.encode(), mode=0o755)
        self.transport.put(f"{abs_dir}/owner", f"{self.name}\n{run_id}\n{self.controller_id}\n".encode())
        self.transport.put(f"{abs_dir}/scratch_vars", "".join(f"{v}\n" for v in scratch_vars).encode())
        for name, text in (files or {}).items():
            self.transport.put(f"{abs_dir}/{name}", text.encode(), mode=0o644)
        if memory_limit_bytes is not None:
            limit = f"{int(memory_limit_bytes)} {_safe(run_id)}\n"
            self.transport.put(f"{abs_dir}/memory_limit", limit.encode())
        d = shlex.quote(abs_dir)
        cmd = (
            f"cd {d} && {{ {RUN_ID_VAR}={shlex.quote(run_id)} setsid bash ./run.sh & }} "
            f"< /dev/null > /dev/null 2>&1; "
            f"for i in $(seq 1 200); do [ -s {d}/pgid ] || [ -s {d}/cgroup_error ] && break; sleep 0.02; "
            f"done; if [ -s {d}/cgroup_error ]; then echo CGROUP_ERROR $(cat {d}/cgroup_error); "
            f"else cat {d}/pgid; fi"
        )
        res = self.run(cmd, timeout=timeout)
        if res.stdout.startswith("CGROUP_ERROR "):
            why = res.stdout.removeprefix("CGROUP_ERROR ").strip()
            raise RunnerError(f"{self.name}: {why}", host=self.name)
        try:
            pgid = int(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RunnerError(f"server did not start on {self.name}: {res.stderr.strip()[:200]}",
                              host=self.name) from None
        return RunRef(abs_dir, pgid, run_id)

    def follow(self, ref: RunRef) -> LineStream:
        """Stream the server log from its start; the stream ends once the server has exited.

        ``tail --pid`` alone would wait until the wrapper is *reaped*, which an init process may do
        seconds late; the wrapper's ``exit_code`` file appears the moment the server exits, so watch it
        too (and give tail a moment to deliver the last lines).
        """
        d = shlex.quote(ref.run_dir)
        return self.stream(
            f"cd {d} || exit 1; tail -n +1 -F -s 0.1 --pid={ref.pgid} server.log 2>/dev/null & t=$!; "
            "while kill -0 $t 2>/dev/null; do "
            "if [ -e exit_code ]; then sleep 0.2; kill $t 2>/dev/null; break; fi; sleep 0.05; done; "
            "wait $t 2>/dev/null; exit 0"
        )

    def exit_code(self, ref: RunRef) -> int | None:
        res = self.run(f"cat {shlex.quote(ref.run_dir)}/exit_code 2>/dev/null", timeout=15)
        text = res.stdout.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def members(self, ref: RunRef) -> list[int]:
        res = self.run(_MEMBERS + f"members {ref.pgid}", timeout=15)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    def alive(self, ref: RunRef) -> bool:
        return bool(self.members(ref))

    def stop(self, ref: RunRef, *, grace: float = 10.0) -> StopResult:
        """TERM the group, TERM again at half the grace, KILL at the end; verify no member is left."""
        script = (
            _STOP.replace("@PGID@", str(ref.pgid))
            .replace("@TAG@", shlex.quote(ref.run_id))
            .replace("@GRACE_MS@", str(int(grace * 1000)))
            .replace("@DIR@", shlex.quote(ref.run_dir))
        )
        res = self.run(script, timeout=grace + 30)
        try:
            data = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RunnerError(f"stop failed on {self.name}: {res.stderr.strip()[:200]}",
                              host=self.name) from None
        if data["result"] == "not_ours":
            raise NotOurProcess(
                f"process group {ref.pgid} on {self.name} is not servetune run {ref.run_id}; "
                "not signalling it",
                host=self.name,
            )
        survivors = tuple(int(p) for p in data.get("survivors", []))
        if survivors:
            raise RunnerError(f"processes {survivors} survived SIGKILL on {self.name}", host=self.name)
        return StopResult(data.get("method", "gone"), float(data.get("ms", 0)) / 1000, survivors,
                          resent_term=bool(data.get("resent_term", False)))

    def remove_scratch(self, ref: RunRef) -> None:
        """Delete the run's scratch directories (call only once its process group is gone)."""
        d = shlex.quote(ref.run_dir)
        self.run(f"a=$(cat {d}/scratch_alias 2>/dev/null); case $a in /tmp/servetune.*) [ -L \"$a\" ] && "
                 f"rm -f \"$a\";; esac; rm -rf {d}/scratch {d}/scratch_alias", timeout=60)

    def oom_evidence(self, ref: RunRef) -> dict[str, int | str]:
        """What the run's memory cgroup saw: ``oom_kill`` (kernel OOM kills inside it),
        ``memory_limit_bytes``, ``memory_peak_bytes``, ``limit_hits``, ``cgroup`` and ``cgroup_version``.
        Empty without a cgroup.

        Readable after :meth:`remove_cgroup` too (it keeps a copy in the run directory).
        """
        res = self.run(_CG_EVIDENCE + f"cg_evidence {shlex.quote(ref.run_dir)}", timeout=15)
        out: dict[str, int | str] = {}
        for line in res.stdout.splitlines():
            key, _, value = line.strip().partition(" ")
            if key and value:
                out[key] = int(value) if value.isdigit() else value
        return out

    def remove_cgroup(self, ref: RunRef, *, timeout: float = 10.0) -> None:
        """Keep the run's cgroup evidence in its run directory, then remove the cgroup (once the group is
        gone). No-op for a run without a memory limit. RunnerError if the cgroup stays busy."""
        d = shlex.quote(ref.run_dir)
        script = (
            _CG_EVIDENCE
            + f"""[ -f {d}/cgroup ] || exit 0
read -r v cg < {d}/cgroup
if [ ! -f {d}/cgroup_evidence ]; then
  cg_evidence {d} > {d}/cgroup_evidence.tmp && mv {d}/cgroup_evidence.tmp {d}/cgroup_evidence
fi
n=0
while [ -d "$cg" ] && ! rmdir "$cg" 2>/dev/null; do
  n=$((n+1))
  if [ $n -gt {int(timeout * 10)} ]; then
    echo "cgroup $cg still busy: $(paste -sd, - < "$cg/cgroup.procs")"; exit 1
  fi
  sleep 0.1
done
exit 0"""
        )
        res = self.run(script, timeout=timeout + 15)
        if not res.ok:
            raise RunnerError(f"cannot remove the memory cgroup on {self.name}: {res.stdout.strip()[:200]}",
                              host=self.name)

    def read(self, path: str, *, tail_bytes: int | None = None) -> str:
        cmd = f"tail -c {tail_bytes} {shlex.quote(path)}" if tail_bytes else f"cat {shlex.quote(path)}"
        res = self.run(cmd + " 2>/dev/null", timeout=60)
        return res.stdout

    def orphans(self) -> list[RunRef]:
        """Run directories of this host whose process group is still alive and has no exit code, and whose
        controller is this host's own or has no live lease (expired, or its process on this machine gone).

        A server of another live controller is never an orphan: it is that controller's running trial.
        """
        live = {lease.controller for lease in self.live_leases() if lease.controller != self.controller_id}
        root = self._path(self.runs_root)
        script = (
            _MEMBERS
            + f"""for d in {root}/*/*/; do
  [ -f "$d/pgid" ] && [ ! -f "$d/exit_code" ] || continue
  [ "$(head -1 "$d/owner" 2>/dev/null)" = {shlex.quote(self.name)} ] || continue
  pg=$(cat "$d/pgid"); id=$(sed -n 2p "$d/owner"); c=$(sed -n 3p "$d/owner")
  [ -n "$(members $pg)" ] && echo "$pg ${{d%/}} ${{c:--}} $id"
done; true"""
        )
        res = self.run(script, timeout=30)
        refs = []
        for line in res.stdout.splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[0].isdigit() and parts[2] not in live:
                refs.append(RunRef(parts[1], int(parts[0]), parts[3]))
        return refs

    # ---- leases and claims ----------------------------------------------------------------------

    def _lease_dir(self) -> str:
        return f"{self._path(self.runs_root)}/{LEASE_DIR}"

    def renew_lease(self, lease: Lease, *, timeout: float = 15.0) -> None:
        """Write (or renew) ``lease`` with the host's current time as its heartbeat."""
        if lease.controller != _safe(lease.controller):
            raise ValueError(f"controller id {lease.controller!r} is not a plain name")
        # The heartbeat is the host's clock, so expiry never depends on the two machines' clocks agreeing.
        head = json.dumps({k: v for k, v in asdict(lease).items() if k != "heartbeat"})[:-1] + ', "heartbeat": '
        d = self._lease_dir()
        f = f"{d}/{lease.controller}.json"
        res = self.run(f'mkdir -p {d} && j={shlex.quote(head)} && echo "$j$(date +%s)}}" '
                       f'> {f}.tmp && mv {f}.tmp {f}', timeout=timeout)
        if not res.ok:
            raise RunnerError(f"cannot write the lease on {self.name}: {res.stderr.strip()[:200]}",
                              host=self.name)

    def drop_lease(self, controller: str, *, timeout: float = 15.0) -> None:
        """Remove ``controller``'s lease, and its claim on the host if it holds one."""
        c = shlex.quote(controller)
        claim = f"{self._path(self.runs_root)}/{CLAIM_DIR}"
        self.run(f'rm -f {self._lease_dir()}/{c}.json; '
                 f'[ "$(cat {claim}/controller 2>/dev/null)" != {c} ] || rm -rf {claim}', timeout=timeout)

    def leases(self, *, timeout: float = 15.0) -> tuple[float, list[Lease]]:
        """The host's clock and every lease on it (unreadable files skipped)."""
        res = self.run(f"date +%s; for f in {self._lease_dir()}/*.json; do [ -f \"$f\" ] && "
                       "tr -d '\\n' < \"$f\" && echo; done; true", timeout=timeout)
        lines = res.stdout.splitlines()
        try:
            now = float(lines[0])
        except (IndexError, ValueError):
            raise HostUnreachable(f"cannot read the leases on {self.name}: {res.stderr.strip()[:200]}",
                                  host=self.name) from None
        out = []
        for line in lines[1:]:
            try:
                data = json.loads(line)
                out.append(Lease(**{k: data[k] for k in Lease.__dataclass_fields__}))
            except (ValueError, TypeError, KeyError):
                continue
        return now, out

    def live_leases(self) -> list[Lease]:
        now, leases = self.leases()
        return [lease for lease in leases if lease.live(now)]

    def holder(self) -> Lease | None:
        """The lease of the controller that holds this host's claim now (None: nobody, or a dead one)."""
        claim = f"{self._path(self.runs_root)}/{CLAIM_DIR}"
        res = self.run(f"cat {claim}/controller 2>/dev/null; true", timeout=15)
        who = res.stdout.strip()
        if not who:
            return None
        return next((lease for lease in self.live_leases() if lease.controller == who), None)

    def claim(self, *, timeout: float = 15.0) -> Claim:
        """Claim the host for one trial of this host's controller (:attr:`controller_id`).

        The claim is a directory made atomically under ``flock``; a claim whose controller has no live lease
        is taken over. When another live controller holds it, nothing is touched and the result names it.
        """
        now, leases = self.leases(timeout=timeout)
        live = [lease for lease in leases if lease.live(now) and lease.controller != self.controller_id]
        keep = " ".join(shlex.quote(lease.controller) for lease in live)
        me = shlex.quote(self.controller_id)
        root = self._path(self.runs_root)
        claim = f"{root}/{CLAIM_DIR}"
        script = f"""mkdir -p {root}/.servetune || exit 1
take() {{
  if ! mkdir {claim} 2>/dev/null; then
    c=$(cat {claim}/controller 2>/dev/null)
    [ "$c" = {me} ] && {{ echo ok; return; }}
    for k in {keep}; do [ "$c" = "$k" ] && {{ echo "held $c"; return; }}; done
    rm -rf {claim}; mkdir {claim} || {{ echo "held ?"; return; }}
  fi
  echo {me} > {claim}/controller; echo ok
}}
if command -v flock >/dev/null; then
  ( flock 9; take ) 9> {root}/.servetune/claim.lock
else
  take
fi"""
        res = self.run(script, timeout=timeout)
        out = res.stdout.strip()
        if out == "ok":
            return Claim(True)
        if not out.startswith("held "):
            raise RunnerError(f"cannot claim {self.name}: {res.stderr.strip()[:200]}", host=self.name)
        who = out.removeprefix("held ")
        holder = next((lease for lease in live if lease.controller == who), None)
        what = holder.describe() if holder else f"controller {who}"
        return Claim(False, holder, f"{self.name} is held by {what}")

    def release_claim(self, *, timeout: float = 15.0) -> None:
        """Give the host's claim back (only if this host's controller holds it)."""
        claim = f"{self._path(self.runs_root)}/{CLAIM_DIR}"
        me = shlex.quote(self.controller_id)
        self.run(f'[ "$(cat {claim}/controller 2>/dev/null)" != {me} ] || rm -rf {claim}', timeout=timeout)

    # ---- the server's port ----------------------------------------------------------------------

    def port_holder(self, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> str:
        """Who listens on ``port`` on the host: ``free``, ``ours`` (a member of ``ref``'s process group),
        ``foreign``, or ``unknown`` (no /proc/net/tcp to read)."""
        script = _PORT_HOLDER.replace("@PORT@", f"{int(port):04X}").replace("@PGID@", str(ref.pgid if ref else 0))
        res = self.run(script, timeout=timeout)
        out = res.stdout.strip().splitlines()
        return out[-1] if out and out[-1] in ("free", "ours", "foreign", "unknown") else "unknown"

    def require_port_free(self, port: int) -> None:
        """HostBusy when another program listens on ``port`` (checked before every launch)."""
        if self.port_holder(port) == "foreign":
            raise HostBusy(f"port {port} on {self.name} is held by another program; the trial waits for it",
                           host=self.name)

    def cleanup_orphans(self, *, grace: float = 10.0) -> list[RunRef]:
        """Stop every orphaned servetune server of this host (and remove its scratch and memory cgroup);
        returns what was stopped."""
        stopped = []
        for ref in self.orphans():
            try:
                self.stop(ref, grace=grace)
            except NotOurProcess:
                continue
            self.remove_scratch(ref)
            self.remove_cgroup(ref)
            stopped.append(ref)
        return stopped

    def close(self) -> None:
        self.transport.close()


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


_ENV_REF = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def _envquote(value: str) -> str:
    """A host env value as shell text: ``$NAME`` and ``${NAME}`` expand (``PATH=/x:$PATH``); everything else,
    ``$(...)``, backquotes, ``$1`` and ``${X:-...}`` included, is quoted literally, so nothing runs."""
    parts: list[str] = []
    pos = 0
    for ref in _ENV_REF.finditer(value):
        if ref.start() > pos:
            parts.append(shlex.quote(value[pos:ref.start()]))
        parts.append('"${' + (ref.group(1) or ref.group(2)) + '}"')
        pos = ref.end()
    if pos < len(value) or not parts:
        parts.append(shlex.quote(value[pos:]))
    return "".join(parts)
