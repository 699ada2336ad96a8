"""What the fleet cost: vastctl's own account of vast's billing, from the state file alone.

vast's invoice is the truth; this is what vastctl can say from what it
recorded. Each machine's row and its transition events give its states in
time, and each state bills one way:

  rented       from the launch until a stop or a kill, at the row's price (GPU and disk): a launch
               whose create is still unanswered may be billing already, so it counts
  stopped      while stopped, the disk price vast last listed for it (instances.storage_dph, copied
               from the listing); without one, the full price (never nothing, as observe does)
  after_kill   from the kill until vast confirmed the destroy (destroyed_at), at the full price:
               an exited container still holds its GPU (a machine killed while stopped: its disk price)

Three kill codes say more: a machine that `disappeared` stopped billing when it
left vast's listing (vast_seen_at); one killed for `start_failed` never
started its container, and a resume killed for `scheduling_timeout` never got
its GPU, so they billed their disk alone (from the start, from the resume on).
A host vast last listed `offline` bills nothing from when the listing first showed it so
(instances.vast_status_since; before that it was `unknown`, and billing). What stays unknown: the minutes before a container runs, when vast bills the
disk but not yet the GPU, count at the full price.

A machine killed with no vast id and nothing confirmed was never rented and
costs nothing. Proofs are what the proof router delivered from a machine when it sent it calls
(facts/deliveries.py), else the machine's own counts, added up over every run of the prover and bounded
per heartbeat (proofs_of: instances.proofs_total, not the raw counter proofs_done); in a
window (`since`) or a day, each machine's count is shared out over the time
it was running. "Never proved" is what machines that proved nothing cost:
boots, failed benches, machines dead before their first proof. "Dead until
detected" is what a machine that had proved billed between its last heartbeat
and its kill for dying (exited, offline, disappeared, heartbeat timeout);
`wasted_share` is both over the whole.
Everything is computed at an injected `now` (the one-clock rule).
"""

from __future__ import annotations

import bisect
import re
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

from vastctl import clock
from vastctl.errors import BadInput
from vastctl.facts import appended, deliveries
from vastctl.state.lifecycle import State

PARTS = ("rented", "stopped_storage", "after_kill")
# kills of a machine that stopped working on its own: from its last heartbeat to the kill it was dead, undetected
DEATH_CODES = ("exited", "offline", "disappeared", "heartbeat_timeout")
GROUPINGS = ("machine", "gpu", "day", "reason")
SOURCE_NOTE = "vastctl's account from its state file; vast's invoice is the truth"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Piece:
    """One stretch of one machine's billing at one price."""

    uuid: str
    start: datetime
    end: datetime
    part: str  # one of PARTS
    dph: float
    running: bool  # the machine was in state running (its proofs are shared out over these)

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds()) / 3600

    @property
    def cost(self) -> float:
        return self.hours * self.dph


