"""A machine's word about its own speed is bounded before it counts: capacity and the release ranking never
follow a liar, and every bounded claim is an `implausible_rate` event the operator sees.

The incident: one heartbeat's proofs_done leapt to 2^63-1 (or `bench-report --rate 1e308`), fleet capacity
read ~1e19, agent-step planned nothing with 59 queued, and the liar ranked best per dollar (released last).
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid as uuid_module
from datetime import datetime, timedelta, timezone

import pytest
import requests
from helpers.serving import ADMIN_TOKEN, Manager
from helpers.stand_in_market import Market, stand_in

from vastctl.state import lifecycle, rates
from vastctl.state.lifecycle import State
from vastctl.state.plausible import MAX_RATE_PER_GPU
from vastctl.validate import MAX_INT

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


# --- over HTTP: a real `vastctl serve` ---------------------------------------------------------------


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("claims"), gate=40).start(0, "--timeout", "2")
    yield m
    assert m.stop() == 0


def post(manager, uuid, report, body=None):
    response = requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", data=json.dumps(body or {}), timeout=10,
                             headers={"Authorization": f"Bearer {manager.token(uuid)}"})
    assert response.status_code == 200, response.text
    return response.json()


def to_running(manager, uuid, rate):
    post(manager, uuid, "register", {"label": f"vastctl-{uuid[:12]}", "gpu_name": "RTX 4090", "num_gpus": 1})
    post(manager, uuid, "params-done")
    post(manager, uuid, "bench-report", {"rate": rate})
    post(manager, uuid, "running")


def fleet(manager):
    response = requests.get(f"{manager.url}/v1/fleet", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=10)
    assert response.status_code == 200
    return response.json()


def implausible_events(manager, uuid):
    return [e for e in manager.events(uuid) if e["kind"] == "implausible_rate"]


@pytest.mark.slow
def test_a_leaping_heartbeat_counter_over_http_is_bounded_and_recorded(manager):
    honest, liar = f"h-{uuid_module.uuid4()}", f"l-{uuid_module.uuid4()}"
    to_running(manager, honest, 70)
    to_running(manager, liar, 70)
    for uuid in (honest, liar):
        post(manager, uuid, "heartbeat", {"proofs_done": 0})
    post(manager, honest, "heartbeat", {"proofs_done": 1})
    post(manager, liar, "heartbeat", {"proofs_done": MAX_INT})
    post(manager, liar, "heartbeat", {"proofs_done": MAX_INT})  # the same claim again: no second event
    rows = manager.rows()
    assert rows[liar]["proofs_done"] == MAX_INT  # the claim is kept as said; the rate it implies is not
    assert rows[liar]["proofs_per_hour"] <= 2 * 70
    (event,) = implausible_events(manager, liar)
    assert event["source"] == "instance" and "not plausible" in event["reason"] and "140" in event["reason"]
    assert implausible_events(manager, honest) == []
    capacity = fleet(manager)["summary"]["capacity_proofs_per_hour"]
    assert capacity <= 70 + 2 * 70  # the honest machine and the liar at its bound; before: ~1e19


@pytest.mark.slow
def test_an_impossible_bench_rate_over_http_counts_as_the_ceiling(manager):
    liar = f"b-{uuid_module.uuid4()}"
    post(manager, liar, "register", {"label": f"vastctl-{liar[:12]}", "gpu_name": "RTX 4090", "num_gpus": 1})
    post(manager, liar, "params-done")
    for _ in range(2):  # delivered twice: one answer, one transition, one implausible event
        assert post(manager, liar, "bench-report", {"rate": 1e308}) == {"state": "bench_done", "passed": True}
    assert manager.rows()[liar]["bench_rate"] == MAX_RATE_PER_GPU
    (event,) = implausible_events(manager, liar)
    assert "1e+308" in event["reason"] and f"counted as {MAX_RATE_PER_GPU:g}" in event["reason"]
    assert [e["to_state"] for e in manager.events(liar)].count("bench_done") == 1


# --- at the command line ----------------------------------------------------------------------------


@pytest.fixture
def market(monkeypatch):
    return stand_in(monkeypatch, Market(dph=lambda i: 0.4))


@pytest.fixture
def ready(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n"
                      "launch:\n  vastctl_source: vastctl\n  install: ./install-provers.sh\n"
                      "fleet:\n  target_proofs_per_hour: 300\n  max_instances: 10\n  max_hourly_spend: 10\n"
                      "agent:\n  max_actions_per_step: 5\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    assert cli("init").code == 0


def machine(cli, label, rate, vast_id, dph=0.4):
    """A machine reporting its way to running at the command line, with what its launch would have recorded."""
    uuid = f"u-{label}"
    for args in (["register", "--uuid", uuid, "--label", label, "--gpu", "RTX 4090"], ["params-done", "--uuid", uuid],
                 ["bench-report", "--uuid", uuid, "--rate", str(rate)], ["running", "--uuid", uuid],
                 ["heartbeat", "--uuid", uuid, "--proofs-done", "0"]):
        assert cli(*args).code == 0, args
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:
        raw.execute("UPDATE instances SET vast_id = ?, dph = ? WHERE uuid = ?", (vast_id, dph, uuid))
    return uuid


def step(cli, *extra):
    result = cli("agent-step", "--policy", "rules", "--json", *extra)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize("lie", [["bench-report", "--rate", "1e308"], ["heartbeat", "--proofs-done", str(MAX_INT)]])
def test_with_59_queued_a_liar_does_not_stop_the_fleet_growing(ready, cli, market, db_path, lie):
    machine(cli, "vastctl-a", 70, 500)
    if lie[0] == "bench-report":  # the liar benches at 1e308/h
        uuid = "u-vastctl-b"
        for args in (["register", "--uuid", uuid, "--label", "vastctl-b", "--gpu", "RTX 4090"],
                     ["params-done", "--uuid", uuid], ["bench-report", "--uuid", uuid, "--rate", "1e308"],
                     ["running", "--uuid", uuid]):
            assert cli(*args).code == 0, args
    else:  # the liar benches honestly, then its counter leaps to 2^63-1
        uuid = machine(cli, "vastctl-b", 70, 501)
        assert cli("heartbeat", "--uuid", uuid, "--proofs-done", str(MAX_INT)).code == 0
    # 59 queued and 400 PoRep coming (320/h over the 75 min look-ahead window): more than the honest 140/h
    assert cli("demand", "report", "--queued", "59", "--lookahead", "400").code == 0
    data = step(cli)
    launches = [a for a in data["actions"] if a["kind"] == "launch"]
    assert launches and all(a["result"].startswith("launched") for a in launches)
    assert ("create", 1) in market.calls
    observed = json.loads(sqlite3.connect(db_path).execute("SELECT observation FROM agent_steps").fetchone()[0])
    assert observed["capacity"] == 70 + 70  # the liar counts for its model's honest rate; before: ~1e19
    assert "capacity 140 of 345 proofs/h" in launches[0]["reason"]
    events = json.loads(cli("events", "--json").out)
    assert [e["label"] for e in events if e["kind"] == "implausible_rate"] == ["vastctl-b"]


def test_the_liar_is_not_released_last(ready, cli, market, db_path):
    """Queue empty past the cooldown: machines are released least proofs per dollar first, the liar among them
    at its model's honest rate, not at the 1e308/h it claimed."""
    machine(cli, "vastctl-a", 60, 500)
    machine(cli, "vastctl-b", 1e308, 501)
    machine(cli, "vastctl-c", 90, 502)
    assert cli("settings", "set", "target_proofs_per_hour", "0").code == 0
    assert cli("demand", "report", "--queued", "0").code == 0
    with sqlite3.connect(db_path) as raw:  # the empty queue was first seen two hours ago
        raw.execute("UPDATE demand_samples SET at = ?", ((datetime.now(timezone.utc) - timedelta(hours=2))
                                                       .strftime("%Y-%m-%dT%H:%M:%S.%fZ"),))
    assert cli("demand", "report", "--queued", "0").code == 0  # and it is still empty now
    data = step(cli, "--dry-run")
    stops = [a["label"] for a in data["actions"] if a["kind"] == "stop"]
    assert stops == ["vastctl-a", "vastctl-b", "vastctl-c"]  # 60/h, 75/h (the median of a and c), 90/h


