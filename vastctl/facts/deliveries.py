"""What the proof router saw: every call it delivered, what it holds now, and the provers it may send to.

The router (vastctl/route/) is the one part of vastctl that watches Curio's proofs happen, so what it
recorded is what vastctl believes over what a machine says in its heartbeats:

  proof_calls   one row per attempt: the prover (uuid, label), the kind, the result, the time the call was
                held before this attempt, its time on the prover and the daemon's own timings. Results:
                completed, failed (a proof the daemon answered FAILED inside gRPC OK), error (another status
                the daemon chose), dropped (the prover failed before answering: the call was sent elsewhere),
                refused (too big, or the router full), expired (its deadline passed), abandoned (Curio gave up)
  route_status  one row the router rewrites every route.refresh: the calls held, their bytes, the oldest's
                age, the calls on provers. Older than STALE_AFTER_S it says nothing (the router is not running)

A call's proof wait is its last attempt's held_ms + prover_ms: from its arrival at the router to its answer.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping

from vastctl import clock
from vastctl.facts import tunnel
from vastctl.state.db import transaction
from vastctl.state.lifecycle import State, record_event

STALE_AFTER_S = 30.0  # a route_status older than this is a router that stopped: no word on held calls
ANSWERED = ("completed", "failed")  # results that carry a proof wait
RESULTS = ("completed", "failed", "error", "dropped", "refused", "expired", "abandoned")
SET_ASIDE = "route_set_aside"  # event kind: the router stopped sending a machine calls
CLAIM_DISAGREES = "claim_disagrees"  # event kind: a machine claims more proofs than the router saw it deliver
CLAIM_SLACK = 0.1  # a claim may pass the delivered count by its benchmark's proofs and this share, plus one
CLAIM_EVENT_EVERY_S = 3600.0  # at most one such event per machine in this long
CALL_COLUMNS = ("at", "request_id", "kind", "uuid", "label", "result", "held_ms", "prover_ms", "attempt",
                "size_bytes", "queue_wait_ms", "srs_load_ms", "synthesis_ms", "gpu_compute_ms", "total_ms", "detail")


@dataclass(frozen=True)
class Held:
    """The router's held calls as its newest status row says, or `fresh` False when it says nothing."""
    fresh: bool
    held: int = 0
    held_bytes: int = 0
    oldest_held_s: float | None = None
    in_flight: int = 0
    provers: int = 0
    updated_at: str | None = None

    def view(self) -> dict[str, Any]:
        return {"router_running": self.fresh, "held": self.held, "held_bytes": self.held_bytes,
                "oldest_held_s": None if self.oldest_held_s is None else round(self.oldest_held_s, 1),
                "in_flight": self.in_flight, "provers": self.provers,
                "updated_at": clock.display_iso(self.updated_at)}


# --- what the router writes --------------------------------------------------------------------------------


def record_calls(conn: sqlite3.Connection, calls: Iterable[Mapping[str, Any]]) -> int:
    """Append the attempts the router finished (one transaction for the batch)."""
    rows = [tuple(call.get(name) for name in CALL_COLUMNS) for call in calls]
    if not rows:
        return 0
    with transaction(conn):
        conn.executemany(f"INSERT INTO proof_calls ({', '.join(CALL_COLUMNS)})"
                         f" VALUES ({', '.join('?' for _ in CALL_COLUMNS)})", rows)
    return len(rows)


def write_status(conn: sqlite3.Connection, snapshot: Mapping[str, Any], *, now: datetime) -> None:
    with transaction(conn):
        conn.execute(
            "INSERT INTO route_status (id, updated_at, held, held_bytes, oldest_held_s, in_flight, provers)"
            " VALUES (1, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at,"
            " held = excluded.held, held_bytes = excluded.held_bytes, oldest_held_s = excluded.oldest_held_s,"
            " in_flight = excluded.in_flight, provers = excluded.provers",
            (clock.to_iso(now), snapshot["held"], snapshot["held_bytes"], snapshot["oldest_held_s"],
             snapshot["in_flight"], len(snapshot["provers"])))


