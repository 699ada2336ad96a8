"""Guarding the dashboard's sign-in: the admin token's strength, and a brake on wrong guesses.

The admin token is the only secret between the network and every dashboard
action (kill, limits), so serve refuses to start with a short or repetitive
one (`weakness()`), and `Throttle` makes guessing it slow: after a few free
failures a client waits twice as long after each further one, and failures
from all clients together are held to a steady trickle, so many addresses do
not add up to many guesses. While a wait runs the token is not even compared:
a locked-out guess learns nothing, right or wrong. Time is the injected
clock's monotonic(), so tests and the simulator drive it.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime

from vastctl.clock import Clock, to_iso
from vastctl.state.db import transaction

MIN_TOKEN_CHARS = 24
MIN_DISTINCT_CHARS = 10
MIN_TOKEN_BITS = 128
GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"

FREE_FAILURES = 5  # a client's mistyped tokens before any wait
FIRST_WAIT_S = 1.0  # then 1 s, 2 s, 4 s … after each further failure
MAX_WAIT_S = 15 * 60.0
GLOBAL_BURST = 30  # failures from all clients together before the global trickle applies
GLOBAL_EVERY_S = 10.0  # then one more failure allowed per this many seconds, whoever sends it
MAX_CLIENTS = 10_000  # remembered addresses; past it the quietest are forgotten (the global limit still holds)


def weakness(token: str) -> str | None:
    """Why `token` is too weak to guard the dashboard, or None. An empty token (feature off) is not judged here."""
    pools = [any(c.islower() for c in token) and 26, any(c.isupper() for c in token) and 26,
             any(c.isdigit() for c in token) and 10, any(not c.isalnum() for c in token) and 33]
    bits = len(token) * math.log2(max(2, sum(pools)))
    if len(token) < MIN_TOKEN_CHARS:
        return f"it has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}"
    if len(set(token)) < MIN_DISTINCT_CHARS:
        return f"it repeats {len(set(token))} different characters, fewer than {MIN_DISTINCT_CHARS}"
    if bits < MIN_TOKEN_BITS:
        return f"it holds about {bits:.0f} bits, fewer than {MIN_TOKEN_BITS}"
    return None


@dataclass
class _Client:
    failures: int = 0
    wait_until: float = 0.0


class Throttle:
    """Failed sign-ins per client and overall, on `clock.monotonic()`; thread-safe (serve may run workers)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._global_level = 0.0  # failures not yet drained, draining one per GLOBAL_EVERY_S
        self._global_at = clock.monotonic()

    def wait(self, client: str) -> float:
        """Seconds `client` must wait before its next sign-in is looked at; 0 when it may try now."""
        with self._lock:
            now = self.clock.monotonic()
            self._drain(now)
            mine = self._clients.get(client)
            own = max(0.0, mine.wait_until - now) if mine else 0.0
            overall = max(0.0, self._global_level - (GLOBAL_BURST - 1)) * GLOBAL_EVERY_S  # until one more fits
            return max(own, overall)

    def failed(self, client: str) -> float:
        """Count a wrong token from `client`; the seconds it must now wait."""
        with self._lock:
            now = self.clock.monotonic()
            self._drain(now)
            self._global_level += 1
            mine = self._clients.pop(client, None) or _Client()
            self._clients[client] = mine  # re-inserted: the dict's order is least recently seen first
            mine.failures += 1
            if mine.failures > FREE_FAILURES:
                mine.wait_until = now + min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** min(mine.failures - FREE_FAILURES - 1, 30))
            while len(self._clients) > MAX_CLIENTS:
                del self._clients[next(iter(self._clients))]
            return max(0.0, mine.wait_until - now)

    def succeeded(self, client: str) -> None:
        """The right token: this client starts afresh (the overall count drains on its own)."""
        with self._lock:
            self._clients.pop(client, None)

    def _drain(self, now: float) -> None:
        self._global_level = max(0.0, self._global_level - (now - self._global_at) / GLOBAL_EVERY_S)
        self._global_at = now


def end_session(conn: sqlite3.Connection, session: str, *, expires: datetime, now: datetime) -> None:
    """Sign-out: the session id is refused from now until its cookie would have expired anyway."""
    with transaction(conn):
        conn.execute("DELETE FROM dashboard_sign_outs WHERE expires_at < ?", (to_iso(now),))  # past their expiry
        conn.execute("INSERT OR IGNORE INTO dashboard_sign_outs (session, expires_at, signed_out_at) VALUES (?, ?, ?)",
                     (session, to_iso(expires), to_iso(now)))


def session_ended(conn: sqlite3.Connection, session: str) -> bool:
    return conn.execute("SELECT 1 FROM dashboard_sign_outs WHERE session = ?", (session,)).fetchone() is not None
