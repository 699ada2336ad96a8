"""Hostile input and bad days: a state file that is not ours, a damaged, read-only or full one, and text
that tries to hide in a terminal. Each case is one `error:` line with the contract's exit code, and the
file is left exactly as it was."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from vastctl.state import db


def snapshot(path: Path):
    """What must not change: the bytes, the mtime, and which files sit beside it."""
    siblings = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))
    return path.read_bytes(), path.stat().st_mtime_ns, siblings


def one_error_line(result, code, *fragments):
    assert result.code == code, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    assert "unexpected" not in result.err
    for fragment in fragments:
        assert fragment in result.err, result.err


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


# --- identifiers: one rule (lifecycle.validate_text) for the command line and HTTP ---------------------


def contents(db_path):
    """Every row of every table: what a refused call must leave as it was."""
    return list(sqlite3.connect(db_path).iterdump())


HIDING = {
    "DEL": "\x7f", "C1 NEL": "\x85", "C1 CSI": "\x9b", "ESC sequence": "\x1b[2J", "newline": "\n", "tab": "\t",
    "RLO": "\u202e", "LRI": "\u2066", "RLM": "\u200f", "ALM": "\u061c", "zero width space": "\u200b",
    "line separator": "\u2028", "paragraph separator": "\u2029", "BOM": "\ufeff",
}


@pytest.mark.parametrize("flag", ["--uuid", "--label", "--gpu"])
@pytest.mark.parametrize("name", HIDING)
def test_control_and_bidi_characters_are_refused_in_identifiers(ready, cli, db_path, flag, name):
    values = {"--uuid": "u1", "--label": "vastctl-a", "--gpu": "RTX 4090"}
    values[flag] = f"vastctl{HIDING[name]}x"
    before = contents(db_path)
    result = cli("register", *[item for pair in values.items() for item in pair])
    one_error_line(result, 2, f"{flag} must be 1 to 256 printable characters")
    assert contents(db_path) == before


def test_a_repeated_register_cannot_smuggle_a_gpu_name_in(ready, cli, db_path):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-a").code == 0
    before = contents(db_path)
    one_error_line(cli("register", "--uuid", "u1", "--gpu", "RTX\u202e4090"), 2, "--gpu")
    assert contents(db_path) == before


@pytest.mark.parametrize("length,code", [(256, 0), (257, 2), (10_000, 2)])
def test_gpu_name_has_the_same_cap_as_http(ready, cli, db_path, length, code):
    before = contents(db_path)
    result = cli("register", "--uuid", "u1", "--label", "vastctl-a", "--gpu", "G" * length)
    assert result.code == code
    if code:
        one_error_line(result, 2, "--gpu must be 1 to 256 printable characters", f"got {length} characters")
        assert contents(db_path) == before


@pytest.mark.parametrize("args,flag", [
    (["heartbeat", "--uuid", "u1", "--proofs-done", str(2**63)], "--proofs-done"),
    (["register", "--uuid", "u2", "--label", "vastctl-b", "--vast-id", str(2**63)], "--vast-id"),
    (["register", "--uuid", "u2", "--label", "vastctl-b", "--num-gpus", str(2**63)], "--num-gpus"),
])
def test_a_number_too_large_for_the_file_names_its_flag(ready, cli, db_path, args, flag):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-a").code == 0
    before = contents(db_path)
    one_error_line(cli(*args), 2, f"{flag} must be a whole number from", "too large")
    assert contents(db_path) == before
    assert cli("heartbeat", "--uuid", "u1", "--proofs-done", str(2**63 - 1)).code == 0


@pytest.mark.parametrize("args,flag", [
    (["register", "--uuid", "u1", "--label", "vastctl-\udcff"], "--label"),
    (["register", "--uuid", "u1", "--label=vastctl-\udcff"], "--label"),
    (["kill", "vastctl-\udcff", "--reason", "x"], "the argument"),
    (["notify", "caf\udce9"], "the argument"),
])
def test_undecodable_bytes_on_the_command_line_name_the_flag(ready, cli, db_path, args, flag):
    before = contents(db_path)
    one_error_line(cli(*args), 2, flag, "not UTF-8 text", "0x")
    assert contents(db_path) == before


def test_undecodable_bytes_from_the_environment_are_refused(ready, cli, db_path, monkeypatch):
    monkeypatch.setenv("VASTCTL_LABEL", "vastctl-\udcff")
    before = contents(db_path)
    one_error_line(cli("register", "--uuid", "u1"), 2, "--label must be 1 to 256 printable characters")
    assert contents(db_path) == before


@pytest.fixture
def machine(ready, cli):
    for args in (["register", "--uuid", "u1", "--label", "vastctl-a"], ["params-done", "--uuid", "u1"],
                 ["bench-report", "--uuid", "u1", "--rate", "60"], ["running", "--uuid", "u1"],
                 ["demand", "report", "--queued", "0"]):  # an empty queue: the last machine may be killed
        assert cli(*args).code == 0


@pytest.mark.parametrize("reason", ["r" * 501, "line one\nline two", "GPU \x1b[31merrors"])
def test_a_kill_reason_is_one_line_of_at_most_500_characters(machine, cli, db_path, reason):
    before = contents(db_path)
    one_error_line(cli("kill", "vastctl-a", "--reason", reason), 2, "--reason must be 1 to 500 printable characters")
    assert contents(db_path) == before
    assert cli("kill", "vastctl-a", "--reason", "r" * 500).code == 0


def test_a_note_keeps_its_4000_cap(ready, cli, db_path):
    before = contents(db_path)
    one_error_line(cli("notify", "n" * 4001), 2, "4000")
    assert contents(db_path) == before


# --- upstream text is shown escaped in tables and lines, and kept as it is in JSON ----------------------

ESC = "\x1b]0;pwned\x07\x1b[2J"
T = "2026-01-01T00:00:00Z"


@pytest.fixture
def upstream_text(machine, db_path):
    """Rows as vast and machines filled them before this rule existed, or as reconcile copies them from vast."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, kill_reason, vast_status,"
                " destroy_attempts, destroy_error) VALUES ('u9', ?, 'killed', ?, ?, ?, ?, 1, ?)",
                ("vastctl-\u202eevil", T, T, f"exited: {ESC}", f"exited{ESC}", f"HTTP 500 {ESC}"))
    raw.execute("UPDATE instances SET vast_status = ?, vast_status_msg = ? WHERE uuid = 'u1'",
                (f"loading{ESC}", f"pulling\n{ESC}"))
    raw.execute("INSERT INTO events (at, kind, uuid, label, to_state, reason, source) VALUES"
                " ('2026-01-01T00:00:00Z', 'transition', 'u9', ?, 'killed', ?, 'reconcile')",
                ("vastctl-\u202eevil", f"vast says exited: {ESC}\u2028fake line"))
    raw.execute("INSERT INTO vast_listings (at, ok, error) VALUES ('2026-01-01T00:00:00Z', 0, ?)", (f"bad {ESC}",))


