"""Why the agent did what it did: its steps as run_step recorded them, skipped ones folded away.

Each step that ran (ok, dry_run, error) is shown with what it saw (capacity,
booting capacity, target, demand, spend), what it did, what the guard refused
and why, why it held when it did nothing, and for `llm` steps the notes the
model left and its tokens and cost. Runs of skipped steps (`--if-events`
with nothing new) between them become one entry that counts them. Read from
agent_steps and agent_notes only; text that came from a model or from vast
is shown as stored (the CLI escapes what it prints, the page what it renders).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from vastctl import clock

DEFAULT_LIMIT = 20


def _parsed(text: Any, empty: Any) -> Any:
    if not isinstance(text, str) or not text:
        return empty
    try:
        value = json.loads(text)
    except ValueError:
        return empty
    return value if isinstance(value, type(empty)) else empty


def _saw(observation: dict[str, Any]) -> dict[str, Any]:
    demand = found if isinstance(found := observation.get("demand"), dict) else {}
    settings = given if isinstance(given := observation.get("settings"), dict) else {}
    return {
        "capacity": observation.get("capacity"), "pending_capacity": observation.get("pending_capacity"),
        "target": settings.get("target_proofs_per_hour"), "spend_per_hour": observation.get("spend_per_hour"),
        "demand": {key: demand.get(key) for key in ("known", "queued", "in_flight", "lookahead", "proofs_per_hour")},
        "by_state": observation.get("by_state") or {},
    }


def _step(row: sqlite3.Row, notes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "step", "id": row["id"], "started_at": clock.display_iso(row["started_at"]),
        "finished_at": clock.display_iso(row["finished_at"]), "policy": row["policy"], "outcome": row["outcome"],
        "saw": _saw(_parsed(row["observation"], {})),
        "did": [{key: action.get(key) for key in ("kind", "label", "gpu_name", "count", "result", "reason")
                 if action.get(key) is not None}
                for action in _parsed(row["actions"], []) if isinstance(action, dict)],
        "refused": [{key: item.get(key) for key in ("kind", "label", "gpu_name", "limit", "why")
                     if item.get(key) is not None}
                    for item in _parsed(row["refused"], []) if isinstance(item, dict)],
        "errors": [str(error) for error in _parsed(row["errors"], [])],
        "hold": row["hold"],
        "notes": notes,
        "tokens": {"input": row["input_tokens"], "output": row["output_tokens"],
                   "cache_read": row["cache_read_tokens"], "cache_write": row["cache_write_tokens"]},
        "cost": round(float(row["cost"] or 0.0), 6),
    }


def history(conn: sqlite3.Connection, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The last `limit` steps that ran, oldest first, with the skipped steps around them folded (`agent history --json`)."""
    ran = conn.execute("SELECT * FROM agent_steps WHERE outcome != 'skipped' ORDER BY id DESC LIMIT ?",
                       (limit,)).fetchall()[::-1]
    first = ran[0]["id"] if ran else None
    skipped_query = "SELECT id, started_at FROM agent_steps WHERE outcome = 'skipped'" + (
        " AND id > (SELECT coalesce(max(id), 0) FROM agent_steps WHERE outcome != 'skipped' AND id < ?)"
        if first is not None else "") + " ORDER BY id"
    skipped = conn.execute(skipped_query, (first,) if first is not None else ()).fetchall()
    notes: dict[int, list[dict[str, Any]]] = {}
    if ran:
        for note in conn.execute("SELECT step_id, at, text FROM agent_notes WHERE step_id BETWEEN ? AND ?"
                                 " ORDER BY id", (ran[0]["id"], ran[-1]["id"])):
            notes.setdefault(note["step_id"], []).append({"at": clock.display_iso(note["at"]), "text": note["text"]})
    entries: list[dict[str, Any]] = []
    pending: list[sqlite3.Row] = []
    rows = sorted([(r["id"], "step", r) for r in ran] + [(r["id"], "skipped", r) for r in skipped])

    def fold() -> None:
        if pending:
            entries.append({"type": "skipped", "count": len(pending), "first_id": pending[0]["id"],
                            "last_id": pending[-1]["id"], "from": clock.display_iso(pending[0]["started_at"]),
                            "to": clock.display_iso(pending[-1]["started_at"])})
            pending.clear()

    for _, kind, row in rows:
        if kind == "skipped":
            pending.append(row)
            continue
        fold()
        entries.append(_step(row, notes.get(row["id"], [])))
    fold()
    return {"limit": limit, "steps_shown": len(ran), "skipped_shown": len(skipped), "entries": entries}
