"""The events and proof_calls tables are only ever appended to: what was read of them stays true, so a reader that
keeps them reads only the rows added since (the dashboard and /metrics read every machine's transitions and
reports per request; the cost account, what the router delivered to each machine).

A Tail remembers the newest row it saw of its table. When that row is still there, only the rows after it are
new; when it is gone or differs (another file at the path, one restored from a backup), everything is read again.
"""

from __future__ import annotations

import sqlite3

from vastctl.state.per_file import PerFile, file_of

__all__ = ["PerFile", "Tail", "file_of"]


APPENDED = ("events", "proof_calls")  # the tables only ever appended to (each has id, at and kind)


class Tail:
    def __init__(self, table: str = "events") -> None:
        if table not in APPENDED:
            raise ValueError(f"{table} is not only ever appended to")
        self.table = table
        self.newest: tuple[int, str, str] | None = None  # (id, at, kind) of the newest row read

    def span(self, conn: sqlite3.Connection) -> tuple[int, int] | None:
        """The ids to read now, (after, up to]: after 0 means from the start (drop what was kept); None: nothing
        was appended since the last read."""
        found = conn.execute(f"SELECT id, at, kind FROM {self.table} ORDER BY id DESC LIMIT 1").fetchone()
        newest = tuple(found) if found is not None else None
        if newest == self.newest:
            return None
        after = 0
        if self.newest is not None and newest is not None and newest[0] > self.newest[0]:
            seen = conn.execute(f"SELECT id, at, kind FROM {self.table} WHERE id = ?", (self.newest[0],)).fetchone()
            if seen is not None and tuple(seen) == self.newest:
                after = self.newest[0]
        self.newest = newest
        return after, newest[0] if newest is not None else 0