def no_raw_controls(text: str) -> None:
    for ch in ("\x1b", "\x07", "\u202e", "\u2028"):
        assert ch not in text, repr(text)


def test_fleet_and_events_escape_what_vast_and_machines_wrote(upstream_text, cli):
    fleet = cli("fleet", "--all")
    assert fleet.code == 0
    no_raw_controls(fleet.out + fleet.err)
    assert "vastctl-\\u202eevil" in fleet.out and "\\x1b[2J" in fleet.out
    assert "warning: the last vast listing failed: bad \\x1b]0;pwned\\x07\\x1b[2J" in fleet.err
    events = cli("events")
    no_raw_controls(events.out)
    assert len(events.out.splitlines()) == 1 + 5  # every event on its own line, the separator escaped
    assert "exited: \\x1b]0;pwned\\x07\\x1b[2J\\u2028fake line" in events.out


def test_json_keeps_the_data_as_it_is(upstream_text, cli):
    instances = {i["uuid"]: i for i in json.loads(cli("fleet", "--json", "--all").out)["instances"]}
    assert instances["u9"]["label"] == "vastctl-\u202eevil"
    assert instances["u1"]["vast_status_msg"] == f"pulling\n{ESC}"
    events = json.loads(cli("events", "--json").out)
    assert events[-1]["reason"] == f"vast says exited: {ESC}\u2028fake line"


def test_kill_prints_an_adopted_label_escaped(ready, cli, db_path):
    sqlite3.connect(db_path, isolation_level=None).execute(
        "INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES ('u7', ?, 'running', ?, ?)",
        ("vastctl-\x1b[8mhidden", T, T))
    assert cli("demand", "report", "--queued", "0").code == 0  # an empty queue: the last machine may be killed
    result = cli("kill", "u7", "--reason", "odd label")
    assert result.code == 0 and result.out == "vastctl-\\x1b[8mhidden killed\n"
