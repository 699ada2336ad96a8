"""Machines we do not rent again for a while (`vast.blocklist_ttl`).

A machine whose instance failed the bench gate or the proof router's calls is
slow or broken whatever boots on it: its `machine_id` is kept out of offer
searches for `vast.blocklist_ttl`. One that died before delivering its first
proof (exited, went offline, vanished, timed out booting) may have drawn a bad
boot, which any host does now and then: once, it is kept out for
FIRST_DEATH_BLOCK_S; a second such death within the TTL shows a pattern, and it
is kept out for the TTL. Entries are derived from killed rows, anchored at the
kill time, so deriving them again (every launch, every reconcile pass) changes
nothing.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta

from vastctl import clock
from vastctl.state.db import transaction
from vastctl.state.rows import InstanceRow, typed

# kills that say nothing about the hardware: our own decisions, or the GPU being taken while stopped
NOT_THE_MACHINE = frozenset({"operator", "agent", "orphan", "scheduling_timeout"})
# kills that measured the host itself: its benchmark under the gate, its calls failing at the router
VERDICTS = frozenset({"bench_failed", "route_failing"})
# one death before a first proof keeps the host out this long (the TTL, if shorter): a cheap host is not lost for a
# day to one bad boot, and a host that dies so again within the TTL is kept out for the TTL
FIRST_DEATH_BLOCK_S = 3600.0


def reason_for(row: InstanceRow) -> str | None:
    """Why this killed row's machine should not be rented again, or None. Pure."""
    code = row.get("kill_code")
    if row.get("state") != "killed" or row.get("machine_id") is None or code is None:
        return None
    if code == "bench_failed":
        rate = row.get("bench_rate")
        return f"failed the bench gate ({'rate ' + format(rate, 'g') if rate is not None else 'no rate'})"
    if code == "route_failing":  # the proof router saw it drop or fail calls in a row: a host not to rent again
        return f"failed the proof router's calls ({row.get('route_failure') or 'no detail'})"
    if code in NOT_THE_MACHINE:
        return None
    if code == "start_failed" and row.get("vast_id") is None:  # the market refused the create: nothing ran
        return None
    if not row.get("proofs_total"):  # every run of its counter: one restarted before dying has proved
        return f"died before its first proof ({code}: {row.get('kill_reason') or 'no reason'})"
    return None


def block(conn: sqlite3.Connection, machine_id: int, reason: str, until: datetime) -> None:
    """Keep `machine_id` out of offers until `until` (an existing later expiry is kept)."""
    until_iso = clock.to_iso(until)
    with transaction(conn):
        conn.execute(
            "INSERT INTO blocklist (machine_id, reason, until) VALUES (?, ?, ?)"
            " ON CONFLICT(machine_id) DO UPDATE SET reason = excluded.reason, until = excluded.until"
            " WHERE excluded.until > blocklist.until",
            (int(machine_id), reason, until_iso),
        )


def block_row(conn: sqlite3.Connection, row: InstanceRow, ttl_s: float) -> bool:
    """Blocklist a killed row's machine if it failed (see reason_for); True when it qualifies.

    Call it after a kill (reconcile, bench gate); it is idempotent.
    """
    reason = reason_for(row)
    killed_at = clock.from_iso(row.get("killed_at"))
    machine_id = row["machine_id"]
    if reason is None or killed_at is None or machine_id is None:  # reason_for has none without a machine_id
        return False
    if row.get("kill_code") in VERDICTS or _died_early_before(conn, row, killed_at, ttl_s):
        block(conn, machine_id, f"{row['label']}: {reason}", killed_at + timedelta(seconds=ttl_s))
        return True
    held_s = min(ttl_s, FIRST_DEATH_BLOCK_S)
    block(conn, machine_id, f"{row['label']}: {reason} (once: kept out for {held_s / 60:g}m)",
          killed_at + timedelta(seconds=held_s))
    return True


def _died_early_before(conn: sqlite3.Connection, row: InstanceRow, killed_at: datetime, ttl_s: float) -> bool:
    """Whether another rental of the row's machine died before its first proof within the TTL before this one."""
    earlier = conn.execute(
        "SELECT * FROM instances WHERE killed_at >= ? AND killed_at <= ? AND +state = 'killed' AND machine_id = ?"
        " AND uuid != ?", (clock.to_iso(killed_at - timedelta(seconds=ttl_s)), clock.to_iso(killed_at),
                           row["machine_id"], row["uuid"])).fetchall()
    rows = [typed(other, InstanceRow) for other in earlier]
    return any(other.get("kill_code") not in VERDICTS and reason_for(other) is not None for other in rows)


def refresh(conn: sqlite3.Connection, ttl_s: float, now: datetime) -> int:
    """Derive entries from every row killed within the TTL; returns how many rows qualified."""
    since = clock.to_iso(now - timedelta(seconds=ttl_s))
    rows = conn.execute(  # through instances_killed, the kills since: `+state` keeps SQLite off every kill ever
        "SELECT * FROM instances WHERE +state = 'killed' AND machine_id IS NOT NULL AND killed_at > ?", (since,)
    ).fetchall()
    return sum(block_row(conn, typed(row, InstanceRow), ttl_s) for row in rows)


def blocked(conn: sqlite3.Connection, now: datetime) -> dict[int, dict[str, str]]:
    """machine_id → {"reason", "until"} for every entry still in force."""
    now_iso = clock.to_iso(now)
    return {
        row["machine_id"]: {"reason": row["reason"], "until": row["until"]}
        for row in conn.execute("SELECT * FROM blocklist WHERE until > ?", (now_iso,))
    }
