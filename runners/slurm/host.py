"""A Slurm cluster as a servetune host: each trial's server is one batch job, submitted from the login node.

:class:`SlurmHost` is a :class:`~runners.host.Host` whose command line is the login node's (SSH or this
machine); what a plain host does with a process group it does with a job:

* start: the run directory is written on the shared filesystem as on any host (launch script, ``run.sh``,
  the load generator), then a batch script (``job.sbatch``: the trial's GPUs, nodes, time limit, partition,
  account, QOS and the inventory's directives) is submitted with ``sbatch``; the job runs ``run.sh`` on its
  head node, so the server log and exit code land in the run directory as on any host;
* the queue: :meth:`SlurmHost.wait_scheduled` waits while the job is pending, apart from the start-up time;
* beside the server: ``/health``, nvidia-smi and the load generator run on the head node inside the
  allocation (``srun --overlap --jobid``), so figures never cross the network;
* stop: ``scancel --signal=TERM --full``, again at half the grace, then SIGKILL and ``scancel``; then a check
  that Slurm lists the job as ended;
* faults: a job Slurm ended (node failure, preemption, time limit, a cancel servetune did not send) is
  :attr:`~runners.telemetry.FailureKind.SCHEDULER` with Slurm's state and reason (FAIL, never PRUNED);
* a server spanning nodes: one job of that many nodes; rank 0 in the batch script on the head node, each rank
  >= 1 (:class:`SlurmRank`) a step of the same job on the job's next node, started once the job runs;
* no leases and no claims: Slurm decides who gets which GPUs. Parallel trials are parallel jobs, one per job
  slot (``max_jobs`` hosts of one inventory entry);
* orphans: this user's jobs whose comment names servetune, this cluster entry and a controller that is gone
  (its process on this machine has exited), or this slot's own leftover; never another user's or another
  live controller's job.
"""

from __future__ import annotations

import os
import random
import shlex
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import runners.host.gpu as gpu
import runners.host.ports as ports
import runners.host.runs as runs
from runners.errors import ConfigError, HostMisconfigured, RunnerError
from runners.host import Host, HostInfo, Resources, RunRef, StopResult
from runners.host.ports import Holder
from runners.host.shell import Shell, env_value, plain_name
from runners.slurm.jobs import COMMENT_TAG, FAULTS, JobInfo, SlurmClient
from runners.slurm.spec import SlurmSpec
from runners.smi import ComputeApp, GpuStatus
from runners.telemetry import Failure, FailureKind, Phase
from runners.transport import CommandResult, LineStream, Transport

__all__ = ["HEAD_ADDRESS", "JobRef", "SlurmHost", "SlurmRank", "SrunTransport", "job_script", "node_env"]

#: Ports picked for a launch when the inventory names none: below Linux's ephemeral range (32768-60999), so an
#: outgoing connection on the head node never holds one.
_PORTS = (20000, 32768)


@dataclass(frozen=True)
class JobRef(RunRef):
    """A server started as a Slurm job: its run directory (on the shared filesystem), run id and job id.
    ``pgid`` is 0: the process group lives on the head node and only ``run.sh`` there knows it."""

    job_id: str = ""


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", name).read_text()


class SrunTransport:
    """Commands on one node of a running job, through ``srun --overlap --jobid`` from the login node (the same
    shell text as on any host). Files are written through the login node: the filesystem is shared."""

    def __init__(self, login: Shell, job_id: str, node: str, *, name: str) -> None:
        self.login = login
        self.job_id = job_id
        self.node = node
        self.name = name

    def wrap(self, command: str) -> str:
        return (f"srun --overlap --jobid={shlex.quote(self.job_id)} --nodelist={shlex.quote(self.node)} "
                f"--nodes=1 --ntasks=1 --quiet --unbuffered bash -c "
                f"{shlex.quote(node_env(self.login.env, self.node) + command)}")

    def run(self, command: str, *, timeout: float = 30.0, stdin: bytes | None = None) -> CommandResult:
        if stdin is not None:
            return self.login.transport.run(self.login._prefix() + self.wrap(command), timeout=timeout,
                                            stdin=stdin)
        return self.login.run(self.wrap(command), timeout=timeout)

    def stream(self, command: str) -> LineStream:
        return self.login.stream(self.wrap(command))

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.login.put(path, data, mode=mode)

    def close(self) -> None:
        pass


