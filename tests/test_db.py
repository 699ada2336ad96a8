"""db: the schema is pinned, migrations upgrade a file that has data, and the file is plain SQLite."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers.db_files import file_at, migration_number

from vastctl import clock
from vastctl.clock import SYSTEM
from vastctl.errors import BadInput
from vastctl.state import db, instances, migrations

_SOURCES = "".join(Path(instances.__file__).parent.parent.joinpath(*name.split("/")).read_text()
                   for name in ("state/instances.py", "state/blocklist.py", "facts/tunnel.py"))

# The columns of every table, in order. A change here means a new migration.
PINNED = {
    "instances": [
        "uuid", "label", "state", "vast_id", "machine_id", "offer_id", "gpu_name", "num_gpus", "dph", "bench_rate",
        "proofs_done", "proofs_per_hour", "restarts", "created_at", "state_since", "last_heartbeat_at",
        "kill_reason", "kill_code", "killed_at", "destroyed_at",
        "vast_status", "vast_status_msg", "vast_seen_at", "vast_missing", "resumed_at", "destroy_attempts",
        "destroy_error", "claimed_vast_id",
        "tunnel_port", "tunnel_public_key", "joined_at", "tunnel_down_since", "tunnel_checked_at", "storage_dph",
        "vast_status_since", "bid", "ask_dph", "outbid_since", "proofs_total", "route_failing_since", "route_failure",
        "boot_stages", "kill_forced",
    ],
    "machine_logs": ["uuid", "name", "at", "text", "cut"],
    "instance_revisions": ["uuid", "revision"],
    "events": ["id", "at", "kind", "uuid", "label", "from_state", "to_state", "reason", "source", "code", "data"],
    "settings": ["key", "value", "updated_at"],
    "migrations": ["id", "name", "applied_at"],
    "vast_listings": ["id", "at", "ok", "instances", "error"],
    "vast_cache": [
        "vast_id", "label", "actual_status", "intended_status", "cur_state", "status_msg", "machine_id", "gpu_name",
        "num_gpus", "dph", "first_seen_at", "seen_at", "storage_dph",
    ],
    "actions": ["id", "at", "actor", "kind", "uuid", "label", "vast_id", "request", "ok", "result"],
    "blocklist": ["machine_id", "reason", "until"],
    "locks": ["name", "holder", "acquired_at", "expires_at"],
    "agent_messages": ["id", "step_id", "at", "role", "content"],
    "agent_notes": ["id", "step_id", "at", "text"],
    "demand_samples": ["id", "at", "queued", "proofs_per_hour", "source", "ok", "error", "in_flight", "lookahead",
                       "arrivals", "later"],
    "agent_steps": [
        "id", "started_at", "finished_at", "policy", "outcome", "event_cursor", "observation", "actions", "refused",
        "errors", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost", "hold",
    ],
    "dashboard_sign_outs": ["session", "expires_at", "signed_out_at"],
    "webhook_deliveries": ["event_id", "received_at", "notif_type", "attempt", "event", "signed"],
    # the proof router's (facts/deliveries.py)
    "proof_calls": ["id", "at", "request_id", "kind", "uuid", "label", "result", "held_ms", "prover_ms", "attempt",
                    "size_bytes", "queue_wait_ms", "srs_load_ms", "synthesis_ms", "gpu_compute_ms", "total_ms", "detail"],
    "route_status": ["id", "updated_at", "held", "held_bytes", "oldest_held_s", "in_flight", "provers", "routing"],
    # the simulated market's (providers/sim_store.py; sim_meta.schema_version counts their changes too)
    "sim_meta": ["id", "schema_version", "seed", "started_at", "advanced_to", "calls", "next_vast_id", "version",
                 "busy_by", "busy_until"],
    "sim_hosts": ["machine_id", "offer_id", "gpu_name", "num_gpus", "cpu_ram_gb", "inet_down_mbps", "reliability",
                  "base_dph", "storage_cost", "true_rate", "slow", "phase"],
    "sim_instances": [
        "vast_id", "machine_id", "offer_id", "label", "uuid", "env_label", "image", "disk_gb", "gpu_dph",
        "storage_dph", "intended_status", "actual_status", "cur_state", "status_msg", "listed", "epoch", "epoch_at",
        "step", "step_at", "fault", "fault_at", "proving_since", "refused_at", "created_at", "died_at",
        "destroy_requested_at", "destroy_refused_s", "destroyed_at", "cost", "billed_s", "gpu_s", "billed_at",
        "bid", "outbids", "outbid_at", "outbid_price", "paused_at", "resume_at", "proofs", "turn",
    ],
    "sim_faults": ["id", "at", "kind", "vast_id", "detail"],
}


def columns(conn, table):
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def tables(conn):
    return {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if not row[0].startswith("sqlite_")
    }


def test_fresh_file_has_the_pinned_schema(conn):
    assert tables(conn) == set(PINNED)
    for table, expected in PINNED.items():
        assert columns(conn, table) == expected, table
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert [r[0] for r in conn.execute("SELECT id FROM migrations ORDER BY id")] == list(range(1, db.SCHEMA_VERSION + 1))


def test_wal_and_busy_timeout(conn):
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000


def schema_of(conn) -> set[tuple[str, str, str]]:
    return {(r[0], r[1], r[2]) for r in conn.execute("SELECT type, name, sql FROM sqlite_master")}


def test_a_new_file_holds_what_a_file_upgraded_migration_by_migration_holds(tmp_path):
    """A new file is written from the schema the migrations lead to (db._create_fresh), not migration by
    migration: the two are the same schema, rows, sequence and version, and the migrations table names each."""
    fresh = db.connect(tmp_path / "fresh.db", create=True, now=SYSTEM.now())
    file_at(tmp_path / "stepped.db", 1).close()
    stepped = db.connect(tmp_path / "stepped.db", now=SYSTEM.now())  # migrations 2… one at a time
    assert schema_of(fresh) == schema_of(stepped) and len(schema_of(fresh)) > 40
    for (table,) in fresh.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'migrations'"):
        assert fresh.execute(f'SELECT * FROM "{table}"').fetchall() == stepped.execute(f'SELECT * FROM "{table}"').fetchall()
    assert [tuple(r) for r in fresh.execute("SELECT id, name FROM migrations ORDER BY id")] == [
        (migration.number, migration.name) for migration in migrations.MIGRATIONS]
    assert fresh.execute("PRAGMA user_version").fetchone()[0] == stepped.execute("PRAGMA user_version").fetchone()[0]
    # the triggers are made and fire in a new file: a vast status change stamps when it changed
    fresh.execute("INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES ('u', 'l', 'running', 't', 't')")
    fresh.execute("UPDATE instances SET vast_seen_at = 'seen', vast_status = 'running' WHERE uuid = 'u'")
    assert fresh.execute("SELECT vast_status_since FROM instances").fetchone()[0] == "seen"


def test_upgrade_of_a_version_1_file_keeps_its_data(db_path):
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for statement in db._statements(migrations.MIGRATIONS[0].sql):
        raw.execute(statement)
    raw.execute("INSERT INTO migrations VALUES (1, ?, '2026-01-01T00:00:00Z')", (db.FIRST_MIGRATION,))
    raw.execute("PRAGMA user_version = 1")
    raw.execute(
        "INSERT INTO instances (uuid, label, state, created_at, state_since, bench_rate)"
        " VALUES ('u1', 'vastctl-old', 'running', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 55.5)"
    )
    raw.execute("INSERT INTO events (at, kind, uuid, label, to_state, reason, source) VALUES ('t', 'transition', 'u1', 'vastctl-old', 'running', 'r', 'instance')")
    raw.close()

    conn = db.connect(db_path, now=SYSTEM.now())
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    row = conn.execute("SELECT * FROM instances WHERE uuid = 'u1'").fetchone()
    assert (row["label"], row["state"], row["bench_rate"], row["vast_missing"], row["destroy_attempts"]) == (
        "vastctl-old", "running", 55.5, 0, 0)
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    for table, expected in PINNED.items():
        assert columns(conn, table) == expected, table


def test_upgrade_turns_an_adopted_rows_vast_id_into_a_claim(db_path):
    """Before claims were kept apart, `register` wrote a machine's vast id into vast_id: for rows the manager
    did not launch that id was never verified, so the upgrade keeps it only as a claim."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for migration in migrations.MIGRATIONS[:2]:
        for statement in db._statements(migration.sql):
            raw.execute(statement)
        raw.execute("INSERT INTO migrations VALUES (?, ?, '2026-01-01T00:00:00Z')", (migration.number, migration.name))
    raw.execute("PRAGMA user_version = 2")
    for uuid, offer_id, vast_id, destroyed in (("adopted", None, 100, None), ("launched", 7, 101, None),
                                               ("gone", None, 102, "2026-01-02T00:00:00Z")):
        raw.execute("INSERT INTO instances (uuid, label, state, vast_id, offer_id, created_at, state_since,"
                    " destroyed_at) VALUES (?, ?, 'running', ?, ?, 't', 't', ?)",
                    (uuid, f"vastctl-{uuid}", vast_id, offer_id, destroyed))
    raw.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    found = {r["uuid"]: (r["vast_id"], r["claimed_vast_id"])
             for r in conn.execute("SELECT uuid, vast_id, claimed_vast_id FROM instances")}
    assert found == {"adopted": (None, 100), "launched": (101, None), "gone": (102, None)}


