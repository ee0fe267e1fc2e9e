"""An inventory entry's ``kind:`` mapped to the placement that opens it, as :mod:`runners.engines` maps engine names.

``open_placements(spec)`` is the only place a kind of placement is chosen by name; adding a kind is one folder
(its implementation of :class:`~runners.placement.protocol.Placement`), one line in ``_REGISTRY`` and one
parametrisation of the contract suite (:mod:`runners.placement.contract`). An entry without ``kind:`` is
``slurm`` when it has a ``slurm:`` mapping, else ``process-group`` (the local or the SSH transport), as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runners.errors import ConfigError
from runners.host import DEFAULT_HOST_DIR, Host
from runners.inventory import HostSpec, open_host, transport_for
from runners.placement.protocol import Placement
from runners.slurm import SlurmHost
from runners.ssh import DEFAULT_SSH_CONFIG

__all__ = ["Opener", "kind_of", "open_placements", "placement_kinds"]

#: Opens the placements of one inventory entry: (spec, ssh_config, connect_timeout, host_dir) -> placements.
Opener = Callable[[HostSpec, str | None, float, str], list[Host]]


def _process_group(spec: HostSpec, ssh_config: str | None, connect_timeout: float, host_dir: str) -> list[Host]:
    """The host itself: servers as process groups, over the local transport (``address: local``) or SSH."""
    return [open_host(spec, ssh_config=ssh_config, connect_timeout=connect_timeout, host_dir=host_dir)]


def _slurm(spec: HostSpec, ssh_config: str | None, connect_timeout: float, host_dir: str) -> list[Host]:
    """A Slurm cluster's ``max_jobs`` job slots (``name#1``, ``name#2``, ...; each its own connection to the
    login node)."""
    if spec.slurm is None:
        raise ConfigError(f"host {spec.name!r}: kind slurm needs a `slurm:` mapping (partition, time_limit, ...)")
    return [SlurmHost(transport_for(spec, f"{spec.name}#{i}", ssh_config, connect_timeout), spec.slurm,
                      cluster=spec.name, slot=i, runs_root=spec.runs_root, env=spec.env, python=spec.python)
            for i in range(1, spec.slurm.max_jobs + 1)]


if TYPE_CHECKING:  # mypy checks each kind against the protocol, member by member
    def _conforms(process_group: Host, slurm: SlurmHost) -> tuple[Placement, Placement]:
        return process_group, slurm

_REGISTRY: dict[str, Opener] = {
    "process-group": _process_group,
    "slurm": _slurm,
}


def placement_kinds() -> list[str]:
    return sorted(_REGISTRY)


def kind_of(spec: HostSpec) -> str:
    """The entry's kind: its ``kind:``, else ``slurm`` for an entry with a ``slurm:`` mapping, else
    ``process-group``."""
    if spec.kind is not None:
        return spec.kind
    return "slurm" if spec.slurm is not None else "process-group"


def open_placements(spec: HostSpec, *, ssh_config: str | None = DEFAULT_SSH_CONFIG, connect_timeout: float = 10.0,
                    host_dir: str = DEFAULT_HOST_DIR) -> list[Host]:
    """The placements of one inventory entry (nothing connects until the first command). ConfigError, one line
    naming the allowed kinds, for a kind no placement has."""
    kind = kind_of(spec)
    try:
        opener = _REGISTRY[kind]
    except KeyError:
        raise ConfigError(f"host {spec.name!r}: unknown kind {kind!r}; allowed: {', '.join(placement_kinds())}"
                          ) from None
    if spec.slurm is not None and kind != "slurm":
        raise ConfigError(f"host {spec.name!r}: a `slurm:` mapping belongs to kind slurm, not {kind!r}")
    return opener(spec, ssh_config, connect_timeout, host_dir)