def test_the_fleet_table_shows_the_bounded_figures(ready, cli, market):
    machine(cli, "vastctl-b", 1e308, 501)
    view = json.loads(cli("fleet", "--json").out)
    (row,) = view["instances"]
    assert row["bench_rate"] == MAX_RATE_PER_GPU
    assert view["summary"]["capacity_proofs_per_hour"] <= MAX_RATE_PER_GPU


# --- the bounds themselves, on the lifecycle ---------------------------------------------------------


def running_machine(conn, uuid="u1", bench=70.0, num_gpus=1):
    lifecycle.create(conn, uuid=uuid, label=f"vastctl-{uuid}", state=State.REGISTERED, reason="test",
                     source="operator", now=T0, fields={"num_gpus": num_gpus})
    lifecycle.params_done(conn, uuid, now=T0)
    rates.bench_report(conn, uuid, bench, gate=40, now=T0)
    lifecycle.running(conn, uuid, now=T0)
    return rates.heartbeat(conn, uuid, proofs_done=0, now=T0)


def beat(conn, proofs, seconds, uuid="u1"):
    return rates.heartbeat(conn, uuid, proofs_done=proofs, now=T0 + timedelta(seconds=seconds))


def implausible(conn, uuid="u1"):
    return conn.execute("SELECT count(*) FROM events WHERE uuid = ? AND kind = 'implausible_rate'",
                        (uuid,)).fetchone()[0]


