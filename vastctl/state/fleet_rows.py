"""The SQL against `instances` of the views and reconcile's listing: the fleet's rows as `fleet` lists them, the
kill and destroy counts the dashboard and /metrics show, what the history replays, the destroyed rows a listing
still shows, and each row's view of vast a good listing records. One place for it, so a renamed column is found
here.
"""

from __future__ import annotations

import sqlite3
from operator import itemgetter
from typing import Iterable, Mapping, Sequence, TypeAlias, cast

from vastctl.state import kept_rows
from vastctl.state.rows import GoneRow, InstanceRow, SQLValue, selected

# What `fleet` shows without --all: a killed machine only while it may still bill (rented, destroy unconfirmed).
SHOWN_WITHOUT_ALL = "state != 'killed' OR (destroyed_at IS NULL AND vast_id IS NOT NULL)"
AMOUNT_COLUMNS = ("uuid", "state", "gpu_name", "proofs_per_hour", "bench_rate", "dph")
Amounts: TypeAlias = "tuple[str, str, str | None, float | None, float | None, float | None]"  # AMOUNT_COLUMNS' values
GONE_COLUMNS = ("uuid", "label", "vast_id", "kill_code", "destroyed_at")
_IDS_PER_READ = 500  # below SQLite's bound on a statement's parameters


def listed(conn: sqlite3.Connection, *, include_killed: bool) -> list[InstanceRow]:
    """The rows `fleet` lists (every row with include_killed), ordered by creation then label."""
    where = "" if include_killed else f" WHERE {SHOWN_WITHOUT_ALL}"
    return selected(conn, InstanceRow, f"SELECT * FROM instances{where} ORDER BY created_at, label")


def destroyed_not_killed(conn: sqlite3.Connection) -> list[InstanceRow]:
    """Destroyed rows not in state killed (an adopted or hand-edited row): `fleet` still lists them."""
    return selected(conn, InstanceRow, "SELECT * FROM instances WHERE destroyed_at IS NOT NULL AND state != 'killed'")


def kills_by_code(conn: sqlite3.Connection) -> dict[str, int]:
    """Killed rows by kill code ('unknown' for none), in code order."""
    rows = conn.execute("SELECT coalesce(kill_code, 'unknown'), count(*) FROM instances"
                        " WHERE state = 'killed' GROUP BY 1 ORDER BY 1")
    return {code: count for code, count in rows}


def pending_destroys(conn: sqlite3.Connection) -> tuple[int, str | None]:
    """(killed rows vast has not confirmed destroyed, the oldest one's killed_at as stored)."""
    count, oldest = conn.execute("SELECT count(*), min(killed_at) FROM instances"
                                 " WHERE state = 'killed' AND destroyed_at IS NULL").fetchone()
    return count, oldest


def amounts(conn: sqlite3.Connection) -> dict[str, Amounts]:
    """uuid → its AMOUNT_COLUMNS as a tuple, for every row: what the history counts a machine's rate and price by
    (from the rows kept between reads: thousands of rows per page)."""
    rows = kept_rows.read(conn)
    columns = itemgetter(*(rows.position[name] for name in AMOUNT_COLUMNS))
    return {row[0]: row for row in map(columns, rows.by_id.values())}


def newest_destroyed(conn: sqlite3.Connection, vast_ids: Iterable[int]) -> dict[int, GoneRow]:
    """vast id → the newest destroyed row that had it (GONE_COLUMNS), for the ids that have one: a few reads for
    the whole listing, not one per instance."""
    ids = sorted(set(vast_ids))
    found: dict[int, GoneRow] = {}
    cursor = conn.cursor()
    cursor.row_factory = None
    for start in range(0, len(ids), _IDS_PER_READ):
        chunk = ids[start:start + _IDS_PER_READ]
        for row in cursor.execute(
                f"SELECT {', '.join(GONE_COLUMNS)} FROM instances WHERE destroyed_at IS NOT NULL AND vast_id IN"
                f" ({', '.join('?' for _ in chunk)}) ORDER BY destroyed_at, rowid", chunk):
            found[row[2]] = cast(GoneRow, dict(zip(GONE_COLUMNS, row)))  # the newest last: it stays
    return found


def record_recovered_ids(conn: sqlite3.Connection, recovered: Mapping[str, int]) -> None:
    """uuid → the vast id a listing found by label for a launch that crashed before recording it (in the caller's
    transaction; a row that has an id keeps it)."""
    conn.executemany("UPDATE instances SET vast_id = ? WHERE uuid = ? AND vast_id IS NULL",
                     [(vast_id, uuid) for uuid, vast_id in recovered.items()])


def record_sightings(conn: sqlite3.Connection, seen: Sequence[tuple[SQLValue, ...]],
                     missing: Sequence[tuple[int, str]]) -> None:
    """Each row's view of vast from one good listing, in the caller's transaction. `seen`: (status, status message,
    listing time, outbid since or None, machine id, GPU name, GPUs, $/h, uuid) of each row the listing shows;
    `missing`: (listings missed in a row, uuid) of the others whose count changed."""
    conn.executemany(
        "UPDATE instances SET vast_status = ?1, vast_status_msg = ?2, vast_seen_at = ?3, vast_missing = 0,"
        " outbid_since = CASE WHEN ?4 IS NOT NULL THEN COALESCE(outbid_since, ?4)"
        " WHEN last_heartbeat_at > outbid_since THEN NULL ELSE outbid_since END,"  # kept until it proves again
        " machine_id = COALESCE(machine_id, ?5), gpu_name = COALESCE(gpu_name, ?6),"
        " num_gpus = COALESCE(num_gpus, ?7), dph = COALESCE(dph, ?8) WHERE uuid = ?9",
        seen,
    )
    conn.executemany("UPDATE instances SET vast_missing = ? WHERE uuid = ?", missing)
