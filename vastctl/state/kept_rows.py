"""Every `instances` row of a state file, kept between reads: serve's page, its refresh and /metrics each read
every machine's row, and between two requests a heartbeat or two changed one or two of them.

Each machine has a revision past the file's highest, set by a trigger at every insert and update of its row
(`instance_revisions`, migration 24), and rows are never deleted. A reader that kept the rows up to revision R
reads only the machines past R (an index). Everything is read again when the kept rows may not be this file's as
the connection sees it: another file at the path (another inode), another schema (a migration ran), the machine
that had revision R gone or at a lower one (a file restored from a backup, or a connection whose read snapshot
is older than what was kept: what it reads is then its own snapshot's, never newer rows), or the file holding
another number of rows than were kept (a uuid edited by hand).

A connection inside a transaction it may have written in reads its own rows, uncommitted: they are returned but
not kept (a rollback would leave kept rows the file never had, at revisions the next commit uses again).
Each reading is a new `Rows`, never changed once made, so serve's threads may hold one while another reads.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Iterable, TypeAlias, cast

from vastctl.state.per_file import PerFile
from vastctl.state.rows import KeptRow, SQLValue

BY_CREATION = ("created_at",)  # ties in the order the rows were first read: SQLite's, by rowid
BY_CREATION_LABEL = ("created_at", "label")
BY_CREATION_UUID = ("created_at", "uuid")

# what says a reading is this file's as the connection sees it: ((st_dev, st_ino) of its path or None, schema version)
Identity: TypeAlias = "tuple[tuple[int, int] | None, int]"


class Rows:
    """One reading of the table: its columns and every row's values (plain tuples, SELECT * order) by uuid.
    A row that did not change since the last reading is the same tuple object in both."""

    __slots__ = ("names", "position", "by_id", "_orders", "_lock")

    def __init__(self, names: tuple[str, ...], by_id: dict[str, KeptRow],
                 orders: dict[tuple[str, ...], list[str]] | None = None):
        self.names = names
        self.position = {name: index for index, name in enumerate(names)}
        self.by_id = by_id
        self._orders: dict[tuple[str, ...], list[str]] = dict(orders or {})
        self._lock = threading.Lock()

    def ordered(self, by: tuple[str, ...]) -> list[KeptRow]:
        """Every row's values ordered by the columns `by` (as SQLite orders them: NULL, numbers, text, blobs),
        ties as first read; the order is worked out once per reading that changed a row's place."""
        with self._lock:
            order = self._orders.get(by)
            if order is None:
                indexes = [self.position[name] for name in by]
                by_id = self.by_id
                order = self._orders[by] = sorted(
                    by_id, key=lambda uuid: tuple(_sortable(by_id[uuid][index]) for index in indexes))
        by_id = self.by_id
        return [by_id[uuid] for uuid in order]

    def dicts(self, values: Iterable[KeptRow]) -> list[dict[str, SQLValue]]:
        """Rows' values as dicts of the columns (new ones: callers may change them)."""
        names = self.names
        return [dict(zip(names, row)) for row in values]

    def changed(self, rows: list[KeptRow]) -> "Rows":
        """A new reading: this one with `rows` ((revision, *values), each a row new or changed since) in it. Its
        orders are kept unless a row is new or a column an order reads changed."""
        by_id = dict(self.by_id)
        ordering = {name for by in self._orders for name in by}
        uuid_at = self.position["uuid"]
        moved = False
        for row in rows:
            values = row[1:]
            uuid = _uuid(values, uuid_at)
            before = by_id.get(uuid)
            moved = moved or before is None or any(before[self.position[name]] != values[self.position[name]]
                                                   for name in ordering)
            by_id[uuid] = values
        return Rows(self.names, by_id, None if moved else self._orders)


def _sortable(value: SQLValue) -> tuple[int, int | float | str | bytes]:
    """A value as SQLite's ORDER BY ranks it across types (a hand-edited file may hold text where a time was)."""
    if value is None:
        return (0, 0)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, bytes(value))


class _Kept:
    """One file's newest kept reading, what it was read against, and the newest row in it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: Rows | None = None
        self.identity: Identity | None = None  # what the kept reading was read against
        self.newest: tuple[int, str] | None = None  # (revision, uuid) of the newest row read


_FILES = PerFile(_Kept)


def read(conn: sqlite3.Connection, *, keep: bool | None = None) -> Rows:
    """Every row of `instances` as `conn` sees it now. `keep`: whether this reading may be kept for the next
    (None: when `conn` is in no transaction; True from a caller that began its transaction only to read)."""
    if keep is None:
        keep = not conn.in_transaction
    kept = _FILES.get(conn)
    with kept.lock:
        identity = _identity(conn)
        rows, newest = kept.rows, kept.newest
        if rows is None or newest is None or identity != kept.identity or not _still_there(conn, newest):
            rows, newest = _read_all(conn)
        else:
            cursor = conn.cursor()
            cursor.row_factory = None
            changed = cursor.execute("SELECT r.revision, i.* FROM instance_revisions r JOIN instances i USING (uuid)"
                                     " WHERE r.revision > ? ORDER BY r.revision", (newest[0],)).fetchall()
            if changed:
                if tuple(column[0] for column in cursor.description[1:]) != rows.names:
                    rows, newest = _read_all(conn)
                else:
                    rows = rows.changed(changed)
                    newest = _newest(changed, rows.position["uuid"])
                    if len(rows.by_id) != conn.execute("SELECT count(*) FROM instances").fetchone()[0]:
                        rows, newest = _read_all(conn)
        if keep:
            kept.rows, kept.identity, kept.newest = rows, identity, newest
        return rows


def _identity(conn: sqlite3.Connection) -> Identity:
    """What says the rows kept were read from this file and schema: the path's inode and the schema's version."""
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    try:
        stat = os.stat(path) if path else None
    except OSError:
        stat = None
    inode = (stat.st_dev, stat.st_ino) if stat is not None else None
    return inode, conn.execute("PRAGMA schema_version").fetchone()[0]


def _still_there(conn: sqlite3.Connection, newest: tuple[int, str]) -> bool:
    """Whether the newest machine kept is in the file as this connection sees it at its revision or a later one:
    then every row at or below that revision is as kept, or changed to one above it."""
    revision, uuid = newest
    found = conn.execute("SELECT revision FROM instance_revisions WHERE uuid = ?", (uuid,)).fetchone()
    return found is not None and isinstance(found[0], int) and found[0] >= revision


def _read_all(conn: sqlite3.Connection) -> tuple[Rows, tuple[int, str] | None]:
    cursor = conn.cursor()
    cursor.row_factory = None
    found = cursor.execute("SELECT r.revision, i.* FROM instances i LEFT JOIN instance_revisions r USING (uuid)"
                           " ORDER BY i.rowid").fetchall()
    names = tuple(column[0] for column in cursor.description[1:])
    uuid_at = names.index("uuid")
    return Rows(names, {row[1 + uuid_at]: row[1:] for row in found}), _newest(found, uuid_at)


def _newest(found: list[KeptRow], uuid_at: int) -> tuple[int, str] | None:
    """(revision, uuid) of the row with the highest revision among `found` ((revision, *values) each; the uuid
    at `uuid_at` among the values)."""
    best = max(found, key=lambda row: row[0] if isinstance(row[0], int) else -1, default=None)
    if best is None or not isinstance(best[0], int):
        return None
    return best[0], _uuid(best, 1 + uuid_at)


def _uuid(values: KeptRow, at: int) -> str:
    """The uuid at `at` among a row's values: the key the rows are kept by (`instances.uuid` is TEXT)."""
    return cast(str, values[at])
