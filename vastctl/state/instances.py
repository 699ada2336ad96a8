"""The questions the code asks of the `instances` table, one function each, so its SQL lives in one layer.

Outside state/ (and facts/, which it serves), a module asks here instead of writing its own SQL against
`instances` (tests/test_sql_in_state.py holds it): a renamed column or a new index is then a change to this file,
and what each query is for is said once, beside it. The lifecycle's writes (create, transition, kill, …) stay
in lifecycle.py, the one writer of a row's state.
"""

from __future__ import annotations

import sqlite3
from operator import itemgetter
from typing import Iterable, NamedTuple, cast

from vastctl.state import kept_rows
from vastctl.state.db import transaction
from vastctl.state.lifecycle import VAST_DEAD_CODES, State
from vastctl.state.rows import InstanceRow, selected, typed

NOT_DESTROYED = "SELECT * FROM instances WHERE destroyed_at IS NULL"  # every row not yet destroyed: what may bill


def undestroyed(conn: sqlite3.Connection, *, ordered: bool = False) -> list[InstanceRow]:
    """Every row not yet destroyed, as the file has it (killed ones too, while their destroy is pending): what
    the observation and a reconcile pass start from. `ordered`: by creation then label, as `fleet` lists them,
    from the rows kept between reads (kept_rows: serve observes at every request; reconcile, once a process,
    reads only the rows not destroyed)."""
    if not ordered:
        return selected(conn, InstanceRow, NOT_DESTROYED)
    rows = kept_rows.read(conn)
    destroyed = rows.position["destroyed_at"]
    return cast(list[InstanceRow], rows.dicts(values for values in rows.ordered(kept_rows.BY_CREATION_LABEL)
                                              if values[destroyed] is None))


def find(conn: sqlite3.Connection, uuid: str) -> InstanceRow | None:
    """The row of `uuid`, or None: for a caller that has its own answer for a row that is gone (lifecycle.get
    raises NotFound instead)."""
    row = conn.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone()
    return None if row is None else typed(row, InstanceRow)


def destroyed_by_vast_id(conn: sqlite3.Connection, vast_ids: Iterable[int]) -> dict[int, InstanceRow]:
    """vast id → the destroyed row that had it, among `vast_ids`: a listed instance no live row stands for may be
    one whose destroy vast had not carried out when it listed (it bills until then)."""
    ids = tuple(vast_ids)
    if not ids:
        return {}
    rows = selected(conn, InstanceRow, f"SELECT * FROM instances WHERE destroyed_at IS NOT NULL AND vast_id IN"
                                       f" ({', '.join('?' for _ in ids)})", ids)
    return {row["vast_id"]: row for row in rows if row["vast_id"] is not None}


class Bench(NamedTuple):
    """What one machine benchmarked, and where."""

    uuid: str
    gpu_name: str | None
    machine_id: int | None
    num_gpus: int | None
    bench_rate: float


def benches(conn: sqlite3.Connection) -> list[Bench]:
    """Every machine that ever reported a bench rate, oldest first: what a GPU model and a host are expected to
    prove (observe.bench_rates). Every machine ever, from the rows kept between reads (kept_rows)."""
    rows = kept_rows.read(conn)
    columns = itemgetter(*(rows.position[name] for name in ("uuid", "gpu_name", "machine_id", "num_gpus",
                                                           "bench_rate")))
    rate = rows.position["bench_rate"]
    return [Bench(*columns(values)) for values in rows.ordered(kept_rows.BY_CREATION) if values[rate] is not None]


def rented_bids(conn: sqlite3.Connection) -> list[float | None]:
    """The bid of each machine not yet destroyed nor killed (None: rented on demand): whether the fleet rents
    interruptible already, which a launch follows (bids.wants_bid)."""
    return [row[0] for row in conn.execute("SELECT bid FROM instances WHERE destroyed_at IS NULL AND state != ?",
                                           (State.KILLED.value,))]


def label_taken(conn: sqlite3.Connection, label: str) -> bool:
    """Whether a row (of any age: labels are unique for ever) has `label`: a new machine's label must be new."""
    return conn.execute("SELECT 1 FROM instances WHERE label = ?", (label,)).fetchone() is not None


def count_destroy_failure(conn: sqlite3.Connection, uuid: str, error: str) -> None:
    """One more failed destroy of `uuid` at vast, and its error: reconcile retries it and the views say why."""
    with transaction(conn):
        conn.execute("UPDATE instances SET destroy_attempts = destroy_attempts + 1, destroy_error = ? WHERE uuid = ?",
                     (error, uuid))


