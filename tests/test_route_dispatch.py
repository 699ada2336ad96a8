"""route.dispatch: slots, the held order, where a call goes, and when a prover is ejected (no gRPC, virtual time;
tests/test_dispatch_outliers.py has the health rules in full)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from vastctl.clock import VirtualClock
from vastctl.route import dispatch
from vastctl.route.dispatch import CLASS_POST, CLASS_PROOF, Dispatcher, ProverSpec

START = datetime(2031, 3, 3, tzinfo=timezone.utc)


def spec(name, slots=2, rate=60.0):
    return ProverSpec(uuid=f"u-{name}", label=name, endpoint=f"127.0.0.1:{20000 + ord(name[-1])}", slots=slots,
                      rate=rate)


def make(**kw):
    args = {"max_held": 10, "max_bytes": 1000, "fail_threshold": 3, **kw}
    return Dispatcher(clock=VirtualClock(START), **args)


def take(d, klass=CLASS_PROOF, size=1):
    ticket = d.admit(klass=klass, size=size)
    return ticket, d.acquire(ticket, timeout=0)


def test_a_call_goes_to_the_prover_with_the_most_free_slots_ties_to_the_best_rate():
    d = make()
    d.update([spec("a", slots=2, rate=50), spec("b", slots=3, rate=40), spec("c", slots=3, rate=70)])
    placed = [take(d)[1].spec.label for _ in range(8)]
    # c (3 free, best rate), b (3 free), c/b (2 free each: c's rate), ... never more than its slots on one
    assert placed == ["c", "b", "c", "a", "b", "c", "a", "b"]
    busy = {p["label"]: p["busy"] for p in d.snapshot()["provers"]}
    assert busy == {"a": 2, "b": 3, "c": 3}
    assert take(d)[1] is None  # every slot taken: the next is held


def test_no_prover_holds_the_call_and_it_is_placed_when_one_joins():
    d = make()
    ticket = d.admit(klass=CLASS_PROOF, size=5)
    assert d.acquire(ticket, timeout=0) is None
    assert d.snapshot()["held"] == 1 and d.snapshot()["held_bytes"] == 5
    got = []
    waiter = threading.Thread(target=lambda: got.append(d.acquire(ticket, timeout=30)))
    waiter.start()
    d.update([spec("a")])
    waiter.join(timeout=10)
    assert got[0].spec.label == "a" and d.snapshot()["held"] == 0


def test_held_calls_are_placed_in_order_post_first():
    d = make()
    first = d.admit(klass=CLASS_PROOF, size=1)
    second = d.admit(klass=CLASS_PROOF, size=1)
    post = d.admit(klass=CLASS_POST, size=1)
    d.update([spec("a", slots=1)])
    assert d.acquire(second, timeout=0) is None  # not its turn: the PoSt call, then the first, come before it
    assert d.acquire(first, timeout=0) is None
    prover = d.acquire(post, timeout=0)
    assert prover.spec.label == "a"
    d.release(post, prover, "completed")
    assert d.acquire(second, timeout=0) is None
    assert d.acquire(first, timeout=0) is not None


def test_a_dropped_call_avoids_its_prover_while_another_is_joined():
    d = make()
    d.update([spec("a", slots=1, rate=90), spec("b", slots=1, rate=10)])
    ticket, prover = take(d)
    assert prover.spec.label == "a"
    d.release(ticket, prover, "dropped")
    assert d.acquire(ticket, timeout=0).spec.label == "b"  # a has the better rate and a free slot, but dropped it


def test_the_only_prover_takes_back_a_call_it_dropped():
    d = make()
    d.update([spec("a", slots=1)])
    ticket, prover = take(d)
    d.release(ticket, prover, "dropped")
    assert d.acquire(ticket, timeout=0) is None  # not at once: the prover gets a moment (RESEND_PAUSE_S × drops)
    d.clock.advance(dispatch.RESEND_PAUSE_S)
    assert d.acquire(ticket, timeout=0).spec.label == "a"


@pytest.mark.parametrize("outcome", ["dropped", "failed"])
def test_a_prover_is_ejected_after_fail_threshold_in_a_row(outcome):
    d = make(fail_threshold=3)
    d.update([spec("a", slots=1)])
    whys = []
    for _ in range(2):
        ticket, prover = take(d)
        whys.append(d.release(ticket, prover, outcome))
        d.finish(ticket)
    ticket, prover = take(d)
    assert d.release(ticket, prover, "completed") is None  # a success breaks the run
    d.finish(ticket)
    for _ in range(3):
        d.clock.advance(dispatch.SETTLE_S + 0.5)  # each a cause of its own, not one daemon going down
        ticket, prover = take(d)
        whys.append(d.release(ticket, prover, outcome))
        d.finish(ticket)
    assert whys[:4] == [None, None, None, None]
    assert whys[4] == dispatch.Change(kind="ejected", seconds=30.0, why=(
        f"3 calls in a row dropped, failed or held to their deadline, the last {outcome} (route.fail_threshold 3)"))
    assert take(d)[1] is None  # it takes no new call


@pytest.mark.parametrize("outcome", ["error", "expired", "abandoned", "moved"])
def test_what_is_not_the_provers_fault_never_sets_it_aside(outcome):
    d = make(fail_threshold=1)
    d.update([spec("a", slots=1)])
    ticket, prover = take(d)
    assert d.release(ticket, prover, outcome) is None  # expired: sent with less than a proof's time left
    waiting, placed = take(d)
    if outcome in ("expired", "abandoned"):  # the daemon proves on for a caller gone: its slot, for a proof's time
        assert placed is None
        d.clock.advance(prover.spec.proof_s)
        placed = d.acquire(waiting, timeout=0)
    assert placed is prover and prover.streak == 0


def test_admission_is_bounded_by_calls_and_bytes_and_bytes_count_until_finished():
    mib = dispatch.MiB
    d = make(max_held=2, max_bytes=100 * mib)
    one = d.admit(klass=CLASS_PROOF, size=60 * mib)
    with pytest.raises(dispatch.Full, match=r"^101 MiB of request memory would be in use \(route.max_held_mb 100\)"):
        d.admit(klass=CLASS_PROOF, size=41 * mib)
    d.admit(klass=CLASS_PROOF, size=10)
    with pytest.raises(dispatch.Full, match=r"2 calls already held \(route.max_held 2\)"):
        d.admit(klass=CLASS_PROOF, size=1)
    d.finish(one)
    assert d.snapshot()["kept_bytes"] == 10 and d.snapshot()["held"] == 1


def test_a_prover_that_leaves_takes_no_new_call_and_is_forgotten_once_its_calls_are_back():
    d = make()
    d.update([spec("a", slots=2)])
    ticket, prover = take(d)
    assert d.update([]) == ["u-a"]
    waiting, placed = take(d)
    assert placed is None
    d.finish(waiting)  # given up: it no longer stands ahead of the next call
    assert [p["gone"] for p in d.snapshot()["provers"]] == [True]
    d.release(ticket, prover, "moved")
    assert d.snapshot()["provers"] == []
    d.update([spec("a", slots=2)])  # it joins again: a fresh start
    assert take(d)[1].spec.label == "a"


def test_closing_refuses_what_is_held_and_what_comes():
    d = make()
    ticket = d.admit(klass=CLASS_PROOF, size=1)
    d.close()
    with pytest.raises(dispatch.Closed):
        d.acquire(ticket, timeout=5)
    with pytest.raises(dispatch.Closed):
        d.admit(klass=CLASS_PROOF, size=1)


def test_the_oldest_held_age_comes_from_the_clock():
    clock = VirtualClock(START)
    d = Dispatcher(max_held=5, max_bytes=100, fail_threshold=3, clock=clock)
    d.admit(klass=CLASS_PROOF, size=1)
    clock.advance(42)
    d.admit(klass=CLASS_PROOF, size=1)
    assert d.snapshot()["oldest_held_s"] == pytest.approx(42)


def test_a_call_is_read_only_while_its_reserve_fits_beside_the_kept_bytes_in_arrival_order():
    d = make(max_bytes=1000, read_reserve=400)
    first, second, third, fourth = (d.enter() for _ in range(4))
    assert d.wait_to_read(first, timeout=0) and d.wait_to_read(second, timeout=0)
    assert d.snapshot()["kept_bytes"] == 800
    assert not d.wait_to_read(fourth, timeout=0)  # not its turn: third came first
    assert not d.wait_to_read(third, timeout=0)  # 800 + 400 > 1000: it waits unread
    assert d.snapshot()["held"] == 2 and d.snapshot()["unread"] == 2  # waiting unread counts as held
    held = d.admit(klass=CLASS_PROOF, size=150, read=first)  # its reserve becomes its size, in one step
    assert d.snapshot()["kept_bytes"] == 550
    assert d.wait_to_read(third, timeout=0) and not d.wait_to_read(fourth, timeout=0)  # 950, then 1350
    d.keep(second, 50)  # kept outside the queue (route.post_address): its own size, not the reserve
    assert d.snapshot()["kept_bytes"] == 600
    d.leave(second)  # answered: given back
    d.finish(held)
    assert d.wait_to_read(fourth, timeout=0)
    assert d.snapshot()["kept_bytes"] == 800 and d.snapshot()["unread"] == 0


def test_a_budget_under_one_reserve_still_reads_one_call_at_a_time_and_closing_refuses_the_unread():
    d = make(max_bytes=100, read_reserve=400)
    first, second = d.enter(), d.enter()
    assert d.wait_to_read(first, timeout=0)  # nothing else kept: read, or nothing would ever be
    assert not d.wait_to_read(second, timeout=0)
    with pytest.raises(dispatch.Full, match=r"^1 MiB of request memory would be in use"):
        d.admit(klass=CLASS_PROOF, size=120, read=first)  # alone over the budget: refused, its reserve given back
    assert d.snapshot()["kept_bytes"] == 0
    d.close()
    with pytest.raises(dispatch.Closed):
        d.wait_to_read(second, timeout=5)
    with pytest.raises(dispatch.Closed):
        d.enter()
    assert d.snapshot()["held"] == 0


# --- what the router shows, and the joined set as update() leaves it -------------------------------------


def test_the_snapshot_counts_held_unread_kept_and_in_flight_and_lists_provers_by_label():
    clock = VirtualClock(START)
    d = Dispatcher(max_held=10, max_bytes=1000, fail_threshold=3, clock=clock)
    assert d.snapshot() == {"held": 0, "held_bytes": 0, "unread": 0, "oldest_held_s": None, "kept_bytes": 0,
                            "in_flight": 0, "provers": []}
    d.update([spec("b", slots=2, rate=10), spec("a", slots=1, rate=20)])
    sent, prover = take(d, size=7)  # b: the most free slots
    d.release(sent, prover, "dropped")
    again = d.acquire(sent, timeout=0)  # a: b dropped it
    d.admit(klass=CLASS_PROOF, size=5)  # placed nowhere yet: held
    clock.advance(30)
    d.enter()  # arrived, not read
    clock.advance(12)
    assert d.snapshot() == {
        "held": 2, "held_bytes": 5, "unread": 1, "oldest_held_s": 42.0, "kept_bytes": 12, "in_flight": 1,
        "provers": [
            {"uuid": "u-a", "label": "a", "endpoint": spec("a").endpoint, "slots": 1, "busy": 1, "lingering": 0,
             "streak": 0, "unreached": 0, "ejections": 0, "set_aside": None, "back_in_s": None, "gone": False},
            {"uuid": "u-b", "label": "b", "endpoint": spec("b").endpoint, "slots": 2, "busy": 0, "lingering": 0,
             "streak": 1, "unreached": 0, "ejections": 0, "set_aside": None, "back_in_s": None, "gone": False}]}
    assert again.spec.label == "a"


def test_the_oldest_call_may_be_one_not_read_yet():
    clock = VirtualClock(START)
    d = Dispatcher(max_held=10, max_bytes=1000, fail_threshold=3, clock=clock)
    d.enter()
    clock.advance(5)
    d.admit(klass=CLASS_PROOF, size=1)
    clock.advance(1)
    assert d.snapshot()["oldest_held_s"] == 6.0


def test_update_returns_who_left_keeps_a_busy_one_until_its_calls_are_back_and_takes_new_slots():
    d = make()
    d.update([spec("a", slots=2), spec("b", slots=1)])
    ticket, prover = take(d)
    assert prover.spec.label == "a"  # the most free slots
    assert d.update([spec("a", slots=1)]) == ["u-b"]  # b, idle, is forgotten at once
    assert [p["label"] for p in d.snapshot()["provers"]] == ["a"]
    assert d.update([]) == ["u-a"] and d.update([]) == []  # a busy one leaves once
    assert [(p["label"], p["gone"], p["busy"]) for p in d.snapshot()["provers"]] == [("a", True, 1)]
    d.update([spec("a", slots=3)])  # back while its call is out: the call still counts, the new slots too
    assert [(p["slots"], p["busy"], p["gone"]) for p in d.snapshot()["provers"]] == [(3, 1, False)]
    d.update([spec("a", slots=2, rate=99)])  # still joined: its spec changes in place
    assert [(p["slots"], p["busy"]) for p in d.snapshot()["provers"]] == [(2, 1)]
    assert take(d)[1].spec.rate == 99


def test_a_prover_set_aside_or_full_takes_nothing_and_the_free_count_says_so():
    d = make(fail_threshold=1)
    d.update([spec("a", slots=3)])
    (first, prover), (second, _) = take(d), take(d)
    assert prover.free == 1
    assert d.release(first, prover, "failed").why == ("1 calls in a row dropped, failed or held to their deadline,"
                                                      " the last failed (route.fail_threshold 1)")
    assert prover.free == 0 and take(d)[1] is None
    assert d.release(second, prover, "failed") is None  # already ejected: said once
    assert d.snapshot()["provers"][0]["streak"] == 2


def test_a_call_admitted_after_it_was_read_keeps_its_place_and_arrival():
    clock = VirtualClock(START)
    d = Dispatcher(max_held=10, max_bytes=1000, fail_threshold=3, clock=clock, read_reserve=100)
    early = d.enter()
    clock.advance(3)
    late = d.admit(klass=CLASS_PROOF, size=1)  # admitted straight away, after `early` arrived
    assert d.wait_to_read(early, timeout=0)
    assert d.snapshot()["kept_bytes"] == 101
    ticket = d.admit(klass=CLASS_PROOF, size=10, read=early)  # its reserve given back in the same step
    assert (ticket.seq, ticket.arrived) == (early.seq, early.arrived) and ticket.seq < late.seq
    assert d.snapshot()["kept_bytes"] == 11 and early.reserved == 0
    d.update([spec("a", slots=1)])
    assert d.acquire(late, timeout=0) is None and d.acquire(ticket, timeout=0).spec.label == "a"


def test_a_reserve_that_fills_the_budget_exactly_is_read():
    d = make(max_bytes=1000, read_reserve=500)
    first, second, third = d.enter(), d.enter(), d.enter()
    assert d.wait_to_read(first, timeout=0) and d.wait_to_read(second, timeout=0)  # 500 + 500 = 1000: fits
    assert not d.wait_to_read(third, timeout=0) and d.snapshot()["kept_bytes"] == 1000


class ReadsClock(VirtualClock):
    """A clock that runs a step on its n-th reading: something happening while a call waits, in one thread."""

    def __init__(self, at: int, step):
        super().__init__(START)
        self.reads, self.at, self.step = 0, at, step

    def monotonic(self) -> float:
        self.reads += 1
        if self.reads == self.at:
            self.step()
        return super().monotonic()


def test_a_call_waiting_to_be_read_is_read_once_room_is_given_back_within_its_timeout():
    d = make(max_bytes=1000, read_reserve=600)
    first, second = d.enter(), d.enter()
    assert d.wait_to_read(first, timeout=0)
    # second's first look finds no room; as its deadline is read the first call gives its room back: it is read
    # on its next look (after a wait of at most 0.02 s), well inside its timeout
    d.clock = ReadsClock(at=2, step=lambda: d.leave(first))
    assert d.wait_to_read(second, timeout=0.02)
    assert d.snapshot()["kept_bytes"] == 600 and d.snapshot()["unread"] == 0


class TickingClock(VirtualClock):
    """Each reading of the monotonic clock moves it on 10 ms: a deadline passes after a few looks."""

    def monotonic(self) -> float:
        self.advance(0.01)
        return super().monotonic()


def test_a_call_with_no_room_gives_up_at_its_deadline_and_keeps_its_place():
    clock = TickingClock(START)
    clock.advance(1000)  # a deadline is counted from now, not from the clock's start
    d = Dispatcher(max_held=10, max_bytes=1000, fail_threshold=3, clock=clock, read_reserve=600)
    first, second = d.enter(), d.enter()
    assert d.wait_to_read(first, timeout=0)
    result = []
    waiter = threading.Thread(target=lambda: result.append(d.wait_to_read(second, timeout=0.05)), daemon=True)
    waiter.start()
    waiter.join(timeout=5)
    gave_up = not waiter.is_alive()
    d.close()  # wakes a waiter that never gave up
    waiter.join(timeout=5)
    assert gave_up and result == [False]
    assert d.unread == [second]  # still first in line once room comes


def test_a_call_refused_after_it_was_read_gives_its_reserve_back_once():
    d = make(max_bytes=100, read_reserve=60)
    call = d.enter()
    assert d.wait_to_read(call, timeout=0) and d.snapshot()["kept_bytes"] == 60
    with pytest.raises(dispatch.Full):
        d.admit(klass=CLASS_PROOF, size=120, read=call)
    d.leave(call)  # the server gives the call up as well: nothing more is given back
    assert d.snapshot()["kept_bytes"] == 0 and call.reserved == 0


def test_an_answer_the_daemon_chose_resets_the_streak_as_a_completed_one_does():
    d = make(fail_threshold=2)
    d.update([spec("a", slots=1)])
    for outcome, streak in (("dropped", 1), ("error", 0), ("failed", 1), ("completed", 0), ("dropped", 1)):
        ticket, prover = take(d)
        d.release(ticket, prover, outcome)
        d.finish(ticket)
        assert d.snapshot()["provers"][0]["streak"] == streak, outcome
    assert d.snapshot()["provers"][0]["set_aside"] is None


def test_a_prover_that_rejoins_while_its_call_is_out_stays_joined():
    d = make()
    d.update([spec("a", slots=2)])
    dropped, prover = take(d)
    d.release(dropped, prover, "dropped")  # one dropped call: a streak of 1
    ticket, prover = take(d)
    d.update([])  # it leaves with the call out
    d.update([spec("a", slots=2)])  # and is back before the call returns: joined afresh, its streak forgotten
    assert [(p["label"], p["busy"], p["gone"], p["streak"]) for p in d.snapshot()["provers"]] == [("a", 1, False, 0)]
    d.release(ticket, prover, "completed")
    d.finish(ticket)
    assert [(p["label"], p["busy"], p["gone"]) for p in d.snapshot()["provers"]] == [("a", 0, False)]
    assert take(d)[1].spec.label == "a" and take(d)[1].spec.label == "a"  # both its slots take calls again


def test_the_oldest_held_age_is_counted_from_its_arrival_and_is_zero_at_once():
    clock = VirtualClock(START)
    d = Dispatcher(max_held=5, max_bytes=100, fail_threshold=3, clock=clock)
    clock.advance(10)
    d.admit(klass=CLASS_PROOF, size=1)
    assert d.snapshot()["oldest_held_s"] == 0.0  # just arrived
    clock.advance(5)
    assert d.snapshot()["oldest_held_s"] == 5.0


def test_a_call_given_back_is_held_again_in_its_first_place_and_leaves_the_queue_once_placed():
    d = make()
    d.update([spec("a", slots=1)])
    first, prover = take(d)
    second = d.admit(klass=CLASS_PROOF, size=1)  # arrives while the first is out
    d.release(first, prover, "dropped")  # the only prover: it takes it back, after a moment
    d.clock.advance(dispatch.RESEND_PAUSE_S)
    assert d.acquire(first, timeout=0) is prover  # ahead of the second, which came later
    assert d.acquire(second, timeout=0) is None and d.snapshot()["held"] == 1
    d.release(first, prover, "completed")
    d.finish(first)
    assert d.acquire(second, timeout=0) is prover and d.snapshot()["held"] == 0


def test_a_call_no_prover_it_prefers_can_take_does_not_hold_back_the_next():
    d = make()
    d.update([spec("a", slots=1, rate=90), spec("b", slots=1, rate=10)])
    dropped, a = take(d)
    busy, b = take(d)
    assert (a.spec.label, b.spec.label) == ("a", "b")
    d.release(dropped, a, "dropped")
    assert d.acquire(dropped, timeout=0) is None  # waits for b, the prover that did not drop it
    later = d.admit(klass=CLASS_PROOF, size=1)
    assert d.acquire(later, timeout=0) is a  # a is free and the first call will not take it


def test_a_call_dropped_by_every_prover_not_set_aside_goes_back_to_one_of_them():
    d = make(fail_threshold=2)
    d.update([spec("a", slots=1, rate=90), spec("b", slots=1, rate=10)])
    dropped, a = take(d)
    for _ in range(2):
        failing, b = take(d)
        assert b.spec.label == "b"
        d.release(failing, b, "failed")
        d.finish(failing)
    assert b.set_aside  # b is ejected
    d.release(dropped, a, "dropped")  # a's first: it is not
    d.clock.advance(dispatch.RESEND_PAUSE_S)
    assert d.acquire(dropped, timeout=0) is a  # b takes nothing: a, though it dropped it, is the one left


def test_a_held_call_is_placed_when_a_prover_joins_within_its_timeout_and_gives_up_at_its_deadline():
    d = make()
    ticket = d.admit(klass=CLASS_PROOF, size=1)
    # as its deadline is read the first time round, a prover joins: it is placed on its next look
    d.clock = ReadsClock(at=2, step=lambda: d.update([spec("a")]))
    assert d.acquire(ticket, timeout=0.02).spec.label == "a"
    clock = TickingClock(START)
    clock.advance(1000)
    waiting = Dispatcher(max_held=10, max_bytes=1000, fail_threshold=3, clock=clock)
    held = waiting.admit(klass=CLASS_PROOF, size=1)
    result = []
    waiter = threading.Thread(target=lambda: result.append(waiting.acquire(held, timeout=0.05)), daemon=True)
    waiter.start()
    waiter.join(timeout=5)
    gave_up = not waiter.is_alive()
    waiting.close()
    waiter.join(timeout=5)
    assert gave_up and result == [None] and waiting.held == [held]  # still held, in its place


def test_a_call_that_fills_the_memory_budget_exactly_is_admitted():
    d = make(max_bytes=100)
    assert d.admit(klass=CLASS_PROOF, size=100).size == 100 and d.snapshot()["kept_bytes"] == 100


def test_a_dispatcher_without_a_read_reserve_reads_a_call_for_nothing():
    d = make()
    call = d.enter()
    assert d.wait_to_read(call, timeout=0) and call.reserved == 0 and d.snapshot()["kept_bytes"] == 0