def parse_since(text: str | None, now: datetime) -> datetime | None:
    """`--since 6h` (a duration before now: s, m, h, d, w) or `--since 2026-11-30T06:00:00Z` (a UTC time)."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if match:
        return now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"--since must be a duration like 6h, 2d, 90m or a UTC time like 2026-11-30T06:00:00Z,"
                       f" got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    if moment > now:
        raise BadInput(f"--since {text} is in the future: give a time before now")
    return moment


def _price(value: Any) -> float | None:
    """A price the file holds, None when it holds none: checked where it entered (an offer, a listing, a bid),
    and old rows by migration 23, so it is read as it is."""
    return None if value is None else float(value)


def _storage_prices(conn: sqlite3.Connection) -> dict[int, float]:
    """vast id → the disk price of the last good listing (for rows listed before the copy on the row existed)."""
    return {row["vast_id"]: price for row in conn.execute("SELECT vast_id, storage_dph FROM vast_cache")
            if (price := _price(row["storage_dph"])) is not None}


def pieces(conn: sqlite3.Connection, *, now: datetime,
           skip: Callable[[dict[str, Any], float | None], bool] | None = None,
           ) -> tuple[list[Piece], dict[str, dict[str, Any]]]:
    """Every machine's billing, piece by piece up to `now`; and the rows by uuid. `skip(row, listed disk price)`
    leaves out machines the caller has already (their rows are still returned).

    A machine's pieces are computed open-ended once (_OPEN) and cut at `now`: they change only with the
    fields of its row that bill (_BILLING), its disk's listed price and its transitions, not with a heartbeat.
    """
    name = appended.file_of(conn)
    rows = {row[0]: dict(zip(_COLUMNS, row)) for row in conn.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM instances ORDER BY created_at, uuid")}
    listed_storage = _storage_prices(conn)
    skipped = {uuid for uuid, row in rows.items()
               if skip is not None and skip(row, listed_storage.get(row["vast_id"]))}
    raw: dict[str, list[tuple[str, str]]] = {}
    for uuid, at, to_state in conn.execute(
            "SELECT uuid, at, to_state FROM events WHERE kind = 'transition' AND uuid IS NOT NULL"
            " AND to_state IS NOT NULL ORDER BY at, id"):
        if uuid not in skipped:
            raw.setdefault(uuid, []).append((at, to_state))
    out: list[Piece] = []
    for uuid, row in rows.items():
        if uuid in skipped:
            continue
        moves = raw.get(uuid, [])
        key = (*(row.get(field) for field in _BILLING), listed_storage.get(row["vast_id"]), len(moves),
               moves[-1] if moves else None)
        found = _OPEN.get((name, uuid))
        if found is None or found[0] != key:
            parsed = [(clock.parse_iso(at), to_state) for at, to_state in moves]
            found = (key, list(_machine_pieces(row, parsed, listed_storage, _FAR)))
            _OPEN[(name, uuid)] = found
        for piece in found[1]:
            if piece.start >= now:
                continue
            out.append(piece if piece.end <= now else
                       Piece(piece.uuid, piece.start, now, piece.part, piece.dph, piece.running))
    return out, rows


# the fields of a machine's row its billing is computed from (a heartbeat changes none of them)
_BILLING = ("created_at", "destroyed_at", "vast_seen_at", "kill_code", "state", "vast_id", "dph", "storage_dph",
            "vast_status", "vast_status_since")
# what the account reads of a row (uuid first): the billing, the count, the grouping, the dead time
_COLUMNS = ("uuid", *_BILLING, "label", "gpu_name", "proofs_total", "last_heartbeat_at", "killed_at")
_FAR = datetime(9999, 1, 1, tzinfo=timezone.utc)  # pieces are computed up to here, then cut at the moment asked
_NEVER = datetime(1, 1, 1, tzinfo=timezone.utc)
# (state file, uuid) → (what its pieces were computed from, its pieces up to _FAR)
_OPEN: dict[tuple[str, str], tuple[tuple[Any, ...], list[Piece]]] = {}


def _machine_pieces(row: dict[str, Any], moves: list[tuple[datetime, str]], listed_storage: dict[int, float],
                    now: datetime) -> Iterable[Piece]:
    created = clock.parse_iso(row["created_at"])
    destroyed = clock.from_iso(row.get("destroyed_at"))
    end_all = min(now, destroyed) if destroyed else now
    seen = clock.from_iso(row.get("vast_seen_at"))
    if row.get("kill_code") == "disappeared" and seen is not None:
        end_all = min(end_all, max(seen, created))  # gone from vast's listing: billing ended when it left
    if row["state"] == State.KILLED and row.get("vast_id") is None and not destroyed:
        return  # killed before anything was rented that the file knows of
    dph = _price(row.get("dph")) or 0.0
    storage = _price(row.get("storage_dph"))
    if storage is None and row.get("vast_id") is not None:
        storage = listed_storage.get(row["vast_id"])
    stopped_dph = dph if storage is None else min(storage, dph) if dph else storage
    timeline = [(created, moves[0][1] if moves else row["state"])]
    timeline += [(at, state) for at, state in moves[1:]]
    # a container that never started or a resume that never got its GPU billed the disk alone since its last start
    stuck_from = len(timeline)
    if row.get("kill_code") in ("start_failed", "scheduling_timeout"):
        stuck_from = max((i for i, (_, state) in enumerate(timeline) if state == State.STOPPED), default=-1)
    # a host gone offline bills nothing: a machine killed for it and last listed offline billed nothing after
    offline_after_kill = row.get("kill_code") == "offline" and row.get("vast_status") == "offline"
    for index, (start, state) in enumerate(timeline):
        end = timeline[index + 1][0] if index + 1 < len(timeline) else end_all
        start, end = max(start, created), min(end, end_all)
        if end <= start:
            continue
        if state == State.KILLED:  # a machine killed while stopped holds no GPU: it bills its disk to the end
            before = timeline[index - 1][1] if index > 0 else None
            part, price = "after_kill", stopped_dph if before == State.STOPPED else dph
        elif state == State.STOPPED:
            part, price = "stopped_storage", stopped_dph
        else:
            part, price = "rented", dph
        if index > stuck_from:
            price = stopped_dph
        if part == "after_kill" and offline_after_kill:
            # billed until the listing first showed the host offline (it is `unknown` before), nothing after
            went = clock.from_iso(row.get("vast_status_since"))
            went = start if went is None else min(max(went, start), end)
            if went > start:
                yield Piece(uuid=row["uuid"], start=start, end=went, part=part, dph=price, running=False)
            start, price = went, 0.0
            if end <= start:
                continue
        yield Piece(uuid=row["uuid"], start=start, end=end, part=part, dph=price, running=state == State.RUNNING)


def _clip(piece: Piece, since: datetime | None) -> Piece | None:
    if since is None or piece.start >= since:
        return piece
    if piece.end <= since:
        return None
    return Piece(piece.uuid, since, piece.end, piece.part, piece.dph, piece.running)


def _by_day(piece: Piece) -> Iterable[tuple[str, Piece]]:
    start = piece.start
    while start < piece.end:
        midnight = datetime(start.year, start.month, start.day, tzinfo=timezone.utc) + timedelta(days=1)
        end = min(midnight, piece.end)
        yield start.strftime("%Y-%m-%d"), Piece(piece.uuid, start, end, piece.part, piece.dph, piece.running)
        start = end


def _group_key(by: str, row: dict[str, Any]) -> str:
    if by == "machine":
        label: str = row["label"]
        return label
    if by == "gpu":
        return row.get("gpu_name") or "unknown"
    if row["state"] == State.KILLED:  # by reason
        return row.get("kill_code") or "killed"
    return "stopped" if row["state"] == State.STOPPED else "live"


def proofs_of(row: dict[str, Any], delivered: Mapping[str, int] | None = None) -> int:
    """The proofs a machine is credited with: the proofs the proof router delivered from it, when the router sent
    it calls (`delivered`: its results in proof_calls, measured by the manager); else its total over every run
    of its prover, each heartbeat's share bounded by what it could have proved (lifecycle.counted_increment),
    never its raw last counter. The one source of counts for every cost figure."""
    if delivered:
        return int(delivered.get("completed", 0))
    return max(0, int(row.get("proofs_total") or 0))


def _dead_cost(piece: Piece, row: dict[str, Any]) -> float:
    """What a rented piece billed between a dead machine's last heartbeat and its kill (dead, not yet detected)."""
    if piece.part != "rented" or row.get("kill_code") not in DEATH_CODES:
        return 0.0
    last, killed = clock.from_iso(row.get("last_heartbeat_at")), clock.from_iso(row.get("killed_at"))
    if last is None or killed is None:
        return 0.0
    overlap = (min(piece.end, killed) - max(piece.start, last)).total_seconds()
    return max(0.0, overlap) / 3600 * piece.dph


