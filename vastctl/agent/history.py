"""Why the agent did what it did: its steps as run_step recorded them, skipped ones folded away.

Each step that ran (ok, dry_run, error) is shown with what it saw (capacity,
booting capacity, target, demand, spend), what it did, what the guard refused
and why, why it held when it did nothing, and for `llm` steps the notes the
model left and its tokens and cost. Runs of skipped steps (`--if-events`
with nothing new) between them become one entry that counts them. Read from
agent_steps and agent_notes, and for `--label` the machine's events (each names
the step that moved it: lifecycle.Cause); text that came from a model or from
vast is shown as stored (the CLI escapes what it prints, the page what it renders).

Two filters narrow what is read: `since` (steps started at or after it) and a
machine (steps whose actions named it, or that wrote one of its events: a launch
names no label before it rents, its events do). Skipped steps touch no machine:
with a machine there are none to fold.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any

from vastctl import clock
from vastctl.state.rows import InstanceRow

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
        "suggested": _parsed(row["observation"], {}).get("plan_suggestion"),  # llm steps: the plan they were shown
        "notes": notes,
        "tokens": {"input": row["input_tokens"], "output": row["output_tokens"],
                   "cache_read": row["cache_read_tokens"], "cache_write": row["cache_write_tokens"]},
        "cost": round(float(row["cost"] or 0.0), 6),
    }


def _like(text: str) -> str:
    """A LIKE pattern finding `text` as json.dumps wrote it, anywhere in a stored JSON column."""
    quoted = json.dumps(text)[1:-1]
    return "%" + quoted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _names(item: Any, machine: InstanceRow) -> bool:
    return isinstance(item, dict) and (item.get("label") == machine["label"] or item.get("uuid") == machine["uuid"])


def steps_touching(conn: sqlite3.Connection, machine: InstanceRow) -> list[int]:
    """The ids of the steps that acted on `machine`: an action or a refusal naming its label or uuid, or one of
    its events naming the step (the launch that rented it, whose action names no label)."""
    found: set[int] = set()
    for (data,) in conn.execute("SELECT data FROM events WHERE uuid = ? AND source = 'agent' AND data IS NOT NULL",
                                (machine["uuid"],)):
        step = _parsed(data, {}).get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            found.add(step)
    patterns = [_like(machine["label"]), _like(machine["uuid"])]
    for row in conn.execute(
            "SELECT id, actions, refused FROM agent_steps WHERE outcome != 'skipped' AND (actions LIKE ? ESCAPE '\\'"
            " OR refused LIKE ? ESCAPE '\\' OR actions LIKE ? ESCAPE '\\' OR refused LIKE ? ESCAPE '\\')",
            (patterns[0], patterns[0], patterns[1], patterns[1])):
        if any(_names(item, machine) for column in ("actions", "refused") for item in _parsed(row[column], [])):
            found.add(row["id"])
    return sorted(found)


def history(conn: sqlite3.Connection, *, limit: int = DEFAULT_LIMIT, since: datetime | None = None,
            machine: InstanceRow | None = None) -> dict[str, Any]:
    """The last `limit` steps that ran, oldest first, with the skipped steps around them folded (`agent history
    --json`); of those started at or after `since`, and of those that acted on `machine` (module docstring)."""
    where: list[str] = ["outcome != 'skipped'"]
    params: list[str] = []
    if since is not None:
        where.append("started_at >= ?")
        params.append(clock.to_iso(since))
    if machine is not None:
        where.append("id IN (SELECT value FROM json_each(?))")
        params.append(json.dumps(steps_touching(conn, machine)))
    ran = conn.execute(f"SELECT * FROM agent_steps WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                       (*params, limit)).fetchall()[::-1]
    skipped = [] if machine is not None else _skipped(conn, ran[0]["id"] if ran else None, since)
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
    return {"limit": limit, "since": clock.display_iso(clock.to_iso(since)),
            "label": None if machine is None else machine["label"], "steps_shown": len(ran),
            "skipped_shown": len(skipped), "entries": entries}


def _skipped(conn: sqlite3.Connection, first: int | None, since: datetime | None) -> list[sqlite3.Row]:
    """The skipped steps to fold: those after the last step that ran before `first` (the first shown), and at or
    after `since`."""
    query = "SELECT id, started_at FROM agent_steps WHERE outcome = 'skipped'"
    params: list[int | str] = []
    if first is not None:
        query += " AND id > (SELECT coalesce(max(id), 0) FROM agent_steps WHERE outcome != 'skipped' AND id < ?)"
        params.append(first)
    if since is not None:
        query += " AND started_at >= ?"
        params.append(clock.to_iso(since))
    return conn.execute(query + " ORDER BY id", params).fetchall()