def test_upgrade_reads_old_events_fields_from_their_text_once(db_path):
    """Events written before they carried fields get them from their reason, once, in the migration: a setting's
    key and values, a kill or stop forced past the guard, and the killed row's kill_forced."""
    raw = file_at(db_path, migration_number("an event's structured fields") - 1)
    for uuid, reason in (("forced", "operator: GPU errors (forced)"), ("plain", "operator: done")):
        raw.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, kill_reason)"
                    " VALUES (?, ?, 'killed', 't', 't', ?)", (uuid, f"vastctl-{uuid}", reason))
        raw.execute("INSERT INTO events (at, kind, uuid, to_state, reason, source) VALUES ('t', 'transition', ?,"
                    " 'killed', ?, 'operator')", (uuid, reason))
    for reason in ("target_proofs_per_hour 300 → 412.5", "max_instances 0 → 12", "not a setting's text"):
        raw.execute("INSERT INTO events (at, kind, reason, source) VALUES ('t', 'setting', ?, 'operator')", (reason,))
    raw.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    data = [(r["kind"], r["uuid"], r["data"] and json.loads(r["data"]))
            for r in conn.execute("SELECT kind, uuid, data FROM events ORDER BY id")]
    assert data == [("transition", "forced", {"forced": True}), ("transition", "plain", None),
                    ("setting", None, {"key": "target_proofs_per_hour", "old": 300.0, "new": 412.5}),
                    ("setting", None, {"key": "max_instances", "old": 0.0, "new": 12.0}), ("setting", None, None)]
    assert {r["uuid"]: r["kill_forced"] for r in conn.execute("SELECT uuid, kill_forced FROM instances")} == {
        "forced": 1, "plain": 0}


