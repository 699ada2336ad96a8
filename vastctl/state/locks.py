"""Named leases in the state file: one reconcile pass, one launch, at a time.

A lease expires, and a holder on this host whose process is gone is ignored,
so a crashed pass never blocks the next one for long. Like every state module
it reads no clock: the holder passes `now` (from its injected Clock), so
leases work on virtual time.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterator

from vastctl import clock as clocks
from vastctl.errors import Unavailable
from vastctl.state.db import transaction


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _holder_is_dead(holder: str) -> bool:
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(conn: sqlite3.Connection, name: str, *, ttl_s: float, now: datetime,
            holder: str | None = None) -> str | None:
    """Take the lease; returns the holder string, or None when someone alive holds it."""
    holder = holder or _holder()
    with transaction(conn):
        row = conn.execute("SELECT * FROM locks WHERE name = ?", (name,)).fetchone()
        if row is not None:
            expires = clocks.from_iso(row["expires_at"])
            assert expires is not None  # locks.expires_at is NOT NULL
            expired = expires <= now
            if not expired and row["holder"] != holder and not _holder_is_dead(row["holder"]):
                return None
        conn.execute(
            "INSERT OR REPLACE INTO locks (name, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?)",
            (name, holder, clocks.to_iso(now), clocks.to_iso(now + timedelta(seconds=ttl_s))),
        )
    return holder


def release(conn: sqlite3.Connection, name: str, holder: str) -> None:
    with transaction(conn):
        conn.execute("DELETE FROM locks WHERE name = ? AND holder = ?", (name, holder))


@dataclass
class Lease:
    """A held lease. `renew(now)` keeps a long holder from being taken for dead."""

    conn: sqlite3.Connection
    name: str
    holder: str
    ttl_s: float

    def renew(self, now: datetime) -> None:
        """Expire `ttl_s` after `now` (the holder's clock: virtual time in the simulator)."""
        with transaction(self.conn):
            self.conn.execute("UPDATE locks SET expires_at = ? WHERE name = ? AND holder = ?",
                              (clocks.to_iso(now + timedelta(seconds=self.ttl_s)), self.name, self.holder))


@contextlib.contextmanager
def held(conn: sqlite3.Connection, name: str, *, ttl_s: float, now: datetime) -> Iterator[Lease]:
    """Hold the lease for the block, or raise Unavailable (exit 1: retry later)."""
    holder = acquire(conn, name, ttl_s=ttl_s, now=now)
    if holder is None:
        row = conn.execute("SELECT holder, acquired_at FROM locks WHERE name = ?", (name,)).fetchone()
        since = clocks.display_iso(row["acquired_at"]) if row else "?"
        raise Unavailable(f"another {name} is running ({row['holder'] if row else '?'} since {since}): retry later")
    try:
        yield Lease(conn, name, holder, ttl_s)
    finally:
        release(conn, name, holder)