def test_a_liar_that_keeps_lying_is_recorded_once_an_hour_and_stays_at_its_bound(conn):
    running_machine(conn, bench=70)
    proofs = 0
    for minute in range(1, 121):
        proofs += 1000
        row = beat(conn, proofs, minute * 60)
        assert row["proofs_per_hour"] <= 140
    assert row["proofs_per_hour"] == pytest.approx(140, abs=2)
    assert implausible(conn) == 2  # at minute 1 and at minute 61


def test_an_honest_batch_of_proofs_is_not_called_a_lie(conn):
    running_machine(conn, bench=70)
    row = beat(conn, 5, 30)  # a -j 5 batch lands between two beats
    assert implausible(conn) == 0 and 70 < row["proofs_per_hour"] < 80


def test_the_ceiling_counts_each_gpu_up_to_eight(conn):
    lifecycle.create(conn, uuid="u8", label="vastctl-u8", state=State.PARAMS_DONE, reason="test", source="operator",
                     now=T0, fields={"num_gpus": 4})
    assert rates.bench_report(conn, "u8", 500, gate=40, now=T0)["bench_rate"] == 500
    assert implausible(conn, "u8") == 0
    lifecycle.create(conn, uuid="u9", label="vastctl-u9", state=State.PARAMS_DONE, reason="test", source="operator",
                     now=T0, fields={"num_gpus": 10**6})
    assert rates.bench_report(conn, "u9", 1e9, gate=40, now=T0)["bench_rate"] == 8 * MAX_RATE_PER_GPU


def test_rows_written_before_the_bounds_are_bounded_by_the_migration_and_counted_so(conn, config):
    """The read path bounds nothing: a row from before the bounds is bounded once, by the migration (test_db
    builds such a file; here its statements run on the row), and then counts as it is stored."""
    from vastctl.observe import observe
    from vastctl.state import db, migrations

    running_machine(conn, bench=70)
    conn.execute("UPDATE instances SET bench_rate = 1e308, proofs_per_hour = 1e19")
    (sql,) = [m.sql for m in migrations.MIGRATIONS if m.name.startswith("a machine's stored rates within")]
    for statement in db._statements(sql):
        conn.execute(statement)
    assert (lifecycle.get(conn, "u1")["bench_rate"], lifecycle.get(conn, "u1")["proofs_per_hour"]) == (
        MAX_RATE_PER_GPU, MAX_RATE_PER_GPU)
    obs = observe(conn, config, now=T0)
    assert obs.capacity == MAX_RATE_PER_GPU


def test_a_first_measured_rate_is_stored_within_its_bound(conn):
    """With no bench to start from, the first rate is the window's own: a burst within BURST_PROOFS of the bound
    is not called a lie, and is still stored no higher than the bound (nothing bounds it when it is read)."""
    lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=State.RUNNING, reason="test", source="operator",
                     now=T0, fields={"num_gpus": 1})
    beat(conn, 0, 0)
    row = beat(conn, int(MAX_RATE_PER_GPU * 600 / 3600) + 5, 600)  # 38 in 10 min: 228/h taken alone
    assert row["proofs_per_hour"] == MAX_RATE_PER_GPU and implausible(conn) == 0


def test_a_lower_bench_after_a_restart_lowers_the_stored_measured_rate(conn):
    running_machine(conn, bench=100)
    conn.execute("UPDATE instances SET proofs_per_hour = 190")  # measured before the restart, within 2 × 100
    lifecycle.register(conn, "u1", now=T0)  # the container restarted
    lifecycle.params_done(conn, "u1", now=T0)
    row = rates.bench_report(conn, "u1", 50, gate=40, now=T0)
    assert (row["bench_rate"], row["proofs_per_hour"]) == (50, 100)


def test_an_adopted_machine_re_saying_fewer_gpus_lowers_its_stored_rates(conn):
    lifecycle.register(conn, "u1", label="vastctl-u1", num_gpus=4, now=T0)
    lifecycle.params_done(conn, "u1", now=T0)
    rates.bench_report(conn, "u1", 700, gate=40, now=T0)
    lifecycle.running(conn, "u1", now=T0)
    conn.execute("UPDATE instances SET proofs_per_hour = 750")
    row = lifecycle.register(conn, "u1", num_gpus=1, now=T0)  # restarted, and now says it has one GPU
    assert (row["num_gpus"], row["bench_rate"], row["proofs_per_hour"]) == (1, MAX_RATE_PER_GPU, MAX_RATE_PER_GPU)


