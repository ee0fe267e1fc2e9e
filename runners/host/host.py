"""A GPU host as servetune uses it: one object over a :class:`~runners.transport.Transport` that asks the parts
of this package, each doing one job:

* :mod:`runners.host.gpu`: the preflight (python and engine present, engine version, nvidia-smi answers,
  GPUs free) and the GPUs' state;
* :mod:`runners.host.runs`: a server started detached in a run directory, its log followed live, its exit
  code, its process group stopped (TERM, TERM, KILL) after checking it is ours, its scratch removed;
* :mod:`runners.host.cgroup`: the memory cgroup evidence of a run with a memory limit, so an OOM kill is told
  from a crash;
* :mod:`runners.host.leases`: controllers' leases on the host and the claim one trial at a time holds;
* :mod:`runners.host.orphans`: servers a crashed controller left behind, found and stopped;
* :mod:`runners.host.ports`: the port a server binds, and whether our process group holds it;
* :mod:`runners.host.shell` and :mod:`runners.host.shipped`: the commands, and the bash scripts shipped as
  files, that all of them run.

Nothing here ever kills by name. Every host-side script is plain bash + coreutils + procps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import runners.host.cgroup as cgroup
import runners.host.gpu as gpu
import runners.host.leases as leases
import runners.host.orphans as orphans
import runners.host.ports as ports
import runners.host.runs as runs
from runners.errors import HostBusy
from runners.host.gpu import HostInfo
from runners.host.leases import Claim, Lease, default_controller_id
from runners.host.ports import Holder
from runners.host.runs import Resources, RunRef, StopResult
from runners.host.shell import DEFAULT_HOST_DIR, Shell
from runners.smi import ComputeApp, GpuStatus
from runners.telemetry import Failure
from runners.transport import LineStream, Transport


class LeaseHold:
    """The hold of a process-group host (:class:`runners.placement.protocol.Hold`): the leases and the claim
    in the host's GPU folder (:mod:`runners.host.leases`), which every controller on the machine shares."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def renew(self, lease: Lease, *, timeout: float = 15.0) -> None:
        self.host.renew_lease(lease, timeout=timeout)

    def drop(self, controller: str, *, timeout: float = 15.0) -> None:
        self.host.drop_lease(controller, timeout=timeout)

    def live(self) -> list[Lease]:
        return self.host.live_leases()

    def holder(self) -> Lease | None:
        return self.host.holder()

    def claim(self, *, timeout: float = 15.0) -> Claim:
        return self.host.claim(timeout=timeout)

    def release(self, *, timeout: float = 15.0) -> None:
        self.host.release_claim(timeout=timeout)


