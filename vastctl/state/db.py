"""The one place that opens the state file.

WAL so readers never wait for writers, a busy timeout so racing writers queue
instead of failing, and numbered, named, append-only migrations applied on open.
A shipped migration is never edited: add a new one at the end of migrations.MIGRATIONS, with the next number.
Times are stored as ISO-8601 UTC text (see clock.py) so the file reads well
in sqlite3, sqlite-utils and Datasette.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Iterator, Sequence

from vastctl import clock
from vastctl.errors import BadInput, Unavailable, VastctlError
from vastctl.state import migrations

BUSY_TIMEOUT_S = 60.0


SCHEMA_VERSION = migrations.MIGRATIONS[-1].number
# What marks a file as ours: its migrations table records our first migration under this name.
FIRST_MIGRATION = migrations.MIGRATIONS[0].name


def connect(path: str | Path, *, now: datetime, create: bool = False) -> sqlite3.Connection:
    """Open (and migrate) the state file; a migration applied now is stamped `now` (the caller's clock).

    Nothing is written to a file before it is known to be ours: another
    application's SQLite file, or one from a newer vastctl, is refused as it is.
    Only `create` (what `vastctl init` passes) may set up a missing or empty file;
    without it a missing file is an error naming `vastctl init`, so a typo in
    VASTCTL_DB never quietly starts an empty fleet.
    """
    path = Path(path).expanduser()
    if str(path) != ":memory:" and not path.exists():
        if not create:
            raise BadInput(f"no state file at {path}: point VASTCTL_CONFIG (or --config) at the config that names"
                           " the state file, or VASTCTL_DB (or --db) at the file; `vastctl init` sets up a new one")
        path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(path)
    conn = None
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _check_ours(conn, path, create=create)
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn, now=now)
    except (sqlite3.Error, BadInput) as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.Error):
            raise (explain(exc, path) or exc) from exc
        raise
    return conn


def _create_private(path: Path) -> None:
    """Make the new state file empty and mode 600 before SQLite opens it.

    SQLite would make it 644 (less the umask), and it gives the -wal and -shm
    it creates later the main file's mode: so all three stay readable by the
    vastctl user only, whatever the umask of whoever ran `init`.
    """
    with contextlib.suppress(FileExistsError):  # another init made it a moment ago: open that one
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _check_ours(conn: sqlite3.Connection, path: Path, *, create: bool) -> None:
    """Refuse, by reading only, a file that is not vastctl's, is from a newer vastctl, or is empty without `create`."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    objects = [(row[0], row[1]) for row in conn.execute("SELECT name, type FROM sqlite_master")
               if not row[0].startswith("sqlite_")]
    if not objects and version == 0:
        if create:
            return
        raise BadInput(f"the state file {path} is empty: run `vastctl init` to set it up, or point VASTCTL_DB at"
                       " vastctl's file")
    tables = [name for name, kind in objects if kind == "table"]
    first = None
    if "migrations" in tables:
        with contextlib.suppress(sqlite3.OperationalError):  # a `migrations` table of some other shape
            first = conn.execute("SELECT name FROM migrations WHERE id = 1").fetchone()
    if first is None or first[0] != FIRST_MIGRATION:
        held = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "") if tables else "none"
        raise BadInput(f"{path} is not a vastctl state file (its tables: {held}): point VASTCTL_DB or --db at"
                       " vastctl's file; `vastctl init` sets up a new one at a path that does not exist yet")
    newest = conn.execute("SELECT max(id) FROM migrations").fetchone()[0] or 0
    if max(version, newest) > SCHEMA_VERSION:
        raise BadInput(f"the state file {path} is from a newer vastctl (schema {max(version, newest)}; this one knows"
                       f" up to {SCHEMA_VERSION}): upgrade vastctl; this version leaves the file alone")