class _Tally:
    def __init__(self) -> None:
        self.cost = {part: 0.0 for part in PARTS}
        self.hours = {part: 0.0 for part in PARTS}
        self.proofs = 0.0
        self.machines: set[str] = set()
        self.never_proved = 0.0
        self.never_proved_machines: set[str] = set()
        self.dead = 0.0

    def add(self, piece: Piece, proofs: float, never_proved: bool, dead: float) -> None:
        self.cost[piece.part] += piece.cost
        self.hours[piece.part] += piece.hours
        self.proofs += proofs
        self.machines.add(piece.uuid)
        self.dead += dead
        if never_proved:
            self.never_proved += piece.cost
            self.never_proved_machines.add(piece.uuid)

    def merge(self, other: "_Tally") -> None:
        for part in PARTS:
            self.cost[part] += other.cost[part]
            self.hours[part] += other.hours[part]
        self.proofs += other.proofs
        self.machines |= other.machines
        self.never_proved += other.never_proved
        self.never_proved_machines |= other.never_proved_machines
        self.dead += other.dead

    def view(self) -> dict[str, Any]:
        total = sum(self.cost.values())
        proofs = int(round(self.proofs))
        return {
            "cost": round(total, 4),
            **{part: round(self.cost[part], 4) for part in PARTS},
            "hours": {part: round(self.hours[part], 3) for part in PARTS},
            "proofs": proofs,
            "cost_per_1000_proofs": round(total / proofs * 1000, 3) if proofs > 0 else None,
            "never_proved_cost": round(self.never_proved, 4),
            "never_proved_share": round(self.never_proved / total, 4) if total > 0 else None,
            "never_proved_machines": len(self.never_proved_machines),
            "dead_until_detected_cost": round(self.dead, 4),
            "wasted_share": round((self.never_proved + self.dead) / total, 4) if total > 0 else None,
            "machines": len(self.machines),
        }


