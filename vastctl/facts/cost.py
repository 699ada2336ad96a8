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

import math
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

from vastctl import clock
from vastctl.errors import BadInput
from vastctl.facts import deliveries
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
    """A price the file holds, if it is one (a finite number ≥ 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


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
    name = _file_of(conn)
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
# (state file, uuid) → (what its pieces were computed from, its pieces up to _FAR)
_OPEN: dict[tuple[str, str], tuple[tuple[Any, ...], list[Piece]]] = {}


def _file_of(conn: sqlite3.Connection) -> str:
    return conn.execute("PRAGMA database_list").fetchone()[2] or f":memory:{id(conn)}"


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
        return row["label"]
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
    if since is None and by is None:
        return _whole(conn, now)
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


# (state file, uuid) → (what its figures were computed from, its figures): machines whose billing is over
_CLOSED: dict[tuple[str, str], tuple[tuple[Any, ...], _Tally]] = {}


def _whole(conn: sqlite3.Connection, now: datetime) -> dict[str, Any]:
    """The whole account (no window, no grouping: the dashboard's and /metrics'), each destroyed machine's
    figures kept from the last time they were computed: its billing ended and its row no longer changes, so
    a scrape costs the live machines, not the day's history. A changed row is computed again."""
    name = _file_of(conn)
    known: dict[str, _Tally] = {}
    closed: dict[str, tuple[Any, ...]] = {}
    delivered = deliveries.delivered(conn)

    def kept(row: dict[str, Any], listed: float | None) -> bool:
        destroyed = clock.from_iso(row.get("destroyed_at"))
        if row["state"] != State.KILLED or destroyed is None or destroyed > now:
            return False
        key = (*row.values(), listed, tuple(sorted((delivered.get(row["uuid"]) or {}).items())))
        closed[row["uuid"]] = key
        found = _CLOSED.get((name, row["uuid"]))
        if found is not None and found[0] == key:
            known[row["uuid"]] = found[1]
            return True
        return False

    all_pieces, rows = pieces(conn, now=now, skip=kept)
    running_h, billed_h = _lifetimes(all_pieces)
    fresh: dict[str, _Tally] = {}
    for piece in all_pieces:
        row = rows[piece.uuid]
        proofs_done = proofs_of(row, delivered.get(piece.uuid))
        proofs, dead = _proofs_and_dead(piece, row, proofs_done, running_h, billed_h)
        fresh.setdefault(piece.uuid, _Tally()).add(piece, proofs, proofs_done == 0, dead)
    for uuid, key in closed.items():
        if uuid not in known:
            _CLOSED[(name, uuid)] = (key, fresh.get(uuid) or _Tally())
    total = _Tally()
    for tally in (*known.values(), *fresh.values()):
        total.merge(tally)
    return _figures(total, {}, now=now, since=None, by=None)
