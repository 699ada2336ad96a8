"""What spends money is recorded before it is spent and completed after: a kill -9 or a crash at any point
around a create leaves a `pending` launch in the audit under the machine's label (reconcile completes it when
it finds the machine), and on a full disk no create goes out when that intent cannot be written."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timezone

import pytest
from helpers.fake_vast import KEY, FakeVast, FakeVastHandler
from helpers.operations_market import FakeMarket, offer
from helpers.serving import on_a_thread, query, wait_for

from vastctl import launches, operations
from vastctl.errors import Unavailable
from vastctl.state import db
from vastctl.state.audit import PENDING

LAUNCH = ("launch", "--gpu", "RTX 4090", "--json")


class BlockingHandler(FakeVastHandler):
    """A create arrives whole, is noted, then waits until the test lets vast go on (and rent the machine)."""

    early: dict | None = None

    def do_PUT(self):
        if self.path.startswith("/api/v0/asks/"):
            self.early = super().read_json()  # the whole request is here before the test is told
            self.server.arrived.set()
            self.server.release.wait(30)
        super().do_PUT()

    def read_json(self) -> dict:
        return self.early if self.early is not None else super().read_json()


@pytest.fixture
def vast():
    server = FakeVast()
    server.RequestHandlerClass = BlockingHandler
    server.arrived, server.release = threading.Event(), threading.Event()
    server.release.set()  # creates go through unless a test holds them
    with on_a_thread(server):
        yield server
        server.release.set()  # a held create lets go before the server stops


@pytest.fixture
def operator(ready, vast, tmp_path, monkeypatch, db_path):
    """The config and environment of an operator launching against the fake vast (in this process and children)."""
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: http://127.0.0.1:9\n  admin_token: admin-token-for-tests-0123456789\n"
                      "fleet:\n  min_bench_rate: 40\n  max_dph: 1.0\n"
                      "launch:\n  vastctl_source: vastctl==0.1.0\n  install: /opt/provers/install.sh\n")
    env = {"VASTCTL_CONFIG": str(config), "VAST_API_KEY": KEY, "VAST_API_URL": vast.url, "VASTCTL_DB": str(db_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def launch_audits(db_path):
    return query(db_path, "SELECT label, uuid, ok, result, vast_id FROM actions WHERE kind = 'launch' ORDER BY id")


@pytest.mark.slow
def test_kill_9_while_the_create_is_in_flight_leaves_a_pending_launch_that_reconcile_completes(operator, vast,
                                                                                                db_path, cli):
    vast.release.clear()
    proc = subprocess.Popen([sys.executable, "-m", "vastctl", *LAUNCH], env={**os.environ, **operator},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        arrived = vast.arrived.wait(60)
        said = "" if arrived else proc.communicate(timeout=60)[1].decode(errors="replace")
        assert arrived, f"no create arrived; the launch said: {said}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    vast.release.set()
    wait_for(lambda: len(vast.creates) == 1, "the create at vast", timeout=20)  # vast rented it although the process died
    (machine,) = query(db_path, "SELECT uuid, label, state, vast_id FROM instances")
    assert (machine["state"], machine["vast_id"]) == ("launching", None)
    (intent,) = launch_audits(db_path)
    assert (intent["label"], intent["uuid"], intent["ok"]) == (machine["label"], machine["uuid"], 0)
    assert intent["result"].startswith(PENDING) and "may have rented" in intent["result"]
    assert vast.creates[0]["label"] == machine["label"]

    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    (found,) = query(db_path, "SELECT vast_id FROM instances")
    (settled,) = launch_audits(db_path)
    assert settled["ok"] == 1, (settled, result.out)
    assert found["vast_id"] == 5001 and (settled["ok"], settled["vast_id"]) == (1, 5001)
    assert "found by label by reconcile" in settled["result"]


@pytest.mark.slow
def test_a_crash_after_vast_answered_leaves_the_pending_launch(operator, vast, db_path, cli, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies between vast's answer and its record

    monkeypatch.setattr(launches, "settle", crash)
    assert cli(*LAUNCH).code != 0
    assert len(vast.creates) == 1
    (intent,) = launch_audits(db_path)
    assert intent["ok"] == 0 and intent["result"].startswith(PENDING) and intent["label"] == vast.creates[0]["label"]


@pytest.mark.slow
def test_every_launch_row_says_what_came_of_it(operator, vast, db_path, cli):
    result = cli(*LAUNCH)
    assert result.code == 0, result.err
    (launched,) = json.loads(result.out)["launched"]
    (row,) = launch_audits(db_path)
    assert (row["label"], row["ok"], row["vast_id"], row["result"]) == (launched["label"], 1, 5001, "instance 5001")


def fill_the_audit(db_path) -> int:
    """The state file at its size limit, the actions table's pages full; returns that page count."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        while True:
            try:
                conn.execute("INSERT INTO actions (at, actor, kind, ok) VALUES ('2026-01-01T00:00:00Z', 'x', 'x', 1)")
            except sqlite3.OperationalError as exc:
                assert "full" in str(exc)
                return pages
    finally:
        conn.close()


