"""The state file as it stood at one moment (`--as-of`): a copy with everything written after that moment taken out.

Every view reads the copy as it reads the file, so the machines, their states and durations, capacity, spend,
demand, cost, proofs, events and the agent's steps are all those of the moment, with no view knowing of it. The
file's tables are of three kinds:

- appended rows, each stamped when it was written (events, calls to vast, listings, demand samples, agent
  steps, the router's calls, …): the copy keeps those stamped at or before the moment;
- rows kept up to date, whose history the events keep: a machine's row is taken back to its state at the
  moment (the last transition at or before it, its kill, its restarts) and a setting to the value it had;
- values the file keeps only as their latest (a machine's heartbeats: its proof counters and heartbeat rate;
  vast's message on it; when it was outbid, resumed, its tunnel last checked): where the latest came after the
  moment, the value then is unknown and the copy says so (null, counters 0), so no figure of the moment is made
  from one that came later. Two are known in part: a machine heard from after the moment was heard from at it
  (HEARTBEATING), and vast's status on a machine that has had it since before the moment is the one the last
  listing by then showed (_vasts_view; vast_cache, which holds the last listing alone, is made again from them).

What no view reads is kept as it is (the simulated market's own tables, the blocklist, the dashboard's
sign-outs, the applied migrations). tests/test_as_of.py holds every table of state/rows.py to a rule here.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import datetime
from pathlib import Path

from vastctl import clock
from vastctl.errors import BadInput
from vastctl.state import db
from vastctl.state.lifecycle import S
from vastctl.state.rows import InstanceChanges, InstanceRow, VastCacheRow, column_values, selected

# Appended rows: the copy keeps those whose stamp is at or before the moment.
STAMPED: dict[str, str] = {
    "events": "at",
    "actions": "at",
    "vast_listings": "at",
    "agent_messages": "at",
    "agent_notes": "at",
    "demand_samples": "at",
    "agent_steps": "coalesce(finished_at, started_at)",  # a step is read once it finished
    "webhook_deliveries": "received_at",
    "machine_logs": "at",  # a log pushed later replaced the one shown then, which is gone: none is shown
    "proof_calls": "at",
    "route_status": "updated_at",  # the router's last word, when it came by then
    "locks": "acquired_at",
}
# Rows kept up to date: taken back through their history (_machines, _settings).
REWOUND = ("instances", "instance_revisions", "settings", "vast_cache")
# Read by no view, kept as they are.
KEPT = ("migrations", "blocklist", "dashboard_sign_outs")

# A machine's columns the file keeps only as their latest value: unknown at the moment when written after it.
HEARTBEAT = InstanceChanges(last_heartbeat_at=None, proofs_done=0, proofs_per_hour=None, proofs_total=0)
# A machine booted and not stopped at the moment, heard from after it, was heartbeating through it: one silent
# for timeouts.heartbeat is killed by reconcile, and a killed machine's heartbeats are refused. Its last heartbeat
# by the moment is shown at the moment (it was at most timeouts.heartbeat before), so it counts as alive then.
HEARTBEATING = (S.REGISTERED, S.PARAMS_DONE, S.BENCH_DONE, S.RUNNING)
NOT_KILLED = InstanceChanges(kill_reason=None, kill_code=None, killed_at=None, kill_forced=0, destroy_attempts=0,
                             destroy_error=None)
JOINED, LEFT = "joined", "tunnel_lost"  # facts/tunnel.py's events: one at each change of joined_at, tunnel_down_since
RESTARTED_FROM = (S.PARAMS_DONE, S.BENCH_DONE, S.RUNNING)  # lifecycle.register: a container restart


def copy_as_of(source: Path, moment: datetime, directory: Path) -> Path:
    """A copy of the state file at `source` in `directory`, as it stood at `moment`. The source is opened as
    every command opens it (checked to be ours, migrated) and never changed otherwise."""
    target = directory / source.name
    original = db.connect(source, now=moment)
    try:
        copy = sqlite3.connect(target)
        try:
            original.backup(copy)
        finally:
            copy.close()
    finally:
        original.close()
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN IMMEDIATE")
        cut(conn, clock.to_iso(moment))
        conn.execute("COMMIT")
    finally:
        conn.close()
    for beside in (".secret", ".webhook-secret"):  # tokens and webhooks are checked against the file's own
        if Path(f"{source}{beside}").exists():
            shutil.copyfile(f"{source}{beside}", f"{target}{beside}")
    return target


def cut(conn: sqlite3.Connection, at: str) -> None:
    """Take everything written after `at` (a stored time) out of the open file, inside the caller's transaction.
    A table this module has no rule for cannot be rewound: refused, rather than shown as it is now."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                             " AND name NOT LIKE 'sqlite_%'")}
    unruled = sorted(tables - {*STAMPED, *REWOUND, *KEPT} - {t for t in tables if t.startswith("sim_")})
    if unruled:
        raise BadInput(f"--as-of cannot rewind the table(s) {', '.join(unruled)} of this file: read it without --as-of")
    _settings(conn, at)  # before the events it reads back are cut
    _machines(conn, at)
    for table, stamp in STAMPED.items():
        conn.execute(f"DELETE FROM {table} WHERE {stamp} > ?", (at,))
    conn.execute("DELETE FROM agent_messages WHERE step_id IS NOT NULL AND step_id NOT IN (SELECT id FROM agent_steps)")
    conn.execute("DELETE FROM agent_notes WHERE step_id IS NOT NULL AND step_id NOT IN (SELECT id FROM agent_steps)")


