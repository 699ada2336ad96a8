"""facts.deliveries: what the proof router recorded, read back as proof wait, held calls and the machines it may use;
and how fleet --json and /metrics show it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vastctl import clock
from vastctl import config as config_module
from vastctl.facts import deliveries
from vastctl.observe import observe
from vastctl.serving import metrics
from vastctl.state import db
from vastctl.views import fleet

NOW = datetime(2031, 3, 3, 12, 0, tzinfo=timezone.utc)
CONFIG = config_module.from_mapping({"agent": {"max_wait": "45m"}})


@pytest.fixture
def conn(tmp_path):
    connection = db.connect(tmp_path / "state.db", now=NOW, create=True)
    yield connection
    connection.close()


def call(result="completed", held_s=0.0, prover_s=60.0, minutes_ago=10, **extra):
    return {"at": clock.to_iso(NOW - timedelta(minutes=minutes_ago)), "request_id": "r", "kind": "porep",
            "uuid": "u-a", "label": "vastctl-a", "result": result, "held_ms": round(held_s * 1000),
            "prover_ms": round(prover_s * 1000), "attempt": 1, "size_bytes": 10, **extra}


def running(conn, name, port, joined=True, failing=None):
    at = clock.to_iso(NOW - timedelta(hours=1))
    conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                 " bench_rate, route_failing_since) VALUES (?, ?, 'running', ?, ?, ?, ?, 55, ?)",
                 (f"u-{name}", name, at, at, port, at if joined else None, failing))
    conn.commit()


def test_proof_wait_is_held_plus_proving_of_answered_calls_by_nearest_rank(conn):
    waits = [60 * n for n in range(1, 101)]  # 1 .. 100 minutes
    calls = [call(held_s=w - 30, prover_s=30) for w in waits]
    calls += [call("dropped", held_s=9999), call("expired", held_s=9999), call("completed", minutes_ago=60 * 25)]
    assert deliveries.record_calls(conn, calls) == 103
    wait = deliveries.proof_wait(conn, since=NOW - timedelta(days=1), until=NOW, max_wait_s=45 * 60)
    assert wait == {"calls": 100, "p50_s": 3000.0, "p95_s": 5700.0, "p99_s": 5940.0, "within_max_wait": 0.45}
    assert deliveries.results(conn, since=NOW - timedelta(days=1), until=NOW) == {
        "completed": 100, "dropped": 1, "expired": 1}
    empty = deliveries.proof_wait(conn, since=NOW, until=NOW, max_wait_s=1)
    assert empty == {"calls": 0, "p50_s": None, "p95_s": None, "p99_s": None, "within_max_wait": None}


def test_held_calls_are_believed_only_from_a_fresh_status(conn):
    assert deliveries.held(conn, now=NOW) == deliveries.Held(fresh=False)
    snapshot = {"held": 7, "held_bytes": 700, "oldest_held_s": 95.5, "in_flight": 3, "provers": [{}, {}]}
    deliveries.write_status(conn, snapshot, now=NOW)
    fresh = deliveries.held(conn, now=NOW + timedelta(seconds=10))
    assert (fresh.fresh, fresh.held, fresh.oldest_held_s, fresh.in_flight, fresh.provers) == (True, 7, 95.5, 3, 2)
    assert observe(conn, CONFIG, now=NOW + timedelta(seconds=10)).demand.held == 7
    stale = deliveries.held(conn, now=NOW + timedelta(seconds=31))
    assert (stale.fresh, stale.held) == (False, 0)  # a router that stopped holds nothing anyone can count on
    assert observe(conn, CONFIG, now=NOW + timedelta(seconds=31)).demand.held == 0


def test_set_aside_marks_a_running_machine_once_with_one_event(conn):
    running(conn, "vastctl-a", 20001)
    assert deliveries.set_aside(conn, "u-vastctl-a", "3 calls in a row dropped", now=NOW)
    assert not deliveries.set_aside(conn, "u-vastctl-a", "again", now=NOW)
    assert not deliveries.set_aside(conn, "u-nobody", "no row", now=NOW)
    rows = conn.execute("SELECT kind, source, reason FROM events WHERE kind = 'route_set_aside'").fetchall()
    assert [tuple(r) for r in rows] == [("route_set_aside", "route",
                                         "the router sends it no more calls: 3 calls in a row dropped")]
    assert conn.execute("SELECT route_failure FROM instances").fetchone()[0] == "3 calls in a row dropped"


def test_candidates_are_running_tunnel_ends_not_set_aside(conn):
    running(conn, "vastctl-a", 20001)
    running(conn, "vastctl-b", 20002, joined=False)
    running(conn, "vastctl-c", 20003, failing=clock.to_iso(NOW))
    assert [(r["label"], r["joined"], r["bench_rate"]) for r in deliveries.candidates(conn)] == [
        ("vastctl-a", True, 55.0), ("vastctl-b", False, 55.0)]


def test_fleet_json_and_metrics_show_the_router(conn):
    deliveries.record_calls(conn, [call(held_s=30, prover_s=90), call("failed", held_s=0, prover_s=60),
                                   call("dropped")])
    deliveries.write_status(conn, {"held": 2, "held_bytes": 20, "oldest_held_s": 12.0, "in_flight": 1,
                                   "provers": [{}]}, now=NOW)
    router = fleet.fleet_view(conn, CONFIG, now=NOW)["summary"]["router"]
    assert router["router_running"] and (router["held"], router["oldest_held_s"], router["in_flight"]) == (2, 12.0, 1)
    assert router["proof_wait_last_day"] == {"calls": 2, "p50_s": 60.0, "p95_s": 120.0, "p99_s": 120.0,
                                             "within_max_wait": 1.0}
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(conn, CONFIG, NOW).decode())}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("vastctl_route_held_calls", ())] == 2
    assert value[("vastctl_route_oldest_held_seconds", ())] == 12
    assert value[("vastctl_proof_wait_seconds", (("quantile", "0.99"),))] == 120
    assert value[("vastctl_proofs_within_max_wait_ratio", ())] == 1
    assert value[("vastctl_route_calls_last_day", (("result", "dropped"),))] == 1
    assert value[("vastctl_route_calls_last_day", (("result", "completed"),))] == 1


def test_a_claim_past_what_the_router_delivered_is_one_event_an_hour_and_is_not_counted(conn):
    running(conn, "vastctl-a", 20001)
    assert not deliveries.check_claim(conn, "u-vastctl-a", bench_proofs=6, now=NOW)  # the router never sent it one
    deliveries.record_calls(conn, [call(uuid="u-vastctl-a") for _ in range(20)])
    conn.execute("UPDATE instances SET proofs_total = 20 + 6 + 2 + 1 WHERE uuid = 'u-vastctl-a'")  # at the slack
    conn.commit()
    assert not deliveries.check_claim(conn, "u-vastctl-a", bench_proofs=6, now=NOW)
    conn.execute("UPDATE instances SET proofs_total = 500 WHERE uuid = 'u-vastctl-a'")
    conn.commit()
    assert deliveries.check_claim(conn, "u-vastctl-a", bench_proofs=6, now=NOW)
    assert not deliveries.check_claim(conn, "u-vastctl-a", bench_proofs=6, now=NOW + timedelta(minutes=30))
    assert deliveries.check_claim(conn, "u-vastctl-a", bench_proofs=6, now=NOW + timedelta(minutes=61))
    (first, _) = conn.execute("SELECT reason, source FROM events WHERE kind = 'claim_disagrees'").fetchall()
    assert tuple(first) == ("its heartbeats claim 500 proofs; the proof router saw 20 come back from it (and 6 in"
                            " its benchmark): the router's count is the one counted", "route")


def test_a_heartbeat_is_checked_against_the_router(conn):
    from vastctl.machine.reports import LocalReports

    running(conn, "vastctl-a", 20001)
    conn.execute("UPDATE instances SET last_heartbeat_at = ? WHERE uuid = 'u-vastctl-a'",
                 (clock.to_iso(NOW - timedelta(hours=1)),))
    conn.commit()
    deliveries.record_calls(conn, [call(uuid="u-vastctl-a")])
    LocalReports(conn, CONFIG, now=NOW).heartbeat("u-vastctl-a", proofs_done=40)
    (event,) = conn.execute("SELECT reason FROM events WHERE kind = 'claim_disagrees'").fetchall()
    assert "the proof router saw 1 come back from it" in event[0]
