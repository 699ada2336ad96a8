"""The events table is only ever appended to: what was read of it stays true, so a reader that keeps it reads
only the rows added since (the dashboard and /metrics read every machine's transitions and reports per request).

A Tail remembers the newest event it saw. When that event is still there, only the rows after it are new; when
it is gone or differs (another file at the path, one restored from a backup), everything is read again.
"""

from __future__ import annotations

import sqlite3

from vastctl.state.per_file import PerFile, file_of

__all__ = ["PerFile", "Tail", "file_of"]


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
