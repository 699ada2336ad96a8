"""migrations: each migration carries its own number and name; a gap, a duplicate or a number out of order is
refused, and a file made when a migration's number was its place in the list migrates exactly as before."""

import sqlite3

import pytest

from vastctl.clock import SYSTEM
from vastctl.state import db, migrations
from vastctl.state.migrations import Migration, MisnumberedMigrations

# The migrations as shipped before each carried its number: (place in the list, name), what every state file made
# by then records in its `migrations` table. A number is never given to another migration.
SHIPPED_BY_PLACE = [
    (1, "instances, events, settings"),
    (2, "vast listing cache, provider audit, blocklist, locks"),
    (3, "agent conversation record and notes"),
    (4, "a machine's claimed vast id, kept apart from the one the manager trusts"),
    (5, "demand samples, agent steps"),
    (6, "demand samples: in flight and look-ahead"),
    (7, "the disk price of each listed instance, what a stopped one still bills"),
    (8, "dashboard sessions ended by sign-out"),
    (9, "vast webhook deliveries, one row an event id"),
    (10, "each machine's tunnel to the manager: its port, the public half of its key, joined or not since when"),
    (11, "each machine keeps the disk price vast last listed for it, for the cost account after it is gone"),
    (12, "the tail of each machine's logs, as its boot script pushed it"),
    (13, "agent steps: why a step that did nothing held"),
    (14, "when vast's status of each machine last changed, as the listings saw it"),
    (15, "each machine's bid when rented interruptible, the offer's on-demand price, since when vast has it outbid"),
    (16, "the simulated market's tables (provider: sim), empty until a market is set up in the file"),
    (17, "indexes for what every decision and every reconcile pass reads, so that a pass costs the same in a file a"
         " year old"),
    (18, "each machine's proofs over every run of its prover (a restarted counter adds, never lowers the total)"),
    (19, "the proof router: every call it delivered, what it holds, the machines it set aside"),
    (20, "where each machine's boot went: the seconds of each stage its boot script timed, reported with `running`"),
    (21, "webhook deliveries: the digest of what vast signed, so a body replayed under a fresh event id is one"),
    (22, "an event's structured fields (a setting's key, old and new value; a kill or stop forced past the guard) and"
         " a row's kill_forced, so nothing is decided from a reason's text; older rows' fields read from it once"),
    (23, "a machine's stored rates within their bounds and its prices real, once: what the file holds is counted as"
         " it is, never checked on read"),
    (24, "a revision per machine, past the file's highest at every insert and update of its row: a reader that kept"
         " the rows reads only those changed since (state/kept_rows.py)"),
    (25, "where the router sends each proof kind (own_daemon, fleet, refused) as JSON by kind name: the dashboard"
         " shows where the proofs Curio does not verify go, as the running router decided"),
]


def three(*numbers, names=("a", "b", "c")):
    return [Migration(number, name, "SELECT 1") for number, name in zip(numbers, names)]


def test_the_shipped_migrations_keep_the_numbers_and_names_their_places_gave_them():
    assert [(m.number, m.name) for m in migrations.MIGRATIONS[:len(SHIPPED_BY_PLACE)]] == SHIPPED_BY_PLACE
    assert [m.number for m in migrations.MIGRATIONS] == list(range(1, len(migrations.MIGRATIONS) + 1))
    assert db.SCHEMA_VERSION == migrations.MIGRATIONS[-1].number


def test_a_gap_in_the_numbers_is_refused_naming_the_migration():
    with pytest.raises(MisnumberedMigrations, match=r"migration 3 \('c'\) stands where migration 2 belongs"):
        migrations.check(three(1, 3, names=("a", "c")))


def test_a_duplicate_number_is_refused():
    """Two branches that each appended migration 26: the second is refused, never renumbered to 27."""
    with pytest.raises(MisnumberedMigrations, match=r"migration 2 \('c'\) stands where migration 3 belongs"):
        migrations.check(three(1, 2, 2))


def test_a_duplicate_name_is_refused():
    with pytest.raises(MisnumberedMigrations, match="migrations 1 and 3 share the name 'a'"):
        migrations.check(three(1, 2, 3, names=("a", "b", "a")))


def test_numbers_out_of_order_are_refused():
    with pytest.raises(MisnumberedMigrations, match="stands where migration 2 belongs"):
        migrations.check(three(1, 3, 2))


def test_a_well_numbered_list_is_kept_as_it_is():
    shipped = three(1, 2, 3)
    assert migrations.check(shipped) == tuple(shipped)


def test_opening_a_file_refuses_a_misnumbered_list_before_changing_it(tmp_path, monkeypatch):
    """A list edited after import (here: a gap appended) is refused when a file would be migrated by it."""
    path = tmp_path / "state.db"
    db.connect(path, create=True, now=SYSTEM.now()).close()
    shipped = migrations.MIGRATIONS[-1].number
    gap = Migration(shipped + 2, "a migration after a gap", "CREATE TABLE gap (id INTEGER)")
    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, gap))
    monkeypatch.setattr(db, "SCHEMA_VERSION", gap.number)
    with pytest.raises(MisnumberedMigrations, match="where migration"):
        db.connect(path, now=SYSTEM.now())
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == shipped
    assert raw.execute("SELECT count(*) FROM sqlite_master WHERE name = 'gap'").fetchone()[0] == 0


def file_by_place(path, version):
    """A state file at `version` as the list numbered by place made it: migration n is the list's n-th (name, sql),
    applied and recorded under the number n."""
    by_place = [(m.name, m.sql) for m in migrations.MIGRATIONS]
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for number, (name, sql) in enumerate(by_place[:version], start=1):
        for statement in db._statements(sql):
            raw.execute(statement)
        raw.execute("INSERT INTO migrations VALUES (?, ?, '2026-01-01T00:00:00Z')", (number, name))
    raw.execute(f"PRAGMA user_version = {version}")
    return raw


def schema(conn):
    return sorted(tuple(row) for row in conn.execute("SELECT type, name, tbl_name FROM sqlite_master"
                                                     " WHERE name NOT LIKE 'sqlite_%'"))


@pytest.mark.parametrize("version", [1, 10, 21, len(SHIPPED_BY_PLACE)])
def test_a_file_made_by_the_list_numbered_by_place_migrates_as_before(tmp_path, version):
    raw = file_by_place(tmp_path / "old.db", version)
    raw.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, bench_rate)"
                " VALUES ('u1', 'vastctl-old', 'running', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 55.5)")
    raw.close()
    conn = db.connect(tmp_path / "old.db", now=SYSTEM.now())
    fresh = db.connect(tmp_path / "fresh.db", create=True, now=SYSTEM.now())
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert [tuple(r) for r in conn.execute("SELECT id, name FROM migrations ORDER BY id")] == [
        (m.number, m.name) for m in migrations.MIGRATIONS]
    assert schema(conn) == schema(fresh)
    row = conn.execute("SELECT label, state, bench_rate FROM instances WHERE uuid = 'u1'").fetchone()
    assert tuple(row) == ("vastctl-old", "running", 55.5)
