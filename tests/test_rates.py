"""Proofs/hour from heartbeats: honest at any spacing, a falling counter recorded, the fleet summary as shown."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from vastctl.state import lifecycle, rates
from vastctl.state.lifecycle import KillCode, State
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
    assert [i["counted_rate"] for i in view["instances"]] == [33.3, 33.3, 33.3]
    assert view["summary"]["capacity_proofs_per_hour"] == 99.9  # the sum of the counted column as shown


def test_fleet_lists_killed_machines_only_while_they_may_bill(conn, config):
    for uuid in ("rented", "never", "gone"):
        running_machine(conn, uuid)
        lifecycle.kill(conn, uuid, "test", source="operator", code=KillCode.OPERATOR, now=T0)
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


# --- the rate cap and the counter's bound, as functions of a row (no state file) ------------------------------


def at(seconds: float) -> str:
    from vastctl import clock

    return clock.to_iso(T0 + timedelta(seconds=seconds))


# A GPU count is 1 or more, or unknown (None), where it enters (vast_mapping.gpu_count, the reports' checks;
# migration 23 for rows from before): the ceiling reads it as it is stored.
@pytest.mark.parametrize("gpus, ceiling", [(None, 200.0), (1, 200.0), (3, 600.0), (8, 1600.0), (9, 1600.0)])
def test_the_ceiling_is_200_an_hour_per_gpu_counted_up_to_eight(gpus, ceiling):
    assert rates.rate_ceiling({"num_gpus": gpus}) == ceiling == rates.measured_rate_bound({"num_gpus": gpus})


@pytest.mark.parametrize("bench, gpus, bound", [(70.0, 1, 140.0), (99.5, 1, 199.0), (150.0, 1, 200.0),
                                                (150.0, 2, 300.0), (0, 1, 0.0)])  # a stored bench rate is ≥ 0
def test_a_measured_rate_counts_for_twice_its_bench_rate_never_past_the_ceiling(bench, gpus, bound):
    assert rates.measured_rate_bound({"bench_rate": bench, "num_gpus": gpus}) == bound


def test_the_bound_says_where_it_comes_from():
    assert rates._bound_source({"bench_rate": 70.0}) == "2 × its bench rate 70"
    assert rates._bound_source({"bench_rate": 150.0}) == "200/h per GPU"  # 300 past the ceiling: the ceiling bounds
    assert rates._bound_source({"bench_rate": None, "num_gpus": 2}) == "200/h per GPU"


def counter(proofs_done=100, **fields):
    return {"proofs_done": proofs_done, "last_heartbeat_at": at(0), "created_at": at(-7200), "bench_rate": 70.0,
            "num_gpus": 1, **fields}


def test_a_counter_adds_what_it_rose_by_up_to_the_bound_for_the_time_since_the_last_beat():
    now = T0 + timedelta(hours=1)
    assert rates.counted_increment(counter(), 150, now) == (50, None)
    assert rates.counted_increment(counter(), 250, now) == (150, None)  # 140/h × 1h + 10: exactly the most
    assert rates.counted_increment(counter(), 100, now) == (0, None)
    assert rates.counted_increment(counter(proofs_done=None), 30, now) == (30, None)
    assert rates.counted_increment(counter(), 1_000_100, now) == (150, (
        "proof counter claimed 1000000 proofs in 1h: not plausible for a machine bounded at 140 proofs/h"
        " (2 × its bench rate 70); 150 counted"))


def test_a_lower_count_is_a_new_run_bounded_the_same_way():
    now = T0 + timedelta(minutes=30)
    assert rates.counted_increment(counter(), 5, now) == (5, None)
    assert rates.counted_increment(counter(), 99, now) == (80, rates.counted_increment(counter(), 99, now)[1])
    assert "claimed 99 proofs in 30m" in rates.counted_increment(counter(), 99, now)[1]


def test_a_first_beat_counts_from_the_rental_and_one_with_no_time_adds_only_a_batch():
    now = T0 + timedelta(minutes=1)
    first = counter(proofs_done=0, last_heartbeat_at=None, created_at=at(0))
    assert rates.counted_increment(first, 10**18, now)[0] == int(140 * 60 / 3600) + rates.BURST_PROOFS
    timeless = counter(proofs_done=0, last_heartbeat_at=None, created_at=None)
    assert rates.counted_increment(timeless, 10**18, now)[0] == rates.BURST_PROOFS
    future = counter(proofs_done=0, last_heartbeat_at=at(120))  # a beat dated after now: no time has passed
    assert rates.counted_increment(future, 10**18, now)[0] == rates.BURST_PROOFS


def smoothing(**fields):
    return {"state": State.RUNNING, "last_heartbeat_at": at(0), "proofs_done": 100, "proofs_per_hour": 70.0,
            "bench_rate": 70.0, "num_gpus": 1, "label": "vastctl-u1", **fields}


def test_the_rate_moves_toward_the_sample_by_the_time_it_covers():
    import math

    rate, why = rates._smoothed_rate(smoothing(), 125, T0 + timedelta(seconds=1800))  # 25 in 30 min: 50/h
    assert why is None and rate == pytest.approx(70 + (1 - math.exp(-1)) * (50 - 70))
    rate, _ = rates._smoothed_rate(smoothing(), 100 + 120, T0 + timedelta(hours=1))  # 120/h: below the bound
    assert rate == pytest.approx(70 + (1 - math.exp(-2)) * (120 - 70))


def test_nothing_to_measure_keeps_the_rate():
    later = T0 + timedelta(seconds=600)
    assert rates._smoothed_rate(smoothing(last_heartbeat_at=None), 200, later) == (70.0, None)
    assert rates._smoothed_rate(smoothing(state=State.STOPPED), 200, later) == (70.0, None)
    assert rates._smoothed_rate(smoothing(), 90, later) == (70.0, None)  # the counter fell
    assert rates._smoothed_rate(smoothing(), 200, T0) == (70.0, None)  # no time passed


def test_a_leaping_counter_counts_at_the_bound_and_says_why():
    rate, why = rates._smoothed_rate(smoothing(), 10**18, T0 + timedelta(seconds=60))
    assert 70 < rate < 140 and why == ("proof counter rose by 999999999999999900 in 1m: not plausible for a machine"
                                       " bounded at 140 proofs/h (2 × its bench rate 70); counted at that rate")
    honest = rates._smoothed_rate(smoothing(), 100 + 12, T0 + timedelta(seconds=60))  # 140/h × 1 min + 10 batch
    assert honest[1] is None
    # a batch landing just after a beat reads 720/h alone, plausible with the burst: the rate still stops at the bound
    assert rates._smoothed_rate(smoothing(proofs_per_hour=139.0), 100 + 12, T0 + timedelta(seconds=60)) == (140.0, None)


def test_an_idle_machine_keeps_its_rate_and_a_first_rate_needs_ten_minutes():
    later = T0 + timedelta(seconds=1800)
    assert rates._smoothed_rate(smoothing(), 105, later, busy=False) == (70.0, None)  # fewer, but no work waited
    assert rates._smoothed_rate(smoothing(), 105, later, busy=True)[0] < 70.0
    fresh = smoothing(proofs_per_hour=None, bench_rate=None)
    assert rates._smoothed_rate(fresh, 105, T0 + timedelta(seconds=599)) == (None, None)
    assert rates._smoothed_rate(fresh, 110, T0 + timedelta(seconds=600)) == (60.0, None)
    benched = smoothing(proofs_per_hour=None)  # no rate yet: it starts from the bench rate
    assert rates._smoothed_rate(benched, 105, later, busy=False) == (70.0, None)


def test_a_bench_rate_is_a_number_or_its_text_and_each_refusal_says_which_rule():
    from vastctl.validate import Invalid

    assert rates.validate_rate("50") == 50.0 and rates.validate_rate(42) == 42.0 and rates.validate_rate("1e3") == 1000.0
    for value, refusal in [("many", "rate must be a number of proofs per hour, got 'many'"),
                           (None, "rate must be a number of proofs per hour, got None"),
                           (True, "rate must be a finite number ≥ 0 (proofs per hour), got True"),
                           (-1, "rate must be a finite number ≥ 0 (proofs per hour), got -1"),
                           ("-5", "rate must be a finite number ≥ 0 (proofs per hour), got '-5'"),
                           ("inf", "rate must be a finite number ≥ 0 (proofs per hour), got 'inf'")]:
        with pytest.raises(Invalid) as caught:
            rates.validate_rate(value)
        assert str(caught.value) == refusal


def test_a_proof_counter_is_a_whole_number_named_as_the_cumulative_count():
    from vastctl.validate import Invalid

    assert rates.validate_proofs(7) == 7
    with pytest.raises(Invalid) as caught:
        rates.validate_proofs(-1)
    assert str(caught.value) == ("proofs_done must be a whole number from 0 to 9223372036854775807 (the cumulative"
                                 " count), got -1")


def test_a_beat_a_second_after_the_last_still_moves_the_rate():
    rate, why = rates._smoothed_rate(smoothing(), 100, T0 + timedelta(seconds=1))  # nothing proved in that second
    assert why is None and 69.9 < rate < 70.0


def test_a_counter_rising_by_exactly_what_the_bound_allows_is_plausible():
    rate, why = rates._smoothed_rate(smoothing(), 100 + 150, T0 + timedelta(hours=1))  # 140/h × 1 h + 10
    assert why is None
    assert rates._smoothed_rate(smoothing(), 100 + 151, T0 + timedelta(hours=1))[1] is not None