def set_aside(conn: sqlite3.Connection, uuid: str, why: str, *, now: datetime) -> bool:
    """Mark a running machine as failing its calls (reconcile kills it, code route_failing); one event, once."""
    with transaction(conn):
        row = conn.execute("SELECT label, state, route_failing_since FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        if row is None or row["state"] != State.RUNNING or row["route_failing_since"] is not None:
            return False
        conn.execute("UPDATE instances SET route_failing_since = ?, route_failure = ? WHERE uuid = ?",
                     (clock.to_iso(now), why, uuid))
        record_event(conn, kind=SET_ASIDE, source="route", uuid=uuid, label=row["label"], now=now,
                     reason=f"the router sends it no more calls: {why}")
    return True


def candidates(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Running machines with a tunnel the router may send to: not set aside, with their bench rate; `joined`
    says whether the manager's check reached the daemon (the router probes the others itself)."""
    rows = [dict(row) for row in conn.execute(
        "SELECT uuid, label, state, state_since, tunnel_port, joined_at, tunnel_down_since, bench_rate"
        " FROM instances WHERE state = ? AND tunnel_port IS NOT NULL AND destroyed_at IS NULL"
        " AND route_failing_since IS NULL ORDER BY tunnel_port", (State.RUNNING,))]
    for row in rows:
        row["joined"] = bool(tunnel.joined(row))
    return rows


def check_claim(conn: sqlite3.Connection, uuid: str, *, bench_proofs: int, now: datetime) -> bool:
    """After a heartbeat: does the machine claim more proofs (its total over every run) than the router saw it
    deliver, past its benchmark's proofs and CLAIM_SLACK? One event when it does (at most one an hour); the
    claim is not counted (cost reads the router's count, facts/cost.proofs_of). A machine the router never
    sent a call is not judged. True when an event was recorded."""
    row = conn.execute("SELECT label, proofs_total FROM instances WHERE uuid = ?", (uuid,)).fetchone()
    counts = delivered(conn, uuid=uuid).get(uuid)
    if row is None or not counts:
        return False
    done, claimed = counts.get("completed", 0), int(row["proofs_total"] or 0)
    if claimed <= done + bench_proofs + int(done * CLAIM_SLACK) + 1:
        return False
    since = clock.to_iso(now - timedelta(seconds=CLAIM_EVENT_EVERY_S))
    with transaction(conn):
        if conn.execute("SELECT 1 FROM events WHERE kind = ? AND uuid = ? AND at > ?",
                        (CLAIM_DISAGREES, uuid, since)).fetchone():
            return False
        record_event(conn, kind=CLAIM_DISAGREES, source="route", uuid=uuid, label=row["label"], now=now,
                     reason=f"its heartbeats claim {claimed} proofs; the proof router saw {done} come back from it"
                            f" (and {bench_proofs} in its benchmark): the router's count is the one counted")
    return True


# --- what the rest of vastctl reads ------------------------------------------------------------------------


def held(conn: sqlite3.Connection, *, now: datetime) -> Held:
    row = conn.execute("SELECT * FROM route_status WHERE id = 1").fetchone()
    if row is None:
        return Held(fresh=False)
    updated = clock.from_iso(row["updated_at"])
    if updated is None or abs((now - updated).total_seconds()) > STALE_AFTER_S:
        return Held(fresh=False, updated_at=row["updated_at"])
    return Held(fresh=True, held=int(row["held"] or 0), held_bytes=int(row["held_bytes"] or 0),
                oldest_held_s=row["oldest_held_s"], in_flight=int(row["in_flight"] or 0),
                provers=int(row["provers"] or 0), updated_at=row["updated_at"])


def proof_wait(conn: sqlite3.Connection, *, since: datetime, until: datetime, max_wait_s: float) -> dict[str, Any]:
    """Held + proving time of the calls answered in [since, until): count, p50/p95/p99 (seconds) and the share
    answered within max_wait_s (agent.max_wait). None figures when nothing was answered."""
    waits = sorted((row[0] or 0) / 1000 for row in conn.execute(
        "SELECT held_ms + coalesce(prover_ms, 0) FROM proof_calls WHERE at >= ? AND at < ? AND result IN (?, ?)",
        (clock.to_iso(since), clock.to_iso(until), *ANSWERED)))
    if not waits:
        return {"calls": 0, "p50_s": None, "p95_s": None, "p99_s": None, "within_max_wait": None}
    return {"calls": len(waits), "p50_s": _rank(waits, 0.50), "p95_s": _rank(waits, 0.95),
            "p99_s": _rank(waits, 0.99),
            "within_max_wait": round(sum(1 for w in waits if w <= max_wait_s) / len(waits), 4)}


def delivered(conn: sqlite3.Connection, *, uuid: str | None = None) -> dict[str, dict[str, int]]:
    """Per machine (uuid): how many of each result the router saw; machines it never sent to are absent.
    With `uuid`, that machine's alone (its rows through the index, as a heartbeat asks)."""
    sql = "SELECT uuid, result, count(*) FROM proof_calls WHERE uuid IS NOT NULL"
    args: tuple = ()
    if uuid is not None:
        sql += " AND uuid = ?"
        args = (uuid,)
    counts: dict[str, dict[str, int]] = {}
    for uuid, result, count in conn.execute(sql + " GROUP BY uuid, result", args):
        counts.setdefault(uuid, {})[result] = count
    return counts


def results(conn: sqlite3.Connection, *, since: datetime, until: datetime) -> dict[str, int]:
    """Attempts by result in [since, until): what /metrics counts."""
    return {result: count for result, count in conn.execute(
        "SELECT result, count(*) FROM proof_calls WHERE at >= ? AND at < ? GROUP BY result",
        (clock.to_iso(since), clock.to_iso(until)))}


def window(now: datetime, hours: float = 24.0) -> tuple[datetime, datetime]:
    return now - timedelta(hours=hours), now + timedelta(microseconds=1)


def _rank(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile: a wait some call really had."""
    index = min(len(sorted_values) - 1, max(0, int(-(-q * len(sorted_values) // 1)) - 1))
    return round(sorted_values[index], 3)
