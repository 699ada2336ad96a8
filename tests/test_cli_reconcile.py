"""`vastctl reconcile` and fleet's view of vast: exit codes, output, and the rows left in the file."""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import timedelta

import pytest

from vastctl import clock
from vastctl.providers.base import ProviderError, RemoteInstance
from vastctl.state import lifecycle, locks


class Market:
    def __init__(self):
        self.instances: dict[int, RemoteInstance] = {}
        self.list_error: Exception | None = None
        self.destroy_error: Exception | None = None
        self.destroyed: list[int] = []

    def list_instances(self):
        if self.list_error:
            raise self.list_error
        return list(self.instances.values())

    def destroy_instance(self, vast_id):
        if self.destroy_error:
            raise self.destroy_error
        self.destroyed.append(vast_id)
        self.instances.pop(vast_id, None)


@pytest.fixture
def market(monkeypatch):
    fake = Market()
    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: fake)
    return fake


def put(store, market, label, vast_id, state="running", status="running", minutes_ago=30, heartbeat_ago=1, **fields):
    now = clock.SYSTEM.now()
    uuid = f"u-{label}"
    lifecycle.create(store, uuid=uuid, label=label, state=lifecycle.State.LAUNCHING, reason="launched",
                     source="operator", now=now - timedelta(minutes=minutes_ago), fields={"vast_id": vast_id})
    columns = {"state": state, "last_heartbeat_at": clock.to_iso(now - timedelta(minutes=heartbeat_ago)), **fields}
    store.execute(f"UPDATE instances SET {', '.join(f'{k} = ?' for k in columns)} WHERE uuid = ?",
                  (*columns.values(), uuid))
    if status is not None:
        market.instances[vast_id] = RemoteInstance(id=vast_id, label=label, actual_status=status,
                                                   intended_status="running")
    return uuid


def row(store, uuid):
    return dict(store.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone())


def test_json_shape_and_rows(store, cli, market):
    stale = put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    healthy = put(store, market, "vastctl-b", 12)
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert set(data) >= {"actions", "refused", "errors"}
    assert data["refused"] == [] and data["errors"] == []
    assert [(a["kind"], a["label"], a["result"]) for a in data["actions"]] == [
        ("kill", "vastctl-a", "killed"), ("destroy", "vastctl-a", "destroyed")]
    assert all(set(a) >= {"kind", "label", "reason", "result"} for a in data["actions"])
    assert data["actions"][0]["reason"].startswith("no heartbeat for 30m (limit 10m)")
    assert row(store, stale)["state"] == "killed" and row(store, stale)["destroyed_at"]
    assert row(store, healthy)["state"] == "running" and row(store, healthy)["vast_status"] == "running"
    assert market.destroyed == [11]
    assert "2 vast instances listed; 1 kill(s), 1 destroy(s)" in result.err


def test_table_output(store, cli, market):
    put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    result = cli("reconcile")
    assert result.code == 0
    lines = result.out.splitlines()  # one line per action: time kind label (vast id) result: reason [code]
    assert len(lines) == 2 and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line) for line in lines)
    assert lines[0].split()[1:5] == ["kill", "vastctl-a", "(vast", "11)"] and lines[0].endswith("[heartbeat_timeout]")
    assert lines[1].split()[1:6] == ["destroy", "vastctl-a", "(vast", "11)", "destroyed:"]


def test_vast_status_text_never_reaches_the_table_raw(store, cli, market):
    put(store, market, "vastctl-a", 11, state="registered", status="exited")
    hostile = "OCI runtime create failed: \x1b]0;pwned\x07\x1b[31mno GPU\u202e"  # a start failure, with escapes
    market.instances[11].status_msg = hostile
    result = cli("reconcile")
    assert result.code == 0
    assert "\x1b" not in result.out and "\u202e" not in result.out
    assert "OCI runtime create failed: \\x1b]0;pwned\\x07\\x1b[31mno GPU" in result.out
    data = json.loads(cli("events", "--json").out)
    assert "\x1b" not in data[-1]["reason"] and "\\x1b[31m" in data[-1]["reason"]
    # the file keeps vast's own text as it came
    assert row(store, "u-vastctl-a")["vast_status_msg"] == hostile


def test_nothing_to_do_prints_no_rows(store, cli, market):
    put(store, market, "vastctl-a", 11)
    result = cli("reconcile")
    assert (result.code, result.out) == (0, "")
    assert json.loads(cli("reconcile", "--json").out) == {"actions": [], "refused": [], "errors": [], "listed": 1,
                                                          "dry_run": False, "deadline_passed": False}


def test_dry_run_changes_nothing(store, cli, market, db_path):
    stale = put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    snapshot = list(sqlite3.connect(db_path).iterdump())
    result = cli("reconcile", "--dry-run", "--json")
    assert result.code == 0
    data = json.loads(result.out)
    assert [(a["kind"], a["result"]) for a in data["actions"]] == [("kill", "planned (dry run)"),
                                                                   ("destroy", "planned (dry run)")]
    assert list(sqlite3.connect(db_path).iterdump()) == snapshot
    assert row(store, stale)["state"] == "running" and market.destroyed == []