def test_the_observation_flags_the_liar_and_counts_it_at_its_models_rate(conn, config):
    from vastctl.observe import observe

    for uuid, bench in (("a", 60.0), ("b", 1e308), ("c", 90.0)):
        running_machine(conn, uuid=uuid, bench=bench)
    conn.execute("UPDATE instances SET gpu_name = 'RTX 4090'")
    obs = observe(conn, config, now=T0)
    rates = {m["uuid"]: m["expected_rate"] for m in obs.machines}
    assert rates == {"a": 60.0, "b": 75.0, "c": 90.0} and obs.model_rates == {"RTX 4090": 75.0}
    flags = {m["uuid"]: m.get("implausible_claims") for m in obs.machines}
    assert flags == {"a": None, "b": 1, "c": None}
    assert [m["implausible_claims"] for m in obs.to_prompt()["machines"] if "implausible_claims" in m] == [1]


# --- the proofs cost counts: every run of the prover, each heartbeat bounded ---------------------------------


def resets(conn, uuid="u1"):
    return conn.execute("SELECT reason FROM events WHERE uuid = ? AND kind = 'counter_reset'", (uuid,)).fetchall()


def test_a_restarted_counter_adds_a_new_run_and_never_lowers_the_total(conn):
    running_machine(conn, bench=70)
    assert beat(conn, 100, 3600)["proofs_total"] == 100
    row = beat(conn, 5, 3660)  # the daemon restarted: its counter starts again
    assert row["proofs_total"] == 105 and row["proofs_done"] == 5
    assert beat(conn, 7, 3720)["proofs_total"] == 107
    (reset,) = resets(conn)
    assert "fell from 100 to 5" in reset["reason"] and "total 105" in reset["reason"]


def test_one_heartbeat_claiming_10_18_proofs_adds_what_a_minute_can(conn):
    running_machine(conn, bench=70)
    row = beat(conn, 10**18, 60)
    assert row["proofs_total"] == int(140 * 60 / 3600) + rates.BURST_PROOFS  # 2 × bench for a minute + a batch
    assert implausible(conn) == 1
    assert beat(conn, 10**18 + 1, 120)["proofs_total"] == row["proofs_total"] + 1  # honest from there on


def test_a_restart_that_claims_more_than_possible_is_bounded_too(conn):
    running_machine(conn, bench=70)
    beat(conn, 50, 3600)
    assert beat(conn, 10**18 - 1, 3601)["proofs_total"] == 50 + rates.BURST_PROOFS  # a leap up: bounded
    row = beat(conn, 3, 3602)  # now lower than the last: a new run of 3
    assert row["proofs_total"] == 50 + rates.BURST_PROOFS + 3 and len(resets(conn)) == 1


@pytest.mark.slow
def test_a_counter_reset_over_http_loses_nothing_and_is_one_event(tmp_path, cli):
    """Real heartbeats to a real `vastctl serve`: 100, then serve and the prover restart, then 5 → 105."""
    manager = Manager(tmp_path, gate=40).start(0, "--timeout", "2")
    uuid = f"r-{uuid_module.uuid4()}"
    try:
        to_running(manager, uuid, 70)
        post(manager, uuid, "heartbeat", {"proofs_done": 0})
        with sqlite3.connect(manager.db_path) as raw:  # that heartbeat an hour ago: 100 proofs since are plausible
            raw.execute("UPDATE instances SET last_heartbeat_at = ? WHERE uuid = ?",
                        ((datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), uuid))
        post(manager, uuid, "heartbeat", {"proofs_done": 100})
        assert manager.stop() == 0
        manager.start(0, "--timeout", "2")
        post(manager, uuid, "heartbeat", {"proofs_done": 5})
        post(manager, uuid, "heartbeat", {"proofs_done": 5})  # the same count again: no second reset
    finally:
        assert manager.stop() == 0
    row = manager.rows()[uuid]
    assert (row["proofs_done"], row["proofs_total"]) == (5, 105)
    assert [e["kind"] for e in manager.events(uuid)].count("counter_reset") == 1
    assert implausible_events(manager, uuid) == []
    result = cli("--db", str(manager.db_path), "cost", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["proofs"] == 105


def test_cost_at_the_command_line_counts_a_10_18_heartbeat_as_what_the_machine_could_prove(ready, cli, market):
    uuid = machine(cli, "vastctl-a", 70, 500)
    assert cli("heartbeat", "--uuid", uuid, "--proofs-done", str(10**18)).code == 0
    figures = json.loads(cli("cost", "--json").out)
    assert 0 < figures["proofs"] <= rates.BURST_PROOFS + 1  # seconds of proving at 140/h, and a batch
    assert json.loads(cli("fleet", "--json").out)["instances"][0]["proofs_done"] == 10**18  # the claim, kept
