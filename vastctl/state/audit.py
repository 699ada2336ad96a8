"""The `actions` table: every call to a provider that spends or stops spending money, with its result.

Who asked (reconcile, agent, operator), what, for which machine, and what the
market answered. Never the API key: requests are recorded as the body we sent, and the
result, often the market's own text, is masked before it is bounded (upstream.clip).

A call that spends money is recorded before it is made and completed after:
`begin_action` commits a row whose result starts with PENDING (ok 0), and
`finish_action` replaces it with the outcome. A crash, a kill -9 or a full
disk anywhere in between leaves the row saying a purchase may have happened,
under the label vast knows the machine by; no row, no call (the caller makes
the call only once begin_action returned).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Mapping

from vastctl import clock, upstream
from vastctl.state.db import inserted_id, transaction
from vastctl.state.rows import JSONValue

RESULT_CHARS = 1000


def record_action(
    conn: sqlite3.Connection,
    *,
    actor: str,
    kind: str,
    ok: bool,
    result: str,
    uuid: str | None = None,
    label: str | None = None,
    vast_id: int | None = None,
    request: Mapping[str, JSONValue] | None = None,
    now: datetime,
) -> int:
    with transaction(conn):
        cursor = conn.execute(
            "INSERT INTO actions (at, actor, kind, uuid, label, vast_id, request, ok, result)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (clock.to_iso(now), actor, kind, uuid, label, vast_id,
             json.dumps(request, sort_keys=True) if request is not None else None, int(ok),
             upstream.clip(result, RESULT_CHARS)),
        )
        return inserted_id(cursor)


PENDING = "pending:"  # a result starting so: the call may have been made, its outcome was never recorded


def begin_action(conn: sqlite3.Connection, *, actor: str, kind: str, what: str, uuid: str | None = None,
                 label: str | None = None, request: Mapping[str, JSONValue] | None = None, now: datetime) -> int:
    """Commit the intent of a call that spends money, before the call; returns the row's id for finish_action."""
    return record_action(conn, actor=actor, kind=kind, ok=False, result=f"{PENDING} {what}", uuid=uuid, label=label,
                         request=request, now=now)


def finish_action(conn: sqlite3.Connection, action_id: int, *, ok: bool, result: str,
                  vast_id: int | None = None) -> None:
    """The outcome of a call begun with begin_action (its row keeps the time of the intent)."""
    with transaction(conn):
        settle(conn, action_id, ok=ok, result=result, vast_id=vast_id)


def settle(conn: sqlite3.Connection, action_id: int, *, ok: bool, result: str, vast_id: int | None = None) -> None:
    """finish_action inside the caller's transaction."""
    conn.execute("UPDATE actions SET ok = ?, result = ?, vast_id = COALESCE(?, vast_id) WHERE id = ?",
                 (int(ok), upstream.clip(result, RESULT_CHARS), vast_id, action_id))


def settle_pending_launches(conn: sqlite3.Connection, uuid: str, vast_id: int, *, by: str) -> None:
    """Inside the caller's transaction: a machine found at vast by its row's label completes the launch
    intents its crash left pending."""
    pending = conn.execute("SELECT id, result FROM actions WHERE uuid = ? AND kind = 'launch' AND ok = 0"
                           " AND result LIKE ?", (uuid, PENDING + "%")).fetchall()
    for action_id, result in pending:
        settle(conn, action_id, ok=True, result=f"instance {vast_id} (found by label by {by}; the create's answer"
                                                f" was never recorded: {result})", vast_id=vast_id)
