"""What a machine said: the tail of each of its boot logs, as its boot script pushed it.

A machine's log is hostile text. It is kept as text only, bounded, and made
safe once, when it arrives: secrets and bearer-like tokens masked, every
control, bidi and separator character but the newline shown as an escape
(`\\x1b`, `\\u202e`), and cut to its last MAX_CHARS characters at a line
start. Nothing here renders or runs it: `vastctl logs` prints it escaped and
the dashboard puts it in a <pre> HTML-escaped. One row per machine and log
name, replaced at each push, so the table stays the size of the fleet.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from vastctl import clock, upstream
from vastctl.errors import BadInput
from vastctl.state import lifecycle
from vastctl.state.db import transaction
from vastctl.validate import Invalid

NAMES = ("onstart", "fetch", "cuzk", "bench")  # the boot script's logs: its own, the parameter fetch, cuzk, the bench
MAX_CHARS = 16 * 1024  # the tail kept per machine and log
PUSH_BYTES = 32 * 1024  # what `log-push` reads from the end of the file (the HTTP body limit is 64 KiB)
RECENT_MACHINES = 12  # machines whose logs the dashboard shows, the latest pushed first


def check_name(name: Any) -> str:
    if name not in NAMES:
        raise Invalid("name", f"must be one of {', '.join(NAMES)}, got {upstream.clip(repr(name), 60)}")
    return name


def made_safe(text: Any) -> tuple[str, bool]:
    """The text as it is kept: masked, escaped line by line, cut to its tail. Returns (text, whether it was cut)."""
    if not isinstance(text, str):
        raise BadInput(f'the log "text" must be text, got {type(text).__name__}')
    lines = text.replace("\r\n", "\n").split("\n")
    safe = "\n".join(upstream.escape_controls(upstream.mask(line)) for line in lines)
    if len(safe) <= MAX_CHARS:
        return safe, False
    tail = safe[-MAX_CHARS:]
    newline = tail.find("\n")
    return (tail[newline + 1:] if 0 <= newline < len(tail) - 1 else tail), True


def tail_of_file(data: bytes) -> str:
    """The last PUSH_BYTES of a log file as text (bytes that are not UTF-8 become U+FFFD)."""
    return data[-PUSH_BYTES:].decode("utf-8", "replace")


def push(conn: sqlite3.Connection, uuid: str, name: str, text: Any, *, now: datetime) -> dict[str, Any]:
    """Keep the tail a machine pushed (a killed machine may still push: its logs say why it failed)."""
    check_name(name)
    safe, was_cut = made_safe(text)
    with transaction(conn):
        row = lifecycle.get(conn, uuid)
        conn.execute(
            "INSERT INTO machine_logs (uuid, name, at, text, cut) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (uuid, name) DO UPDATE SET at = excluded.at, text = excluded.text, cut = excluded.cut",
            (uuid, name, clock.to_iso(now), safe, int(was_cut)))
    return {"state": row["state"], "name": name, "chars": len(safe), "cut": was_cut}


def _view(row: sqlite3.Row) -> dict[str, Any]:
    return {"label": row["label"], "uuid": row["uuid"], "name": row["name"], "at": clock.display_iso(row["at"]),
            "cut": bool(row["cut"]), "text": row["text"]}


def tails(conn: sqlite3.Connection, label_or_uuid: str, name: str | None = None) -> dict[str, Any]:
    """One machine's logs, in NAMES order (the `logs --json` shape)."""
    if name is not None:
        check_name(name)
    row = lifecycle.resolve(conn, label_or_uuid)
    logs = [_view(r) for r in conn.execute(
        "SELECT l.*, i.label FROM machine_logs l JOIN instances i USING (uuid) WHERE l.uuid = ?", (row["uuid"],))
        if name is None or r["name"] == name]
    logs.sort(key=lambda log: NAMES.index(log["name"]) if log["name"] in NAMES else len(NAMES))
    return {"label": row["label"], "uuid": row["uuid"], "state": row["state"],
            "logs": [{key: log[key] for key in ("name", "at", "cut", "text")} for log in logs]}


def recent(conn: sqlite3.Connection, machines: int = RECENT_MACHINES) -> list[dict[str, Any]]:
    """The logs of the machines that pushed last (the dashboard's view), newest machine first."""
    latest = [r["uuid"] for r in conn.execute(
        "SELECT uuid, max(at) AS last FROM machine_logs GROUP BY uuid ORDER BY last DESC, uuid LIMIT ?", (machines,))]
    out: list[dict[str, Any]] = []
    for uuid in latest:
        row = conn.execute("SELECT label FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        if row is None:
            continue
        out.extend({"label": row["label"], **log} for log in tails(conn, uuid)["logs"])
    return out