def _settings(conn: sqlite3.Connection, at: str) -> None:
    """A setting changed after the moment had the value its first later change replaced (the event's `old`);
    one never set by then is the config's again."""
    changes = [(event["at"], json.loads(event["data"])) for event in conn.execute(
        "SELECT at, data FROM events WHERE kind = 'setting' AND data IS NOT NULL ORDER BY id")]
    for row in conn.execute("SELECT key FROM settings WHERE updated_at > ?", (at,)).fetchall():
        mine = [(when, data) for when, data in changes if isinstance(data, dict) and data.get("key") == row["key"]]
        before = [when for when, _ in mine if when <= at]
        after = [data for when, data in mine if when > at]
        if not before or not after:
            conn.execute("DELETE FROM settings WHERE key = ?", (row["key"],))
            continue
        conn.execute("UPDATE settings SET value = ?, updated_at = ? WHERE key = ?",
                     (repr(after[0]["old"]), before[-1], row["key"]))


def _machines(conn: sqlite3.Connection, at: str) -> None:
    """Machines launched after the moment are gone; the others are taken back to the moment (module docstring)."""
    conn.execute("DELETE FROM instance_revisions WHERE uuid IN (SELECT uuid FROM instances WHERE created_at > ?)", (at,))
    conn.execute("DELETE FROM instances WHERE created_at > ?", (at,))
    listings = [row[0] for row in conn.execute("SELECT at FROM vast_listings WHERE ok = 1 AND at <= ? ORDER BY at", (at,))]
    for row in selected(conn, InstanceRow, "SELECT * FROM instances"):
        then = _machine_then(conn, row, at, listings)
        changed = {name: value for name, value in column_values(then).items() if row.get(name) != value}
        if changed:
            names = ", ".join(f"{name} = ?" for name in changed)
            conn.execute(f"UPDATE instances SET {names} WHERE uuid = ?", (*changed.values(), row["uuid"]))
    _listing(conn, at, listings)


def _machine_then(conn: sqlite3.Connection, row: InstanceRow, at: str, listings: list[str]) -> InstanceChanges:
    """One machine's columns at the moment, from its transitions up to it (those that may differ)."""
    moves = conn.execute("SELECT at, from_state, to_state FROM events WHERE uuid = ? AND kind = 'transition'"
                         " ORDER BY id", (row["uuid"],)).fetchall()
    then = [move for move in moves if move["at"] <= at]
    later = [move for move in moves if move["at"] > at]
    changes = InstanceChanges()
    if later and then:
        changes["state"], changes["state_since"] = then[-1]["to_state"], then[-1]["at"]
        restarts = sum(move["to_state"] == S.REGISTERED and move["from_state"] in RESTARTED_FROM for move in later)
        changes["restarts"] = max(0, row["restarts"] - restarts)
    reached = {move["to_state"] for move in then}
    if S.KILLED not in reached:
        changes.update(NOT_KILLED)
        if S.BENCH_DONE not in reached:
            changes["bench_rate"] = None
        if S.RUNNING not in reached:
            changes["boot_stages"] = None
    if not reached - {S.LAUNCHING, S.STOPPED}:
        changes["claimed_vast_id"] = None
    if _after(row["destroyed_at"], at):
        changes["destroyed_at"] = None
    if _after(row["last_heartbeat_at"], at):
        changes.update(HEARTBEAT)
        if then and then[-1]["to_state"] in HEARTBEATING:
            changes["last_heartbeat_at"] = at
    if _after(row["route_failing_since"], at):
        changes["route_failing_since"], changes["route_failure"] = None, None
    if _after(row["resumed_at"], at):
        changes["resumed_at"] = None
    if _after(row["tunnel_checked_at"], at):
        changes["tunnel_checked_at"] = None
    if _after(row["outbid_since"], at):
        changes["outbid_since"] = None
    changes.update(_vasts_view(row, at, listings))
    changes.update(_tunnel(conn, row, at))
    return changes


