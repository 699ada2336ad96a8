"""How a machine bills, from the state file: its pieces (stretches at one price) and what they add up to.

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
costs nothing. facts/cost.py adds the pieces up into the account.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Hashable, Iterable, Literal, TypedDict, cast

from vastctl import clock
from vastctl.facts import appended
from vastctl.state.lifecycle import KillCode, State

Part = Literal["rented", "stopped_storage", "after_kill"]
PARTS: tuple[Part, ...] = ("rented", "stopped_storage", "after_kill")


# kills of a machine that stopped working on its own: from its last heartbeat to the kill it was dead, undetected
DEATH_CODES = (KillCode.EXITED, KillCode.OFFLINE, KillCode.DISAPPEARED, KillCode.HEARTBEAT_TIMEOUT)


class BillingRow(TypedDict):
    """What the account reads of a machine's row (COLUMNS): the billing, the count, the grouping, the dead time.
    An InstanceRow is one (the same columns, the same types)."""

    uuid: str
    created_at: str
    destroyed_at: str | None
    vast_seen_at: str | None
    kill_code: str | None
    state: str
    vast_id: int | None
    dph: float | None
    storage_dph: float | None
    vast_status: str | None
    vast_status_since: str | None
    label: str
    gpu_name: str | None
    proofs_total: int
    last_heartbeat_at: str | None
    killed_at: str | None


@dataclass(frozen=True)
class Piece:
    """One stretch of one machine's billing at one price."""

    uuid: str
    start: datetime
    end: datetime
    part: Part
    dph: float
    running: bool  # the machine was in state running (its proofs are shared out over these)

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds()) / 3600

    @property
    def cost(self) -> float:
        return self.hours * self.dph


def stored_price(value: float | None) -> float | None:
    """A price the file holds, None when it holds none: checked where it entered (an offer, a listing, a bid),
    and old rows by migration 23, so it is read as it is."""
    return None if value is None else float(value)


def storage_prices(conn: sqlite3.Connection) -> dict[int, float]:
    """vast id → the disk price of the last good listing (for rows listed before the copy on the row existed)."""
    return {row["vast_id"]: price for row in conn.execute("SELECT vast_id, storage_dph FROM vast_cache")
            if (price := stored_price(row["storage_dph"])) is not None}


# (state file, uuid) → (what its pieces were computed from, its pieces up to FAR)
_OPEN: dict[tuple[str, str], tuple[tuple[Hashable, ...], list[Piece]]] = {}


def pieces(conn: sqlite3.Connection, *, now: datetime,
           skip: Callable[[BillingRow, float | None], bool] | None = None,
           ) -> tuple[list[Piece], dict[str, BillingRow]]:
    """Every machine's billing, piece by piece up to `now`; and the rows by uuid. `skip(row, listed disk price)`
    leaves out machines the caller has already (their rows are still returned).

    A machine's pieces are computed open-ended once (_OPEN) and cut at `now`: they change only with the
    fields of its row that bill (BILLING), its disk's listed price and its transitions, not with a heartbeat.
    """
    name = appended.file_of(conn)
    rows = {row[0]: billing_row(row) for row in conn.execute(
        f"SELECT {', '.join(COLUMNS)} FROM instances ORDER BY created_at, uuid")}
    listed_storage = storage_prices(conn)
    skipped = {uuid for uuid, row in rows.items()
               if skip is not None and skip(row, _listed(listed_storage, row))}
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
        key = (*(row.get(field) for field in BILLING), _listed(listed_storage, row), len(moves),
               moves[-1] if moves else None)
        found = _OPEN.get((name, uuid))
        if found is None or found[0] != key:
            parsed = [(clock.parse_iso(at), to_state) for at, to_state in moves]
            found = (key, list(machine_pieces(row, parsed, listed_storage, FAR)))
            _OPEN[(name, uuid)] = found
        for piece in found[1]:
            if piece.start >= now:
                continue
            out.append(piece if piece.end <= now else
                       Piece(piece.uuid, piece.start, now, piece.part, piece.dph, piece.running))
    return out, rows


# the fields of a machine's row its billing is computed from (a heartbeat changes none of them)
BILLING: tuple[Literal["created_at", "destroyed_at", "vast_seen_at", "kill_code", "state", "vast_id", "dph",
                      "storage_dph", "vast_status", "vast_status_since"], ...] = ("created_at", "destroyed_at", "vast_seen_at", "kill_code", "state", "vast_id", "dph", "storage_dph",
            "vast_status", "vast_status_since")


# what the account reads of a row (uuid first): the billing, the count, the grouping, the dead time
COLUMNS = ("uuid", *BILLING, "label", "gpu_name", "proofs_total", "last_heartbeat_at", "killed_at")


def billing_row(values: Iterable[object]) -> BillingRow:
    """A row's COLUMNS, in that order (a SELECT of them, or the values kept of one), as its BillingRow."""
    return cast(BillingRow, dict(zip(COLUMNS, values)))


FAR = datetime(9999, 1, 1, tzinfo=timezone.utc)  # pieces are computed up to here, then cut at the moment asked