def _lifetimes(all_pieces: list[Piece]) -> tuple[dict[str, float], dict[str, float]]:
    """uuid → hours running, and hours billed, over each machine's whole life (its count is shared over these)."""
    running_h: dict[str, float] = {}
    billed_h: dict[str, float] = {}
    for piece in all_pieces:
        running_h[piece.uuid] = running_h.get(piece.uuid, 0.0) + (piece.hours if piece.running else 0.0)
        billed_h[piece.uuid] = billed_h.get(piece.uuid, 0.0) + piece.hours
    return running_h, billed_h


def _proofs_and_dead(piece: Piece, row: dict[str, Any], proofs_done: int, running_h: dict[str, float],
                     billed_h: dict[str, float]) -> tuple[float, float]:
    """The piece's share of the machine's proofs, and what it billed dead until detected."""
    if running_h[piece.uuid] > 0:
        share = piece.hours / running_h[piece.uuid] if piece.running else 0.0
    else:  # counted proofs but never in state running (an adopted machine): shared over its billed time
        share = piece.hours / billed_h[piece.uuid] if billed_h[piece.uuid] > 0 else 0.0
    dead = _dead_cost(piece, row) if proofs_done > 0 else 0.0  # else counted as never proved
    return proofs_done * share, dead


def account(conn: sqlite3.Connection, *, now: datetime, since: datetime | None = None,
            by: str | None = None) -> dict[str, Any]:
    """The cost figures `vastctl cost`, the dashboard and /metrics all show (the `cost --json` shape)."""
    if by is not None and by not in GROUPINGS:
        raise BadInput(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    if by is None:
        return _figures(_book(conn).tally(now, since), {}, now=now, since=since, by=None)
    return afresh(conn, now=now, since=since, by=by)


def afresh(conn: sqlite3.Connection, *, now: datetime, since: datetime | None = None,
           by: str | None = None) -> dict[str, Any]:
    """account() computed piece by piece from every row and event (what `cost --by` reads, and what the account
    kept between scrapes is checked against)."""
    all_pieces, rows = pieces(conn, now=now)
    delivered = deliveries.delivered(conn)
    running_h, billed_h = _lifetimes(all_pieces)
    total, groups = _Tally(), dict[str, _Tally]()
    for whole in all_pieces:
        clipped = _clip(whole, since)
        if clipped is None:
            continue
        piece = clipped
        row = rows[piece.uuid]
        proofs_done = proofs_of(row, delivered.get(piece.uuid))
        split = [(_group_key(by, row) if by and by != "day" else None, piece)] if by != "day" else list(_by_day(piece))
        for key, part_piece in split:
            proofs, dead = _proofs_and_dead(part_piece, row, proofs_done, running_h, billed_h)
            total.add(part_piece, proofs, proofs_done == 0, dead)
            if key is not None:
                groups.setdefault(key, _Tally()).add(part_piece, proofs, proofs_done == 0, dead)
    return _figures(total, groups, now=now, since=since, by=by)


def _figures(total: _Tally, groups: dict[str, _Tally], *, now: datetime, since: datetime | None,
             by: str | None) -> dict[str, Any]:
    figures = {
        "as_of": clock.display_iso(clock.to_iso(now)),
        "since": clock.display_iso(clock.to_iso(since)) if since else None,
        "source": SOURCE_NOTE,
        **total.view(),
        "by": by,
        "groups": [{"key": key, **tally.view()} for key, tally in sorted(
            groups.items(), key=lambda item: (-sum(item[1].cost.values()), item[0]) if by != "day" else (item[0],))],
    }
    return figures


def day_start(now: datetime) -> datetime:
    """00:00 UTC of `now`'s day: where a day's spend (max_daily_spend, `cost --by day`) begins."""
    return datetime(now.year, now.month, now.day, tzinfo=timezone.utc)


def spent_today(conn: sqlite3.Connection, *, now: datetime) -> float:
    """$ spent since 00:00 UTC up to `now`, as `vastctl cost --since` that midnight says it."""
    return float(account(conn, now=now, since=day_start(now))["cost"])


# --- the account kept between scrapes -----------------------------------------------------------------
#
# The dashboard and /metrics ask for the whole account, the last 24 hours and today at every request. What a
# machine billed changes only with its billing fields, its transitions and its disk's listed price; between
# those, a live machine's figures grow with `now` along its one open piece. So each state file keeps (_Book):
# its transitions read once and then only the new ones (events are only ever appended), each machine's pieces
# compiled once with the sums of its closed pieces, and per connection the rows as of the file's last change
# (PRAGMA data_version for other connections' writes, total_changes for this one's). A request then costs one
# short sum per machine. Counts (proofs_total, the router's deliveries) are read again whenever the file changed.

_CONNECTIONS_KEPT = 4  # connections per file whose rows are kept (serve has one per thread)


class _Compiled:
    """One machine's pieces up to _FAR with what any window needs precomputed: the closed pieces' ends and
    suffix sums (cost and hours per part, running hours, billed hours), and its open piece."""

    __slots__ = ("pieces", "closed", "ends", "suffix", "open", "settled", "plain", "first", "whole", "open_us",
                 "open_part", "before_open")

    def __init__(self, machine_pieces: list[Piece]):
        self.pieces = machine_pieces
        self.open = machine_pieces[-1] if machine_pieces and machine_pieces[-1].end >= _FAR else None
        self.closed = machine_pieces[:-1] if self.open is not None else machine_pieces
        self.ends = [piece.end for piece in self.closed]
        self.settled = max(self.ends, default=_NEVER)  # when its last closed piece ended
        # the sums below are the per-piece sums only while pieces follow each other without overlapping
        self.plain = all(a.end <= b.start for a, b in zip(machine_pieces, machine_pieces[1:]))
        suffix: list[tuple[float, ...]] = [(0.0,) * 8]
        for piece in reversed(self.closed):
            sums = list(suffix[-1])
            index = _PART_INDEX[piece.part]
            hours = piece.hours
            sums[index] += piece.cost
            sums[3 + index] += hours
            sums[6] += hours if piece.running else 0.0
            sums[7] += hours
            suffix.append(tuple(sums))
        self.suffix = suffix[::-1]
        self.first = machine_pieces[0].start if machine_pieces else _FAR
        # the open piece's start in whole microseconds (a window's hours from integers, as timedelta's own are) and
        # part; the closed pieces' sums in a window by its start (the same at every moment after the last closed)
        self.open_us = _micros(self.open.start) if self.open is not None else 0
        self.open_part = _PART_INDEX[self.open.part] if self.open is not None else 0
        self.before_open: dict[datetime | None, list[float] | None] = {}
        # a machine whose billing is over: its whole life's figures, the same at every later moment
        self.whole = None
        if self.open is None and self.plain and machine_pieces:
            sums = list(self.suffix[0])
            self.whole = (sums, sums[6], sums[7], sums[6], sums[7])


_PART_INDEX = {part: index for index, part in enumerate(PARTS)}


class _Book:
    """One state file's kept account: transitions by machine, compiled machines, rows per connection."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # serve's worker threads share the book (--threads)
        self.tail = appended.Tail()
        self.moves: dict[str, list[tuple[str, int, str]]] = {}  # uuid → its transitions (at, id, to_state)
        self.compiled: dict[str, tuple[tuple[Any, ...], _Compiled]] = {}
        # uuid → (its row, listed disk price, transitions, router count as last read; its entry): unchanged, reused
        self.entry_of: dict[str, tuple[tuple[Any, ...], float | None, int, Any, _Entry | None]] = {}
        # the newest few connections' rows: (connection, what the file was at, its machines); a connection is
        # held only while it is among them (its id alone could be a later one's)
        self.snapshots: list[tuple[sqlite3.Connection, tuple[Any, ...], tuple[list[_Entry], list[_Entry]]]] = []
        # the machines whose billing is over, and their figures summed per window start (the same at every moment
        # after the last of them ended): a request sums the machines still billing, whatever the day's history
        self.closed: list[_Entry] = []
        self.settled = _NEVER
        self.blocks: OrderedDict[datetime | None, _Sums] = OrderedDict()

    def read_moves(self, conn: sqlite3.Connection) -> None:
        """The transitions appended since the last read (all of them when the file is not the one last read)."""
        span = self.tail.span(conn)
        if span is None:
            return
        after, upto = span
        if after == 0:
            self.moves, self.compiled, self.entry_of = {}, {}, {}
        changed: set[str] = set()
        for event_id, uuid, at, to_state in conn.execute(
                "SELECT id, uuid, at, to_state FROM events WHERE id > ? AND id <= ? AND kind = 'transition'"
                " AND uuid IS NOT NULL AND to_state IS NOT NULL ORDER BY id", (after, upto)):
            self.moves.setdefault(uuid, []).append((at, event_id, to_state))
            changed.add(uuid)
        for uuid in changed:  # the order pieces() reads them in: by time, then id
            self.moves[uuid].sort()

    def entries(self, conn: sqlite3.Connection) -> tuple[list[_Entry], list[_Entry]]:
        """Every machine that billed, as the file has it now: (uuid, compiled pieces, proofs, its row's dead-time
        fields); those still billing (or whose pieces cannot be summed), then those whose billing is over."""
        if conn.in_transaction:
            return self._entries(conn)
        conn.execute("BEGIN")  # one snapshot of the file: its version, its transitions and its rows agree
        try:
            return self._entries(conn)
        finally:
            conn.execute("COMMIT")

    def _entries(self, conn: sqlite3.Connection) -> tuple[list[_Entry], list[_Entry]]:
        key = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
        kept = next((snapshot for snapshot in self.snapshots if snapshot[0] is conn), None)
        if kept is not None and kept[1] == key:
            return kept[2]
        self.read_moves(conn)
        listed_storage = _storage_prices(conn)
        delivered = deliveries.delivered(conn)
        cursor = conn.cursor()
        cursor.row_factory = None
        live: list[_Entry] = []
        closed: list[_Entry] = []
        billing = len(_BILLING) + 1
        for values in cursor.execute(f"SELECT {', '.join(_COLUMNS)} FROM instances ORDER BY created_at, uuid"):
            uuid = values[0]
            moves = self.moves.get(uuid, _NO_MOVES)
            listed = listed_storage.get(values[_VAST_ID])
            counted = delivered.get(uuid)
            last = self.entry_of.get(uuid)
            if last is not None and last[0] == values and last[1] == listed and last[2] == len(moves) \
                    and last[3] == counted:  # the row, its disk price, its transitions and count as last read
                if last[4] is not None:
                    (live if last[4][1].whole is None else closed).append(last[4])
                continue
            compile_key = (values[1:billing], listed, len(moves), moves[-1] if moves else None)
            found = self.compiled.get(uuid)
            if found is None or found[0] != compile_key:
                row = dict(zip(_COLUMNS, values))
                parsed = [(clock.parse_iso(at), to_state) for at, _, to_state in moves]
                found = (compile_key, _Compiled(list(_machine_pieces(row, parsed, listed_storage, _FAR))))
                self.compiled[uuid] = found
            proofs = max(0, int(values[_PROOFS] or 0))
            if counted:
                proofs = int(counted.get("completed", 0))
            dying = values[_KILL_CODE] in DEATH_CODES
            compiled = found[1]
            entry = (uuid, compiled, proofs, values if dying else None) if compiled.pieces else None
            self.entry_of[uuid] = (values, listed, len(moves), counted, entry)
            if entry is not None:  # a machine that never billed is in no window
                (closed if compiled.whole is not None else live).append(entry)
        if closed != self.closed:  # a machine's billing ended, or a finished one's row or count changed
            self.closed, self.blocks = closed, OrderedDict()
            self.settled = max((entry[1].settled for entry in closed), default=_NEVER)
        out = (live, self.closed)
        self.snapshots = [(conn, key, out), *(s for s in self.snapshots if s[0] is not conn)][:_CONNECTIONS_KEPT]
        return out



_Entry = tuple[str, _Compiled, int, "tuple[Any, ...] | None"]
_NO_MOVES: list[tuple[str, int, str]] = []
_VAST_ID = _COLUMNS.index("vast_id")
_PROOFS = _COLUMNS.index("proofs_total")
_KILL_CODE = _COLUMNS.index("kill_code")
_BOOKS = appended.PerFile(_Book)


def _book(conn: sqlite3.Connection) -> "_Reader":
    return _Reader(_BOOKS.get(conn), conn)


class _Reader:
    """A book read through one connection."""

    def __init__(self, book: _Book, conn: sqlite3.Connection):
        self.book, self.conn = book, conn

    def tally(self, now: datetime, since: datetime | None) -> _Tally:
        """The account over [since, now] (since None: every machine's whole life), as afresh() sums it."""
        book = self.book
        with book.lock:
            live, closed = book.entries(self.conn)
            if now < book.settled:  # a moment before some finished machine's end: nothing kept applies
                block = _sum(closed, now, since)
            else:
                found = book.blocks.get(since)
                if found is None:
                    found = book.blocks[since] = _sum(closed, now, since)
                    while len(book.blocks) > _BLOCKS_KEPT:
                        book.blocks.popitem(last=False)
                book.blocks.move_to_end(since)
                block = found
        sums = _sum(live, now, since)
        total = _Tally()
        for index, part in enumerate(PARTS):
            total.cost[part] = block.numbers[index] + sums.numbers[index]
            total.hours[part] = block.numbers[3 + index] + sums.numbers[3 + index]
        total.proofs = block.numbers[6] + sums.numbers[6]
        total.never_proved = block.numbers[7] + sums.numbers[7]
        total.dead = block.numbers[8] + sums.numbers[8]
        total.machines = block.machines | sums.machines
        total.never_proved_machines = block.never_proved | sums.never_proved
        return total


_BLOCKS_KEPT = 4  # window starts kept for the finished machines: the whole life, today, and the moving day's last


class _Sums:
    """Machines' figures over one window: cost and hours per part, proofs, never proved, dead until detected."""

    __slots__ = ("numbers", "machines", "never_proved")

    def __init__(self) -> None:
        self.numbers = [0.0] * 9
        self.machines: set[str] = set()
        self.never_proved: set[str] = set()


def _sum(entries: list[_Entry], now: datetime, since: datetime | None) -> _Sums:
    out = _Sums()
    numbers = out.numbers
    cost0 = cost1 = cost2 = hours0 = hours1 = hours2 = proofs = never = dead = 0.0
    now_us = _micros(now)
    since_h = 0.0 if since is None else max(0.0, (now - since).total_seconds()) / 3600
    for uuid, compiled, proofs_done, dying in entries:
        whole = compiled.whole
        if whole is not None and now >= compiled.settled and (since is None or since <= compiled.first):
            sums, run_w, billed_w, run_all, billed_all = whole  # billing over, all of it in the window
        else:
            window = _window(compiled, now, since, now_us, since_h)
            if window is None:
                continue
            sums, run_w, billed_w, run_all, billed_all = window
        cost0 += sums[0]
        cost1 += sums[1]
        cost2 += sums[2]
        hours0 += sums[3]
        hours1 += sums[4]
        hours2 += sums[5]
        out.machines.add(uuid)
        if run_all > 0:
            proofs += proofs_done * (run_w / run_all)
        elif billed_all > 0:
            proofs += proofs_done * (billed_w / billed_all)
        if proofs_done == 0:
            never += sums[0] + sums[1] + sums[2]
            out.never_proved.add(uuid)
        elif dying is not None:
            row = dict(zip(_COLUMNS, dying))
            for piece in compiled.pieces:
                clipped = _clip(_cut(piece, now), since) if piece.start < now else None
                if clipped is not None:
                    dead += _dead_cost(clipped, row)
    numbers[:] = [cost0, cost1, cost2, hours0, hours1, hours2, proofs, never, dead]
    return out


def _cut(piece: Piece, now: datetime) -> Piece:
    return piece if piece.end <= now else Piece(piece.uuid, piece.start, now, piece.part, piece.dph, piece.running)


def _window(compiled: _Compiled, now: datetime, since: datetime | None, now_us: int | None = None,
            since_h: float | None = None) -> tuple[list[float], float, float, float, float] | None:
    """One machine over [since, now]: (cost and hours per part, running and billed hours in the window), and its
    running and billed hours over its life up to now; None when no piece of it falls in the window. `now_us`,
    `since_h`: now in whole microseconds and max(0, now - since) in hours, when the caller worked them out."""
    opened = compiled.open
    if compiled.whole is not None and now >= compiled.settled:  # billing over: all of it, part of it or none
        if since is None or since <= compiled.first:
            return compiled.whole
        if since >= compiled.settled:
            return None
    if (not compiled.plain or now < compiled.settled
            or (opened is not None and opened.start >= now)):
        return _window_by_piece(compiled, now, since)
    suffix = compiled.suffix
    run_all, billed_all = suffix[0][6], suffix[0][7]
    open_h = 0.0
    if opened is not None:
        # (now - opened.start).total_seconds() is these microseconds over 10**6, rounded once the same way
        open_h = max(0.0, ((_micros(now) if now_us is None else now_us) - compiled.open_us) / 1_000_000) / 3600
        billed_all += open_h
        run_all += open_h if opened.running else 0.0
    closed = compiled.before_open.get(since, _UNKNOWN)  # one read: serve's threads share the compiled machine
    if closed is _UNKNOWN:
        closed = _closed_sums(compiled, since)
        if len(compiled.before_open) >= _SINCES_KEPT:
            compiled.before_open.clear()
        compiled.before_open[since] = closed
    sums = None if closed is None else list(closed)
    if opened is not None and (since is None or now > since):
        if sums is None:
            sums = [0.0] * 8
        if since is None or opened.start >= since:
            hours = open_h
        else:
            hours = max(0.0, (now - since).total_seconds()) / 3600 if since_h is None else since_h
        part = compiled.open_part
        sums[part] += hours * opened.dph
        sums[3 + part] += hours
        sums[6] += hours if opened.running else 0.0
        sums[7] += hours
    if sums is None:
        return None
    return sums, sums[6], sums[7], run_all, billed_all


_UNKNOWN: Any = object()
_SINCES_KEPT = 8  # window starts whose closed sums a machine keeps (the whole life, today, the moving day's last)


def _closed_sums(compiled: _Compiled, since: datetime | None) -> list[float] | None:
    """The machine's closed pieces summed over [since, their end] (None: none of them reaches into the window)."""
    index = 0 if since is None else bisect.bisect_right(compiled.ends, since)
    if index >= len(compiled.closed):
        return None
    piece = compiled.closed[index]
    if since is None or piece.start >= since:
        return list(compiled.suffix[index])
    sums = list(compiled.suffix[index + 1])  # the piece the window starts in counts from since
    part = _PART_INDEX[piece.part]
    hours = max(0.0, (piece.end - since).total_seconds()) / 3600
    sums[part] += hours * piece.dph
    sums[3 + part] += hours
    sums[6] += hours if piece.running else 0.0
    sums[7] += hours
    return sums


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    """A moment as whole microseconds since the epoch (exact: a difference of two is timedelta's own count)."""
    return (moment - _EPOCH) // _MICROSECOND


def _window_by_piece(compiled: _Compiled, now: datetime, since: datetime | None
                     ) -> tuple[list[float], float, float, float, float] | None:
    """_window() for a machine whose pieces the sums do not cover at `now` (a moment before its last change)."""
    cut = [_cut(piece, now) for piece in compiled.pieces if piece.start < now]
    sums = [0.0] * 8
    run_all = sum(piece.hours for piece in cut if piece.running)
    billed_all = sum(piece.hours for piece in cut)
    found = False
    for whole in cut:
        piece = _clip(whole, since)
        if piece is None:
            continue
        found = True
        part = _PART_INDEX[piece.part]
        sums[part] += piece.cost
        sums[3 + part] += piece.hours
        sums[6] += piece.hours if piece.running else 0.0
        sums[7] += piece.hours
    return (sums, sums[6], sums[7], run_all, billed_all) if found else None
