"""The host pool: one trial per host, flapping hosts set aside, the search ends when none is left."""

from __future__ import annotations

import threading

import pytest

from runners.host import Host
from runners.transport import LocalTransport
from search.driver.pool import HostPool, HostSlot, HostState, NoHostsLeft


def hosts(n: int) -> list[Host]:
    return [Host(LocalTransport(f"h{i}")) for i in range(n)]


def test_one_trial_per_host_at_a_time() -> None:
    pool = HostPool(hosts(2))
    a = pool.acquire()
    b = pool.acquire()
    assert {a.name, b.name} == {"h0", "h1"}
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(pool.acquire().name))
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive() and not got  # blocked: both hosts busy
    pool.release(a, infra_failure=False)
    t.join(timeout=2)
    assert got == [a.name]


def test_flapping_host_is_set_aside_and_others_carry_on() -> None:
    pool = HostPool(hosts(2), max_consecutive_failures=2, cooldown=60)
    for _ in range(2):
        slot = next(s for s in pool.slots if s.name == "h0")
        slot.busy = True
        pool.release(slot, infra_failure=True, error="ssh refused")
    states = {s.host: s.state for s in pool.states()}
    assert states == {"h0": HostState.SET_ASIDE, "h1": HostState.IDLE}
    assert pool.acquire().name == "h1"


def test_success_resets_the_failure_count() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=2)
    slot = pool.acquire()
    pool.release(slot, infra_failure=True, error="x")
    slot = pool.acquire()
    pool.release(slot, infra_failure=False)
    slot = pool.acquire()
    pool.release(slot, infra_failure=True, error="x")
    assert pool.acquire().name == "h0"


def test_no_hosts_left_ends_the_search() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=1, cooldown=60, max_set_asides=1)
    slot = pool.acquire()
    pool.release(slot, infra_failure=True, error="GPU busy")
    with pytest.raises(NoHostsLeft, match="GPU busy"):
        pool.acquire()
    assert pool.states()[0].state == HostState.RETIRED


def test_all_set_aside_waits_for_the_cooldown_then_retires() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=1, cooldown=2.0, max_set_asides=2)
    first = pool.acquire()
    pool.release(first, infra_failure=True, error="ssh refused")
    assert pool.states()[0].state == HostState.SET_ASIDE
    got: list[HostSlot] = []
    waiting = threading.Event()

    def acquire() -> None:
        waiting.set()
        got.append(pool.acquire())  # waits for the cooldown instead of ending the search

    t = threading.Thread(target=acquire, daemon=True)
    t.start()
    assert waiting.wait(timeout=10)
    blocked_while_set_aside = False
    while True:
        done = bool(got)  # read before the state: a host set aside now was set aside then, too
        state = pool.states()[0].state
        if done:
            assert state == "running", "acquire() returned a host that is still set aside"
            break
        blocked_while_set_aside |= state == HostState.SET_ASIDE
        assert t.is_alive() or got, "acquire() ended without a host"
        t.join(timeout=0.01)
    assert blocked_while_set_aside, "acquire() returned before the cooldown was over"
    assert len(got) == 1 and got[0] is first and first.name == "h0"
    t.join(timeout=10)
    pool.release(first, infra_failure=True, error="ssh refused")
    with pytest.raises(NoHostsLeft, match="retired"):
        pool.acquire()  # set aside twice in a row: retired


def test_success_resets_the_set_aside_streak() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=1, cooldown=0.05, max_set_asides=2)
    for ok in (False, True, False, True):
        slot = pool.acquire()
        pool.release(slot, infra_failure=not ok, error="x")
    assert pool.states()[0].set_aside_count == 2
    assert pool.acquire().name == "h0"


def test_waiting_for_a_set_aside_host_stops_on_request() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=1, cooldown=60)
    pool.release(pool.acquire(), infra_failure=True, error="x")
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(NoHostsLeft, match="stopping"):
        pool.acquire(stop=stop)


def test_put_back_keeps_the_failure_count() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=2)
    pool.release(pool.acquire(), infra_failure=True, error="x")
    pool.put_back(pool.acquire())
    assert pool.states()[0].consecutive_failures == 1
    assert pool.states()[0].trials == 1


def test_a_host_held_by_another_controller_is_handed_out_later_with_no_failure() -> None:
    pool = HostPool(hosts(2), max_consecutive_failures=1, cooldown=60)
    first = pool.acquire()
    pool.hold_off(first, 0.3, "h held by controller c2")
    states = {s.host: (s.state, s.held_by) for s in pool.states()}
    assert states[first.name] == (HostState.HELD, "h held by controller c2")
    other = pool.acquire()
    assert other.name != first.name, "the other host carries on meanwhile"
    again = pool.acquire()  # waits out the hold-off
    assert again is first and first.consecutive_failures == 0 and first.set_aside_count == 0


def test_a_misconfigured_host_is_retired_at_once() -> None:
    pool = HostPool(hosts(2))
    slot = pool.acquire()
    pool.retire(slot, "h0: nvidia-smi is not on PATH; fix: ...")
    states = {s.host: s.state for s in pool.states()}
    assert states[slot.name] == HostState.RETIRED
    assert pool.acquire().name != slot.name


def test_a_failure_without_a_trial_counts_but_is_no_trial() -> None:
    pool = HostPool(hosts(1), max_consecutive_failures=2)
    slot = pool.acquire()
    pool.release(slot, infra_failure=True, error="cannot claim", trial=False)
    assert (slot.trials, slot.consecutive_failures) == (0, 1)
