"""A machine's proved rate is what the proof router saw it prove (facts/deliveries.routed_rates): its expected
rate, and so the fleet's capacity, is held within those figures once the router saw enough; fleet shows them."""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import timedelta

import pytest
from helpers.routed_calls import NOW, SLOTS, attempts, kept_full, one_at_a_time

from vastctl import clock
from vastctl import config as config_module
from vastctl.facts import deliveries
from vastctl.observe import observe
from vastctl.state import db

CONFIG = config_module.from_mapping({"fleet": {"default_rate": 40}, "launch": {"bench_concurrency": 5}})


@pytest.fixture
def conn(tmp_path):
    connection = db.connect(tmp_path / "state.db", now=NOW, create=True)
    yield connection
    connection.close()


def machine(conn, name, *, bench=80.0, measured=None, gpus=1, state="running"):
    at = clock.to_iso(NOW - timedelta(hours=3))
    conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, gpu_name, num_gpus,"
                 " bench_rate, proofs_per_hour) VALUES (?, ?, ?, ?, ?, 'RTX 4090', ?, ?, ?)",
                 (f"u-{name}", name, state, at, at, gpus, bench, measured))
    conn.commit()
    return f"u-{name}"


def by_uuid(obs):
    return {m["uuid"]: m for m in obs.machines}


def test_a_machine_kept_full_counts_at_what_the_router_saw_whatever_its_heartbeats_claim(conn):
    liar = machine(conn, "vastctl-a", bench=80.0, measured=100.0)  # its heartbeats claim 100/h
    slow = machine(conn, "vastctl-b", bench=80.0)
    before = observe(conn, CONFIG, now=NOW)
    assert before.capacity == 180.0 and by_uuid(before)[liar]["rate_source"] == "heartbeats"
    # five at once, 300 s each, for an hour: 60 proofs in 3600 s of busy time, 60/h both ways
    deliveries.record_calls(conn, kept_full(liar) + kept_full(slow, prover_s=600.0, batches=6))
    obs = observe(conn, CONFIG, now=NOW)
    a, b = by_uuid(obs)[liar], by_uuid(obs)[slow]
    assert (a["expected_rate"], a["rate_source"], a["routed_proofs"]) == (pytest.approx(60.0), "router", 60)
    assert a["routed_rate"] == pytest.approx(60.0) and a["routed_rate_max"] == pytest.approx(60.0)
    assert (b["expected_rate"], b["rate_source"]) == (pytest.approx(30.0), "router")  # bench 80, proved 30
    assert obs.capacity == pytest.approx(90.0)
    assert obs.to_prompt()["machines"][0]["routed_rate"] == 60.0


def test_too_few_calls_leave_the_bench_rate(conn):
    uuid = machine(conn, "vastctl-a", bench=80.0)
    deliveries.record_calls(conn, kept_full(uuid)[:deliveries.ROUTED_MIN_PROOFS - 1])
    seen = by_uuid(observe(conn, CONFIG, now=NOW))[uuid]
    assert seen["routed_proofs"] == deliveries.ROUTED_MIN_PROOFS - 1 and seen["routed_rate"] is not None
    assert (seen["expected_rate"], seen["rate_source"]) == (80.0, "bench")
    deliveries.record_calls(conn, kept_full(uuid)[deliveries.ROUTED_MIN_PROOFS - 1:deliveries.ROUTED_MIN_PROOFS])
    assert by_uuid(observe(conn, CONFIG, now=NOW))[uuid]["rate_source"] == "router"


def test_calls_older_than_the_window_are_not_counted_and_one_across_its_start_counts_its_share(conn):
    uuid = machine(conn, "vastctl-a", bench=80.0)
    deliveries.record_calls(conn, kept_full(uuid, now=NOW - timedelta(seconds=deliveries.ROUTED_WINDOW_S + 1)))
    assert by_uuid(observe(conn, CONFIG, now=NOW))[uuid]["routed_proofs"] == 0
    # five calls of 600 s that ended 300 s into the window: half of each inside it, 2.5 proofs in 300 busy seconds
    deliveries.record_calls(conn, attempts(uuid, prover_s=600.0, ends=[deliveries.ROUTED_WINDOW_S - 300] * 5))
    (routed,) = deliveries.routed_rates(conn, now=NOW, slots=SLOTS).values()
    assert routed.proofs == 5 and routed.busy_s == pytest.approx(300.0, abs=0.01)
    assert routed.rate == pytest.approx(2.5 * 3600 / 300, rel=1e-3)


def test_failed_and_dropped_calls_take_time_and_are_no_proofs(conn):
    uuid = machine(conn, "vastctl-a", bench=80.0)
    results = ["completed", "failed", "dropped", "error", "completed"] * 12  # two of every five slots proved
    deliveries.record_calls(conn, kept_full(uuid, results=results))
    deliveries.record_calls(conn, [{**call, "prover_ms": None, "result": "refused"} for call in kept_full(uuid)])
    seen = by_uuid(observe(conn, CONFIG, now=NOW))[uuid]
    assert seen["routed_proofs"] == 24 and seen["routed_rate"] == pytest.approx(24.0)
    assert (seen["expected_rate"], seen["rate_source"]) == (pytest.approx(24.0), "router")


