"""The contract every kind of placement passes, shipped with the package (as Optuna ships its storage tests).

A test module parametrises one fixture, ``make_placement``: a factory of fresh placements of one kind that share
where runs live (a new one is what a restarted controller would have), each with a controller of its own::

    from runners.placement.contract import PlacementContract  # noqa: F401  (collected by pytest)

    @pytest.fixture(params=["local", "ssh", "slurm"])
    def make_placement(request) -> Iterator[MakePlacement]: ...

The next kind of placement adds one parametrisation (see ``tests/contracts/test_placement_contract.py``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from runners.host.leases import Lease, new_controller_id
from runners.host.runs import RunRef
from runners.placement.protocol import Placement

__all__ = ["MakePlacement", "PlacementContract"]

MakePlacement = Callable[[], Placement]

LONG_SERVER = "echo ready; exec sleep 120\n"


def _start(placement: Placement, script: str) -> RunRef:
    trial = uuid.uuid4().hex[:8]
    ref = placement.start(placement.run_dir("contract", trial), script, f"run-{trial}")
    assert placement.wait_scheduled(ref, stop=threading.Event(), timeout=60) is None
    return ref


def _lines(placement: Placement, ref: RunRef, until: str) -> list[str]:
    stream = placement.follow(ref)
    seen: list[str] = []
    try:
        for line in stream:
            seen.append(line)
            if until in line:
                break
    finally:
        stream.close()
    return seen


class PlacementContract:
    """What the run loop relies on, for any kind of placement."""

    def test_it_is_a_placement_of_a_registered_kind(self, make_placement: MakePlacement) -> None:
        from runners.placement.registry import placement_kinds

        placement = make_placement()
        assert isinstance(placement, Placement)
        assert placement.kind in placement_kinds()

    def test_a_server_is_followed_from_its_start_until_it_exits_with_its_exit_code(
            self, make_placement: MakePlacement) -> None:
        placement = make_placement()
        # It exits once told (a file in its run directory): a scheduler may not list a job that ended at once.
        ref = _start(placement, "echo first; echo second; while [ ! -e go ]; do sleep 0.1; done; exit 3\n")
        lines = _lines(placement, ref, until="second")
        assert [line for line in lines if line in ("first", "second")] == ["first", "second"]
        assert placement.beside(ref).run(f"touch {ref.run_dir}/go").ok
        stream = placement.follow(ref)
        try:
            assert [line for line in stream if line in ("first", "second")] == ["first", "second"]  # from the start
        finally:
            stream.close()
        placement.stop(ref, grace=5)
        assert placement.exit_code(ref) == 3
        assert not placement.alive(ref)
        assert placement.scheduler_end(ref) is None

    def test_stop_ends_a_running_server_and_verifies_it_is_gone(self, make_placement: MakePlacement) -> None:
        placement = make_placement()
        ref = _start(placement, LONG_SERVER)
        assert "ready" in _lines(placement, ref, until="ready")
        assert placement.alive(ref)
        result = placement.stop(ref, grace=10)
        assert result.method in ("term", "kill", "cancel") and not result.survivors
        assert not placement.alive(ref)
        assert placement.scheduler_end(ref) is None  # servetune's own stop is no fault
        assert placement.stop(ref, grace=1).method == "gone"

    def test_the_shell_beside_the_server_runs_where_it_runs(self, make_placement: MakePlacement) -> None:
        placement = make_placement()
        ref = _start(placement, LONG_SERVER)
        try:
            _lines(placement, ref, until="ready")
            res = placement.beside(ref).run(f"cat {ref.run_dir}/run_id 2>/dev/null || echo missing; echo $((6 * 7))")
            assert res.ok and res.stdout.split()[-1] == "42"
        finally:
            placement.stop(ref, grace=5)

    def test_a_hold_gives_one_trial_at_a_time_or_there_is_none(self, make_placement: MakePlacement) -> None:
        first, second = make_placement(), make_placement()
        first.controller_id, second.controller_id = new_controller_id(), new_controller_id()
        hold_a, hold_b = first.hold, second.hold
        if hold_a is None:  # a scheduler decides who gets the GPUs: both run, it queues what does not fit
            assert hold_b is None
            return
        assert hold_b is not None
        for placement, hold in ((first, hold_a), (second, hold_b)):
            hold.renew(Lease.of_this_process(placement.controller_id, "contract", "sqlite:///x.db", 60))
        try:
            assert hold_a.claim().ok
            held = hold_b.claim()
            assert not held.ok and held.reason
            hold_a.release()
            assert hold_b.claim().ok
        finally:
            hold_b.release()
            hold_a.drop(first.controller_id)
            hold_b.drop(second.controller_id)

    def test_a_server_left_over_by_a_crashed_controller_is_an_orphan_and_cleaned_up(
            self, make_placement: MakePlacement) -> None:
        gone = make_placement()
        gone.controller_id = new_controller_id()
        ref = _start(gone, LONG_SERVER)
        _lines(gone, ref, until="ready")
        later = make_placement()  # the slot's controller again after a crash: its earlier server is left over
        later.controller_id = gone.controller_id
        try:
            stopped = later.cleanup_orphans(grace=5)
            assert ref.run_dir in {r.run_dir for r in stopped}
            assert not gone.alive(ref)
        finally:
            gone.stop(ref, grace=1)