#: The head node's address in a rank's launch script: ``job.sh`` sets it once the job runs (its ``NodeAddr``).
HEAD_ADDRESS = "$SERVETUNE_HEAD_ADDR"


def node_env(env: Mapping[str, str], node: str) -> str:
    """Shell text that exports ``SERVETUNE_NODE`` (the job's node a command runs on) and then the host's
    environment again, so a value naming ``$SERVETUNE_NODE`` is that node's (srun carries the login node's
    values, expanded there)."""
    exports = [f"export SERVETUNE_NODE={shlex.quote(node)}"]
    exports += [f"export {k}={env_value(v)}" for k, v in env.items()]
    return "; ".join(exports) + "; "


def job_script(spec: SlurmSpec, need: Resources, *, run_dir: str, job_name: str, comment: str,
               env: Mapping[str, str], run_id: str, memory_limit_bytes: int | None = None) -> str:
    """The batch script of one trial: ``#SBATCH`` lines, the host's environment, then the job body
    (``scripts/job.sh``). Rendered from the inventory entry and the trial's resources alone."""
    for what, text in (("run directory", run_dir), ("job name", job_name), ("comment", comment)):
        if not text or any(c.isspace() for c in text):
            raise ConfigError(f"Slurm {what} {text!r} must be one word (no spaces) to go on an #SBATCH line")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --comment={comment}",
             f"#SBATCH --chdir={run_dir}", f"#SBATCH --output={run_dir}/slurm.out",
             f"#SBATCH --nodes={need.nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --no-requeue",
             f"#SBATCH --time={spec.time_limit}"]
    if need.gpus_per_node > 0:
        lines.append(f"#SBATCH {spec.gpu_option(need.gpus_per_node)}")
    for option, value in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos)):
        if value is not None:
            lines.append(f"#SBATCH --{option}={value}")
    if memory_limit_bytes is not None:
        lines.append(f"#SBATCH --mem={max(1, int(memory_limit_bytes) // 2**20)}M")
    lines += [f"#SBATCH {d}" for d in spec.directives]
    lines.append('export SERVETUNE_NODE="${SLURMD_NODENAME:-$(hostname -s)}"')  # the head: this script's node
    lines += [f"export {k}={env_value(v)}" for k, v in env.items()]
    lines.append(f"export SERVETUNE_RUN_ID={shlex.quote(run_id)}")
    return "\n".join(lines) + "\n" + _script("job.sh")