class Host(Shell):
    """One GPU host: a transport plus where runs live, extra environment and how to call nvidia-smi.

    ``env`` is exported before every command (e.g. PATH for a simulated host's nvidia-smi).
    ``busy_mib`` is how much used memory per GPU, with no compute process of ours, still counts as free.
    ``server_port``, when set, is the port servers bind on this host instead of the space's ``port``;
    :data:`~runners.host.ports.ANY_FREE_PORT` (0) on this machine: a free loopback port chosen for each
    launch, so controllers, demos and test runs from different folders never fight over one port.
    ``host_dir`` is where the leases and the claim of the host's GPUs live, shared by every controller of
    every user on the machine (see :mod:`runners.host.leases`).
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
        host_dir: str = DEFAULT_HOST_DIR,
        node_address: str = "127.0.0.1",
        price_per_gpu_hour: float | None = None,
    ) -> None:
        super().__init__(transport, runs_root=runs_root, env=env, host_dir=host_dir)
        self.price_per_gpu_hour = price_per_gpu_hour
        """What one GPU of this host costs per hour (the inventory's; the ``cost_per_mtok`` objective)."""
        self.busy_mib = busy_mib
        self.server_port = server_port
        self.python = python  # the engine's python on this host, instead of the space's engine.python
        self.node_address = node_address
        """The address the other nodes of a server spanning nodes reach this host at (its dist-init address
        when it is the head)."""
        #: The controller this host's servers belong to; :func:`search.run.run_search` sets a fresh one.
        self.controller_id = default_controller_id()

    #: The placement registry's name for this kind (:mod:`runners.placement.registry`): servers as process
    #: groups on a machine reached by the local or the SSH transport.
    kind = "process-group"

    @property
    def hold(self) -> LeaseHold | None:
        """The leases and claim on this host's GPUs, shared with every controller on the machine."""
        return LeaseHold(self)

    def launch_port(self) -> int | None:
        """The port the next server binds (see :func:`runners.host.ports.launch_port`)."""
        return ports.launch_port(self, self.server_port)

    #: Whether this host runs every rank of a server spanning nodes by itself (a Slurm job slot: one job of
    #: that many nodes); a plain host runs one rank and a server spanning nodes takes an inventory group.
    spans_nodes = False

    def rank_hosts(self, nodes: int) -> list[Host]:
        """The hosts, head first, of a server of ``nodes`` ranks that this host runs by itself: a plain host
        runs one rank (a server spanning nodes takes an inventory group); a Slurm job slot runs every rank in
        one job of ``nodes`` nodes."""
        return [self]

    def rank_script(self, script: str) -> str:
        """A rank's rendered launch script as this host runs it: unchanged on a plain host (a Slurm job slot
        fills in the head's address, known only once its job runs)."""
        return script

    # ---- preflight and GPU state ----------------------------------------------------------------

    def gpus(self, *, timeout: float = 20.0) -> list[GpuStatus]:
        return gpu.gpus(self, timeout=timeout)

    def compute_apps(self, *, timeout: float = 20.0) -> list[ComputeApp]:
        return gpu.compute_apps(self, timeout=timeout)

    def foreign_apps(self, ref: RunRef, *, timeout: float = 20.0) -> list[ComputeApp]:
        """The compute processes on the GPUs that are not ``ref``'s server's (see
        :func:`runners.host.gpu.foreign_apps`)."""
        return gpu.foreign_apps(self, ref.pgid, timeout=timeout)

    def gpu_state(self, *, timeout: float = 20.0) -> tuple[list[GpuStatus], list[ComputeApp]]:
        """GPUs and compute processes in one round trip."""
        return gpu.gpu_state(self, timeout=timeout)

    def smi_sample(self) -> tuple[float, list[GpuStatus]]:
        return time.time(), self.gpus()

    def preflight(self, engine: str, python: str, version_command: str, *, timeout: float = 60.0,
                  gpus: bool = True, model_path: str | None = None, gpus_needed: int = 0) -> HostInfo:
        """Check python, engine and version, file transfer, nvidia-smi, the model path, the GPU count, and
        that the GPUs are free of foreign processes.

        A fault waiting will not fix raises :class:`~runners.errors.HostMisconfigured` (its message names the
        host, the fault and the fix): python or engine missing (EngineMissing), python older than 3.8 (the
        load generator's floor), no SFTP subsystem, no ``nvidia-smi`` on PATH, ``model_path`` (an absolute or
        ``~`` path) missing, fewer GPUs than ``gpus_needed``. Trouble reaching the host raises
        HostUnreachable. A busy GPU is reported in the result (``busy``) so a ``hosts check`` can print it;
        :meth:`require_free` turns it into HostBusy. ``gpus=False`` (an engine that runs on the CPU) skips
        nvidia-smi.
        """
        return gpu.preflight(self, engine, python, version_command, busy_mib=self.busy_mib, timeout=timeout,
                             gpus_wanted=gpus, model_path=model_path, gpus_needed=gpus_needed)

    def check_put(self, *, timeout: float = 30.0) -> None:
        """Write a small file into the runs root as every launch does (see :func:`runners.host.gpu.check_put`)."""
        gpu.check_put(self, timeout=timeout)

    def judge_busy(self, info: HostInfo) -> None:
        """Mark ``info`` busy when foreign compute processes or memory are on the GPUs."""
        gpu.judge_busy(info, self.busy_mib)

    def require_free(self, info: HostInfo) -> None:
        if info.busy:
            raise HostBusy(f"{self.name} is busy: {info.reason}", host=self.name)

    def wait_gpus_free(self, *, timeout: float = 30.0, interval: float = 0.25) -> list[GpuStatus]:
        """Wait until no compute process is left and used memory is back near its baseline."""
        return gpu.wait_gpus_free(self, self.busy_mib, timeout=timeout, interval=interval)

    # ---- servers --------------------------------------------------------------------------------

    def run_dir(self, study: str, trial: str) -> str:
        return runs.run_dir(self.runs_root, study, trial)

    def start(self, run_dir: str, launch_script: str, run_id: str, *, files: Mapping[str, str] | None = None,
              scratch_vars: tuple[str, ...] = ("TMPDIR",), memory_limit_bytes: int | None = None,
              timeout: float = 30.0, resources: Resources | None = None) -> RunRef:
        """Start ``launch_script`` detached in ``run_dir`` (created fresh) and return its reference.

        ``resources`` (nodes, GPUs per node) is what a cluster's scheduler is asked for
        (:class:`runners.slurm.SlurmHost`); a plain host runs the server on itself and needs no request.

        Each variable in ``scratch_vars`` points at its own directory under ``run_dir/scratch`` for the
        server's whole process tree; :meth:`remove_scratch` deletes them once the server is stopped.
        ``memory_limit_bytes`` runs the tree in a memory cgroup of its own with that limit (root only;
        RunnerError when the host cannot make one); :meth:`remove_cgroup` removes it after the stop.
        """
        return runs.start(self, run_dir, launch_script, run_id, controller=self.controller_id, files=files,
                          scratch_vars=scratch_vars, memory_limit_bytes=memory_limit_bytes, timeout=timeout)

    def wait_scheduled(self, ref: RunRef, *, stop: threading.Event, timeout: float | None = None) -> Failure | None:
        """Wait until ``ref``'s server holds its resources (a cluster job has left the queue); why it never
        will (a Failure), or None. A plain host runs the server at once: None at once."""
        return None

    def beside(self, ref: RunRef) -> Shell:
        """The command line of the machine ``ref``'s server runs on (the load generator and ``/health`` run
        there): this host itself; a Slurm job's head node through ``srun --overlap``."""
        return self

    def scheduler_end(self, ref: RunRef) -> Failure | None:
        """How a cluster's scheduler ended ``ref``'s run (a node failure, preemption, a time limit, a cancel
        servetune did not send), or None: a plain host has no scheduler."""
        return None

    def follow(self, ref: RunRef) -> LineStream:
        """Stream the server log from its start; the stream ends once the server has exited."""
        return runs.follow(self, ref)

    def exit_code(self, ref: RunRef) -> int | None:
        return runs.exit_code(self, ref)

    def members(self, ref: RunRef) -> list[int]:
        return runs.members(self, ref)

    def alive(self, ref: RunRef) -> bool:
        return bool(self.members(ref))

    def stop(self, ref: RunRef, *, grace: float = 10.0) -> StopResult:
        """TERM the group, TERM again at half the grace, KILL at the end; verify no member is left."""
        return runs.stop(self, ref, grace=grace)

    def remove_scratch(self, ref: RunRef) -> None:
        """Delete the run's scratch directories (call only once its process group is gone)."""
        runs.remove_scratch(self, ref)

    def read(self, path: str, *, tail_bytes: int | None = None) -> str:
        return runs.read(self, path, tail_bytes=tail_bytes)

    def oom_evidence(self, ref: RunRef) -> dict[str, int | str]:
        """What the run's memory cgroup saw (see :func:`runners.host.cgroup.oom_evidence`)."""
        return cgroup.oom_evidence(self, ref)

    def remove_cgroup(self, ref: RunRef, *, timeout: float = 10.0) -> None:
        """Keep the run's cgroup evidence, then remove its cgroup (see :func:`runners.host.cgroup.remove_cgroup`)."""
        cgroup.remove_cgroup(self, ref, timeout=timeout)

    def orphans(self) -> list[RunRef]:
        """Servers of this host left by a controller that is gone, or by this host's own (see
        :mod:`runners.host.orphans`)."""
        return orphans.find(self, self.controller_id)

    def cleanup_orphans(self, *, grace: float = 10.0) -> list[RunRef]:
        """Stop every orphaned servetune server of this host (and remove its scratch and memory cgroup);
        returns what was stopped."""
        return orphans.cleanup(self, self.controller_id, grace=grace)

    # ---- leases and claims ----------------------------------------------------------------------

    def gpu_dir(self) -> str:
        """The folder of this host's GPU set where leases, claim and queue live (see
        :func:`runners.host.leases.gpu_dir`)."""
        return leases.gpu_dir(self)

    def renew_lease(self, lease: Lease, *, timeout: float = 15.0) -> None:
        """Write (or renew) ``lease`` with the host's current time as its heartbeat."""
        leases.renew(self, lease, timeout=timeout)

    def drop_lease(self, controller: str, *, timeout: float = 15.0) -> None:
        """Remove ``controller``'s lease, and its claim on the host if it holds one."""
        leases.drop(self, controller, timeout=timeout)

    def leases(self, *, timeout: float = 15.0) -> tuple[float, list[Lease]]:
        """The host's clock and every valid lease on it (see :func:`runners.host.leases.read_all`)."""
        return leases.read_all(self, timeout=timeout)

    def live_leases(self) -> list[Lease]:
        return leases.live(self)

    def holder(self) -> Lease | None:
        """The lease of the controller that holds this host's claim now (None: nobody, or a dead one)."""
        return leases.holder(self)

    def claim(self, *, timeout: float = 15.0) -> Claim:
        """Claim the host for one trial of this host's controller (:attr:`controller_id`); see
        :func:`runners.host.leases.claim`."""
        return leases.claim(self, self.controller_id, timeout=timeout)

    def release_claim(self, *, timeout: float = 15.0) -> None:
        """Give the host's claim back (only if this host's controller holds it)."""
        leases.release(self, self.controller_id, timeout=timeout)

    # ---- the server's port ----------------------------------------------------------------------

    def port_holder(self, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> Holder:
        """Who listens on ``port`` on the host: ``free``, ``ours`` (a member of ``ref``'s process group),
        ``foreign``, or ``unknown`` (no /proc/net/tcp to read)."""
        return ports.holder(self, port, ref, timeout=timeout)

    def free_port(self, python: str, address: str) -> int:
        """A port free at ``address`` on this host now (see :func:`runners.host.ports.free_port_on`)."""
        return ports.free_port_on(self, python, address)

    def require_port_free(self, port: int) -> None:
        """HostBusy when another program listens on ``port`` (checked before every launch)."""
        ports.require_free(self, port)

    def close(self) -> None:
        self.transport.close()
