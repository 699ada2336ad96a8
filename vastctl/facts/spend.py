"""Spend: what vast bills us for now, $/h per machine (observe reads it into the observation).

A machine bills from its create until vast confirms its destroy (docs/cost.md): GPU and disk while it
runs or boots, the disk alone while stopped. So every machine of ours counts:
  - a row the file has not seen destroyed, killed ones included while their destroy is pending;
  - an instance the last good listing shows under a row's vast id, whatever label vast gives it, and
    one it still shows after its row's destroy was confirmed (unless vast says `unloaded`);
  - an instance listed with our label prefix and no row (an orphan, until reconcile destroys it).
Where the file and the listing both know a machine, the one that heard of it last decides (a stop or
kill since the listing, or vast's status since our last change). A stopped machine bills its disk
price as the listing gives it; without one it counts at its full price, never at nothing. The row's price
is used when the listing has none. A stored price is one (validate.price where it entered: an offer, a listing,
a bid through the guard; migration 23 for rows from before), so it is read as it is.
"""

from __future__ import annotations

import sqlite3
from typing import Iterable

from vastctl.facts.billing import stored_price
from vastctl.state import instances
from vastctl.state.lifecycle import State
from vastctl.state.rows import InstanceRow, VastCacheRow, selected


def _listing(conn: sqlite3.Connection) -> dict[int, VastCacheRow]:
    """vast id → the instance as the last good listing showed it (vast_cache holds that listing only)."""
    return {row["vast_id"]: row for row in selected(conn, VastCacheRow, "SELECT * FROM vast_cache")}


def _stopped_price(dph: float | None, entry: VastCacheRow | None) -> float:
    storage = None if entry is None else stored_price(entry.get("storage_dph"))
    if storage is not None:
        return storage if dph is None else min(storage, dph)
    return dph or 0.0


def _listed_price(entry: VastCacheRow, row: InstanceRow | None) -> float:
    """$/h for one instance as vast listed it."""
    if entry.get("cur_state") == "unloaded":  # released: the destroy took
        return 0.0
    dph = stored_price(entry.get("dph"))
    if dph is None and row is not None:
        dph = stored_price(row.get("dph"))
    if "stopped" in (entry.get("actual_status"), entry.get("cur_state")):
        return _stopped_price(dph, entry)
    return dph or 0.0


def _file_price(row: InstanceRow, entry: VastCacheRow | None) -> float:
    """$/h for one row as the file has it."""
    if row.get("destroyed_at"):
        return 0.0
    dph = stored_price(row.get("dph"))
    if row["state"] in (State.KILLED, State.STOPPED) and row.get("vast_id") is None:
        return 0.0  # nothing rented that the file knows of (the listing finds one by label: billing())
    if row["state"] == State.KILLED:  # bills until vast confirms the destroy
        return dph or 0.0
    if row["state"] == State.STOPPED:
        return _stopped_price(dph, entry)
    return dph or 0.0  # live: a launch whose create is still unanswered may be billing already


def _heard_last(row: InstanceRow) -> str:
    """When the file last learned something that changes the row's billing (ISO text sorts as time)."""
    return max(row.get("state_since") or "", row.get("destroyed_at") or "")


def billing(conn: sqlite3.Connection, rows: Iterable[InstanceRow],
            prefix: str) -> tuple[dict[str, float], float]:
    """(uuid → $/h each live row bills, $/h of the listed machines of ours no live row stands for)."""
    rows = list(rows)
    listing = _listing(conn)
    per_row: dict[str, float] = {}
    claimed: set[int] = set()
    known = {row.get("vast_id") for row in rows}
    by_label = {entry["label"]: vast_id for vast_id, entry in listing.items()
                if entry.get("label") and vast_id not in known}  # an instance another row has by id is that row's
    for row in rows:
        vast_id = row.get("vast_id")
        if vast_id is None:  # a launch that crashed before recording its id: vast may list it by label
            vast_id = by_label.get(row["label"])
        entry = listing.get(vast_id) if vast_id is not None else None
        if entry is not None and vast_id is not None:
            claimed.add(vast_id)
        if entry is not None and entry["seen_at"] >= _heard_last(row):
            per_row[row["uuid"]] = _listed_price(entry, row)
        else:
            per_row[row["uuid"]] = _file_price(row, entry)
    others = 0.0
    unclaimed = {vast_id: entry for vast_id, entry in listing.items() if vast_id not in claimed}
    if unclaimed:
        gone = instances.destroyed_by_vast_id(conn, unclaimed)
        for vast_id, entry in unclaimed.items():
            destroyed = gone.get(vast_id)
            if destroyed is not None:  # destroyed here; billing only if vast still listed it after
                others += _listed_price(entry, destroyed) if entry["seen_at"] >= _heard_last(destroyed) else 0.0
            elif prefix and (entry.get("label") or "").startswith(prefix):
                others += _listed_price(entry, None)
    return per_row, others