def test_failed_listing_is_exit_1_one_error_line(store, cli, market):
    uuid = put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    market.list_error = ProviderError("vast GET /api/v1/instances/: HTTP 503 down: retry later")
    result = cli("reconcile", "--json")
    assert result.code == 1 and result.out == ""
    assert result.err == "error: vast GET /api/v1/instances/: HTTP 503 down: retry later\n"
    assert row(store, uuid)["state"] == "running"
    assert store.execute("SELECT ok FROM vast_listings").fetchone()[0] == 0


def test_distrusted_listing_is_exit_1(store, cli, market):
    uuids = [put(store, market, f"vastctl-{n}", 10 + n) for n in range(3)]
    market.instances.clear()
    result = cli("reconcile")
    assert result.code == 1
    assert result.err.startswith("error: vast listing distrusted: 3 of 3 live machines vanished at once")
    assert len(result.err.splitlines()) == 1
    assert all(row(store, u)["state"] == "running" for u in uuids)


def test_lock_held_is_exit_1(store, cli, market):
    uuid = put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    locks.acquire(store, "reconcile", ttl_s=600, holder="otherhost:42", now=clock.SYSTEM.now())
    result = cli("reconcile")
    assert result.code == 1 and "another reconcile is running (otherhost:42" in result.err
    assert row(store, uuid)["state"] == "running"


def test_failed_destroy_is_exit_0_with_the_error_reported(store, cli, market):
    uuid = put(store, market, "vastctl-a", 11, heartbeat_ago=30)
    market.destroy_error = ProviderError("vast DELETE /api/v0/instances/11/: HTTP 500 oops: retry later")
    result = cli("reconcile", "--json")
    assert result.code == 0
    data = json.loads(result.out)
    assert data["actions"][1]["result"].startswith("destroy failed (attempt 1)")
    assert len(data["errors"]) == 1 and "HTTP 500" in data["errors"][0]
    assert "warning: vastctl-a (vast 11)" in result.err
    assert row(store, uuid)["destroyed_at"] is None
    market.destroy_error = None
    assert json.loads(cli("reconcile", "--json").out)["actions"][0]["result"] == "destroyed"
    assert row(store, uuid)["destroyed_at"]


def test_no_api_key_is_a_usage_error(store, cli):
    result = cli("reconcile")
    assert result.code == 2 and result.err.startswith("error: no vast.ai API key")


# --- fleet's view of vast ------------------------------------------------------------------------


def test_fleet_shows_vast_status_disagreement_and_listing_age(store, cli, market):
    put(store, market, "vastctl-a", 11)
    put(store, market, "vastctl-b", 12, status="exited")
    put(store, market, "vastctl-c", 13, status=None)  # vast does not list it
    put(store, market, "vastctl-d", 14)
    assert cli("reconcile").code == 0
    data = json.loads(cli("fleet", "--json").out)
    by_label = {i["label"]: i for i in data["instances"]}
    assert by_label["vastctl-a"]["vast_status"] == "running" and by_label["vastctl-a"]["disagreement"] is None
    assert by_label["vastctl-b"]["vast_status"] == "exited"
    assert by_label["vastctl-b"]["disagreement"] == "running here but vast says exited"
    assert by_label["vastctl-c"]["vast_status"] is None and by_label["vastctl-c"]["vast_missing"] == 1
    assert by_label["vastctl-c"]["disagreement"] == "missing from vast (1 listing)"
    summary = data["summary"]
    assert summary["disagreements"] == 2 and summary["listing_instances"] == 3
    assert 0 <= summary["listing_age_s"] < 60 and summary["listing_at"].endswith("Z")
    assert summary["listing_error"] is None
    table = cli("fleet")
    lines = table.out.splitlines()
    assert "exited !" in next(line for line in lines if line.startswith("vastctl-b"))
    assert "missing !" in next(line for line in lines if line.startswith("vastctl-c"))
    assert " · vast listed " in lines[-1] and lines[-1].endswith(" ago")


def test_fleet_warns_when_the_last_listing_failed(store, cli, market):
    put(store, market, "vastctl-a", 11)
    assert cli("reconcile").code == 0
    market.list_error = ProviderError("vast GET /api/v1/instances/: unreachable after 4 attempts: retry later")
    assert cli("reconcile").code == 1
    result = cli("fleet")
    assert result.code == 0 and "warning: the last vast listing failed: vast GET" in result.err
    data = json.loads(cli("fleet", "--json").out)["summary"]
    assert data["listing_error"].startswith("vast GET") and data["listing_at"] is not None


def test_fleet_before_any_listing(store, cli, market):
    put(store, market, "vastctl-a", 11)
    data = json.loads(cli("fleet", "--json").out)
    assert data["summary"]["listing_at"] is None and data["summary"]["listing_age_s"] is None
    assert data["instances"][0]["vast_status"] is None and data["instances"][0]["disagreement"] is None
    assert "vast has not been listed yet" in cli("fleet").err
