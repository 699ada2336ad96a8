"""What the fleet cost: vastctl's own account of vast's billing, from the state file alone.

Each machine bills in pieces (facts/billing.py says how); the account adds them up, by part (PARTS), kept
between scrapes (facts/cost_kept.py) or afresh. Proofs are what the proof router delivered from a machine when
it sent it calls (facts/deliveries.py), else the machine's own counts, added up over every run of the prover and bounded
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

import re
import sqlite3
from datetime import datetime, timedelta, timezone
from typing import Iterable, Literal, Mapping

from vastctl import clock
from vastctl.errors import BadInput
from vastctl.facts import cost_kept, deliveries
from vastctl.facts.billing import PARTS, BillingRow, Piece, Tally, TallyView, clip, dead_cost, pieces
from vastctl.state.lifecycle import State

__all__ = ["GROUPINGS", "PARTS", "SOURCE_NOTE", "CostView", "account", "afresh", "day_start", "parse_since",
           "proofs_of", "spent_today"]

Grouping = Literal["machine", "gpu", "day", "reason"]
GROUPINGS: tuple[Grouping, ...] = ("machine", "gpu", "day", "reason")
SOURCE_NOTE = "vastctl's account from its state file; vast's invoice is the truth"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str | None, now: datetime) -> datetime | None:
    """`--since 6h` (a duration before now: s, m, h, d, w) or `--since 2026-11-30T06:00:00Z` (a UTC time)."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if match:
        try:
            return now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
        except OverflowError:  # further back than a datetime reaches
            raise BadInput(f"--since {text} reaches before the year 1: give a shorter duration") from None
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


def _by_day(piece: Piece) -> Iterable[tuple[str, Piece]]:
    start = piece.start
    while start < piece.end:
        midnight = datetime(start.year, start.month, start.day, tzinfo=timezone.utc) + timedelta(days=1)
        end = min(midnight, piece.end)
        yield start.strftime("%Y-%m-%d"), Piece(piece.uuid, start, end, piece.part, piece.dph, piece.running)
        start = end


class GroupView(TallyView):
    """One group of `cost --by`: its key (a label, a GPU model, a day, a kill code or live/stopped) first."""

    key: str


class CostView(TallyView):
    """The `cost --json` object (docs/interface.md): as_of, since, source, the tally, by, groups (in that order)."""

    as_of: str | None
    since: str | None
    source: str
    by: str | None
    groups: list[GroupView]


def _group_key(by: Grouping, row: BillingRow) -> str:
    if by == "machine":
        label: str = row["label"]
        return label
    if by == "gpu":
        return row.get("gpu_name") or "unknown"
    if row["state"] == State.KILLED:  # by reason
        return row.get("kill_code") or "killed"
    return "stopped" if row["state"] == State.STOPPED else "live"


def proofs_of(row: BillingRow, delivered: Mapping[str, int] | None = None) -> int:
    """The proofs a machine is credited with: the proofs the proof router delivered from it, when the router sent
    it calls (`delivered`: its results in proof_calls, measured by the manager); else its total over every run
    of its prover, each heartbeat's share bounded by what it could have proved (lifecycle.counted_increment),
    never its raw last counter. The one source of counts for every cost figure."""
    if delivered:
        return int(delivered.get("completed", 0))
    return max(0, int(row.get("proofs_total") or 0))


def _lifetimes(all_pieces: list[Piece]) -> tuple[dict[str, float], dict[str, float]]:
    """uuid → hours running, and hours billed, over each machine's whole life (its count is shared over these)."""
    running_h: dict[str, float] = {}
    billed_h: dict[str, float] = {}
    for piece in all_pieces:
        running_h[piece.uuid] = running_h.get(piece.uuid, 0.0) + (piece.hours if piece.running else 0.0)
        billed_h[piece.uuid] = billed_h.get(piece.uuid, 0.0) + piece.hours
    return running_h, billed_h


def _proofs_and_dead(piece: Piece, row: BillingRow, proofs_done: int, running_h: dict[str, float],
                     billed_h: dict[str, float]) -> tuple[float, float]:
    """The piece's share of the machine's proofs, and what it billed dead until detected."""
    if running_h[piece.uuid] > 0:
        share = piece.hours / running_h[piece.uuid] if piece.running else 0.0
    else:  # counted proofs but never in state running (an adopted machine): shared over its billed time
        share = piece.hours / billed_h[piece.uuid] if billed_h[piece.uuid] > 0 else 0.0
    dead = dead_cost(piece, row) if proofs_done > 0 else 0.0  # else counted as never proved
    return proofs_done * share, dead


def account(conn: sqlite3.Connection, *, now: datetime, since: datetime | None = None,
            by: str | None = None) -> CostView:
    """The cost figures `vastctl cost`, the dashboard and /metrics all show (the `cost --json` shape)."""
    if by is None:
        return _figures(cost_kept.book(conn).tally(now, since), {}, now=now, since=since, by=None)
    return afresh(conn, now=now, since=since, by=_grouping(by))


def afresh(conn: sqlite3.Connection, *, now: datetime, since: datetime | None = None,
           by: str | None = None) -> CostView:
    """account() computed piece by piece from every row and event (what `cost --by` reads, and what the account
    kept between scrapes is checked against)."""
    grouping = None if by is None else _grouping(by)
    all_pieces, rows = pieces(conn, now=now)
    delivered = deliveries.delivered(conn)
    running_h, billed_h = _lifetimes(all_pieces)
    total, groups = Tally(), dict[str, Tally]()
    for whole in all_pieces:
        clipped = clip(whole, since)
        if clipped is None:
            continue
        piece = clipped
        row = rows[piece.uuid]
        proofs_done = proofs_of(row, delivered.get(piece.uuid))
        split = [(_group_key(grouping, row) if grouping else None, piece)] if grouping != "day" else list(_by_day(piece))
        for key, part_piece in split:
            proofs, dead = _proofs_and_dead(part_piece, row, proofs_done, running_h, billed_h)
            total.add(part_piece, proofs, proofs_done == 0, dead)
            if key is not None:
                groups.setdefault(key, Tally()).add(part_piece, proofs, proofs_done == 0, dead)
    return _figures(total, groups, now=now, since=since, by=grouping)


def _grouping(by: str) -> Grouping:
    """`--by` as given, checked against GROUPINGS."""
    if by not in GROUPINGS:
        raise BadInput(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    return by


def _figures(total: Tally, groups: dict[str, Tally], *, now: datetime, since: datetime | None,
             by: Grouping | None) -> CostView:
    ordered = sorted(groups.items(), key=lambda item: (-sum(item[1].cost.values()), item[0]) if by != "day"
                     else (item[0],))
    return {
        "as_of": clock.display_iso(clock.to_iso(now)),
        "since": clock.display_iso(clock.to_iso(since)) if since else None,
        "source": SOURCE_NOTE,
        **total.view(),
        "by": by,
        "groups": [{"key": key, **tally.view()} for key, tally in ordered],
    }


def day_start(now: datetime) -> datetime:
    """00:00 UTC of `now`'s day: where a day's spend (max_daily_spend, `cost --by day`) begins."""
    return datetime(now.year, now.month, now.day, tzinfo=timezone.utc)


def spent_today(conn: sqlite3.Connection, *, now: datetime) -> float:
    """$ spent since 00:00 UTC up to `now`, as `vastctl cost --since` that midnight says it."""
    return float(account(conn, now=now, since=day_start(now))["cost"])
