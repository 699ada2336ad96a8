"""The simulated day's proofs as the proof router's calls (vastctl/demo/calls.py): rows, held times, waits."""

from __future__ import annotations

from datetime import timedelta

from vastctl import clock as clocks
from vastctl.demo import calls as routed_calls
from vastctl.demo import setting
from vastctl.facts import deliveries
from vastctl.providers.sim_engine import Share
from vastctl.state import db

SLOW = Share(vast_id=1, uuid="u-slow", label="vastctl-slow", rate=60.0, proofs=0.0)  # 2 slots × 3600 / 60: 120 s
FAST = Share(vast_id=2, uuid="u-fast", label="vastctl-fast", rate=120.0, proofs=0.0)  # 60 s a call


def share(machine: Share, proofs: float) -> Share:
    return Share(vast_id=machine.vast_id, uuid=machine.uuid, label=machine.label, rate=machine.rate, proofs=proofs)


def at(seconds: float) -> str:
    return clocks.to_iso(setting.START + timedelta(seconds=seconds))


def test_shares_become_whole_calls_held_from_arrival_and_the_late_still_queued_expire(tmp_path):
    """Two machines' fractional shares become whole calls in proof_calls, each held from the arrival of the proof
    at the head of the queue to the moment its machine took it, and on the prover for its true rate's time;
    what is still queued at the end past max_wait is recorded as expired and counted late."""
    conn = db.connect(tmp_path / "calls.db", now=setting.START, create=True)
    calls = routed_calls.RoutedCalls(conn, slots=2)
    calls.arrive(3.0)  # minute 0: proofs 1, 2, 3 arrive by 20, 40 and 60 s
    calls.take(0, [share(SLOW, 0.6), share(FAST, 1.2)])  # fast reaches a proof at 50 s, 1.5 done: proof 2's head (30 s)
    assert conn.execute("SELECT count(*) FROM proof_calls").fetchone()[0] == 0  # answered at 110 s: not yet
    calls.arrive(0.0)
    calls.take(1, [share(SLOW, 0.5), share(FAST, 0.5)])  # slow reaches 1.1 at 108 s, 2.6 done (52 s); fast 0.7
    assert [r[0] for r in conn.execute("SELECT request_id FROM proof_calls")] == ["sim-1"]  # ended by 120 s
    calls.arrive(2.0)  # minute 2: proofs 4 and 5 by 150 and 180 s, never taken
    calls.take(2, [])
    calls.finish(60, 45 * 60)  # an hour in: proof 3 (partly done) and 4, 5 waited past 45 min
    rows = [dict(r) for r in conn.execute("SELECT * FROM proof_calls ORDER BY at, request_id")]
    done = [(r["request_id"], r["uuid"], r["label"], r["held_ms"], r["prover_ms"], r["total_ms"], r["at"])
            for r in rows if r["result"] == "completed"]
    assert done == [("sim-1", "u-fast", "vastctl-fast", 20_000, 60_000, 60_000, at(110)),
                    ("sim-2", "u-slow", "vastctl-slow", 56_000, 120_000, 120_000, at(228))]
    assert {(r["kind"], r["attempt"], r["size_bytes"]) for r in rows if r["result"] == "completed"} == {
        ("porep", 1, routed_calls.RoutedCalls.REQUEST_BYTES)}
    late = [(r["request_id"], r["uuid"], r["held_ms"], r["prover_ms"], r["attempt"], r["at"]) for r in rows
            if r["result"] == "expired"]
    assert late == [("sim-3", None, 3_540_000, None, 0, at(3600)), ("sim-4", None, 3_450_000, None, 0, at(3600)),
                    ("sim-5", None, 3_420_000, None, 0, at(3600))]
    assert set(rows[0]) >= set(deliveries.CALL_COLUMNS)
    assert deliveries.delivered(conn) == {"u-fast": {"completed": 1}, "u-slow": {"completed": 1}}  # 1.7 and 1.1 done
    measured = deliveries.proof_wait(conn, since=setting.START, until=calls.until, max_wait_s=45 * 60)
    assert measured == {"calls": 2, "p50_s": 80.0, "p95_s": 176.0, "p99_s": 176.0, "within_max_wait": 1.0}
    assert routed_calls.proof_waits(conn, calls, 45 * 60) == {"judged": 5, "within": 0.4, "p50": 80.0, "p95": 176.0,
                                                              "p99": 176.0}  # the late three count against the share
    assert routed_calls.wait_minutes(conn, calls) == {1: 1, 2: 1, 57: 2, 59: 1}
    conn.close()


def test_a_fraction_left_on_a_machine_through_a_quiet_spell_is_not_a_proof_that_waited(tmp_path):
    """Half a proof stays on the machine through 200 minutes with nothing arriving; the call it makes of it once
    work comes again is the new work at the head of the queue, held for nothing, not 200 minutes."""
    conn = db.connect(tmp_path / "calls.db", now=setting.START, create=True)
    calls = routed_calls.RoutedCalls(conn, slots=2)
    calls.arrive(1.5)
    calls.take(0, [share(FAST, 1.5)])  # one call at 40 s, half a proof left on it
    for minute in range(1, 201):
        calls.arrive(0.0)
        calls.take(minute, [])
    calls.arrive(1.0)
    calls.take(201, [share(FAST, 1.0)])  # 0.5 + 1.0: its second call half way through the minute
    calls.finish(202, 45 * 60)
    held = [r[0] for r in conn.execute("SELECT held_ms FROM proof_calls ORDER BY at")]
    assert held == [0, 0] and calls.late == 0
    conn.close()