@pytest.fixture
def full_disk(operator, db_path, monkeypatch):
    """Every connection vastctl opens can no longer grow the file (SQLITE_FULL), as on a full disk."""
    real_connect = db.connect

    def connect(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    cli_ready = query(db_path, "SELECT count(*) AS n FROM instances")  # the file exists and is ours
    assert cli_ready == [{"n": 0}]
    fill_the_audit(db_path)
    monkeypatch.setattr(db, "connect", connect)


@pytest.mark.slow
def test_on_a_full_disk_no_create_goes_out(full_disk, vast, db_path, cli):
    result = cli(*LAUNCH)
    assert vast.creates == [] and not vast.arrived.is_set()  # nothing was rented
    assert result.code == 1, (result.out, result.err)
    assert result.err.startswith("error: ") and len(result.err.splitlines()) == 1
    assert "full" in result.err and "not saved" in result.err
    assert [r for r in launch_audits(db_path) if r["label"]] == []


@pytest.mark.slow
def test_a_rental_the_file_cannot_record_says_so_and_where_to_find_it(operator, vast, db_path, cli, monkeypatch):
    real_update = operations.lifecycle.update_fields

    def full(conn, uuid, columns):
        if "vast_id" in columns:
            raise sqlite3.OperationalError("database or disk is full")
        return real_update(conn, uuid, columns)

    monkeypatch.setattr(operations.lifecycle, "update_fields", full)
    result = cli(*LAUNCH)
    assert len(vast.creates) == 1 and result.code == 1
    assert result.err.startswith("error: vast rented instance 5001") and len(result.err.splitlines()) == 1
    assert "reconcile finds the machine by its label" in result.err and "not saved" not in result.err
    (intent,) = launch_audits(db_path)
    assert intent["result"].startswith(PENDING)  # rolled back with the row's vast id: still says "may have"


def test_the_intent_is_in_the_file_when_the_create_goes_out_and_a_create_past_the_deadline_rents_nothing(conn, cfg):
    from vastctl.providers.base import DeadlinePassed

    now = datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)
    market = FakeMarket(conn, [offer(10, 100, 0.3), offer(11, 110, 0.4)])
    seen_at_create = []
    real_create = market.create_instance

    def create(request):
        seen_at_create.append([dict(r) for r in conn.execute("SELECT label, ok, result FROM actions")])
        if len(seen_at_create) == 1:
            raise DeadlinePassed("vast PUT /api/v0/asks/10/: not called: the deadline had passed")
        return real_create(request)

    market.create_instance = create
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=now)
    (first,) = seen_at_create  # the deadline passed: no further create is tried
    assert [(r["ok"], r["result"][:8]) for r in first] == [(0, PENDING)]  # committed before the create went out
    assert result.failed and "deadline" in result.failed[0]["reason"]
    audit = [dict(r) for r in conn.execute("SELECT label, ok, result FROM actions WHERE kind = 'launch' ORDER BY id")]
    assert audit[0]["ok"] == 0 and audit[0]["result"].startswith("not sent: ")
    killed = conn.execute("SELECT state, kill_code, destroyed_at FROM instances WHERE label = ?",
                          (audit[0]["label"],)).fetchone()
    assert (killed["state"], killed["kill_code"]) == ("killed", "start_failed") and killed["destroyed_at"]


# --- a start spends money again: its intent is committed before the call too ------------------------------


def stopped_machine(conn):
    from helpers.operations_market import NOW, live_row
    live_row(conn, operations.State.REGISTERED)
    operations.lifecycle.transition(conn, "u1", operations.State.STOPPED, "t", "operator", now=NOW)
    return NOW


def test_the_start_intent_is_in_the_file_when_the_call_goes_out(conn, cfg):
    now = stopped_machine(conn)
    market = FakeMarket(conn)
    seen = []
    market.start_instance = lambda vast_id: seen.append(
        [tuple(r) for r in conn.execute("SELECT kind, ok, result FROM actions WHERE kind = 'start'")])
    operations.start(conn, market, cfg, "vastctl-a", now=now)
    ((kind, ok, result),) = seen[0]
    assert (kind, ok) == ("start", 0) and result.startswith(PENDING) and "may have resumed it" in result
    assert [tuple(r) for r in conn.execute("SELECT kind, ok, result, vast_id FROM actions WHERE kind = 'start'")] == [
        ("start", 1, "accepted", 77)]


def test_on_a_full_disk_no_start_goes_out(conn, cfg):
    now = stopped_machine(conn)
    market = FakeMarket(conn)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        while True:  # the actions table's pages full, as the disk is
            conn.execute("INSERT INTO actions (at, actor, kind, ok) VALUES ('2026-01-01T00:00:00Z', 'x', 'x', 1)")
    with pytest.raises(Unavailable, match="cannot grow"):
        operations.start(conn, market, cfg, "vastctl-a", now=now)
    assert market.calls == [] and operations.lifecycle.get(conn, "u1")["state"] == "stopped"
