"""Proofs/hour from heartbeats: honest at any spacing, a falling counter recorded, the fleet summary as shown."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from vastctl.state import lifecycle, rates
from vastctl.state.lifecycle import State
from vastctl.views import fleet

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def running_machine(conn, uuid="u1", bench=70.0):
    lifecycle.create(conn, uuid=uuid, label=f"vastctl-{uuid}", state=State.REGISTERED, reason="test",
                     source="operator", now=T0)
    lifecycle.params_done(conn, uuid, now=T0)
    rates.bench_report(conn, uuid, bench, gate=40, now=T0)
    lifecycle.running(conn, uuid, now=T0)


def beat(conn, proofs, seconds, uuid="u1"):
    return rates.heartbeat(conn, uuid, proofs_done=proofs, now=T0 + timedelta(seconds=seconds))


def test_two_heartbeats_30s_apart_do_not_swing_a_benched_rate(conn):
    running_machine(conn, bench=70)
    beat(conn, 10, 60)
    row = beat(conn, 14, 90)  # 4 proofs in 30 s would be 480/h taken alone
    assert 70 < row["proofs_per_hour"] < 78


@pytest.mark.parametrize("spacing_s", [15, 60, 300, 1800])
def test_the_rate_converges_to_the_true_rate_at_any_spacing(conn, spacing_s):
    running_machine(conn, bench=70)  # the bench was optimistic: the machine proves 50/h
    seconds, proofs = 0, 0.0
    beat(conn, 0, 0)
    while seconds < 4 * 3600:
        seconds += spacing_s
        proofs += 50 * spacing_s / 3600
        row = beat(conn, int(proofs), seconds)
        assert 40 <= row["proofs_per_hour"] <= 75  # never further out than the evidence allows
    assert row["proofs_per_hour"] == pytest.approx(50, abs=2.5)


def test_without_a_benchmark_a_short_window_gives_no_rate(conn):
    lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=State.RUNNING, reason="test", source="operator",
                     now=T0)
    beat(conn, 0, 0)
    assert beat(conn, 5, 30)["proofs_per_hour"] is None
    assert beat(conn, 15, 30 + 600)["proofs_per_hour"] == pytest.approx(60.0)


def test_a_falling_counter_is_an_event_and_keeps_the_rate(conn):
    running_machine(conn)
    beat(conn, 100, 0)
    before = beat(conn, 110, 600)["proofs_per_hour"]
    row = beat(conn, 3, 660)
    assert row["proofs_per_hour"] == before and row["proofs_done"] == 3
    resets = conn.execute("SELECT * FROM events WHERE kind = 'counter_reset'").fetchall()
    assert len(resets) == 1 and resets[0]["source"] == "instance" and resets[0]["uuid"] == "u1"
    assert "fell from 110 to 3" in resets[0]["reason"]
    beat(conn, 3, 700)  # the same count again (a retried heartbeat) is no second event
    assert conn.execute("SELECT count(*) FROM events WHERE kind = 'counter_reset'").fetchone()[0] == 1


def test_summary_capacity_uses_the_table_rounding(conn, config):
    for uuid in ("u1", "u2", "u3"):
        running_machine(conn, uuid)
    conn.execute("UPDATE instances SET proofs_per_hour = 33.3333")
    view = fleet.fleet_view(conn, config, now=T0)
    assert [i["proofs_per_hour"] for i in view["instances"]] == [33.3, 33.3, 33.3]
    assert view["summary"]["capacity_proofs_per_hour"] == 100.0


def test_fleet_lists_killed_machines_only_while_they_may_bill(conn, config):
    for uuid in ("rented", "never", "gone"):
        running_machine(conn, uuid)
        lifecycle.kill(conn, uuid, "test", source="operator", code="operator", now=T0)
    conn.execute("UPDATE instances SET vast_id = 9001 WHERE uuid IN ('rented', 'gone')")
    conn.execute("UPDATE instances SET destroyed_at = '2026-11-30T12:05:00Z' WHERE uuid = 'gone'")
    shown = [i["uuid"] for i in fleet.fleet_view(conn, config, now=T0)["instances"]]
    assert shown == ["rented"]
    everything = fleet.fleet_view(conn, config, include_killed=True, now=T0)["instances"]
    assert sorted(i["uuid"] for i in everything) == ["gone", "never", "rented"]


@pytest.mark.parametrize(("queued", "falls"), [(2, False), (500, True)])
def test_a_machine_given_too_little_work_keeps_its_rate_one_kept_busy_shows_its_own(conn, queued, falls):
    """Counts are proofs done, not capacity: fewer proofs while the queue held less than ten minutes of the
    running fleet's work is idleness and keeps the rate; with work waiting, the rate follows the count."""
    from vastctl.facts import demand

    running_machine(conn, bench=70)
    beat(conn, 0, 0)
    for minute in range(1, 61):
        demand.report(conn, queued, None, now=T0 + timedelta(minutes=minute) - timedelta(seconds=5))
        row = beat(conn, minute // 2, minute * 60)  # 30/h
    assert (row["proofs_per_hour"] < 50) is falls
    assert row["proofs_total"] == 30
