"""The one place that opens the state file.

WAL so readers never wait for writers, a busy timeout so racing writers queue
instead of failing, and numbered append-only migrations applied on open.
A shipped migration is never edited: add a new one at the end of MIGRATIONS.
Times are stored as ISO-8601 UTC text (see clock.py) so the file reads well
in sqlite3, sqlite-utils and Datasette.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Iterator

from .errors import BadInput, Unavailable

BUSY_TIMEOUT_S = 60.0

# (name, sql). The position in this list is the migration's number (1-based).
MIGRATIONS: list[tuple[str, str]] = [
    (
        "instances, events, settings",
        """
        CREATE TABLE instances (
            uuid TEXT PRIMARY KEY,
            label TEXT NOT NULL,
            state TEXT NOT NULL,
            vast_id INTEGER,
            machine_id INTEGER,
            offer_id INTEGER,
            gpu_name TEXT,
            num_gpus INTEGER,
            dph REAL,
            bench_rate REAL,
            proofs_done INTEGER NOT NULL DEFAULT 0,
            proofs_per_hour REAL,
            restarts INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            state_since TEXT NOT NULL,
            last_heartbeat_at TEXT,
            kill_reason TEXT,
            kill_code TEXT,
            killed_at TEXT,
            destroyed_at TEXT
        );
        CREATE UNIQUE INDEX instances_label ON instances(label);
        CREATE INDEX instances_state ON instances(state);
        CREATE INDEX instances_vast_id ON instances(vast_id);
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            kind TEXT NOT NULL,
            uuid TEXT,
            label TEXT,
            from_state TEXT,
            to_state TEXT,
            reason TEXT,
            source TEXT NOT NULL,
            code TEXT
        );
        CREATE INDEX events_uuid ON events(uuid);
        CREATE TABLE settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        """,
    ),
    (
        "vast listing cache, provider audit, blocklist, locks",
        """
        ALTER TABLE instances ADD COLUMN vast_status TEXT;
        ALTER TABLE instances ADD COLUMN vast_status_msg TEXT;
        ALTER TABLE instances ADD COLUMN vast_seen_at TEXT;
        ALTER TABLE instances ADD COLUMN vast_missing INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE instances ADD COLUMN resumed_at TEXT;
        ALTER TABLE instances ADD COLUMN destroy_attempts INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE instances ADD COLUMN destroy_error TEXT;
        CREATE TABLE vast_listings (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            ok INTEGER NOT NULL,
            instances INTEGER,
            error TEXT
        );
        CREATE TABLE vast_cache (
            vast_id INTEGER PRIMARY KEY,
            label TEXT,
            actual_status TEXT,
            intended_status TEXT,
            cur_state TEXT,
            status_msg TEXT,
            machine_id INTEGER,
            gpu_name TEXT,
            num_gpus INTEGER,
            dph REAL,
            first_seen_at TEXT NOT NULL,
            seen_at TEXT NOT NULL
        );
        CREATE TABLE actions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            actor TEXT NOT NULL,
            kind TEXT NOT NULL,
            uuid TEXT,
            label TEXT,
            vast_id INTEGER,
            request TEXT,
            ok INTEGER NOT NULL,
            result TEXT
        );
        CREATE INDEX actions_uuid ON actions(uuid);
        CREATE TABLE blocklist (
            machine_id INTEGER PRIMARY KEY,
            reason TEXT NOT NULL,
            until TEXT NOT NULL
        );
        CREATE TABLE locks (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            acquired_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        )
        """,
    ),
    (
        "demand samples, agent steps",
        """
        CREATE TABLE demand_samples (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            queued INTEGER,
            proofs_per_hour REAL,
            source TEXT NOT NULL,
            ok INTEGER NOT NULL,
            error TEXT
        );
        CREATE INDEX demand_samples_at ON demand_samples(at);
        CREATE TABLE agent_steps (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            policy TEXT NOT NULL,
            outcome TEXT NOT NULL,
            event_cursor INTEGER,
            observation TEXT,
            actions TEXT,
            refused TEXT,
            errors TEXT,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cache_read_tokens INTEGER NOT NULL DEFAULT 0,
            cache_write_tokens INTEGER NOT NULL DEFAULT 0,
            cost REAL NOT NULL DEFAULT 0
        );
        CREATE INDEX agent_steps_outcome ON agent_steps(outcome, id)
        """,
    ),
]

SCHEMA_VERSION = len(MIGRATIONS)


def connect(path: str | Path, *, create: bool = False) -> sqlite3.Connection:
    """Open (and migrate) the state file.

    Without `create`, a missing file is an error naming `vastctl init`: a typo
    in VASTCTL_DB must not quietly start an empty fleet.
    """
    path = Path(path).expanduser()
    if str(path) != ":memory:" and not path.exists():
        if not create:
            raise BadInput(f"no state file at {path}: run `vastctl init` first, or point VASTCTL_DB at the file")
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn)
    except sqlite3.DatabaseError as exc:
        raise _translate(exc, path) from exc
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration the file has not had yet; returns the schema version."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return SCHEMA_VERSION
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
        for number in range(version + 1, SCHEMA_VERSION + 1):
            name, sql = MIGRATIONS[number - 1]
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO migrations (id, name, applied_at) VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (number, name),
            )
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return SCHEMA_VERSION


def _statements(sql: str) -> list[str]:
    return [part.strip() for part in sql.split(";") if part.strip()]


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE … COMMIT: take the write lock up front, so two writers
    queue on the busy timeout instead of deadlocking on a lock upgrade."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise _translate(exc, None) from exc
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    else:
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            conn.execute("ROLLBACK")
            raise _translate(exc, None) from exc


def _translate(exc: sqlite3.DatabaseError, path: Path | None) -> Exception:
    text = str(exc)
    where = f" {path}" if path else ""
    if "locked" in text or "busy" in text:
        return Unavailable(f"the state file{where} stayed busy for {BUSY_TIMEOUT_S:.0f}s: retry later")
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in text:
        return BadInput(f"cannot open the state file{where}: check the path and its permissions")
    if "not a database" in text or "malformed" in text:
        return BadInput(f"the state file{where} is not a vastctl SQLite database: check VASTCTL_DB")
    return exc
