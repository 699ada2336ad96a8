"""The rows kept between reads (state/kept_rows.py) are the file's rows as the connection sees them, after any
change: a new row, an update, a write rolled back, an older snapshot, another file at the path, a migration."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from helpers.db_files import file_at, migration_number

from vastctl.clock import SYSTEM
from vastctl.state import db, instances, kept_rows


def add(conn, uuid, created="2026-01-01T00:00:00Z", **fields):
    names = ["uuid", "label", "state", "created_at", "state_since", *fields]
    values = [uuid, f"vastctl-{uuid}", "running", created, created, *fields.values()]
    conn.execute(f"INSERT INTO instances ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})", values)


def as_file_has_them(conn):
    """uuid → the row's values, as a SELECT * reads them now (what the kept rows must equal)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return {row[0]: row for row in cursor.execute("SELECT * FROM instances")}


@pytest.fixture
def pair(tmp_path):
    """The reader's connection, and a writer's: another process's heartbeats, as serve sees them."""
    path = tmp_path / "state.db"
    reader = db.connect(path, create=True, now=SYSTEM.now())
    writer = sqlite3.connect(str(path), isolation_level=None)
    yield path, reader, writer
    reader.close()
    writer.close()


def test_each_insert_and_update_takes_a_revision_past_the_files_highest(pair):
    _path, reader, writer = pair
    add(writer, "a")
    add(writer, "b")
    revisions = dict(writer.execute("SELECT uuid, revision FROM instance_revisions"))
    assert revisions == {"a": 1, "b": 2}
    writer.execute("UPDATE instances SET proofs_total = 5 WHERE uuid = 'a'")
    writer.execute("UPDATE instances SET proofs_total = proofs_total WHERE uuid = 'b'")  # no value changed: still
    writer.execute("UPDATE instances SET vast_status = 'running', vast_seen_at = 'x' WHERE uuid = 'a'")  # 2 triggers
    revisions = dict(writer.execute("SELECT uuid, revision FROM instance_revisions"))
    assert revisions["b"] == 4 and revisions["a"] > 4


def test_the_kept_rows_are_the_files_after_inserts_and_updates_read_from_another_connection(pair):
    _path, reader, writer = pair
    for n in range(5):
        add(writer, f"m{n}", created=f"2026-01-0{5 - n}T00:00:00Z")
    first = kept_rows.read(reader)
    assert first.by_id == as_file_has_them(reader)
    writer.execute("UPDATE instances SET last_heartbeat_at = 'x', proofs_total = 7 WHERE uuid = 'm2'")
    add(writer, "new", created="2026-01-03T00:00:00Z")
    second = kept_rows.read(reader)
    assert second.by_id == as_file_has_them(reader)
    # unchanged rows are the very tuples of the last reading; the reading before is left as it was
    unchanged = [uuid for uuid in first.by_id if uuid != "m2"]
    assert all(second.by_id[uuid] is first.by_id[uuid] for uuid in unchanged)
    assert first.by_id["m2"] != second.by_id["m2"] and "new" not in first.by_id
    by_created = [row[second.position["uuid"]] for row in second.ordered(kept_rows.BY_CREATION)]
    assert by_created == [u for (u,) in reader.execute("SELECT uuid FROM instances ORDER BY created_at, rowid")]


def test_an_order_follows_a_changed_creation_time_and_label(pair):
    _path, reader, writer = pair
    for n in range(4):
        add(writer, f"m{n}", created=f"2026-01-0{n + 1}T00:00:00Z")
    order = lambda: [row[0] for row in kept_rows.read(reader).ordered(kept_rows.BY_CREATION_LABEL)]  # noqa: E731
    assert order() == ["m0", "m1", "m2", "m3"]
    writer.execute("UPDATE instances SET created_at = '2026-02-01T00:00:00Z' WHERE uuid = 'm0'")  # by hand
    assert order() == ["m1", "m2", "m3", "m0"]
    writer.execute("UPDATE instances SET created_at = '2026-01-02T00:00:00Z', label = 'a-first' WHERE uuid = 'm3'")
    assert order() == ["m3", "m1", "m2", "m0"]  # the same time as m1, a label before its
    expected = [u for (u,) in reader.execute("SELECT uuid FROM instances ORDER BY created_at, label")]
    assert order() == expected


def test_a_write_rolled_back_is_read_by_its_connection_but_never_kept(pair):
    _path, reader, writer = pair
    add(writer, "a")
    add(writer, "b")
    kept_rows.read(reader)
    with pytest.raises(RuntimeError):
        with db.transaction(reader):
            reader.execute("UPDATE instances SET proofs_total = 99 WHERE uuid = 'a'")
            inside = kept_rows.read(reader)
            assert inside.by_id["a"][inside.position["proofs_total"]] == 99  # its own write, uncommitted
            raise RuntimeError("rolled back")
    # the other connection commits the revision the rolled-back write had used, to the same row
    writer.execute("UPDATE instances SET proofs_total = 5 WHERE uuid = 'a'")
    after = kept_rows.read(reader)
    assert after.by_id == as_file_has_them(reader)
    assert after.by_id["a"][after.position["proofs_total"]] == 5


