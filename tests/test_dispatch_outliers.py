"""route.dispatch's health rules on virtual time: ejection and return, the share ejected, connects apart from
answers, one cause counted once, the machine reported only when it keeps failing, and slots of calls given up."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from vastctl.clock import SYSTEM, VirtualClock
from vastctl.route import dispatch
from vastctl.route.dispatch import CLASS_PROOF, Dispatcher, ProverSpec

START = datetime(2031, 3, 3, tzinfo=timezone.utc)


def spec(name, slots=1, rate=60.0):
    return ProverSpec(uuid=f"u-{name}", label=name, endpoint=f"127.0.0.1:{20000 + ord(name[-1])}", slots=slots,
                      rate=rate)


def make(*names, slots=1, **kw):
    args = {"max_held": 50, "max_bytes": 1000, "fail_threshold": 3, "ejection_base": 30.0, **kw}
    d = Dispatcher(clock=VirtualClock(START), **args)
    d.update([spec(name, slots=slots) for name in names])
    return d


def take(d):
    ticket = d.admit(klass=CLASS_PROOF, size=1)
    return ticket, d.acquire(ticket, timeout=0)


def place_on(d, prover):
    """A call placed on this prover, whatever the balance would choose (as acquire places one)."""
    ticket = d.admit(klass=CLASS_PROOF, size=1)
    prover.busy += 1
    prover.placed += 1
    ticket.placed, ticket.placed_at = prover.placed, d.clock.monotonic()
    return ticket


def fail(d, times, outcome="failed"):
    """`times` calls in turn, each placed and answered `outcome`; the changes they made."""
    changes = []
    for _ in range(times):
        ticket, prover = take(d)
        assert prover is not None
        changes.append(d.release(ticket, prover, outcome))
        d.finish(ticket)
    return changes


def health(d, name):
    (found,) = [p for p in d.snapshot()["provers"] if p["label"] == name]
    return found


def test_an_ejection_lasts_the_base_times_the_ejections_since_a_good_answer_then_the_prover_is_back():
    d = make("a")
    assert fail(d, 3)[2] == dispatch.Change(kind="ejected", seconds=30.0, why=(
        "3 calls in a row dropped, failed or held to their deadline, the last failed (route.fail_threshold 3)"))
    assert take(d)[1] is None  # out: the call is held
    d.clock.advance(29.9)
    assert d.acquire(d.held[0], timeout=0) is None and d.taken_back() == []
    d.clock.advance(0.1)
    assert d.taken_back() == ["a"] and d.taken_back() == []  # told once
    waiting = d.held[0]
    prover = d.acquire(waiting, timeout=0)
    assert prover.spec.label == "a" and health(d, "a")["streak"] == 0  # its counts start again
    assert d.release(waiting, prover, "failed") is None
    d.finish(waiting)
    change = fail(d, 2)[1]
    assert change.kind == "ejected" and change.seconds == 60.0  # the second since its last good answer
    assert change.report is not None  # and for failed answers both times: reported


def test_a_good_answer_between_ejections_resets_the_time_and_the_report():
    d = make("a")
    fail(d, 3)
    d.clock.advance(30)
    fail(d, 1, "completed")  # taken back, and a proof came back
    assert fail(d, 3)[2] == dispatch.Change(kind="ejected", seconds=30.0, why=(
        "3 calls in a row dropped, failed or held to their deadline, the last failed (route.fail_threshold 3)"))
    d.clock.advance(30)
    fail(d, 1, "error")  # a status the daemon chose is an answer too
    assert fail(d, 3)[2].report is None and health(d, "a")["ejections"] == 1


def test_a_reported_prover_takes_no_call_again_and_is_reported_once():
    d = make("a", "b", max_ejected_percent=100)
    d.update([spec("a", rate=90), spec("b", rate=10)])  # a takes every call while it is in
    fail(d, 3)
    d.clock.advance(30)
    assert d.taken_back() == ["a"]
    change = fail(d, 3)[2]
    assert change.report == ("ejected 2 times for failed answers with none good between, the last: 3 calls in a row"
                             " dropped, failed or held to their deadline, the last failed (route.fail_threshold 3)")
    d.clock.advance(3600)
    assert d.taken_back() == [] and take(d)[1].spec.label == "b"
    assert health(d, "a")["set_aside"].startswith("reported: ejected 2 times")


def test_at_most_max_ejected_percent_of_the_provers_are_out_at_once_and_at_least_one():
    d = make("a", "b", "c", "d")  # 10% of 4: none by the share, but one always may be
    first, second = d.provers["u-a"], d.provers["u-b"]
    for prover in (first, second):
        for _ in range(3):
            ticket = place_on(d, prover)
            d.release(ticket, prover, "failed")
            d.finish(ticket)
    assert (health(d, "a")["ejections"], health(d, "b")["ejections"]) == (1, 0)
    assert health(d, "b")["set_aside"] is None and health(d, "b")["streak"] == 3  # in, and counted
    d.max_ejected_percent = 50  # two of four may be out
    assert d.release(place_on(d, second), second, "failed").kind == "ejected"


def test_calls_lost_together_count_once_and_a_call_placed_after_counts_again():
    d = make("a", slots=3)
    placed = [take(d) for _ in range(3)]
    changes = [d.release(ticket, prover, "dropped") for ticket, prover in placed]
    assert changes == [None, None, None] and health(d, "a")["streak"] == 1  # one connection lost: one failure
    later = placed[0][0]
    d.clock.advance(dispatch.SETTLE_S + 0.5)
    assert d.acquire(later, timeout=0) is not None  # placed after it, past SETTLE_S: a cause of its own
    d.release(later, placed[0][1], "dropped")
    assert health(d, "a")["streak"] == 2


def test_a_call_sent_as_the_daemon_goes_down_is_the_same_failure_and_one_sent_later_is_not():
    d = make("a", slots=2)
    (first, prover), (second, _) = take(d), take(d)
    d.release(first, prover, "dropped")
    again, _ = take(d)  # placed after the failure: accepted by a daemon going down, then lost
    d.clock.advance(dispatch.SETTLE_S)
    d.release(again, prover, "dropped")
    d.release(second, prover, "dropped")
    assert health(d, "a")["streak"] == 1
    d.clock.advance(0.1)
    later, _ = take(d)
    d.release(later, prover, "failed")  # past SETTLE_S and placed after: its own
    assert health(d, "a")["streak"] == 2


def test_a_call_placed_before_but_failing_long_after_the_last_counted_failure_counts():
    d = make("a", slots=2)
    (early, prover), (other, _) = take(d), take(d)
    d.release(other, prover, "dropped")
    d.clock.advance(dispatch.SAME_CAUSE_S + 1)
    d.release(early, prover, "dropped")
    assert health(d, "a")["streak"] == 2


def test_a_refused_connect_is_no_drop_the_prover_is_retried_after_a_pause_that_doubles_and_the_last_is_never_ejected():
    d = make("a", slots=2, fail_threshold=2)
    pauses = []
    for _ in range(6):
        ticket, prover = take(d)
        change = d.release(ticket, prover, "unreached", "a: UNAVAILABLE failed to connect")
        assert change.kind == "retrying" and not ticket.dropped_by and ticket.drops == 0
        pauses.append(change.seconds)
        assert take(d)[1] is None  # held while it waits to be tried again
        d.clock.advance(change.seconds)
        for waiting in list(d.held):
            d.finish(waiting)
    assert pauses == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert health(d, "a")["ejections"] == 0  # the one prover able to take held calls: never out for connects
    ticket, prover = take(d)
    d.release(ticket, prover, "completed")
    assert health(d, "a")["unreached"] == 0


def test_refused_connects_together_count_once_and_eject_only_while_another_prover_can_take_the_calls():
    d = make(fail_threshold=2)
    d.update([spec("a", slots=4), spec("b", slots=2)])  # a has the most free slots for two calls
    (one, a), (two, also) = take(d), take(d)
    assert a.spec.label == "a" and also is a
    assert d.release(one, a, "unreached").kind == "retrying"
    assert d.release(two, a, "unreached") is None  # refused in the same burst: the same failure
    assert health(d, "a")["unreached"] == 1
    assert d.acquire(one, timeout=0).spec.label == "b"  # it goes elsewhere meanwhile
    d.clock.advance(0.5)
    third, prover = take(d)
    assert prover.spec.label == "a"
    change = d.release(third, prover, "unreached")
    assert change.kind == "ejected" and change.seconds == 30.0 and change.report is None
    for _ in range(5):  # ejected again and again for connects alone: never reported (reconcile's tunnel check)
        d.clock.advance(3600)
        for _ in range(2):
            ticket = place_on(d, a)
            d.clock.advance(1)
            change = d.release(ticket, a, "unreached")
            d.finish(ticket)
        assert change.report is None
    assert not a.reported


def test_a_call_held_to_its_deadline_counts_only_when_the_prover_had_it_a_proofs_time():
    d = make("a", fail_threshold=1)
    proof_s = spec("a").proof_s
    assert proof_s == 60.0  # one slot at 60 proofs/h
    ticket, prover = take(d)
    d.clock.advance(proof_s - 1)
    assert d.release(ticket, prover, "expired") is None  # sent with little time left: the queue's fault
    d.clock.advance(proof_s)  # its slot, held by the daemon proving on, comes free
    ticket, prover = take(d)
    d.clock.advance(proof_s)
    assert d.release(ticket, prover, "expired").kind == "ejected"  # it had a proof's time and said nothing


def test_a_slot_of_a_call_given_up_is_free_once_the_daemon_shows_its_work_gone_or_a_proof_s_time_passed():
    d = make("a", slots=3)
    placed = [take(d) for _ in range(3)]
    for ticket, prover in placed[:2]:
        d.release(ticket, prover, "abandoned")
    prover = placed[0][1]
    assert (prover.busy, len(prover.lingering), prover.free) == (1, 2, 0)
    assert d.lingering_provers() == ["u-a"]
    assert d.observe_work("u-a", 3) == 0  # the router's one call and both given up: still proving
    assert d.observe_work("u-a", 2) == 0  # perhaps the router's call is not there yet: both may still run
    assert d.observe_work("u-a", 1) == 1 and prover.free == 1  # at most one runs: the other is done
    d.clock.advance(prover.spec.proof_s)  # the other: a proof's time has passed
    assert take(d)[1] is prover and d.lingering_provers() == []


def test_a_held_call_is_placed_when_an_ejection_ends_by_the_clock_within_its_wait():
    d = Dispatcher(max_held=5, max_bytes=100, fail_threshold=1, clock=SYSTEM, ejection_base=0.05)
    d.update([spec("a")])
    fail(d, 1)
    ticket = d.admit(klass=CLASS_PROOF, size=1)
    assert d.acquire(ticket, timeout=10).spec.label == "a"  # woken by the ejection's end, not by a release


def test_an_unknown_outcome_is_an_error():
    d = make("a")
    ticket, prover = take(d)
    with pytest.raises(ValueError, match="unknown outcome 'lost'"):
        d.release(ticket, prover, "lost")