def test_a_migration_whose_trigger_body_holds_semicolons_applies_whole(db_path, monkeypatch):
    """A migration is cut into statements where SQLite says one is complete, not at every `;`: a trigger's
    body, a string and a comment may all hold one."""
    trigger = migrations.Migration(
        len(migrations.MIGRATIONS) + 1, "a trigger whose body is two statements",
        """
        CREATE TABLE setting_notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);
        CREATE TRIGGER settings_noted AFTER INSERT ON settings
        BEGIN
            INSERT INTO setting_notes (text) VALUES ('set; ' || NEW.key);
            INSERT INTO setting_notes (text) VALUES ('-- not a comment; ' || NEW.value);
        END;
        -- a comment; with a semicolon
        INSERT INTO settings VALUES ('k', 'v', 't')
        """,
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, trigger])
    monkeypatch.setattr(db, "SCHEMA_VERSION", len(migrations.MIGRATIONS))
    conn = db.connect(db_path, create=True, now=SYSTEM.now())
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert [r[0] for r in conn.execute("SELECT text FROM setting_notes ORDER BY id")] == [
        "set; k", "-- not a comment; v"]
    conn.execute("INSERT INTO settings VALUES ('k2', 'v2', 't')")  # the trigger is whole: both statements run
    assert conn.execute("SELECT count(*) FROM setting_notes").fetchone()[0] == 4


def test_a_failing_statement_undoes_its_whole_migration(db_path, monkeypatch):
    broken = migrations.Migration(len(migrations.MIGRATIONS) + 1, "a migration that fails half way",
                                  "CREATE TABLE half (id INTEGER); INSERT INTO nowhere VALUES (1)")
    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, broken])
    monkeypatch.setattr(db, "SCHEMA_VERSION", len(migrations.MIGRATIONS))
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        db.connect(db_path, create=True, now=SYSTEM.now())
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0 and tables(raw) == set()