NEVER = datetime(1, 1, 1, tzinfo=timezone.utc)


def machine_pieces(row: BillingRow, moves: list[tuple[datetime, str]], listed_storage: dict[int, float],
                    now: datetime) -> Iterable[Piece]:
    created = clock.parse_iso(row["created_at"])
    destroyed = clock.from_iso(row.get("destroyed_at"))
    end_all = min(now, destroyed) if destroyed else now
    seen = clock.from_iso(row.get("vast_seen_at"))
    if row.get("kill_code") == KillCode.DISAPPEARED and seen is not None:
        end_all = min(end_all, max(seen, created))  # gone from vast's listing: billing ended when it left
    if row["state"] == State.KILLED and row.get("vast_id") is None and not destroyed:
        return  # killed before anything was rented that the file knows of
    dph = stored_price(row.get("dph")) or 0.0
    storage = stored_price(row.get("storage_dph"))
    if storage is None:
        storage = _listed(listed_storage, row)
    stopped_dph = dph if storage is None else min(storage, dph) if dph else storage
    timeline = [(created, moves[0][1] if moves else row["state"])]
    timeline += [(at, state) for at, state in moves[1:]]
    # a container that never started or a resume that never got its GPU billed the disk alone since its last start
    stuck_from = len(timeline)
    if row.get("kill_code") in (KillCode.START_FAILED, KillCode.SCHEDULING_TIMEOUT):
        stuck_from = max((i for i, (_, state) in enumerate(timeline) if state == State.STOPPED), default=-1)
    # a host gone offline bills nothing: a machine killed for it and last listed offline billed nothing after
    offline_after_kill = row.get("kill_code") == KillCode.OFFLINE and row.get("vast_status") == "offline"
    for index, (start, state) in enumerate(timeline):
        end = timeline[index + 1][0] if index + 1 < len(timeline) else end_all
        start, end = max(start, created), min(end, end_all)
        if end <= start:
            continue
        if state == State.KILLED:  # a machine killed while stopped holds no GPU: it bills its disk to the end
            before = timeline[index - 1][1] if index > 0 else None
            part: Part = "after_kill"
            price = stopped_dph if before == State.STOPPED else dph
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


def _listed(listed_storage: dict[int, float], row: BillingRow) -> float | None:
    """The disk price the last good listing gave the row's instance (None: none, or no vast id)."""
    vast_id = row.get("vast_id")
    return None if vast_id is None else listed_storage.get(vast_id)


def clip(piece: Piece, since: datetime | None) -> Piece | None:
    if since is None or piece.start >= since:
        return piece
    if piece.end <= since:
        return None
    return Piece(piece.uuid, since, piece.end, piece.part, piece.dph, piece.running)


def dead_cost(piece: Piece, row: BillingRow) -> float:
    """What a rented piece billed between a dead machine's last heartbeat and its kill (dead, not yet detected)."""
    if piece.part != "rented" or row.get("kill_code") not in DEATH_CODES:
        return 0.0
    last, killed = clock.from_iso(row.get("last_heartbeat_at")), clock.from_iso(row.get("killed_at"))
    if last is None or killed is None:
        return 0.0
    overlap = (min(piece.end, killed) - max(piece.start, last)).total_seconds()
    return max(0.0, overlap) / 3600 * piece.dph


class PartFigures(TypedDict):
    """A figure per part (PARTS, in that order)."""

    rented: float
    stopped_storage: float
    after_kill: float


class TallyView(TypedDict):
    """What a tally shows (`cost --json`, overall and per group): $ per part, hours per part, proofs, waste."""

    cost: float
    rented: float
    stopped_storage: float
    after_kill: float
    hours: PartFigures
    proofs: int
    cost_per_1000_proofs: float | None
    never_proved_cost: float
    never_proved_share: float | None
    never_proved_machines: int
    dead_until_detected_cost: float
    wasted_share: float | None
    machines: int


class Tally:
    def __init__(self) -> None:
        self.cost: dict[Part, float] = {part: 0.0 for part in PARTS}
        self.hours: dict[Part, float] = {part: 0.0 for part in PARTS}
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

    def view(self) -> TallyView:
        total = sum(self.cost.values())
        proofs = int(round(self.proofs))
        return {
            "cost": round(total, 4),
            "rented": round(self.cost["rented"], 4),
            "stopped_storage": round(self.cost["stopped_storage"], 4),
            "after_kill": round(self.cost["after_kill"], 4),
            "hours": {"rented": round(self.hours["rented"], 3),
                      "stopped_storage": round(self.hours["stopped_storage"], 3),
                      "after_kill": round(self.hours["after_kill"], 3)},
            "proofs": proofs,
            "cost_per_1000_proofs": round(total / proofs * 1000, 3) if proofs > 0 else None,
            "never_proved_cost": round(self.never_proved, 4),
            "never_proved_share": round(self.never_proved / total, 4) if total > 0 else None,
            "never_proved_machines": len(self.never_proved_machines),
            "dead_until_detected_cost": round(self.dead, 4),
            "wasted_share": round((self.never_proved + self.dead) / total, 4) if total > 0 else None,
            "machines": len(self.machines),
        }
