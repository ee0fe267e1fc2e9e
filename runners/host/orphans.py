"""Servers a crashed controller left behind: run directories with a live process group and no exit code whose
controller is the asking one or has no live lease (expired, or its process on this machine gone). A server
of another live controller is never an orphan: it is that controller's running trial."""

from __future__ import annotations

from runners.errors import NotOurProcess
from runners.host.cgroup import remove_cgroup
from runners.host.leases import live as live_leases
from runners.host.runs import RunRef, remove_scratch, stop
from runners.host.shell import Shell


def find(shell: Shell, controller: str) -> list[RunRef]:
    """The orphaned servers on this host (see the module docstring), asked by ``controller``."""
    alive = {lease.controller for lease in live_leases(shell) if lease.controller != controller}
    res = shell.run_script("orphans.sh", shell.runs_root, shell.name, timeout=30)
    refs = []
    for line in res.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[2] not in alive:
            refs.append(RunRef(parts[1], int(parts[0]), parts[3]))
    return refs


def cleanup(shell: Shell, controller: str, *, grace: float = 10.0) -> list[RunRef]:
    """Stop every orphaned server (and remove its scratch and memory cgroup); returns what was stopped."""
    stopped = []
    for ref in find(shell, controller):
        try:
            stop(shell, ref, grace=grace)
        except NotOurProcess:
            continue
        remove_scratch(shell, ref)
        remove_cgroup(shell, ref)
        stopped.append(ref)
    return stopped
