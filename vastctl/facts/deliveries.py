"""What the proof router saw: every call it delivered, what it holds now, and the provers it may send to.

The router (vastctl/route/) is the one part of vastctl that watches Curio's proofs happen, so what it
recorded is what vastctl believes over what a machine says in its heartbeats:

  proof_calls   one row per attempt: the prover (uuid, label), the kind, the result, the time the call was
                held before this attempt, its time on the prover and the daemon's own timings. Results:
                completed, failed (a proof the daemon answered FAILED inside gRPC OK), error (another status
                the daemon chose), dropped (the prover failed before answering: the call was sent elsewhere),
                refused (too big, or the router full), expired (its deadline passed), abandoned (Curio gave up).
                A prover not reached (its connect refused) was sent nothing: no row, no attempt
  route_status  one row the router rewrites every route.refresh: the calls held, their bytes, the oldest's
                age, the calls on provers, where it sends each proof kind (routing). Older than STALE_AFTER_S it
                says nothing (the router is not running)

A call's proof wait is its last attempt's held_ms + prover_ms: from its arrival at the router to its answer.

A machine's routed rate (routed_rates) is what the router saw it prove over the last ROUTED_WINDOW_S, from the
attempts that held one of its slots (an attempt's row is written when it ends: [at - prover_ms, at] is its time
on the prover). Two figures bound what the machine proves when kept full (`slots` calls at once):

  rate      completed proofs × 3600 / the seconds it held at least one call: its throughput while it had work.
            Little's law: kept at `slots` calls, this is slots / the time a proof takes at that load, the machine's
            true rate. Given fewer calls it is what it proved at the load it had: at least its rate (a daemon
            proving fewer calls at once proves no faster in total).
  rate_max  completed proofs × 3600 × slots / the slot-seconds its attempts took: `slots` calls at once, each
            taking no longer than its calls took. A call shares the GPU with fewer others at a lower load, so
            it is done sooner than at full load: this is at most what the machine proves full.

The two meet when the machine was kept full. `slots × 3600 / median proving time` alone would be rate_max: right
for a full machine and up to `slots` times too high for one given a call at a time, the unsafe side for a fleet
sized on it. Failed, error and dropped attempts held a slot for their time and proved nothing: they count as
time, never as proofs. Calls running when the window is read are not yet rows: `rate` understates by at most
half of `slots` proofs over the window; an attempt begun before the window counts for its share inside it.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Literal, Mapping, Sized, TypedDict, cast

from vastctl import clock
from vastctl.facts import tunnel
from vastctl.state.db import transaction
from vastctl.state.lifecycle import State, record_event
from vastctl.state.per_file import PerFile, file_of
from vastctl.state.rows import RouteStatusRow, typed

STALE_AFTER_S = 30.0  # a route_status older than this is a router that stopped: no word on held calls
Result = Literal["completed", "failed", "error", "dropped", "refused", "expired", "abandoned"]
ANSWERED: tuple[Result, ...] = ("completed", "failed")  # results that carry a proof wait
RESULTS: tuple[Result, ...] = ("completed", "failed", "error", "dropped", "refused", "expired", "abandoned")
SET_ASIDE = "route_set_aside"  # event kind: the router reports a machine that kept failing after it was taken back
CLAIM_DISAGREES = "claim_disagrees"  # event kind: a machine claims more proofs than the router saw it deliver
CLAIM_SLACK = 0.1  # a claim may pass the delivered count by its benchmark's proofs and this share, plus one
CLAIM_EVENT_EVERY_S = 3600.0  # at most one such event per machine in this long
ROUTED_WINDOW_S = 3600.0  # the recent window a machine's routed rate is measured over
ROUTED_MIN_PROOFS = 10  # completed calls in the window before the routed rate bounds the machine's expected rate
ON_PROVER: tuple[Result, ...] = ("completed", "failed", "error", "dropped")  # results of attempts that held one of a prover's slots


Route = Literal["own_daemon", "fleet", "refused"]  # where the router sends a proof kind (route/routing.py's Way)


class HeldView(TypedDict):
    """The router's held calls as `fleet --json`'s summary.router and the page show them."""

    router_running: bool
    held: int
    held_bytes: int
    oldest_held_s: float | None
    in_flight: int
    provers: int
    updated_at: str | None
    routing: dict[str, Route] | None


class ProofWait(TypedDict):
    """The proof wait of the calls answered in a window: count, nearest-rank quantiles (s), share within max_wait."""

    calls: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    within_max_wait: float | None


class CallRecord(TypedDict, total=False):
    """One attempt as the router (or the demo) hands it to record_calls: proof_calls' columns (CALL_COLUMNS); a
    column it leaves out is stored NULL."""

    at: str
    request_id: str | None
    kind: str
    uuid: str | None
    label: str | None
    result: Result
    held_ms: int
    prover_ms: int | None
    attempt: int
    size_bytes: int
    queue_wait_ms: int | None
    srs_load_ms: int | None
    synthesis_ms: int | None
    gpu_compute_ms: int | None
    total_ms: int | None
    detail: str | None


CALL_COLUMNS = tuple(CallRecord.__annotations__)  # proof_calls' columns a record fills, in its order


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
    routing: dict[str, Route] | None = None  # proof kind name → where the router sends it, as it decided

    def view(self) -> HeldView:
        return {"router_running": self.fresh, "held": self.held, "held_bytes": self.held_bytes,
                "oldest_held_s": None if self.oldest_held_s is None else round(self.oldest_held_s, 1),
                "in_flight": self.in_flight, "provers": self.provers,
                "updated_at": clock.display_iso(self.updated_at), "routing": self.routing}


@dataclass(frozen=True)
class Routed:
    """What the router saw one machine prove over the window (module docstring: rate, rate_max)."""
    proofs: int  # completed calls that ended in the window
    rate: float  # proofs/h while it held at least one call: what it proves at the load it had (a floor)
    rate_max: float  # proofs/h if `slots` calls at once each took what its calls took (a ceiling)
    busy_s: float  # seconds it held at least one call

    @property
    def enough(self) -> bool:
        """Enough proofs seen for the figures to bound the machine's expected rate."""
        return self.proofs >= ROUTED_MIN_PROOFS


