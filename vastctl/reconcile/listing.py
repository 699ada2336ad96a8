"""What vast listed, kept as state: each pass's listing (vast_listings, a week of history), the instances it
showed (vast_cache), and each row's view of vast (vast_status, vast_seen_at, vast_missing, outbid_since, and
the vast id found by label for a launch that crashed before recording it).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import Sequence

from vastctl import clock, upstream
from vastctl.config import Config
from vastctl.providers.base import RemoteInstance
from vastctl.reconcile.decide import Matched, missing_after, outbid
from vastctl.state import fleet_rows
from vastctl.state.audit import settle_pending_launches
from vastctl.state.db import transaction
from vastctl.state.lifecycle import State
from vastctl.state.rows import GoneRow, InstanceRow, SQLValue

LISTINGS_KEPT_S = 7 * 86400  # vast_listings older than this are pruned (one row a pass would grow without bound)


def record_failed_listing(conn: sqlite3.Connection, error: str, now: datetime) -> None:
    with transaction(conn):
        conn.execute("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, 0, NULL, ?)",
                     (clock.to_iso(now), upstream.clip(error, 1000)))
        _prune_listings(conn, now)


def _prune_listings(conn: sqlite3.Connection, now: datetime) -> None:
    """Keep a week of listing history; the newest good listing is kept whatever its age (fleet shows its age)."""
    conn.execute(
        "DELETE FROM vast_listings WHERE at < ? AND id != (SELECT coalesce(max(id), 0) FROM vast_listings WHERE ok = 1)",
        (clock.to_iso(now - timedelta(seconds=LISTINGS_KEPT_S)),),
    )


def record_listing(conn: sqlite3.Connection, rows: Sequence[InstanceRow], listing: Sequence[RemoteInstance],
                   matched: Matched, now: datetime) -> None:
    """Cache one good listing: vast_listings, vast_cache, and each row's view of vast; one transaction."""
    at = clock.to_iso(now)
    seen: list[tuple[SQLValue, ...]] = []
    missing: list[tuple[int, str]] = []
    for row in rows:
        entry = matched.by_uuid.get(row["uuid"])
        if entry is not None:
            paused = at if outbid(entry) and row.get("state") == State.RUNNING else None
            seen.append((entry.actual_status, entry.status_msg, at, paused, entry.machine_id, entry.gpu_name,
                         entry.num_gpus, entry.dph_total, row["uuid"]))
        else:
            count = missing_after(row, matched)
            if count != int(row.get("vast_missing") or 0):
                missing.append((count, row["uuid"]))
    with transaction(conn):
        conn.execute("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, 1, ?, NULL)", (at, len(listing)))
        _prune_listings(conn, now)
        conn.executemany(
            "INSERT INTO vast_cache (vast_id, label, actual_status, intended_status, cur_state, status_msg, machine_id,"
            " gpu_name, num_gpus, dph, storage_dph, first_seen_at, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(vast_id) DO UPDATE SET label = excluded.label, actual_status = excluded.actual_status,"
            " intended_status = excluded.intended_status, cur_state = excluded.cur_state,"
            " status_msg = excluded.status_msg, machine_id = excluded.machine_id, gpu_name = excluded.gpu_name,"
            " num_gpus = excluded.num_gpus, dph = excluded.dph, storage_dph = excluded.storage_dph,"
            " seen_at = excluded.seen_at",
            [(e.id, e.label, e.actual_status, e.intended_status, e.cur_state, e.status_msg, e.machine_id, e.gpu_name,
              e.num_gpus, e.dph_total, e.storage_dph, at, at) for e in listing],
        )
        conn.execute("DELETE FROM vast_cache WHERE seen_at != ?", (at,))
        fleet_rows.record_recovered_ids(conn, matched.recovered)
        for uuid, vast_id in matched.recovered.items():  # the launch a crash left pending in the audit
            settle_pending_launches(conn, uuid, vast_id, by="reconcile")
        fleet_rows.record_sightings(conn, seen, missing)



def strays_context(conn: sqlite3.Connection, config: Config,
                    unclaimed: Sequence[RemoteInstance]) -> tuple[dict[int, str], dict[int, GoneRow]]:
    """first_seen and history for the (normally few) listed instances no unfinished row claims: a few reads for
    them all (a fleet's listing may hold hundreds of other people's instances)."""
    prefix = config.vast.label_prefix
    ours = sorted({entry.id for entry in unclaimed if prefix and entry.label and entry.label.startswith(prefix)})
    first_seen: dict[int, str] = {}
    for start in range(0, len(ours), _IDS_PER_READ):
        chunk = ours[start:start + _IDS_PER_READ]
        first_seen.update(conn.execute(f"SELECT vast_id, first_seen_at FROM vast_cache WHERE vast_id IN"
                                       f" ({', '.join('?' for _ in chunk)})", chunk).fetchall())
    return first_seen, fleet_rows.newest_destroyed(conn, (entry.id for entry in unclaimed))


_IDS_PER_READ = 500  # below SQLite's bound on a statement's parameters