def test_a_machine_given_a_call_at_a_time_is_held_between_what_it_proved_and_what_five_at_once_would(conn):
    honest = machine(conn, "vastctl-a", bench=50.0)    # alone a call takes 300 s: 12/h seen, at most 60/h full
    claims = machine(conn, "vastctl-b", bench=150.0)   # claims more than five such calls at once could prove
    modest = machine(conn, "vastctl-c", bench=50.0, measured=5.0)  # its heartbeats say less than it proved
    deliveries.record_calls(conn, one_at_a_time(honest) + one_at_a_time(claims) + one_at_a_time(modest))
    seen = by_uuid(observe(conn, CONFIG, now=NOW))
    routed = seen[honest]
    assert (routed["routed_rate"], routed["routed_rate_max"]) == (pytest.approx(12.0), pytest.approx(60.0))
    assert (routed["expected_rate"], routed["rate_source"]) == (50.0, "bench")  # idle slots are not slowness
    assert (seen[claims]["expected_rate"], seen[claims]["rate_source"]) == (pytest.approx(60.0), "router")
    assert (seen[modest]["expected_rate"], seen[modest]["rate_source"]) == (pytest.approx(12.0), "router")


def test_the_routed_rate_is_bounded_by_the_machines_ceiling(conn):
    uuid = machine(conn, "vastctl-a", bench=150.0)
    deliveries.record_calls(conn, kept_full(uuid, prover_s=30.0, batches=120))  # 600/h seen on one GPU
    seen = by_uuid(observe(conn, CONFIG, now=NOW))[uuid]
    assert seen["routed_rate"] == pytest.approx(600.0)
    assert (seen["expected_rate"], seen["rate_source"]) == (200.0, "router")  # rates.MAX_RATE_PER_GPU


def test_fleet_shows_the_routed_rate_and_where_each_expected_rate_came_from(ready, cli, db_path):
    for uuid, label in (("u1", "vastctl-a"), ("u2", "vastctl-b")):
        cli("register", "--uuid", uuid, "--label", label, "--gpu", "RTX 4090")
        cli("params-done", "--uuid", uuid)
        cli("bench-report", "--uuid", uuid, "--rate", "80")
        cli("running", "--uuid", uuid)
    now = clock.SYSTEM.now().replace(microsecond=0) + timedelta(minutes=1)
    conn = db.connect(db_path, now=now)
    try:
        deliveries.record_calls(conn, kept_full("u1", now=now))
    finally:
        conn.close()
    at = clock.display_iso(clock.to_iso(now))
    data = json.loads(cli("--as-of", at, "fleet", "--json").out)
    a, b = data["instances"]
    assert {k: a[k] for k in ("expected_rate", "rate_source", "routed_rate", "routed_rate_max", "routed_proofs")} == {
        "expected_rate": 60.0, "rate_source": "router", "routed_rate": 60.0, "routed_rate_max": 60.0,
        "routed_proofs": 60}
    assert {k: b[k] for k in ("expected_rate", "rate_source", "routed_rate", "routed_proofs")} == {
        "expected_rate": 80.0, "rate_source": "bench", "routed_rate": None, "routed_proofs": 0}
    assert data["summary"]["capacity_proofs_per_hour"] == 140.0
    table = cli("--as-of", at, "fleet").out
    assert "routed/h" in table and "60.0*" in table and "capacity 140/" in table
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:
        assert raw.execute("SELECT count(*) FROM proof_calls").fetchone()[0] == 60  # reading changed nothing


@pytest.mark.slow  # the router finds libc for malloc_trim (ldconfig)
def test_the_router_breaks_a_tie_by_the_rate_it_saw_not_the_benchmark(conn, tmp_path):
    """Two joined provers with as many free slots: the one whose calls the router saw go faster is first, though
    its benchmark said less; a machine with too few calls seen keeps its benchmark's rate."""
    from vastctl.route import server as route_server
    from vastctl.route.dispatch import CLASS_PROOF

    fast, slow, new = (machine(conn, name, bench=bench) for name, bench in (("fast", 50.0), ("slow", 90.0), ("new", 70.0)))
    at = clock.to_iso(NOW - timedelta(hours=1))
    conn.execute("UPDATE instances SET tunnel_port = 40000 + rowid, joined_at = ?", (at,))
    conn.commit()
    deliveries.record_calls(conn, kept_full(fast, prover_s=150.0) + kept_full(slow, prover_s=600.0, batches=6)
                            + one_at_a_time(new, calls=3))
    router = route_server.Router(CONFIG, clock=clock.VirtualClock(NOW), probe=lambda port, timeout: False)
    router.refresh(conn)
    seen = deliveries.routed_rates(conn, now=NOW, slots=SLOTS)
    assert seen[fast].rate > 70.0 > seen[slow].rate  # fast proved faster than new's benchmark, slow slower
    order = []
    for _ in range(3):  # each takes one slot of the first in the tie order; all keep SLOTS - 1 free after
        ticket = router.dispatcher.admit(klass=CLASS_PROOF, size=1)
        order.append(router.dispatcher.acquire(ticket, timeout=0).spec.label)
    # fast by what it proved, then new by its benchmark (3 calls are not enough to overrule it), then slow:
    # its benchmark said 90/h, but the router saw it prove less
    assert order == ["fast", "new", "slow"]