# --- what the router writes --------------------------------------------------------------------------------


def record_calls(conn: sqlite3.Connection, calls: Iterable[CallRecord]) -> int:
    """Append the attempts the router finished (one transaction for the batch)."""
    rows = [tuple(call.get(name) for name in CALL_COLUMNS) for call in calls]
    if not rows:
        return 0
    with transaction(conn):
        conn.executemany(f"INSERT INTO proof_calls ({', '.join(CALL_COLUMNS)})"
                         f" VALUES ({', '.join('?' for _ in CALL_COLUMNS)})", rows)
    return len(rows)


def write_status(conn: sqlite3.Connection, snapshot: Mapping[str, object], *, now: datetime,
                 routing: Mapping[str, str] | None = None) -> None:
    """The router's status row from its snapshot (route/dispatch.py's Dispatcher.snapshot, a shape the router owns:
    held, held_bytes, oldest_held_s, in_flight and the list of provers are read); `routing`: where it sends each
    proof kind (kind name → own_daemon, fleet or refused)."""
    provers = snapshot["provers"]
    with transaction(conn):
        conn.execute(
            "INSERT INTO route_status (id, updated_at, held, held_bytes, oldest_held_s, in_flight, provers, routing)"
            " VALUES (1, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at,"
            " held = excluded.held, held_bytes = excluded.held_bytes, oldest_held_s = excluded.oldest_held_s,"
            " in_flight = excluded.in_flight, provers = excluded.provers, routing = excluded.routing",
            (clock.to_iso(now), snapshot["held"], snapshot["held_bytes"], snapshot["oldest_held_s"],
             snapshot["in_flight"], len(provers) if isinstance(provers, Sized) else 0,
             None if routing is None else json.dumps(dict(routing), sort_keys=True)))


