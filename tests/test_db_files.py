"""The state file on a bad day (vastctl/state/db.py): a file that is not ours, an empty, newer, damaged, read-only
or full one. Each case is one `error:` line with the contract's exit code, and the file is left exactly as it was."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from helpers.refusals import one_error_line

from vastctl.state import db


def snapshot(path: Path):
    """What must not change: the bytes, the mtime, and which files sit beside it."""
    siblings = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))
    return path.read_bytes(), path.stat().st_mtime_ns, siblings


def foreign_sqlite(path: Path) -> None:
    """Another application's SQLite file, in rollback-journal mode with its own user_version."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    raw.execute("INSERT INTO notes (body) VALUES ('mine, not vastctl''s')")
    raw.execute("PRAGMA user_version = 1")
    raw.close()


# --- the state file: only `init` creates or adopts, and only an empty file ------------------------------


READ_AND_WRITE_COMMANDS = [("fleet",), ("events",), ("settings", "list"), ("notify", "hello"),
                           ("register", "--uuid", "u1", "--label", "a"), ("init",)]


@pytest.mark.parametrize("args", READ_AND_WRITE_COMMANDS)
def test_another_applications_file_is_refused_untouched(cli, db_path, args):
    foreign_sqlite(db_path)
    before = snapshot(db_path)
    one_error_line(cli(*args), 2, str(db_path), "not a vastctl state file (its tables: notes)")
    assert snapshot(db_path) == before
    assert not db_path.with_name(db_path.name + ".secret").exists()


@pytest.mark.parametrize("args", [a for a in READ_AND_WRITE_COMMANDS if a != ("init",)])
def test_an_empty_file_is_only_adopted_by_init(cli, db_path, args):
    db_path.write_bytes(b"")
    before = snapshot(db_path)
    one_error_line(cli(*args), 2, "is empty", "vastctl init")
    assert snapshot(db_path) == before
    assert cli("init").code == 0
    assert cli("fleet").code == 0


def test_init_adopts_a_sqlite_file_with_no_tables(cli, db_path):
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("VACUUM")  # writes a valid header and nothing else
    raw.close()
    assert db_path.stat().st_size > 0
    before = snapshot(db_path)
    one_error_line(cli("fleet"), 2, "is empty", "vastctl init")
    assert snapshot(db_path) == before
    assert cli("init").code == 0
    assert json.loads(cli("fleet", "--json").out)["instances"] == []


def a_newer_file(cli, db_path) -> None:
    assert cli("init").code == 0
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("INSERT INTO migrations VALUES (?, 'from the future', 't')", (db.SCHEMA_VERSION + 1,))
    raw.execute(f"PRAGMA user_version = {db.SCHEMA_VERSION + 1}")
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()


@pytest.mark.parametrize("args", READ_AND_WRITE_COMMANDS)
def test_a_file_from_a_newer_vastctl_is_refused_untouched(cli, db_path, args):
    a_newer_file(cli, db_path)
    before = snapshot(db_path)
    one_error_line(cli(*args), 2, "newer vastctl", f"schema {db.SCHEMA_VERSION + 1}", "upgrade vastctl")
    assert snapshot(db_path) == before


def test_a_file_with_our_version_number_but_not_our_tables_is_not_ours(cli, db_path):
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT, applied_at TEXT)")
    raw.execute("INSERT INTO migrations VALUES (1, '0001_initial', 't')")
    raw.execute(f"PRAGMA user_version = {db.SCHEMA_VERSION}")
    raw.close()
    before = snapshot(db_path)
    one_error_line(cli("fleet"), 2, "not a vastctl state file")
    assert snapshot(db_path) == before


def test_a_text_file_is_refused_untouched(cli, db_path):
    db_path.write_text("not a database at all, just text " * 100)
    before = snapshot(db_path)
    one_error_line(cli("init"), 2, "not a SQLite database", "VASTCTL_DB")
    assert snapshot(db_path) == before


# --- damaged, read-only and full files ---------------------------------------------------------------


def test_a_damaged_file_says_restore_from_a_backup(cli, db_path):
    assert cli("init").code == 0
    for n in range(30):
        cli("register", "--uuid", f"u{n}", "--label", f"vastctl-{n}", "--gpu", "RTX 4090")
    sqlite3.connect(db_path).execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    data = bytearray(db_path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[page_size:] = b"\xa5" * (len(data) - page_size)  # every page after the schema is garbage
    db_path.write_bytes(bytes(data))
    result = cli("fleet")
    one_error_line(result, 2, str(db_path), "damaged", "restore it from a backup")


@contextlib.contextmanager
def unprivileged():
    """Permission checks as an ordinary user would meet them (root ignores file modes)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def open_dir(monkeypatch):
    """A directory an unprivileged user can reach (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="vastctl-ro-"))
    path.chmod(0o755)
    monkeypatch.setenv("VASTCTL_DB", str(path / "state.db"))
    monkeypatch.setenv("HOME", str(path))
    yield path
    path.chmod(0o755)
    shutil.rmtree(path)


def test_a_read_only_file_names_the_permissions_to_check(cli, open_dir):
    path = open_dir / "state.db"
    assert cli("init").code == 0
    path.chmod(0o444)
    open_dir.chmod(0o777)  # the directory stays writable: only the file is read-only
    before = snapshot(path)
    with unprivileged():
        result = cli("register", "--uuid", "u1", "--label", "a")
    one_error_line(result, 2, str(path), "read-only", "permissions of the file and its directory")
    assert snapshot(path)[:2] == before[:2]  # reading a WAL file may leave its -shm beside it


def test_a_read_only_directory_names_the_wal_files(cli, open_dir):
    path = open_dir / "state.db"
    assert cli("init").code == 0
    open_dir.chmod(0o555)
    before = snapshot(path)
    with unprivileged():
        result = cli("fleet")
    one_error_line(result, 2, str(path), "permissions of the file and its directory", "-wal")
    assert snapshot(path) == before


@pytest.fixture
def full_disk(monkeypatch, db_path):
    """The state file cannot grow by a single page, as on a full disk."""
    real_connect = db.connect

    def connect(path, **kwargs):
        conn = real_connect(path, **kwargs)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    monkeypatch.setattr(db, "connect", connect)


def test_a_full_disk_says_so_and_the_file_stays_whole(ready, cli, db_path, full_disk):
    assert cli("notify", "small").code == 0
    result = cli("notify", "x" * 3900)
    for _ in range(20):  # fill what is left of the last page
        if result.code != 0:
            break
        result = cli("notify", "x" * 3900)
    one_error_line(result, 1, "database or disk is full", "free space")
    assert "cannot rollback" not in result.err
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    notes = conn.execute("SELECT count(*) FROM events WHERE kind = 'note'").fetchone()[0]
    assert notes == len(json.loads(cli("events", "--json", "--limit", "100").out))


def test_a_failed_commit_reports_its_own_error_not_the_rollback(conn):
    conn.execute("PRAGMA max_page_count = %d" % conn.execute("PRAGMA page_count").fetchone()[0])
    conn.execute("PRAGMA cache_size = 1")  # spill to the file before COMMIT
    with pytest.raises(Exception) as caught:
        with db.transaction(conn):
            conn.execute("INSERT INTO settings VALUES ('k', ?, 't')", ("v" * 100_000,))
    assert "full" in str(caught.value)
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM settings").fetchone()[0] == 0
