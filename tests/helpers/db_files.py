"""State files at an older schema, built migration by migration, for the tests of one migration's data."""

from __future__ import annotations

import sqlite3

from vastctl.state import db, migrations


def migration_number(name_start):
    """The number of the migration whose name begins so: a test of one migration's data builds the file as the one
    before it left it, whatever is appended after."""
    return next(m.number for m in migrations.MIGRATIONS if m.name.startswith(name_start))


def file_at(db_path, version):
    """A raw connection to a new state file at schema `version` (its migrations applied and recorded by hand)."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for migration in migrations.MIGRATIONS[:version]:
        for statement in db._statements(migration.sql):
            raw.execute(statement)
        raw.execute("INSERT INTO migrations VALUES (?, ?, '2026-01-01T00:00:00Z')", (migration.number, migration.name))
    raw.execute(f"PRAGMA user_version = {version}")
    return raw