def set_aside(conn: sqlite3.Connection, uuid: str, why: str, *, now: datetime) -> bool:
    """Mark a running machine the router reports: ejected for failed answers, taken back, and ejected again with
    no good answer between (route/dispatch.py). Reconcile kills it (code route_failing); one event, once. An
    ejection alone (the router takes the machine back by itself) and connects that failed (reconcile's tunnel
    check judges those) never come here."""
    with transaction(conn):
        row = conn.execute("SELECT label, state, route_failing_since FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        if row is None or row["state"] != State.RUNNING or row["route_failing_since"] is not None:
            return False
        conn.execute("UPDATE instances SET route_failing_since = ?, route_failure = ? WHERE uuid = ?",
                     (clock.to_iso(now), why, uuid))
        record_event(conn, kind=SET_ASIDE, source="route", uuid=uuid, label=row["label"], now=now,
                     reason=f"the router sends it no more calls: {why}")
    return True


class Candidate(tunnel.TunnelRow):
    """A machine the router may send to: where its tunnel stands, its bench rate, whether it joined."""

    bench_rate: float | None
    joined: bool  # the manager's check reached its daemon (derived, not a column)


def candidates(conn: sqlite3.Connection) -> list[Candidate]:
    """Running machines with a tunnel the router may send to: not set aside, with their bench rate; `joined`
    says whether the manager's check reached the daemon (the router probes the others itself)."""
    # the selected columns, and joined added below: a Candidate's keys
    rows = [typed(row, Candidate) for row in conn.execute(
        f"SELECT {tunnel.TUNNEL_COLUMNS}, bench_rate, NULL AS joined"
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
    if row is None:
        return False
    claimed = int(row["proofs_total"] or 0)
    floor = _COUNTED.get(conn).floor(conn, uuid)
    if floor is not None and claimed <= _allowed(floor, bench_proofs):
        return False  # what the router had delivered when last counted clears the claim: no need to count again
    counts = delivered(conn, uuid=uuid).get(uuid)
    if not counts:
        return False
    done = counts.get("completed", 0)
    _COUNTED.get(conn).keep(conn, uuid, done)
    if claimed <= _allowed(done, bench_proofs):
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


def _allowed(done: int, bench_proofs: int) -> int:
    """The most proofs a machine may claim with `done` completed calls (more `done`, never fewer allowed)."""
    return done + bench_proofs + int(done * CLAIM_SLACK) + 1


class _Counted:
    """One file's completed calls per machine as check_claim last counted them: a floor of what a count finds now
    (proof_calls rows are never deleted), so a heartbeat whose claim that floor clears reads nothing more. A
    machine's calls grow all its life and a count reads them all: without the floor every heartbeat of a week's
    machine would. Kept only for a file on disk, counted outside a transaction, while it is the same file (its
    inode) and its newest call no older than when counted."""

    def __init__(self) -> None:
        # (st_dev, st_ino) of the file counted in, its highest proof_calls id then, uuid → completed calls: one
        # value, replaced whole, so that serve's threads never see the counts of one file with another's identity
        self.kept: tuple[tuple[int, int] | None, int, dict[str, int]] = (None, 0, {})

    def floor(self, conn: sqlite3.Connection, uuid: str) -> int | None:
        """The machine's completed calls when last counted, while that is still a floor of a count now."""
        identity, newest, completed = self.kept
        found = completed.get(uuid)
        if found is None:
            return None
        now_identity, now_newest = self._state(conn)
        return found if now_identity is not None and now_identity == identity and now_newest >= newest else None

    def keep(self, conn: sqlite3.Connection, uuid: str, done: int) -> None:
        identity, newest = self._state(conn)
        if identity is None or conn.in_transaction:
            return
        kept_identity, kept_newest, completed = self.kept
        same = identity == kept_identity and newest >= kept_newest
        self.kept = (identity, newest, {**(completed if same else {}), uuid: done})

    @staticmethod
    def _state(conn: sqlite3.Connection) -> tuple[tuple[int, int] | None, int]:
        path = file_of(conn)
        try:
            stat = None if path.startswith(":memory:") else os.stat(path)
        except OSError:
            stat = None
        newest = conn.execute("SELECT coalesce(max(id), 0) FROM proof_calls").fetchone()[0]
        return (None if stat is None else (stat.st_dev, stat.st_ino)), int(newest)


_COUNTED = PerFile(_Counted)


# --- what the rest of vastctl reads ------------------------------------------------------------------------


def held(conn: sqlite3.Connection, *, now: datetime) -> Held:
    found = conn.execute("SELECT * FROM route_status WHERE id = 1").fetchone()
    if found is None:
        return Held(fresh=False)
    row = typed(found, RouteStatusRow)
    updated = clock.from_iso(row["updated_at"])
    if updated is None or abs((now - updated).total_seconds()) > STALE_AFTER_S:
        return Held(fresh=False, updated_at=row["updated_at"])
    return Held(fresh=True, held=int(row["held"] or 0), held_bytes=int(row["held_bytes"] or 0),
                oldest_held_s=row["oldest_held_s"], in_flight=int(row["in_flight"] or 0),
                provers=int(row["provers"] or 0), updated_at=row["updated_at"], routing=_routing(row["routing"]))


ROUTES: tuple[Route, ...] = ("own_daemon", "fleet", "refused")


def _routing(text: str | None) -> dict[str, Route] | None:
    """route_status.routing as written, or None when absent or not the router's shape."""
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(found, dict) or not all(isinstance(k, str) and v in ROUTES for k, v in found.items()):
        return None
    return {str(k): cast(Route, v) for k, v in found.items()}


def proof_wait(conn: sqlite3.Connection, *, since: datetime, until: datetime, max_wait_s: float) -> ProofWait:
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


def delivered(conn: sqlite3.Connection, *, uuid: str | None = None,
              ids: tuple[int, int] | None = None) -> dict[str, dict[str, int]]:
    """Per machine (uuid): how many of each result the router saw; machines it never sent to are absent.
    With `uuid`, that machine's alone (its rows through the index, as a heartbeat asks); with `ids` (after, up to],
    the calls of those ids alone (what a reader that keeps the counts adds: facts/appended.py)."""
    sql = "SELECT uuid, result, count(*) FROM proof_calls WHERE uuid IS NOT NULL"
    args: tuple[str | int, ...] = ()
    if uuid is not None:
        sql += " AND uuid = ?"
        args = (uuid,)
    if ids is not None:
        sql += " AND id > ? AND id <= ?"
        args += ids
    counts: dict[str, dict[str, int]] = {}
    for uuid, result, count in conn.execute(sql + " GROUP BY uuid, result", args):
        counts.setdefault(uuid, {})[result] = count
    return counts


def routed_rates(conn: sqlite3.Connection, *, now: datetime, slots: int,
                 window_s: float = ROUTED_WINDOW_S) -> dict[str, Routed]:
    """uuid → what the router saw the machine prove over the last window_s (module docstring), for every machine
    with a completed call in it. One read of the window's attempts (the `at` index), grouped here by machine."""
    start = clock.to_iso(now - timedelta(seconds=window_s))
    spans: dict[str, list[tuple[float, float, bool]]] = {}
    for uuid, stop, prover_ms, done in conn.execute(  # each end in seconds from the window's start, in SQLite
            f"SELECT uuid, (julianday(at) - julianday(?)) * 86400, prover_ms, result = 'completed' FROM proof_calls"
            f" WHERE at >= ? AND at <= ? AND uuid IS NOT NULL AND prover_ms IS NOT NULL"
            f" AND result IN ({', '.join('?' for _ in ON_PROVER)})", (start, start, clock.to_iso(now), *ON_PROVER)):
        if stop is not None:
            spans.setdefault(uuid, []).append((stop - max(0, prover_ms) / 1000, stop, bool(done)))
    return {uuid: routed for uuid, calls in spans.items() if (routed := _routed(calls, slots)) is not None}


def _routed(calls: list[tuple[float, float, bool]], slots: int) -> Routed | None:
    """One machine's figures from its attempts (begin, end, completed) in seconds from the window's start."""
    proofs = sum(1 for _, _, done in calls if done)
    credit = slot_s = busy_s = 0.0
    reach = 0.0  # the end of the busy stretch so far: attempts in order of their begin
    for begin, stop, done in sorted(calls):
        inside = stop - max(begin, 0.0)
        slot_s += inside
        if done:
            credit += inside / (stop - begin) if stop > begin else 1.0
        busy_s += max(0.0, stop - max(begin, 0.0, reach))
        reach = max(reach, stop)
    if not proofs or busy_s <= 0 or slot_s <= 0:
        return None
    rate = credit * 3600 / busy_s
    return Routed(proofs=proofs, rate=rate, rate_max=max(rate, credit * 3600 * slots / slot_s), busy_s=busy_s)


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