def test_a_file_whose_simulator_made_its_tables_before_the_migration_keeps_its_market(db_path, monkeypatch):
    """The simulator once created its tables itself (CREATE TABLE IF NOT EXISTS); the migration leaves them."""
    number = next(m.number - 1 for m in migrations.MIGRATIONS if "TABLE IF NOT EXISTS sim_instances" in m.sql)
    with monkeypatch.context() as before:
        before.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:number])
        before.setattr(db, "SCHEMA_VERSION", number)
        old = db.connect(db_path, create=True, now=SYSTEM.now())
    for statement in db._statements(migrations.MIGRATIONS[number].sql):
        old.execute(statement)
    old.execute("INSERT INTO sim_meta (id, schema_version, seed, started_at, advanced_to, calls, next_vast_id, version)"
                " VALUES (1, 2, 7, 't', 't', 3, 7000002, 4)")
    old.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert tuple(conn.execute("SELECT seed, calls, version FROM sim_meta").fetchone()) == (7, 3, 4)


def test_connect_twice_does_not_reapply_migrations(db_path):
    first, later = datetime(2031, 3, 1, tzinfo=timezone.utc), datetime(2031, 3, 2, tzinfo=timezone.utc)
    db.connect(db_path, create=True, now=first).close()
    conn = db.connect(db_path, now=later)
    stamps = [row[0] for row in conn.execute("SELECT applied_at FROM migrations")]
    assert len(stamps) == db.SCHEMA_VERSION
    assert set(stamps) == {clock.to_iso(first)}  # the caller's time (virtual in the simulator), not SQLite's 'now'


@pytest.mark.parametrize("sql, index", [
    (instances.NOT_DESTROYED, "instances_undestroyed"),
    ("SELECT 1 FROM instances WHERE tunnel_port IS NOT NULL LIMIT 1", "instances_tunneled"),
    ("SELECT vast_id, killed_at FROM instances WHERE killed_at >= ? AND vast_id IS NOT NULL", "instances_killed"),
    ("SELECT * FROM instances WHERE +state = 'killed' AND machine_id IS NOT NULL AND killed_at > ?", "instances_killed"),
])
def test_the_rows_every_pass_reads_come_through_an_index_not_every_row_ever(conn, sql, index):
    """A file's killed rows accumulate over months; the reads of every pass (what may bill, whether any tunnel is
    left, the kills lately) must not visit them all: SQLite's own plan names the index it searches."""
    assert sql in _SOURCES  # the very statements the code runs
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, (clock.to_iso(SYSTEM.now()),) * sql.count("?")))
    assert f"INDEX {index}" in plan, plan


def test_missing_file_is_an_error_unless_creating(tmp_path):
    path = tmp_path / "sub" / "state.db"
    with pytest.raises(BadInput, match="vastctl init"):
        db.connect(path, now=SYSTEM.now())
    assert not path.exists()
    db.connect(path, create=True, now=SYSTEM.now()).close()
    assert path.exists()


def test_a_file_that_is_not_sqlite_is_bad_input(tmp_path):
    path = tmp_path / "junk.db"
    path.write_text("not a database at all, just text " * 100)
    with pytest.raises(BadInput, match="not a SQLite database"):
        db.connect(path, now=SYSTEM.now())


def test_transaction_rolls_back_on_error(conn):
    with pytest.raises(RuntimeError):
        with db.transaction(conn):
            conn.execute("INSERT INTO settings VALUES ('k', 'v', 't')")
            raise RuntimeError("boom")
    assert conn.execute("SELECT count(*) FROM settings").fetchone()[0] == 0


def test_sqlite_utils_reads_the_file_with_plain_column_names(conn, db_path, cli):
    cli("register", "--uuid", "u1", "--label", "vastctl-a", "--gpu", "RTX 4090")
    import sqlite_utils
    database = sqlite_utils.Database(db_path)
    (row,) = list(database["instances"].rows)
    assert (row["label"], row["state"], row["gpu_name"]) == ("vastctl-a", "registered", "RTX 4090")
    assert row["created_at"].endswith("Z")
    assert [e["to_state"] for e in database["events"].rows] == ["registered"]


