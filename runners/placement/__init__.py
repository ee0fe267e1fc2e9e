"""Where and how one trial's server runs, behind one protocol (:class:`~runners.placement.protocol.Placement`).

* :mod:`runners.placement.protocol` -- the protocol and the :class:`~runners.placement.protocol.Hold`;
* :mod:`runners.placement.registry` -- an inventory entry's ``kind:`` mapped to the placement that opens it.
"""

from runners.placement.protocol import Beside, Hold, Placement

__all__ = ["Beside", "Hold", "Placement"]