def uuids_after(conn: sqlite3.Connection, rowid: int) -> list[tuple[int, str]]:
    """(rowid, uuid) of each row past `rowid`, in order: rows are never deleted, so these are the machines new
    since the highest rowid a reader saw (the keyring learns new machines' tokens from them)."""
    return [(row[0], row[1]) for row in conn.execute("SELECT rowid, uuid FROM instances WHERE rowid > ? ORDER BY rowid",
                                                     (rowid,))]


def awaiting_confirmation(conn: sqlite3.Connection) -> bool:
    """Whether a live machine (not killed nor stopped) was shown dead or missing by the last listing: the next
    listing decides whether it is killed (the statuses are the ones the rules kill for once two listings agree)."""
    dead = sorted(VAST_DEAD_CODES)
    marks = ", ".join("?" for _ in dead)
    return conn.execute(
        "SELECT 1 FROM instances WHERE state NOT IN ('killed', 'stopped') AND destroyed_at IS NULL"
        f" AND (vast_status IN ({marks}) OR vast_missing > 0) LIMIT 1", dead).fetchone() is not None


def creation_times(conn: sqlite3.Connection) -> list[str]:
    """When each machine was created, oldest first (the demo's chart marks its launches)."""
    return [row[0] for row in conn.execute("SELECT created_at FROM instances ORDER BY created_at")]


def kills(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
    """(killed_at, kill_code) of each machine ever killed, in the order of the kills (the demo's chart marks)."""
    return [(row[0], row[1]) for row in conn.execute(
        "SELECT killed_at, kill_code FROM instances WHERE killed_at IS NOT NULL ORDER BY killed_at")]


def kill_times(conn: sqlite3.Connection, *, since: str | None = None) -> list[tuple[int, str | None]]:
    """(vast id, when its machine was killed; None: not killed) of every machine that got a vast id: how long
    after a death the manager killed it, and what it billed until then (the demo's figures). With `since` (an ISO
    time), those killed then or later alone, through the instances_killed index."""
    if since is None:
        return [(row[0], row[1]) for row in conn.execute("SELECT vast_id, killed_at FROM instances WHERE vast_id IS NOT NULL")]
    return [(row[0], row[1]) for row in conn.execute(
        "SELECT vast_id, killed_at FROM instances WHERE killed_at >= ? AND vast_id IS NOT NULL", (since,))]


class Boot(NamedTuple):
    """What tells how a machine's boots ended: when it was created and last resumed, killed (and why), its last
    heartbeat, and when it last reached each step of a boot (its last registered, params_done and bench_done
    events: when it last began its benchmark is the params_done one)."""

    created_at: str | None
    resumed_at: str | None
    killed_at: str | None
    last_heartbeat_at: str | None
    kill_code: str | None
    bench_began_at: str | None
    registered_at: str | None
    bench_done_at: str | None


def boots_since(conn: sqlite3.Connection, since: str) -> list[Boot]:
    """The machines created or resumed at `since` (an ISO time) or later (the planning policy's boot odds)."""
    return [Boot(*row) for row in conn.execute(
        "SELECT created_at, resumed_at, killed_at, last_heartbeat_at, kill_code,"
        " (SELECT max(e.at) FROM events e WHERE e.uuid = i.uuid AND e.to_state = 'params_done'),"
        " (SELECT max(e.at) FROM events e WHERE e.uuid = i.uuid AND e.to_state = 'registered'),"
        " (SELECT max(e.at) FROM events e WHERE e.uuid = i.uuid AND e.to_state = 'bench_done')"
        " FROM instances i WHERE created_at >= ? OR resumed_at >= ?", (since, since))]


def kill_counts(conn: sqlite3.Connection) -> dict[str | None, int]:
    """kill code (None: none recorded) → how many machines are killed with it, by code."""
    return {row[0]: row[1] for row in conn.execute(
        "SELECT kill_code, count(*) AS n FROM instances WHERE state = 'killed' GROUP BY kill_code ORDER BY kill_code")}


def count(conn: sqlite3.Connection) -> int:
    """How many machines the file ever had (rows are never deleted): how many were launched or adopted."""
    total: int = conn.execute("SELECT count(*) FROM instances").fetchone()[0]
    return total
