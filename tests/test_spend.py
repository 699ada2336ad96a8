"""Spend is what vast bills us for, as far as the file and the last good listing know.

The incident: a killed machine whose destroy was still pending, a machine vast listed under another label
(ours by id) and the disks of stopped machines all dropped out of the spend, so `max_hourly_spend 0.8`
let a launch through while vast billed $1.17/h. Each component is tested on observe(), then the incident at
the command line: `fleet --json` and the guard of `launch` read the same figure.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
import responses

from vastctl import clock, guard, reconcile
from vastctl import config as config_module
from vastctl.observe import observe
from vastctl.providers.base import RemoteInstance
from vastctl.state import db, lifecycle, migrations
from vastctl.state.lifecycle import KillCode, State

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
CFG = config_module.from_mapping({"fleet": {"max_hourly_spend": 0.8, "max_dph": 1.0, "max_instances": 10}})
API = "https://vast.test"


def put(conn, label, state, *, vast_id, dph, at=NOW - timedelta(hours=1)):
    """A row as a launch leaves it (offer recorded), then moved to `state` at `at`."""
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=State.LAUNCHING, reason="t", source="operator",
                     now=at - timedelta(minutes=10), fields={"vast_id": vast_id, "dph": dph, "offer_id": vast_id})
    path = [State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING]
    if state in path:
        for step in path[: path.index(state) + 1]:
            lifecycle.transition(conn, uuid, step, "t", "instance", now=at)
    elif state == State.KILLED:
        lifecycle.kill(conn, uuid, "t", source="operator", code=KillCode.OPERATOR, now=at)
    elif state != State.LAUNCHING:
        lifecycle.transition(conn, uuid, state, "t", "operator", now=at)
    return uuid


def listed(conn, *entries, at=NOW - timedelta(minutes=1)):
    """A good listing recorded the way a reconcile pass records it."""
    rows = [dict(r) for r in conn.execute("SELECT * FROM instances WHERE destroyed_at IS NULL")]
    matched = reconcile.match(rows, entries, "vastctl-")
    reconcile.record_listing(conn, rows, entries, matched, at)


def vast(vast_id, label, status="running", dph=0.4, storage=None):
    return RemoteInstance(id=vast_id, label=label, actual_status=status, intended_status=status,
                          cur_state="stopped" if status == "stopped" else "running", dph_total=dph,
                          storage_dph=storage)


def spend(conn):
    return observe(conn, CFG, now=NOW).spend_per_hour


def test_a_killed_machine_bills_until_its_destroy_is_confirmed(conn):
    uuid = put(conn, "vastctl-k", State.KILLED, vast_id=402, dph=0.4)
    assert spend(conn) == pytest.approx(0.4)
    conn.execute("UPDATE instances SET destroyed_at = ? WHERE uuid = ?", (clock.to_iso(NOW), uuid))
    assert spend(conn) == 0.0


def test_a_killed_row_with_nothing_rented_bills_nothing(conn):
    put(conn, "vastctl-k", State.KILLED, vast_id=None, dph=0.4)
    assert spend(conn) == 0.0


def test_an_instance_listed_under_another_label_is_ours_by_id(conn):
    put(conn, "vastctl-x", State.KILLED, vast_id=403, dph=0.3, at=NOW - timedelta(hours=2))
    listed(conn, vast(403, "someone renamed it", dph=0.32))
    assert spend(conn) == pytest.approx(0.32)  # vast's price, heard after the kill


def test_an_instance_still_listed_after_its_destroy_bills(conn):
    uuid = put(conn, "vastctl-d", State.KILLED, vast_id=404, dph=0.3, at=NOW - timedelta(hours=2))
    conn.execute("UPDATE instances SET destroyed_at = ? WHERE uuid = ?", (clock.to_iso(NOW - timedelta(hours=1)), uuid))
    listed(conn, vast(404, "vastctl-d", dph=0.3))
    assert spend(conn) == pytest.approx(0.3)
    listed(conn, vast(404, "vastctl-d", dph=0.3))
    conn.execute("UPDATE vast_cache SET cur_state = 'unloaded'")
    assert spend(conn) == 0.0


def test_a_stopped_machine_bills_its_disk(conn):
    put(conn, "vastctl-s", State.STOPPED, vast_id=405, dph=0.4, at=NOW - timedelta(hours=2))
    assert spend(conn) == pytest.approx(0.4)  # no disk price known yet: never counted as nothing
    listed(conn, vast(405, "vastctl-s", status="stopped", dph=0.4, storage=0.05))
    assert spend(conn) == pytest.approx(0.05)


def test_an_orphan_with_our_prefix_bills_and_someone_elses_machine_is_not_ours(conn):
    listed(conn, vast(406, "vastctl-orphan", dph=0.25), vast(407, "jupyter-box", dph=2.0))
    assert spend(conn) == pytest.approx(0.25)


def test_a_launch_that_crashed_before_recording_its_id_counts_once(conn):
    put(conn, "vastctl-c", State.LAUNCHING, vast_id=None, dph=0.4, at=NOW - timedelta(hours=1))
    # nothing listed yet: the row's own price
    assert spend(conn) == pytest.approx(0.4)
    conn.execute("INSERT INTO vast_cache (vast_id, label, actual_status, dph, first_seen_at, seen_at)"
                 " VALUES (412, 'vastctl-c', 'running', 0.42, ?, ?)", (clock.to_iso(NOW),) * 2)
    assert spend(conn) == pytest.approx(0.42)  # vast lists it by label: that machine, once, at vast's price


def test_whichever_heard_last_decides(conn):
    # stopped here after the listing that still showed it running: the disk only (vast's price known)
    listed(conn, vast(408, "vastctl-late", dph=0.4, storage=0.05), at=NOW - timedelta(hours=2))
    put(conn, "vastctl-late", State.STOPPED, vast_id=408, dph=0.4, at=NOW - timedelta(hours=1))
    assert spend(conn) == pytest.approx(0.05)
    # vast says running after we stopped it (the stop did not take): the GPU bills
    listed(conn, vast(408, "vastctl-late", dph=0.4, storage=0.05))
    assert spend(conn) == pytest.approx(0.4)


def test_a_listed_price_that_is_no_price_falls_back_to_the_row(conn):
    put(conn, "vastctl-r", State.RUNNING, vast_id=409, dph=0.4, at=NOW - timedelta(hours=2))
    listed(conn, vast(409, "vastctl-r", dph=None))
    assert spend(conn) == pytest.approx(0.4)
    conn.execute("UPDATE instances SET dph = -20")  # a row written before prices were checked lowers nothing:
    conn.execute("UPDATE vast_cache SET dph = NULL")  # its price is none once the migration has run (test_db)
    (sql,) = [m.sql for m in migrations.MIGRATIONS if m.name.startswith("a machine's stored rates within")]
    for statement in db._statements(sql):
        conn.execute(statement)
    assert conn.execute("SELECT dph FROM instances").fetchone()[0] is None
    assert spend(conn) == 0.0


def test_resuming_a_stopped_machine_adds_its_price_less_its_disk(conn):
    put(conn, "vastctl-a", State.RUNNING, vast_id=410, dph=0.4, at=NOW - timedelta(hours=2))
    put(conn, "vastctl-s", State.STOPPED, vast_id=411, dph=0.4, at=NOW - timedelta(hours=2))
    listed(conn, vast(410, "vastctl-a"), vast(411, "vastctl-s", status="stopped", storage=0.05))
    obs = observe(conn, CFG, now=NOW)
    assert obs.spend_per_hour == pytest.approx(0.45)
    start = guard.Action(kind="start", actor="operator", label="vastctl-s", uuid="u-vastctl-s")
    assert guard.check(obs, start, CFG).allowed  # 0.45 + 0.35 = 0.80: at the limit, not over it
    other = guard.Action(kind="launch", actor="operator", offer_id=1, gpu_name="RTX 4090", dph=0.36)
    verdict = guard.check(obs, other, CFG, earlier=[start])
    assert not verdict.allowed and verdict.limit == "max_hourly_spend" and "$1.16/h" in verdict.why


# --- the incident at the command line -------------------------------------------------------------------


@pytest.fixture
def ready(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n"
                      "fleet:\n  max_instances: 10\n  max_dph: 1.0\n  max_hourly_spend: 0.8\n"
                      "launch:\n  image: ghcr.io/x/cuzk:1\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    monkeypatch.setenv("VAST_API_KEY", "spend-test-key-31337")
    monkeypatch.setenv("VAST_API_URL", API)
    assert cli("init").code == 0


def test_the_incident_no_launch_while_vast_bills_more_than_the_limit(ready, cli, db_path):
    conn = db.connect(db_path, now=clock.SYSTEM.now())
    now = clock.SYSTEM.now()
    earlier = now - timedelta(hours=1)
    put(conn, "vastctl-run", State.RUNNING, vast_id=501, dph=0.4, at=earlier)
    put(conn, "vastctl-kill", State.KILLED, vast_id=502, dph=0.4, at=earlier)         # destroy pending
    put(conn, "vastctl-stop", State.STOPPED, vast_id=503, dph=0.4, at=earlier)        # its disk bills
    put(conn, "vastctl-renamed", State.KILLED, vast_id=504, dph=0.3, at=earlier)      # vast lists it as 'x'
    listed(conn, vast(501, "vastctl-run", dph=0.4), vast(503, "vastctl-stop", status="stopped", storage=0.05),
           vast(504, "x", dph=0.32), at=now - timedelta(minutes=1))
    conn.close()
    summary = json.loads(cli("fleet", "--json").out)["summary"]
    assert summary["spend_per_hour"] == pytest.approx(0.4 + 0.4 + 0.05 + 0.32)  # $1.17/h; before: $0.40/h
    with responses.RequestsMock(assert_all_requests_are_fired=False) as fake_vast:
        fake_vast.post(f"{API}/api/v0/bundles/", json={"offers": [
            {"id": 7, "machine_id": 70, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.3, "cpu_ram": 515000,
             "inet_down": 900.0, "reliability": 0.99}]})
        result = cli("launch", "--offer", "7")
        assert [c.request.method for c in fake_vast.calls] == ["POST"]  # searched; nothing rented
    assert result.code == 4 and "max_hourly_spend" in result.err and "$1.47/h" in result.err
    assert result.err.strip().count("\n") == 0 and result.err.startswith("error: ")
    raw = sqlite3.connect(db_path)
    assert raw.execute("SELECT count(*) FROM instances").fetchone()[0] == 4
    refused = raw.execute("SELECT result FROM actions WHERE kind = 'launch' AND ok = 0").fetchall()
    assert refused and "max_hourly_spend" in refused[-1][0]


def test_a_reconcile_pass_keeps_the_disk_price_vast_listed(ready, cli, db_path, monkeypatch):
    class Market:
        def list_instances(self):
            return [vast(601, "vastctl-s", status="stopped", dph=0.4, storage=0.06)]

    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: Market())
    conn = db.connect(db_path, now=clock.SYSTEM.now())
    put(conn, "vastctl-s", State.STOPPED, vast_id=601, dph=0.4, at=clock.SYSTEM.now() - timedelta(hours=1))
    conn.close()
    assert json.loads(cli("fleet", "--json").out)["summary"]["spend_per_hour"] == pytest.approx(0.4)
    assert cli("reconcile").code == 0
    assert json.loads(cli("fleet", "--json").out)["summary"]["spend_per_hour"] == pytest.approx(0.06)
