"""The `actions` table: every call to a provider that spends or stops spending money, with its result.

Who asked (reconcile, agent, operator), what, for which machine, and what the
market answered. Never the API key: requests are recorded as the body we sent, and the
result, often the market's own text, is masked before it is bounded (upstream.clip).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any

from . import clock, upstream
from .db import transaction

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
    request: dict[str, Any] | None = None,
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
        return cursor.lastrowid