class SlurmHost(Host):
    """One job slot of a Slurm cluster (see the module docstring). ``cluster`` is the inventory entry's name;
    ``slot`` numbers the slot from 1 (the host's name is ``cluster#slot``)."""

    def __init__(self, transport: Transport, spec: SlurmSpec, *, cluster: str, slot: int, runs_root: str,
                 env: Mapping[str, str] | None = None, python: str | None = None) -> None:
        super().__init__(transport, runs_root=runs_root, env=env, server_port=spec.server_port, python=python,
                         node_address=HEAD_ADDRESS)
        self.spec = spec
        self.cluster = cluster
        self.slot = slot
        self.slurm = SlurmClient(self)
        self._gpus: list[GpuStatus] = []
        self._job: JobRef | None = None
        self._info: JobInfo | None = None
        self._cancelled: set[str] = set()
        """Jobs servetune cancelled itself: their CANCELLED is no fault."""

    kind = "slurm"

    @property
    def hold(self) -> None:
        """None: no lease and no claim; Slurm decides who gets the GPUs (a job slot is this controller's own,
        and Slurm queues what does not fit)."""
        return None

    spans_nodes = True

    def rank_hosts(self, nodes: int) -> list[Host]:
        """Every rank of a server spanning ``nodes`` nodes runs in this slot's one job of ``nodes`` nodes: this
        slot is rank 0 (on the job's head node, where the batch script runs), :class:`SlurmRank` ``r`` the job's
        ``r``-th node."""
        return [self, *(SlurmRank(self, rank) for rank in range(1, nodes))]

    def rank_script(self, script: str) -> str:
        """The head's address (:data:`HEAD_ADDRESS`, rendered quoted as a literal) made a variable the shell
        expands: ``'$SERVETUNE_HEAD_ADDR:PORT'`` becomes ``"$SERVETUNE_HEAD_ADDR"':PORT'``."""
        return script.replace(shlex.quote(HEAD_ADDRESS + ":")[:-2], f'"{HEAD_ADDRESS}"\'')

    def free_port(self, python: str, address: str) -> int:
        """The dist-init port of a server spanning nodes: picked at random below the ephemeral range (the head
        node is not known before the job runs; a taken port fails the trial at init, and it is retried)."""
        return random.randrange(*_PORTS)

    def require_port_free(self, port: int) -> None:
        """The head node is not known before the job runs; a foreign listener there is found at readiness
        (``port_in_use``)."""

    def launch_port(self) -> int | None:
        """``server_port + slot - 1`` when the inventory names a first port, else a port picked at random
        below the ephemeral range (a taken one is ``port_in_use``, and the trial is retried)."""
        if self.spec.server_port is not None:
            return self.spec.server_port + self.slot - 1
        return random.randrange(*_PORTS)

    # ---- preflight: on the login node, GPUs from sinfo ----------------------------------------------

    def preflight(self, engine: str, python: str, version_command: str, *, timeout: float = 60.0,
                  gpus: bool = True, model_path: str | None = None, gpus_needed: int = 0) -> HostInfo:
        """Python, engine, file transfer and model path checked on the login node (the shared filesystem);
        the partition's GPUs per node from ``sinfo`` (their memory from the inventory's ``gpu_memory_mib``). A
        partition Slurm does not know, or fewer GPUs than
        ``gpus_needed``, raises HostMisconfigured."""
        per_node, nodes, kind = self._partition_gpus()
        info = gpu.preflight(self, engine, python, version_command, busy_mib=self.busy_mib, timeout=timeout,
                             gpus_wanted=False, model_path=model_path, gpus_needed=0)
        if gpus and per_node * nodes < gpus_needed:
            raise HostMisconfigured(
                f"{self.name}: the partition has {nodes} node(s) with {per_node} GPU(s) each, the space needs "
                f"{gpus_needed}; fix: choose a partition with enough GPUs or lower the TP size",
                host=self.name, fault="too_few_gpus")
        total = self.spec.gpu_memory_mib
        self._gpus = [GpuStatus(i, kind, total, None, total, None) for i in range(per_node)] if gpus else []
        info.gpus = list(self._gpus)
        return info

    def _partition_gpus(self) -> tuple[int, int, str]:
        """(GPUs per node, nodes, GPU type) of the partition, from ``sinfo``'s GRES column."""
        part = f"-p {shlex.quote(self.spec.partition)} " if self.spec.partition else ""
        out = self.slurm._run(f'sinfo -h {part}-o "%G|%D|%P"', "sinfo")
        rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
        if not rows:
            where = f"partition {self.spec.partition!r}" if self.spec.partition else "any partition"
            raise HostMisconfigured(f"{self.name}: sinfo lists no nodes in {where}; fix: name a partition "
                                    "sinfo shows", host=self.name, fault="slurm_partition")
        per_node, nodes, kind = 0, 0, "gpu"
        for gres, count, _ in rows:
            nodes += int(count) if count.isdigit() else 0
            for item in gres.split(","):
                parts = item.split("(")[0].split(":")
                if parts[0] == "gpu" and parts[-1].isdigit():
                    per_node = max(per_node, int(parts[-1]))
                    if len(parts) == 3:
                        kind = parts[1]
        return per_node, nodes, kind

    def gpu_state(self, *, timeout: float = 20.0) -> tuple[list[GpuStatus], list[ComputeApp]]:
        """The partition's GPUs as the preflight found them: Slurm hands a job free GPUs, so none is busy."""
        return list(self._gpus), []

    def wait_gpus_free(self, *, timeout: float = 30.0, interval: float = 0.25) -> list[GpuStatus]:
        return list(self._gpus)

    def smi_sample(self) -> tuple[float, list[GpuStatus]]:
        """nvidia-smi on the running job's head node; RunnerError while no job of this slot runs."""
        job = self._job
        if job is None or self._info is None or not self._info.running:
            raise RunnerError(f"{self.name}: no running job to sample", host=self.name)
        return time.time(), gpu.gpus(self.beside(job))

    # ---- a server as a job ----------------------------------------------------------------------

    def start(self, run_dir: str, launch_script: str, run_id: str, *, files: Mapping[str, str] | None = None,
              scratch_vars: tuple[str, ...] = ("TMPDIR",), memory_limit_bytes: int | None = None,
              timeout: float = 30.0, resources: Resources | None = None) -> JobRef:
        """Write the run directory on the shared filesystem and submit the trial's job; its reference at once
        (the job may wait in the queue: :meth:`wait_scheduled`). A directive Slurm refuses raises
        HostMisconfigured. ``memory_limit_bytes`` becomes ``--mem`` (Slurm's cgroup enforces it where the
        cluster has one)."""
        need = resources or Resources()
        abs_dir = runs.prepare(self, run_dir, launch_script, run_id, controller=self.controller_id, files=files,
                               scratch_vars=scratch_vars, timeout=timeout)
        study, trial = ["", "", *abs_dir.rstrip("/").split("/")][-2:]  # <runs_root>/<study>/<trial>
        comment = ",".join([COMMENT_TAG, f"study={plain_name(study)}", f"trial={plain_name(trial)}",
                            f"cluster={plain_name(self.cluster)}", f"slot={self.slot}",
                            f"controller={self.controller_id}", f"pid={os.getpid()}",
                            f"on={plain_name(socket.gethostname())}"])
        script = job_script(self.spec, need, run_dir=abs_dir, job_name=f"servetune-{plain_name(study)}-"
                            f"{plain_name(trial)}", comment=comment, env=self.env, run_id=run_id,
                            memory_limit_bytes=memory_limit_bytes)
        self.put(f"{abs_dir}/job.sbatch", script.encode(), mode=0o644)
        job_id = self.slurm.submit(f"{abs_dir}/job.sbatch")
        self.put(f"{abs_dir}/job_id", f"{job_id}\n".encode())
        ref = JobRef(abs_dir, 0, run_id, job_id)
        self._job, self._info = ref, None
        return ref

    def job(self, ref: RunRef) -> JobInfo:
        """The job's state now (and, once it runs, its nodes: the head node first)."""
        info = self.slurm.info(_job_id(ref))
        if self._job is not None and self._job.job_id == info.job_id:
            self._info = info
        return info

    def nodes(self, ref: RunRef) -> tuple[str, ...]:
        """The job's node list, head node first (empty while it waits): where a multi-node server's ranks run."""
        return self.job(ref).nodes

    def wait_scheduled(self, ref: RunRef, *, stop: threading.Event, timeout: float | None = None) -> Failure | None:
        """Wait while the job is pending (``timeout``, else the inventory's ``queue_timeout``, else for ever);
        None once it runs. A job that ends before it ran, or waits past the limit (it is then cancelled), is a
        SCHEDULER failure; ``stop`` set while it waits is INTERRUPTED (the job is cancelled)."""
        limit = timeout if timeout is not None else self.spec.queue_timeout
        began = time.monotonic()
        while True:
            info = self.job(ref)
            if info.running or (info.active and info.state not in ("PENDING", "CONFIGURING", "REQUEUED")):
                return None
            if not info.active:
                why = FAULTS.get(info.state, "it ended")
                return Failure(FailureKind.SCHEDULER, Phase.STARTING, f"Slurm {info.describe()} before it ran: {why}")
            if stop.is_set():
                self._cancel(ref)
                return Failure(FailureKind.INTERRUPTED, Phase.STARTING, "interrupted while the job was queued")
            if limit is not None and time.monotonic() - began > limit:
                self._cancel(ref)
                return Failure(FailureKind.SCHEDULER, Phase.STARTING,
                               f"Slurm {info.describe()} waited in the queue longer than {limit:g}s; cancelled")
            stop.wait(self.spec.poll_interval)

    def beside(self, ref: RunRef) -> Shell:
        """The job's head node, through ``srun --overlap``."""
        info = self._info if self._info is not None and self._info.job_id == _job_id(ref) else self.job(ref)
        if info.head is None:
            info = self.job(ref)
        if info.head is None:
            raise RunnerError(f"{self.name}: Slurm {info.describe()} has no node to run on", host=self.name)
        transport = SrunTransport(self, _job_id(ref), info.head, name=f"{self.name}:{info.head}")
        return Shell(transport, runs_root=self.runs_root, env=self.env)

    def scheduler_end(self, ref: RunRef) -> Failure | None:
        """A Slurm fault that ended the job, with Slurm's state and reason; OUT_OF_MEMORY is the trial's OOM."""
        info = self.job(ref)
        if info.state == "OUT_OF_MEMORY":
            return Failure(FailureKind.OOM, None, f"Slurm {info.describe()}: the job went over its memory")
        if info.state not in FAULTS or (info.state == "CANCELLED" and info.job_id in self._cancelled):
            return None
        return Failure(FailureKind.SCHEDULER, None, f"Slurm {info.describe()}: {FAULTS[info.state]}")

    def follow(self, ref: RunRef) -> LineStream:
        """The server log from its start, live, until the server exits or Slurm ends the job."""
        return self._follow_job(ref.run_dir, _job_id(ref))

    def _follow_job(self, run_dir: str, job_id: str) -> LineStream:
        from_script = f"set -- {shlex.quote(run_dir)} {shlex.quote(job_id)} " \
                      f"{max(1, round(self.spec.poll_interval))}\n" + _script("follow_job.sh")
        return self.stream(from_script)

    def alive(self, ref: RunRef) -> bool:
        if self.run(f"test -e {shlex.quote(ref.run_dir)}/exit_code", timeout=15).ok:
            return False
        return self.job(ref).active

    def members(self, ref: RunRef) -> list[int]:
        """The server's process group on the head node (empty once the job has ended)."""
        info = self.job(ref)
        pgid = self._pgid(ref)
        if not info.running or pgid <= 1:
            return []
        res = self.beside(ref).run_script("members.sh", pgid, timeout=30)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    def _pgid(self, ref: RunRef) -> int:
        if ref.pgid > 1:
            return ref.pgid
        text = self.run(f"cat {shlex.quote(ref.run_dir)}/pgid 2>/dev/null", timeout=15).stdout.strip()
        return int(text) if text.isdigit() else 0

    def port_holder(self, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> Holder:
        """Who listens on ``port`` on the job's head node (``unknown`` before the job runs)."""
        if ref is None:
            return "unknown"
        mine = RunRef(ref.run_dir, self._pgid(ref), ref.run_id)
        try:
            return ports.holder(self.beside(ref), port, mine, timeout=timeout + 15)
        except RunnerError:
            return "unknown"

    def stop(self, ref: RunRef, *, grace: float = 10.0) -> StopResult:
        """SIGTERM to every process of the job, again at half the grace, SIGKILL and ``scancel`` at its end;
        then wait until Slurm lists the job as ended (RunnerError when it does not)."""
        job = _job_id(ref)
        began = time.monotonic()
        info = self.job(ref)
        if not info.active:
            return StopResult("gone", 0.0)
        method, resent = "term", False
        if not info.running:
            self._cancel(ref)
            method = "cancel"
        else:
            self.slurm.signal(job, "TERM")
        while info.active and method == "term":
            elapsed = time.monotonic() - began
            if not resent and elapsed > grace / 2:
                self.slurm.signal(job, "TERM")
                resent = True
            if elapsed > grace:
                method = "kill"
                self._cancelled.add(job)
                self.slurm.signal(job, "KILL")
                self.slurm.cancel(job)
                break
            time.sleep(0.1)
            info = self.job(ref)
        deadline = time.monotonic() + 60
        while info.active:
            if time.monotonic() > deadline:
                raise RunnerError(f"{self.name}: Slurm {info.describe()} still listed 60s after scancel",
                                  host=self.name)
            time.sleep(0.2)
            info = self.job(ref)
        return StopResult(method, time.monotonic() - began, (), resent_term=resent)

    def _cancel(self, ref: RunRef) -> None:
        self._cancelled.add(_job_id(ref))
        self.slurm.cancel(_job_id(ref))

    def remove_cgroup(self, ref: RunRef, *, timeout: float = 10.0) -> None:
        """Slurm's own cgroup goes with the job."""

    def oom_evidence(self, ref: RunRef) -> dict[str, int | str]:
        """Slurm reports an over-memory job as OUT_OF_MEMORY (:meth:`scheduler_end`); no cgroup of servetune's."""
        return {}

    # ---- jobs left behind ----------------------------------------------------------------------------

    def orphans(self) -> list[RunRef]:
        """This user's servetune jobs of this cluster entry left by a controller that is gone, or by this slot
        of this controller (see the module docstring)."""
        here = plain_name(socket.gethostname())
        found: list[RunRef] = []
        for job, state, work_dir, fields in self.slurm.own_jobs():
            if fields.get("cluster") != plain_name(self.cluster) or state not in ("PENDING", "RUNNING",
                                                                                   "CONFIGURING", "SUSPENDED"):
                continue
            if fields.get("controller") == self.controller_id:
                if fields.get("slot") != str(self.slot):
                    continue  # a sibling slot's running trial
            elif fields.get("on") != here or _pid_alive(fields.get("pid", "")):
                continue  # another live controller's trial (or one on another machine: its time limit ends it)
            found.append(JobRef(work_dir, 0, "", job))
        return found

    def cleanup_orphans(self, *, grace: float = 10.0) -> list[RunRef]:
        """Cancel every orphaned job (see :meth:`orphans`) and wait until each has ended."""
        stopped = []
        for ref in self.orphans():
            self._cancel(ref)
            stopped.append(ref)
        for ref in stopped:
            deadline = time.monotonic() + max(grace, 10) + 60
            while self.job(ref).active and time.monotonic() < deadline:
                time.sleep(0.2)
        return stopped


class SlurmRank(SlurmHost):
    """Rank ``rank`` (1 and up) of a server spanning the nodes of ``head``'s job: a step of that job on its
    ``rank``-th node (``srun --overlap --jobid --nodelist=<node>``, from the login node, detached), started once
    the job runs, in a run directory of its own beside the head's (``<trial>-rank<r>``) on the shared
    filesystem, where its log, process group and exit code land as on any host. Its node's name is exported as
    ``SERVETUNE_NODE`` and the host's environment again after it, the head's address as
    ``SERVETUNE_HEAD_ADDR``. It lives and ends with the job: the head's stop signals every step of it, and
    recovery finds the job by the head's comment."""

    def __init__(self, head: SlurmHost, rank: int) -> None:
        super().__init__(head.transport, head.spec, cluster=head.cluster, slot=head.slot, runs_root=head.runs_root,
                         python=head.python)
        self.env = head.env  # one environment: what the preflight adds to the head's, the ranks see
        self.head = head
        self.rank = rank
        self.name = f"{head.name}:rank{rank}"
        self.controller_id = head.controller_id
        self._jobs: dict[str, JobRef] = {}
        self._need: dict[str, Resources] = {}
        self._ref: RunRef | None = None

    def run_dir(self, study: str, trial: str) -> str:
        return runs.run_dir(self.runs_root, study, f"{trial}-rank{self.rank}")

    def launch_port(self) -> int | None:
        """A port of its own (ranks >= 1 answer a health check on it); nodes of a test cluster share one
        machine."""
        return random.randrange(*_PORTS)

    def cleanup_orphans(self, *, grace: float = 10.0) -> list[RunRef]:
        """The head's job slot finds and cancels the job this rank ran in."""
        return []

    def orphans(self) -> list[RunRef]:
        return []

    def start(self, run_dir: str, launch_script: str, run_id: str, *, files: Mapping[str, str] | None = None,
              scratch_vars: tuple[str, ...] = ("TMPDIR",), memory_limit_bytes: int | None = None,
              timeout: float = 30.0, resources: Resources | None = None) -> JobRef:
        """Write the rank's run directory; the rank itself starts once the head's job runs
        (:meth:`wait_scheduled`)."""
        abs_dir = runs.prepare(self, run_dir, launch_script, run_id, controller=self.controller_id, files=files,
                               scratch_vars=scratch_vars, timeout=timeout)
        ref = JobRef(abs_dir, 0, run_id, "")
        self._need[abs_dir] = resources or Resources()
        self._ref = ref
        return ref

    def _job_of(self, ref: RunRef, *, wait: float = 60.0) -> JobRef | None:
        """The head's job this rank belongs to (the head's run directory is the rank's less ``-rank<r>``);
        None when the head submitted none within ``wait`` seconds (its start failed)."""
        if ref.run_dir in self._jobs:
            return self._jobs[ref.run_dir]
        head_dir = ref.run_dir.removesuffix(f"-rank{self.rank}")
        deadline = time.monotonic() + wait
        while True:
            job = self.head._job
            if job is not None and job.run_dir == head_dir:
                self._jobs[ref.run_dir] = job
                return job
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _job_for(self, ref: RunRef) -> JobRef:
        job = self._job_of(ref)
        if job is None:
            raise RunnerError(f"{self.name}: the head submitted no job for {ref.run_dir}", host=self.name)
        return job

    def _node(self, job: JobRef) -> tuple[str, JobInfo]:
        info = self.head.job(job)
        if len(info.nodes) <= self.rank:
            raise RunnerError(f"{self.name}: Slurm {info.describe()} has no node for rank {self.rank}",
                              host=self.name)
        return info.nodes[self.rank], info

    def wait_scheduled(self, ref: RunRef, *, stop: threading.Event, timeout: float | None = None) -> Failure | None:
        """Once the head's job runs: start this rank on the job's ``rank``-th node. A job that ended first is
        the head's failure to tell; here it is None."""
        job = self._job_for(ref)
        failure = self.head.wait_scheduled(job, stop=stop, timeout=timeout)
        if failure is not None:
            return failure
        node, info = self._node(job)
        if not info.running:
            return None  # ended already: the head's watch says why
        head_addr = self.slurm.node_address(info.head or node)
        need = self._need.get(ref.run_dir, Resources())
        gres = f"{self.spec.gpu_option(need.gpus_per_node)} " if need.gpus_per_node > 0 else ""
        inner = (node_env(self.env, node)
                 + f"export SERVETUNE_HEAD={shlex.quote(info.head or node)} "
                 f"SERVETUNE_HEAD_ADDR={shlex.quote(head_addr)} SERVETUNE_NODES={shlex.quote(' '.join(info.nodes))} "
                 f"SERVETUNE_RUN_ID={shlex.quote(ref.run_id)}; exec bash ./run.sh")
        step = (f"srun --overlap --jobid={shlex.quote(job.job_id)} --nodelist={shlex.quote(node)} --nodes=1 "
                f"--ntasks=1 --quiet --unbuffered {gres}--chdir={shlex.quote(ref.run_dir)} "
                f"bash -c {shlex.quote(inner)}")
        # Detached on the login node: the srun client lives as long as the step (or the job), not the controller.
        res = self.run(f"cd {shlex.quote(ref.run_dir)} && {{ setsid nohup {step} > srun.out 2>&1 < /dev/null & }}",
                       timeout=30)
        if not res.ok:
            raise RunnerError(f"{self.name}: could not start rank {self.rank} on {node}: "
                              f"{(res.stderr.strip() or res.stdout.strip())[-300:]}", host=self.name)
        return None

    def follow(self, ref: RunRef) -> LineStream:
        return self._follow_job(ref.run_dir, self._job_for(ref).job_id)

    def alive(self, ref: RunRef) -> bool:
        if self.run(f"test -e {shlex.quote(ref.run_dir)}/exit_code", timeout=15).ok:
            return False
        return self.head.job(self._job_for(ref)).active

    def members(self, ref: RunRef) -> list[int]:
        """Not asked on another node: the step ends with its job (the head's stop verifies that)."""
        return []

    def scheduler_end(self, ref: RunRef) -> Failure | None:
        job = self._job_of(ref, wait=0)
        return self.head.scheduler_end(job) if job is not None else None

    def beside(self, ref: RunRef) -> Shell:
        """The rank's node, through ``srun --overlap``."""
        job = self._job_for(ref)
        node, _ = self._node(job)
        return Shell(SrunTransport(self, job.job_id, node, name=f"{self.name}:{node}"), runs_root=self.runs_root,
                     env=self.env)

    def smi_sample(self) -> tuple[float, list[GpuStatus]]:
        """nvidia-smi on this rank's node; RunnerError until it runs."""
        ref = self._ref
        if ref is None or self._job_of(ref, wait=0) is None:
            raise RunnerError(f"{self.name}: no running job to sample", host=self.name)
        return time.time(), gpu.gpus(self.beside(ref))

    def port_holder(self, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> Holder:
        return "unknown"

    def stop(self, ref: RunRef, *, grace: float = 10.0) -> StopResult:
        """The head's stop signals every step of the job; here: wait until this rank has exited or the job has
        ended (RunnerError when neither happens within the grace and a minute more)."""
        began = time.monotonic()
        job = self._job_of(ref, wait=5)
        if job is None:
            return StopResult("gone", 0.0)
        deadline = began + grace + 60
        while True:
            done = self.run(f"test -e {shlex.quote(ref.run_dir)}/exit_code", timeout=15).ok
            if done or not self.head.job(job).active:
                return StopResult("term", time.monotonic() - began)
            if time.monotonic() > deadline:
                raise RunnerError(f"{self.name}: rank {self.rank} still running {grace + 60:g}s after the stop",
                                  host=self.name)
            time.sleep(0.2)


def _job_id(ref: RunRef) -> str:
    if not isinstance(ref, JobRef) or not ref.job_id:
        raise RunnerError(f"{ref.run_dir or ref.run_id}: not a Slurm job of servetune's")
    return ref.job_id


def _pid_alive(text: str) -> bool:
    if not text.isdigit():
        return False
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
