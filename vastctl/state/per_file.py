"""One kept reading per state file: what serve's readers keep between requests, by the file they read."""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

FILES_KEPT = 8  # state files whose readings are kept (a process serves one; tests open many)

T = TypeVar("T")


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
