"""The cost account kept between scrapes (cost.account reads it; cost.afresh, piece by piece, is what it is checked against).

The dashboard and /metrics ask for the whole account, the last 24 hours and today at every request. What a
machine billed changes only with its billing fields, its transitions and its disk's listed price; between
those, a live machine's figures grow with `now` along its one open piece. So each state file keeps (_Book):
its transitions read once and then only the new ones (events are only ever appended), each machine's pieces
compiled once with the sums of its closed pieces, and per connection the rows as of the file's last change
(PRAGMA data_version for other connections' writes, total_changes for this one's). A request then costs one
short sum per machine. The router's deliveries are counted as they are appended; proofs_total is read again
whenever the file changed.
"""

from __future__ import annotations

import bisect
import sqlite3
import threading
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from enum import Enum
from operator import itemgetter
from typing import Final, Hashable

from vastctl import clock
from vastctl.facts import appended, deliveries
from vastctl.facts.billing import (
    BILLING,
    COLUMNS,
    DEATH_CODES,
    FAR,
    NEVER,
    PARTS,
    Piece,
    Tally,
    billing_row,
    clip,
    dead_cost,
    machine_pieces,
    storage_prices,
)
from vastctl.state import kept_rows

_CONNECTIONS_KEPT = 4  # connections per file whose rows are kept (serve has one per thread)


class _Compiled:
    """One machine's pieces up to FAR with what any window needs precomputed: the closed pieces' ends and
    suffix sums (cost and hours per part, running hours, billed hours), and its open piece."""

    __slots__ = ("pieces", "closed", "ends", "suffix", "open", "settled", "plain", "first", "whole", "open_us",
                 "open_part", "before_open", "settled_us", "billing")

    def __init__(self, machine_pieces: list[Piece]):
        self.pieces = machine_pieces
        self.open = machine_pieces[-1] if machine_pieces and machine_pieces[-1].end >= FAR else None
        self.closed = machine_pieces[:-1] if self.open is not None else machine_pieces
        self.ends = [piece.end for piece in self.closed]
        self.settled = max(self.ends, default=NEVER)  # when its last closed piece ended
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
        self.first = machine_pieces[0].start if machine_pieces else FAR
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
        # still billing along its open piece, after its closed ones: what _sum() reads of it for any window
        self.settled_us = _micros(self.settled)
        self.billing = (self.open.dph, self.open.running) if self.open is not None and self.plain else None


_PART_INDEX = {part: index for index, part in enumerate(PARTS)}


