"""A GPU host as servetune uses it (:class:`Host`), in parts that each do one job; see :mod:`runners.host.host`.

Host-side work is done by bash scripts shipped in ``runners/host/scripts`` (:mod:`runners.host.shipped`).
"""

from runners.host.gpu import HostInfo
from runners.host.group import HostGroup
from runners.host.host import Host
from runners.host.leases import CLAIM_DIR, LEASE_DIR, Claim, Lease, default_controller_id, new_controller_id
from runners.host.ports import ANY_FREE_PORT
from runners.host.runs import RUN_ID_VAR, Resources, RunRef, StopResult
from runners.host.shell import DEFAULT_HOST_DIR

__all__ = [
    "ANY_FREE_PORT",
    "CLAIM_DIR",
    "DEFAULT_HOST_DIR",
    "LEASE_DIR",
    "RUN_ID_VAR",
    "Claim",
    "Host",
    "HostGroup",
    "HostInfo",
    "Lease",
    "Resources",
    "RunRef",
    "StopResult",
    "default_controller_id",
    "new_controller_id",
]