def test_upgrade_bounds_old_rows_rates_once(db_path):
    """Rows written before rates were bounded as they were stored get their bounds from the migration, once,
    so a reader counts a stored rate as it is: a bench rate within 200/h per GPU (8 counted at most, an unknown
    count, or one below 1, as one), a measured rate within twice the bench rate and the ceiling, nothing below 0,
    text no rate."""
    number = migration_number("a machine's stored rates within their bounds")
    raw = file_at(db_path, number - 1)
    rows = {  # uuid: (num_gpus, bench_rate, proofs_per_hour, proofs_done) → bench_rate, proofs_per_hour after
        "liar": ((1, 1e308, 1e19, 5), (200.0, 200.0)),
        "infinite": ((2, float("inf"), float("-inf"), 5), (400.0, 0.0)),
        "eight": ((10**6, 5000.0, 9000.0, 5), (1600.0, 1600.0)),
        "unknown": ((None, 300.0, None, 5), (200.0, None)),
        "fast": ((1, 70.0, 500.0, 5), (70.0, 140.0)),
        "negative": ((1, -5.0, 20.0, -3), (0.0, 0.0)),
        "no bench": ((1, None, 1e6, 5), (None, 200.0)),
        "text": ((1, "fast", "slow", 5), (None, None)),
        "honest": ((1, 70.0, 80.0, 5), (70.0, 80.0)),
        "no gpus": ((-2, 500.0, 900.0, 5), (200.0, 200.0)),  # a count below 1 is unknown: one GPU's ceiling
    }
    for uuid, ((gpus, bench, measured, done), _after) in rows.items():
        raw.execute("INSERT INTO instances (uuid, label, state, num_gpus, bench_rate, proofs_per_hour, proofs_done,"
                    " proofs_total, created_at, state_since) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, 't', 't')",
                    (uuid, f"vastctl-{uuid}", gpus, bench, measured, done, done))
    raw.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    found = {r["uuid"]: (r["bench_rate"], r["proofs_per_hour"])
             for r in conn.execute("SELECT uuid, bench_rate, proofs_per_hour FROM instances")}
    assert found == {uuid: after for uuid, (_before, after) in rows.items()}
    assert conn.execute("SELECT proofs_done, proofs_total FROM instances WHERE uuid = 'negative'").fetchone()[:] == (
        0, 0)
    assert conn.execute("SELECT num_gpus FROM instances WHERE uuid = 'no gpus'").fetchone()[0] is None
    assert number in [r[0] for r in conn.execute("SELECT id FROM migrations ORDER BY id")]
    conn.execute("UPDATE instances SET bench_rate = 1e308 WHERE uuid = 'honest'")  # once: opening again bounds nothing
    conn.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    assert conn.execute("SELECT bench_rate FROM instances WHERE uuid = 'honest'").fetchone()[0] == 1e308


def test_upgrade_forgets_old_rows_prices_that_are_no_price_once(db_path):
    """A price the file held before prices were checked where they enter (a negative, a zero, an infinite one,
    text) is none after the upgrade, as one never listed: readers count a stored price as it is."""
    raw = file_at(db_path, migration_number("a machine's stored rates within their bounds") - 1)
    prices = {"good": (0.4, 0.05, 0.5), "negative": (-20.0, -1.0, -3.0), "zero": (0.0, 0.0, 0.0),
              "infinite": (float("inf"), float("inf"), float("-inf")), "text": ("cheap", "free", "x"),
              "tiny": (1e-320, 1e-320, 1e-320)}
    kept = {"good": (0.4, 0.05, 0.5), "negative": (None, None, None), "zero": (None, 0.0, None),
            "infinite": (None, None, None), "text": (None, None, None), "tiny": (None, 1e-320, None)}
    for number, (uuid, (dph, storage, ask)) in enumerate(prices.items(), start=1):
        raw.execute("INSERT INTO instances (uuid, label, state, vast_id, dph, storage_dph, ask_dph, created_at,"
                    " state_since) VALUES (?, ?, 'running', ?, ?, ?, ?, 't', 't')",
                    (uuid, f"vastctl-{uuid}", number, dph, storage, ask))
        raw.execute("INSERT INTO vast_cache (vast_id, label, dph, storage_dph, first_seen_at, seen_at)"
                    " VALUES (?, ?, ?, ?, 't', 't')", (number, f"vastctl-{uuid}", dph, storage))
    raw.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    rows = {r["uuid"]: (r["dph"], r["storage_dph"], r["ask_dph"])
            for r in conn.execute("SELECT uuid, dph, storage_dph, ask_dph FROM instances")}
    assert rows == kept
    listed = {r["label"][len("vastctl-"):]: (r["dph"], r["storage_dph"])
              for r in conn.execute("SELECT label, dph, storage_dph FROM vast_cache")}
    assert listed == {uuid: (dph, storage) for uuid, (dph, storage, _ask) in kept.items()}