class _Book:
    """One state file's kept account: transitions by machine, compiled machines, rows per connection."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # serve's worker threads share the book (--threads)
        self.tail = appended.Tail()
        self.calls = appended.Tail("proof_calls")
        # uuid → what the router delivered to it, by result: a machine's dict is replaced, never changed, when its
        # calls grow (entry_of compares the one it last read)
        self.delivered: dict[str, dict[str, int]] = {}
        self.moves: dict[str, list[tuple[str, int, str]]] = {}  # uuid → its transitions (at, id, to_state)
        self.compiled: dict[str, tuple[tuple[Hashable, ...], _Compiled]] = {}
        # uuid → (its row's columns, listed disk price, transitions, router count as last read; its entry; the whole
        # row as kept_rows had it, the same object while the row is unchanged): unchanged, reused
        self.entry_of: dict[str, tuple[_Values, float | None, int, dict[str, int] | None, _Entry | None, _Values]] = {}
        # the newest few connections' rows: (connection, what the file was at, its machines); a connection is
        # held only while it is among them (its id alone could be a later one's)
        self.snapshots: list[tuple[sqlite3.Connection, tuple[int, int], tuple[list[_Entry], list[_Entry]]]] = []
        # the machines whose billing is over, and their figures summed per window start (the same at every moment
        # after the last of them ended): a request sums the machines still billing, whatever the day's history
        self.closed: list[_Entry] = []
        self.settled = NEVER
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

    def read_deliveries(self, conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
        """The router's counts per machine, adding the calls appended since the last read (all of them when the
        file is not the one last read): a long run's calls are counted once, not at every read."""
        span = self.calls.span(conn)
        if span is None:
            return self.delivered
        after, upto = span
        if after == 0:
            self.delivered = {}
        for uuid, counts in deliveries.delivered(conn, ids=(after, upto)).items():
            kept = self.delivered.get(uuid, {})
            self.delivered[uuid] = {result: kept.get(result, 0) + counts.get(result, 0) for result in kept | counts}
        return self.delivered

    def entries(self, conn: sqlite3.Connection) -> tuple[list[_Entry], list[_Entry]]:
        """Every machine that billed, as the file has it now: (uuid, compiled pieces, proofs, its row's dead-time
        fields); those still billing (or whose pieces cannot be summed), then those whose billing is over."""
        if conn.in_transaction:
            return self._entries(conn, keep_rows=False)
        conn.execute("BEGIN")  # one snapshot of the file: its version, its transitions and its rows agree
        try:  # begun only to read: the rows it reads may be kept (kept_rows)
            return self._entries(conn, keep_rows=True)
        finally:
            conn.execute("COMMIT")

    def _entries(self, conn: sqlite3.Connection, *, keep_rows: bool) -> tuple[list[_Entry], list[_Entry]]:
        key = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
        kept = next((snapshot for snapshot in self.snapshots if snapshot[0] is conn), None)
        if kept is not None and kept[1] == key:
            return kept[2]
        self.read_moves(conn)
        listed_storage = storage_prices(conn)
        delivered = self.read_deliveries(conn)
        rows = kept_rows.read(conn, keep=keep_rows)
        columns, uuid_at = itemgetter(*(rows.position[name] for name in COLUMNS)), rows.position["uuid"]
        live: list[_Entry] = []
        closed: list[_Entry] = []
        billing = len(BILLING) + 1
        for row in rows.ordered(kept_rows.BY_CREATION_UUID):
            last = self.entry_of.get(str(row[uuid_at]))
            values: _Values = last[0] if last is not None and last[5] is row else columns(row)  # unchanged: itself
            uuid = str(values[0])
            moves = self.moves.get(uuid, _NO_MOVES)
            vast_id = values[_VAST_ID]
            listed = listed_storage.get(vast_id) if isinstance(vast_id, int) else None
            counted = delivered.get(uuid)
            if last is not None and last[0] == values and last[1] == listed and last[2] == len(moves) \
                    and last[3] == counted:  # the row, its disk price, its transitions and count as last read
                if last[4] is not None:
                    (live if last[4][1].whole is None else closed).append(last[4])
                continue
            compile_key = (values[1:billing], listed, len(moves), moves[-1] if moves else None)
            found = self.compiled.get(uuid)
            if found is None or found[0] != compile_key:
                fields = billing_row(values)
                parsed = [(clock.parse_iso(at), to_state) for at, _, to_state in moves]
                found = (compile_key, _Compiled(list(machine_pieces(fields, parsed, listed_storage, FAR))))
                self.compiled[uuid] = found
            proofs = max(0, _count(values[_PROOFS]))
            if counted:
                proofs = int(counted.get("completed", 0))
            dying = values[_KILL_CODE] in DEATH_CODES
            compiled = found[1]
            entry = (uuid, compiled, proofs, values if dying else None) if compiled.pieces else None
            self.entry_of[uuid] = (values, listed, len(moves), counted, entry, row)
            if entry is not None:  # a machine that never billed is in no window
                (closed if compiled.whole is not None else live).append(entry)
        if closed != self.closed:  # a machine's billing ended, or a finished one's row or count changed
            self.closed, self.blocks = closed, OrderedDict()
            self.settled = max((entry[1].settled for entry in closed), default=NEVER)
        out = (live, self.closed)
        self.snapshots = [(conn, key, out), *(s for s in self.snapshots if s[0] is not conn)][:_CONNECTIONS_KEPT]
        return out