def _vasts_view(row: InstanceRow, at: str, listings: list[str]) -> InstanceChanges:
    """What vast's listings said of the machine by the moment. Seen since: the status it has had since before
    the moment is the one the last listing by then showed (vast_status_since changes with every new status);
    its message then, or a status that changed since, is unknown."""
    seen, since = row["vast_seen_at"], row["vast_status_since"]
    if seen is None:
        return {}
    if seen <= at:  # the good listings by the moment that did not show it
        return {"vast_missing": min(row["vast_missing"], sum(listed > seen for listed in listings))}
    last = listings[-1] if listings else None
    if since is not None and since <= at and last is not None and last >= since:
        return {"vast_seen_at": last, "vast_missing": 0, "vast_status_msg": None}
    return {"vast_status": None, "vast_status_msg": None, "vast_status_since": None, "vast_seen_at": None,
            "vast_missing": 0}


def _tunnel(conn: sqlite3.Connection, row: InstanceRow, at: str) -> InstanceChanges:
    """Whether the manager reached its daemon through the tunnel then, from the events of each change."""
    changes = conn.execute("SELECT at, kind FROM events WHERE uuid = ? AND kind IN (?, ?) ORDER BY id",
                           (row["uuid"], JOINED, LEFT)).fetchall()
    if not any(change["at"] > at for change in changes):
        return {}
    joined = [change["at"] for change in changes if change["kind"] == JOINED and change["at"] <= at]
    left = [change["at"] for change in changes if change["kind"] == LEFT and change["at"] <= at]
    down = left[-1] if left and (not joined or left[-1] >= joined[-1]) else None
    return {"joined_at": joined[-1] if joined else None, "tunnel_down_since": down}


def _listing(conn: sqlite3.Connection, at: str, listings: list[str]) -> None:
    """vast_cache holds the last good listing alone. When that came after the moment, the one by then is made
    again from what it showed: each machine's view of vast as just taken back (an instance the cache still holds
    keeps its other columns when its status is the same), and the cached instances no machine of ours stands for
    that were first seen by then."""
    if conn.execute("SELECT count(*) FROM vast_cache WHERE seen_at > ?", (at,)).fetchone()[0] == 0:
        return
    cached = {entry["vast_id"]: entry for entry in selected(conn, VastCacheRow, "SELECT * FROM vast_cache")}
    conn.execute("DELETE FROM vast_cache")
    if not listings:
        return
    last = listings[-1]
    ours: set[int] = set()
    for row in selected(conn, InstanceRow, "SELECT * FROM instances WHERE vast_id IS NOT NULL"):
        vast_id, status = row["vast_id"], row["vast_status"]
        assert vast_id is not None  # the query's
        ours.add(vast_id)
        if row["vast_seen_at"] != last or status is None:
            continue
        entry = cached.get(vast_id)
        if entry is None or entry["actual_status"] != status or entry["first_seen_at"] > at:
            entry = {"vast_id": vast_id, "label": row["label"], "actual_status": status, "intended_status": status,
                     "cur_state": status, "status_msg": None, "machine_id": row["machine_id"],
                     "gpu_name": row["gpu_name"], "num_gpus": row["num_gpus"], "dph": row["dph"],
                     "storage_dph": row["storage_dph"], "first_seen_at": row["vast_status_since"] or row["created_at"],
                     "seen_at": last}
        _cache(conn, {**entry, "status_msg": None, "seen_at": last})
    for vast_id, entry in cached.items():
        if vast_id not in ours and entry["first_seen_at"] <= at:
            _cache(conn, {**entry, "status_msg": None, "seen_at": last})


def _cache(conn: sqlite3.Connection, entry: VastCacheRow) -> None:
    names = ", ".join(entry)
    conn.execute(f"INSERT INTO vast_cache ({names}) VALUES ({', '.join('?' for _ in entry)})", tuple(entry.values()))


def _after(value: str | None, at: str) -> bool:
    return value is not None and value > at
