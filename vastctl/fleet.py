"""Queries and views of the state file shared by `fleet`, `events`, `notify` and `serve`."""

from __future__ import annotations

import sqlite3
from collections import Counter
from datetime import datetime
from typing import Any

from . import clock, settings
from .config import Config
from .db import transaction
from .errors import BadInput
from .lifecycle import LIVE_STATES, State, record_event

INSTANCE_FIELDS = (
    "uuid", "label", "state", "vast_id", "vast_status", "gpu_name", "num_gpus", "bench_rate", "dph",
    "proofs_per_hour", "proofs_done", "state_since", "last_heartbeat_at", "kill_reason", "kill_code", "destroyed_at",
)
TIME_FIELDS = ("state_since", "last_heartbeat_at", "destroyed_at")


def instance_view(row: dict[str, Any]) -> dict[str, Any]:
    view = {name: row.get(name) for name in INSTANCE_FIELDS}
    for name in TIME_FIELDS:
        view[name] = clock.display_iso(view[name])
    return view


def expected_rate(row: dict[str, Any], default_rate: float) -> float:
    """What a machine proves per hour: measured, else benchmarked, else the model's default."""
    for value in (row.get("proofs_per_hour"), row.get("bench_rate")):
        if value is not None:
            return float(value)
    return float(default_rate)


def fleet_view(conn: sqlite3.Connection, config: Config, *, include_killed: bool = False) -> dict[str, Any]:
    """The `fleet --json` object: every machine we pay for (or paid for, with include_killed) and a summary."""
    query = "SELECT * FROM instances"
    if not include_killed:
        query += " WHERE state != 'killed' OR destroyed_at IS NULL"
    rows = [dict(row) for row in conn.execute(query + " ORDER BY created_at, label")]
    values = settings.effective(conn, config)
    running = [row for row in rows if row["state"] == State.RUNNING]
    billing = [row for row in rows if row["state"] in LIVE_STATES - {State.STOPPED}]
    summary = {
        "by_state": dict(Counter(row["state"] for row in rows)),
        "capacity_proofs_per_hour": round(sum(expected_rate(row, config.fleet.default_rate) for row in running), 3),
        "target_proofs_per_hour": values["target_proofs_per_hour"],
        "spend_per_hour": round(sum(row["dph"] or 0.0 for row in billing), 4),
    }
    return {"instances": [instance_view(row) for row in rows], "summary": summary}


def event_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"], "at": clock.display_iso(row["at"]), "kind": row["kind"], "uuid": row["uuid"],
        "label": row["label"], "from_state": row["from_state"], "to_state": row["to_state"],
        "reason": row["reason"], "source": row["source"], "code": row["code"],
    }


def events(conn: sqlite3.Connection, *, since: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Events oldest first: the newest `limit` of those after `since`."""
    if limit < 1:
        raise BadInput(f"--limit must be at least 1, got {limit}")
    rows = conn.execute(
        "SELECT * FROM (SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?) ORDER BY id",
        (since or 0, limit),
    ).fetchall()
    return [event_view(row) for row in rows]


def notify(conn: sqlite3.Connection, text: str, *, source: str = "operator", now: datetime | None = None) -> int:
    """An operator's note for the agent: an event with no instance."""
    text = text.strip()
    if not text:
        raise BadInput("the note is empty: say something, e.g. vastctl notify 'price spike expected tonight'")
    if len(text) > 4000:
        raise BadInput("the note is longer than 4000 characters: shorten it")
    with transaction(conn):
        return record_event(conn, kind="note", source=source, reason=text, now=now or clock.utcnow())
