"""The events table is only ever appended to: what was read of it stays true, so a reader that keeps it reads
only the rows added since (the dashboard and /metrics read every machine's transitions and reports per request).

A Tail remembers the newest event it saw. When that event is still there, only the rows after it are new; when
it is gone or differs (another file at the path, one restored from a backup), everything is read again.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

FILES_KEPT = 8  # state files whose readings are kept (a process serves one; tests open many)

T = TypeVar("T")


class Tail:
    def __init__(self) -> None:
        self.newest: tuple[int, str, str] | None = None  # (id, at, kind) of the newest event read

    def span(self, conn: sqlite3.Connection) -> tuple[int, int] | None:
        """The ids to read now, (after, up to]: after 0 means from the start (drop what was kept); None: nothing
        was appended since the last read."""
        found = conn.execute("SELECT id, at, kind FROM events ORDER BY id DESC LIMIT 1").fetchone()
        newest = tuple(found) if found is not None else None
        if newest == self.newest:
            return None
        after = 0
        if self.newest is not None and newest is not None and newest[0] > self.newest[0]:
            seen = conn.execute("SELECT id, at, kind FROM events WHERE id = ?", (self.newest[0],)).fetchone()
            if seen is not None and tuple(seen) == self.newest:
                after = self.newest[0]
        self.newest = newest
        return after, newest[0] if newest is not None else 0


class PerFile(Generic[T]):
    """One kept reading per state file, the newest few files only."""

    def __init__(self, make: type[T]):
        self.make = make
        self.kept: OrderedDict[str, T] = OrderedDict()
        self.lock = threading.Lock()  # serve's worker threads share it (--threads)

    def get(self, conn: sqlite3.Connection) -> T:
        name = file_of(conn)
        with self.lock:
            found = self.kept.get(name)
            if found is None:
                found = self.kept[name] = self.make()
                while len(self.kept) > FILES_KEPT:
                    self.kept.popitem(last=False)
            self.kept.move_to_end(name)
            return found


def file_of(conn: sqlite3.Connection) -> str:
    """The connection's file (an in-memory database by its connection)."""
    return conn.execute("PRAGMA database_list").fetchone()[2] or f":memory:{id(conn)}"
