"""Where and how one trial's server runs: the :class:`Placement` protocol, and the :class:`Hold` a placement that
shares its GPUs with other controllers keeps on them.

A placement is what the run loop (``search/driver``), the trial's server path (``search/trial/server.py``) and
one server's session (:class:`runners.server.ServerSession`) ask of "a host"; nothing more. Its members, in the
order a trial uses them:

1. the facts the inventory gave (:attr:`Placement.name`, :attr:`~Placement.kind`, ``python``, the price, the
   node address, whether it runs every rank of a server spanning nodes by itself);
2. the preflight and the GPUs' state (:meth:`~Placement.preflight`, :meth:`~Placement.gpu_state`, ...);
3. the hold (:attr:`~Placement.hold`): leases and the claim one trial at a time holds, or **None** where a
   scheduler decides who gets the GPUs (Slurm queues what does not fit; there is nothing to lease or claim);
4. start (:meth:`~Placement.start`), 5. wait until scheduled (:meth:`~Placement.wait_scheduled`),
6. follow the log (:meth:`~Placement.follow`), 7. a shell beside the server (:meth:`~Placement.beside`),
8. stop (:meth:`~Placement.stop`), 9. the scheduler's or the cgroup's verdict (:meth:`~Placement.scheduler_end`,
   :meth:`~Placement.oom_evidence`), 10. orphans (:meth:`~Placement.orphans`, :meth:`~Placement.cleanup_orphans`).

Implementations: the process-group kind (:class:`runners.host.Host`, over the local or the SSH transport) and
Slurm (:class:`runners.slurm.SlurmHost`); :mod:`runners.placement.registry` maps an inventory entry's ``kind:``
to its opener. Everything here is structural (:class:`typing.Protocol`): an implementation subclasses nothing.
Changes to this module are additive: a new member gets a default in every implementation first.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from runners.host.gpu import HostInfo
from runners.host.leases import Claim, Lease
from runners.host.ports import Holder
from runners.host.runs import Resources, RunRef, StopResult
from runners.smi import ComputeApp, GpuStatus
from runners.telemetry import Failure
from runners.transport import CommandResult, LineStream

__all__ = ["Beside", "Hold", "Placement"]


class Beside(Protocol):
    """A command line on the machine a server runs on (``/health``, nvidia-smi, the load generator run here, so
    figures never cross the network)."""

    name: str

    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        """Run ``command`` there (bash) and return its output and exit code; CommandTimeout past ``timeout``."""
        ...

    def run_script(self, name: str, *args: str | int, timeout: float = 30.0) -> CommandResult:
        """Run the shipped host script ``name`` (:mod:`runners.host.shipped`) with ``args``."""
        ...

    def stream(self, command: str) -> LineStream:
        """Stream ``command``'s stdout lines live; the stream's ``exit_code`` once it has ended."""
        ...


@runtime_checkable
class Hold(Protocol):
    """What a controller keeps on GPUs it shares with other controllers: a lease (renewed while it runs, so a
    dead controller's servers are found as orphans) and the claim one trial at a time holds. A placement whose
    scheduler decides who gets the GPUs has none (:attr:`Placement.hold` is None)."""

    def renew(self, lease: Lease, *, timeout: float = 15.0) -> None:
        """Write (or renew) ``lease`` with the host's current time as its heartbeat."""
        ...

    def drop(self, controller: str, *, timeout: float = 15.0) -> None:
        """Remove ``controller``'s lease, and its claim if it holds one."""
        ...

    def live(self) -> list[Lease]:
        """Every lease whose controller is alive."""
        ...

    def holder(self) -> Lease | None:
        """The lease of the controller that holds the claim now (None: nobody, or a dead one)."""
        ...

    def claim(self, *, timeout: float = 15.0) -> Claim:
        """Claim the GPUs for one trial of this placement's controller; ``Claim(False, reason)`` while another
        live controller holds them (the caller waits its turn, no failure counted)."""
        ...

    def release(self, *, timeout: float = 15.0) -> None:
        """Give the claim back (only if this placement's controller holds it)."""
        ...


@runtime_checkable
class Placement(Protocol):
    """Where and how one trial's server runs (see the module docstring for the members' order of use)."""

    # ---- 1. what the inventory said ------------------------------------------------------------------
    name: str
    """The label trials record as their host (``cluster#slot`` for a Slurm job slot)."""
    kind: str
    """The registry's name for this kind of placement (:mod:`runners.placement.registry`)."""
    controller_id: str
    """The controller this placement's servers belong to (the run sets a fresh one)."""
    python: str | None
    """The engine's python here, instead of the space's ``engine.python``."""
    price_per_gpu_hour: float | None
    """What one GPU costs per hour (the ``cost_per_mtok`` objective)."""
    node_address: str
    """The address the other ranks of a server spanning nodes reach this one at."""
    spans_nodes: bool
    """Runs every rank of a server spanning nodes by itself (one scheduler job of that many nodes)."""
    env: dict[str, str]
    """Exported before every command (the preflight may add to it, e.g. a simulated host's PATH)."""
    runs_root: str
    """Where run directories live."""

    @property
    def hold(self) -> Hold | None:
        """3. The leases and the claim of the GPUs, or None where a scheduler decides who gets them."""
        ...

    # ---- 2. preflight and GPUs -------------------------------------------------------------------------
    def preflight(self, engine: str, python: str, version_command: str, *, timeout: float = 60.0,
                  gpus: bool = True, model_path: str | None = None, gpus_needed: int = 0) -> HostInfo:
        """Python, engine, version, file transfer, nvidia-smi, model path, GPU count; HostMisconfigured for a
        fault waiting will not fix, HostUnreachable for trouble reaching it. A busy GPU is reported, not raised."""
        ...

    def gpu_dir(self) -> str:
        """Where the hold of this placement's GPU set lives (a folder that cannot be made drops the placement)."""
        ...

    def gpu_state(self, *, timeout: float = 20.0) -> tuple[list[GpuStatus], list[ComputeApp]]:
        """The GPUs and their compute processes now."""
        ...

    def judge_busy(self, info: HostInfo) -> None:
        """Mark ``info`` busy when foreign compute processes or memory are on the GPUs."""
        ...

    def require_free(self, info: HostInfo) -> None:
        """HostBusy when ``info`` says the GPUs are busy."""
        ...

    def wait_gpus_free(self, *, timeout: float = 30.0, interval: float = 0.25) -> list[GpuStatus]:
        """Wait until the GPUs are free again (a stopped server's memory released); RunnerError past ``timeout``."""
        ...

    def smi_sample(self) -> tuple[float, list[GpuStatus]]:
        """(wall-clock time, the GPUs) sampled beside the running server."""
        ...

    def foreign_apps(self, ref: RunRef, *, timeout: float = 20.0) -> list[ComputeApp]:
        """Compute processes on the GPUs that are not ``ref``'s server's."""
        ...

    # ---- the command line (the preflight's probes) -----------------------------------------------------
    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        """Run ``command`` where this placement's commands run (a login node for a cluster)."""
        ...

    def run_script(self, name: str, *args: str | int, timeout: float = 30.0) -> CommandResult:
        """Run a shipped host script there."""
        ...

    # ---- ranks and ports --------------------------------------------------------------------------------
    def rank_hosts(self, nodes: int) -> Sequence[Placement]:
        """The placements, head first, of a server of ``nodes`` ranks that this one runs by itself."""
        ...

    def rank_script(self, script: str) -> str:
        """A rank's rendered launch script as this placement runs it."""
        ...

    def launch_port(self) -> int | None:
        """The port the next server binds (None: the space's)."""
        ...

    def free_port(self, python: str, address: str) -> int:
        """A port free at ``address`` now (the dist-init port of a server spanning nodes)."""
        ...

    def require_port_free(self, port: int) -> None:
        """HostBusy when another program listens on ``port`` (checked before every launch)."""
        ...

    def port_holder(self, port: int, ref: RunRef | None = None, *, timeout: float = 15.0) -> Holder:
        """``free``, ``ours`` (``ref``'s server), ``foreign`` or ``unknown``."""
        ...

    # ---- 4. start -----------------------------------------------------------------------------------
    def run_dir(self, study: str, trial: str) -> str:
        """The run directory of ``study``'s trial ``trial``."""
        ...

    def start(self, run_dir: str, launch_script: str, run_id: str, *, files: Mapping[str, str] | None = None,
              scratch_vars: tuple[str, ...] = ("TMPDIR",), memory_limit_bytes: int | None = None,
              timeout: float = 30.0, resources: Resources | None = None) -> RunRef:
        """Start ``launch_script`` detached in ``run_dir`` (created fresh, ``files`` written into it) and return
        its reference at once; a scheduler may still queue it (:meth:`wait_scheduled`)."""
        ...

    # ---- 5. wait until scheduled ----------------------------------------------------------------------
    def wait_scheduled(self, ref: RunRef, *, stop: threading.Event,
                       timeout: float | None = None) -> Failure | None:
        """Wait until ``ref``'s server holds its resources; why it never will (a Failure), or None. A placement
        without a queue: None at once."""
        ...

    # ---- 6. follow the log ----------------------------------------------------------------------------
    def follow(self, ref: RunRef) -> LineStream:
        """The server log from its start, live; the stream ends once the server has exited (its ``exit_code``
        set) or is cut (``exit_code`` None: ask :meth:`alive`)."""
        ...

    def exit_code(self, ref: RunRef) -> int | None:
        """The server's exit code once it has exited, else None."""
        ...

    def alive(self, ref: RunRef) -> bool:
        """Whether the server still runs; RunnerError when that cannot be known (the host is lost)."""
        ...

    # ---- 7. a shell beside the server -----------------------------------------------------------------
    def beside(self, ref: RunRef) -> Beside:
        """The command line of the machine ``ref``'s server runs on."""
        ...

    # ---- 8. stop ------------------------------------------------------------------------------------
    def stop(self, ref: RunRef, *, grace: float = 10.0) -> StopResult:
        """Stop the server (TERM, TERM again at half the grace, KILL at its end) and verify it is gone."""
        ...

    def remove_scratch(self, ref: RunRef) -> None:
        """Delete the run's scratch directories (once the server is stopped)."""
        ...

    def remove_cgroup(self, ref: RunRef, *, timeout: float = 10.0) -> None:
        """Keep the run's memory cgroup evidence, then remove its cgroup (a scheduler's goes with its job)."""
        ...

    # ---- 9. the verdict of the scheduler or the cgroup ------------------------------------------------
    def scheduler_end(self, ref: RunRef) -> Failure | None:
        """How a scheduler ended ``ref``'s run (node failure, preemption, time limit, a cancel servetune did not
        send), or None (no scheduler, or it did not end it)."""
        ...

    def oom_evidence(self, ref: RunRef) -> dict[str, int | str]:
        """What the run's memory cgroup saw (limit, peak, OOM kills); empty without one."""
        ...

    # ---- 10. orphans --------------------------------------------------------------------------------
    def orphans(self) -> list[RunRef]:
        """Servers here left by a controller that is gone (or by this one's own earlier run of the slot)."""
        ...

    def cleanup_orphans(self, *, grace: float = 10.0) -> list[RunRef]:
        """Stop every orphan (with its scratch and cgroup); returns what was stopped."""
        ...

    def close(self) -> None:
        """Close the connection(s)."""
        ...