# a row's COLUMNS values, in that order (billing_row() names them)
_Values = tuple[object, ...]
# a machine that billed: (uuid, its compiled pieces, its proofs, its row's values when it died on its own)
_Entry = tuple[str, _Compiled, int, "_Values | None"]
_NO_MOVES: list[tuple[str, int, str]] = []
_VAST_ID = COLUMNS.index("vast_id")
_PROOFS = COLUMNS.index("proofs_total")
_KILL_CODE = COLUMNS.index("kill_code")


def _count(value: object) -> int:
    """A stored count (proofs_total) as a number: 0 for none."""
    return int(value) if isinstance(value, (int, float)) else 0
_BOOKS = appended.PerFile(_Book)


def book(conn: sqlite3.Connection) -> "_Reader":
    return _Reader(_BOOKS.get(conn), conn)


class _Reader:
    """A book read through one connection."""

    def __init__(self, book: _Book, conn: sqlite3.Connection):
        self.book, self.conn = book, conn

    def tally(self, now: datetime, since: datetime | None) -> Tally:
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
        total = Tally()
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
    since_us = None if since is None else _micros(since)
    window_open = since is None or now > since
    for uuid, compiled, proofs_done, dying in entries:
        whole = compiled.whole
        billing = compiled.billing
        if whole is not None and now >= compiled.settled and (since is None or since <= compiled.first):
            sums, run_w, billed_w, run_all, billed_all = whole  # billing over, all of it in the window
        elif billing is not None and now_us >= compiled.settled_us and compiled.open_us < now_us:
            # _window() for a machine billing along its open piece after its closed ones, the same sums inline
            dph, running = billing
            open_h = max(0.0, (now_us - compiled.open_us) / 1_000_000) / 3600
            suffix = compiled.suffix[0]
            run_all, billed_all = suffix[6] + (open_h if running else 0.0), suffix[7] + open_h
            closed = compiled.before_open.get(since, _UNKNOWN)  # one read: serve's threads share the machine
            if closed is _UNKNOWN:
                closed = _closed_kept(compiled, since)
            if window_open:
                sums = [0.0] * 8 if closed is None else list(closed)
                hours = open_h if since_us is None or compiled.open_us >= since_us else since_h
                part = compiled.open_part
                sums[part] += hours * dph
                sums[3 + part] += hours
                sums[6] += hours if running else 0.0
                sums[7] += hours
            elif closed is None:
                continue
            else:
                sums = list(closed)
            run_w, billed_w = sums[6], sums[7]
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
            row = billing_row(dying)
            for piece in compiled.pieces:
                clipped = clip(_cut(piece, now), since) if piece.start < now else None
                if clipped is not None:
                    dead += dead_cost(clipped, row)
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
        closed = _closed_kept(compiled, since)
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


class _Unknown(Enum):
    """Nothing kept for a window's start (a None kept means: no closed piece reaches into the window)."""

    UNKNOWN = 0


_UNKNOWN: Final = _Unknown.UNKNOWN
_SINCES_KEPT = 8  # window starts whose closed sums a machine keeps (the whole life, today, the moving day's last)


def _closed_kept(compiled: _Compiled, since: datetime | None) -> list[float] | None:
    """_closed_sums(), kept by the machine for the window's start (the same at every moment after its last closed
    piece ended)."""
    closed = _closed_sums(compiled, since)
    if len(compiled.before_open) >= _SINCES_KEPT:
        compiled.before_open.clear()
    compiled.before_open[since] = closed
    return closed


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
        piece = clip(whole, since)
        if piece is None:
            continue
        found = True
        part = _PART_INDEX[piece.part]
        sums[part] += piece.cost
        sums[3 + part] += piece.hours
        sums[6] += piece.hours if piece.running else 0.0
        sums[7] += piece.hours
    return (sums, sums[6], sums[7], run_all, billed_all) if found else None