def migrate(conn: sqlite3.Connection, *, now: datetime) -> int:
    """Apply every migration the file has not had yet, stamped `now`; returns the schema version."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return SCHEMA_VERSION
    shipped = migrations.check(migrations.MIGRATIONS)  # numbered 1…SCHEMA_VERSION: a migration's number is its place
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            _create_fresh(conn)
        else:
            _apply(conn, range(version + 1, SCHEMA_VERSION + 1))
        conn.executemany("INSERT INTO migrations (id, name, applied_at) VALUES (?, ?, ?)",
                         [(migration.number, migration.name, clock.to_iso(now)) for migration in shipped[version:]])
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return SCHEMA_VERSION


def _apply(conn: sqlite3.Connection, numbers: range, shipped: Sequence[migrations.Migration] | None = None) -> None:
    """Run the migrations numbered `numbers`, in order (the migrations table is created with the first)."""
    if numbers.start == 1:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
    for number in numbers:
        for statement in _statements((shipped or migrations.MIGRATIONS)[number - 1].sql):
            conn.execute(statement)


def _create_fresh(conn: sqlite3.Connection) -> None:
    """A new file gets the schema every migration leads to, written at once.

    Running each migration on a new file re-reads the growing schema at every
    ALTER (~100 statements, most of an `init`); the schema they lead to is the
    same text in fewer statements. It is built once a process by running the
    migrations on a database in memory. Rows the migrations wrote there (none
    today but the migrations table's own, which the caller stamps) are copied
    before any trigger exists, so none fires twice. tests/test_db.py checks
    that a new file and one upgraded migration by migration are the same.
    """
    tables, rows, triggers = _fresh_schema(tuple(migrations.MIGRATIONS))
    for statement in tables:
        conn.execute(statement)
    for table, columns, values in rows:
        marks = ", ".join("?" for _ in columns)
        conn.executemany(f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({marks})', values)
    for statement in triggers:
        conn.execute(statement)


FreshRows = list[tuple[str, list[str], list[tuple[object, ...]]]]


@functools.cache
def _fresh_schema(shipped: tuple[migrations.Migration, ...]) -> tuple[list[str], FreshRows, list[str]]:
    """What a new file needs after running `shipped` (the migrations, as the key of this cache): the statements
    that make its tables, indexes and views in the order SQLite keeps them, the rows the migrations wrote
    (table, columns, rows), and the statements that make its triggers."""
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        _apply(memory, range(1, len(shipped) + 1), shipped)
        objects = memory.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
                                 " AND name NOT LIKE 'sqlite_%' ORDER BY rowid").fetchall()
        rows: FreshRows = []
        for kind, table, _ in objects:
            if kind != "table" or table == "migrations":
                continue
            cursor = memory.execute(f'SELECT * FROM "{table}"')
            values = [tuple(row) for row in cursor]
            if values:
                rows.append((table, [f'"{column[0]}"' for column in cursor.description], values))
        return ([sql for kind, _, sql in objects if kind != "trigger"], rows,
                [sql for kind, _, sql in objects if kind == "trigger"])
    finally:
        memory.close()


def _statements(sql: str) -> list[str]:
    """The statements of a migration; a trigger's body (BEGIN … ; … END) stays one statement."""
    statements, pending = [], ""
    for part in sql.split(";"):
        pending = f"{pending};{part}" if pending else part
        if pending.strip() and sqlite3.complete_statement(pending + ";"):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        statements.append(pending.strip())
    return statements


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The row id an INSERT just wrote (sqlite3 types `lastrowid` as optional; after an INSERT it is set)."""
    row_id = cursor.lastrowid
    assert row_id is not None, "inserted_id() after a statement that inserted nothing"
    return row_id


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE … COMMIT: take the write lock up front, so two writers
    queue on the busy timeout instead of deadlocking on a lock upgrade.

    A failure of the file itself (full, read-only, damaged, busy) leaves as the
    typed error that says what to do; the transaction is undone either way.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise (explain(exc, _path_of(conn)) or exc) from exc
    try:
        yield conn
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        _rollback(conn)
        raise (explain(exc, _path_of(conn)) or exc) from exc
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo what is left of a failed transaction.

    After a full disk or an I/O error SQLite may have rolled back already; a
    second ROLLBACK would then fail and hide the error that matters.
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _path_of(conn: sqlite3.Connection) -> str | None:
    with contextlib.suppress(sqlite3.Error):
        row = conn.execute("PRAGMA database_list").fetchone()
        return row[2] or None
    return None


def explain(exc: sqlite3.Error, path: str | Path | None = None) -> VastctlError | None:
    """The typed error, naming the fix, for a failure of the state file itself; None for anything else."""
    text = str(exc)
    name = getattr(exc, "sqlite_errorname", "")
    where = f" {path}" if path else ""
    beside = f"{Path(path).name}-wal and {Path(path).name}-shm" if path else "FILE-wal and FILE-shm"
    permissions = (f"check the permissions of the file and its directory (vastctl writes the file, and SQLite's"
                   f" WAL needs to write {beside} beside it)")
    if "locked" in text or "busy" in text or name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return Unavailable(f"the state file{where} stayed busy for {BUSY_TIMEOUT_S:.0f}s: retry later")
    if "disk is full" in text or name == "SQLITE_FULL":
        return Unavailable(f"the state file{where} cannot grow ({text}): free space on its disk and retry;"
                           " the change was not saved")
    if "readonly" in text or name.startswith("SQLITE_READONLY"):
        return BadInput(f"the state file{where} is read-only ({text}): {permissions}")
    if "unable to open" in text or name.startswith("SQLITE_CANTOPEN"):
        return BadInput(f"cannot open the state file{where} ({text}): check the path, and {permissions}")
    if "not a database" in text or name == "SQLITE_NOTADB":
        return BadInput(f"the state file{where} is not a SQLite database ({text}): check VASTCTL_DB or --db;"
                        " if it was vastctl's, restore it from a backup")
    if "malformed" in text or name.startswith("SQLITE_CORRUPT"):
        return BadInput(f"the state file{where} is damaged ({text}): restore it from a backup"
                        " (`sqlite3 FILE .recover` may save what is left)")
    if "disk I/O error" in text or name.startswith("SQLITE_IOERR"):
        return Unavailable(f"the state file{where} could not be read or written ({text}): check its disk, then retry")
    return None
