"""A GPU host as servetune uses it (:class:`Host`), in parts that each do one job; see :mod:`runners.host.host`.

Host-side work is done by bash scripts shipped in ``runners/host/scripts`` (:mod:`runners.host.shipped`).
"""

from runners.host.gpu import HostInfo
from runners.host.host import Host
from runners.host.leases import CLAIM_DIR, LEASE_DIR, Claim, Lease, default_controller_id, new_controller_id
from runners.host.ports import ANY_FREE_PORT
from runners.host.runs import RUN_ID_VAR, Resources, RunRef, StopResult

__all__ = [
    "ANY_FREE_PORT",
    "CLAIM_DIR",
    "LEASE_DIR",
    "RUN_ID_VAR",
    "Claim",
    "Host",
    "HostInfo",
    "Lease",
    "Resources",
    "RunRef",
    "StopResult",
    "default_controller_id",
    "new_controller_id",
]