def test_a_connection_whose_snapshot_is_older_reads_its_own_snapshot(pair):
    path, reader, writer = pair
    add(writer, "a")
    old = db.connect(path, now=SYSTEM.now())
    old.execute("BEGIN")
    assert kept_rows.read(old).by_id == as_file_has_them(old)  # its snapshot starts here
    writer.execute("UPDATE instances SET proofs_total = 3 WHERE uuid = 'a'")
    add(writer, "b")
    assert len(kept_rows.read(reader).by_id) == 2  # the newer reading is kept
    seen = kept_rows.read(old)
    assert seen.by_id == as_file_has_them(old) and len(seen.by_id) == 1
    old.execute("COMMIT")
    old.close()
    assert kept_rows.read(reader).by_id == as_file_has_them(reader)


def test_another_file_at_the_path_or_a_restored_copy_is_read_whole(pair, tmp_path):
    path, reader, writer = pair
    add(writer, "a")
    add(writer, "b")
    backup = tmp_path / "backup.db"
    writer.execute(f"VACUUM INTO '{backup}'")
    writer.execute("UPDATE instances SET proofs_total = 40 WHERE uuid = 'a'")
    writer.execute("UPDATE instances SET proofs_total = 50 WHERE uuid = 'b'")
    assert kept_rows.read(reader).by_id == as_file_has_them(reader)
    # restored in place (the same inode), then written again past the revisions kept
    restore = sqlite3.connect(str(backup))
    target = sqlite3.connect(str(path))
    restore.backup(target)
    restore.close()
    target.close()
    writer.execute("UPDATE instances SET proofs_total = 1 WHERE uuid = 'b'")
    writer.execute("UPDATE instances SET proofs_total = 2 WHERE uuid = 'b'")
    writer.execute("UPDATE instances SET proofs_total = 3 WHERE uuid = 'b'")
    assert kept_rows.read(reader).by_id == as_file_has_them(reader)
    # another file moved to the path: a new connection to it (the old one still reads the file it opened)
    other = tmp_path / "other.db"
    shutil.copy(backup, other)
    other.replace(path)
    fresh = db.connect(path, now=SYSTEM.now())
    assert kept_rows.read(fresh).by_id == as_file_has_them(fresh)
    fresh.close()


def test_a_uuid_edited_by_hand_is_read_whole(pair):
    _path, reader, writer = pair
    add(writer, "a")
    add(writer, "b")
    kept_rows.read(reader)
    writer.execute("UPDATE instances SET uuid = 'c' WHERE uuid = 'a'")
    assert kept_rows.read(reader).by_id == as_file_has_them(reader)


def test_a_migration_is_read_whole(pair):
    _path, reader, writer = pair
    add(writer, "a")
    kept_rows.read(reader)
    writer.execute("ALTER TABLE instances ADD COLUMN later TEXT DEFAULT 'x'")
    rows = kept_rows.read(reader)
    assert rows.names[-1] == "later" and rows.by_id == as_file_has_them(reader)


def test_the_readers_that_keep_rows_answer_as_their_queries_did(pair):
    """undestroyed (ordered), benches and amounts, against the SQL they ran before rows were kept."""
    _path, reader, writer = pair
    for n in range(6):
        add(writer, f"m{n}", created=f"2026-01-0{(n * 5) % 7 + 1}T00:00:00Z", bench_rate=None if n % 3 else 50.0 + n,
            destroyed_at="2026-01-09T00:00:00Z" if n == 4 else None)
    for round_ in range(3):
        writer.execute("UPDATE instances SET bench_rate = ?, proofs_total = ? WHERE uuid = ?",
                       (60.0 + round_, round_, f"m{round_ + 1}"))
        expected = [dict(row) for row in reader.execute(
            "SELECT * FROM instances WHERE destroyed_at IS NULL ORDER BY created_at, label")]
        assert instances.undestroyed(reader, ordered=True) == expected
        assert instances.benches(reader) == [instances.Bench(*row) for row in reader.execute(
            "SELECT uuid, gpu_name, machine_id, num_gpus, bench_rate FROM instances WHERE bench_rate IS NOT NULL"
            " ORDER BY created_at, rowid")]


def test_an_upgrade_gives_old_rows_a_revision_each_and_new_writes_the_next(db_path):
    number = migration_number("a revision per machine")
    raw = file_at(db_path, number - 1)
    for uuid in ("a", "b", "c"):
        raw.execute("INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES (?, ?, 'running',"
                    " 't', 't')", (uuid, f"vastctl-{uuid}"))
    raw.close()
    conn = db.connect(db_path, now=SYSTEM.now())
    assert dict(conn.execute("SELECT uuid, revision FROM instance_revisions")) == {"a": 1, "b": 2, "c": 3}
    conn.execute("UPDATE instances SET proofs_total = 1 WHERE uuid = 'a'")
    assert conn.execute("SELECT revision FROM instance_revisions WHERE uuid = 'a'").fetchone()[0] == 4
    assert kept_rows.read(conn).by_id == as_file_has_them(conn)
