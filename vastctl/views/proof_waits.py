"""Proofs done within agent.max_wait over the last day, estimated from the demand samples Curio reported (the file
records no proof's own wait without the proof router): the dashboard's "Work waiting" card and `fleet`'s work line
(views/work_waiting.py) read it, and the page's overview carries it."""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime, timedelta, timezone
from typing import TypedDict

from vastctl import clock, validate
from vastctl.config import Config

HISTORY = timedelta(days=1)  # the page's last day (overview's too)


class ProofWaits(TypedDict):
    """Proofs done within agent.max_wait over the last day, as proof_waits() estimates them."""

    max_wait_s: float
    proofs: float
    within_share: float | None
    wait_now_s: float | None
    stuck_now: bool


# a demand sample as proof_waits reads it: (at, ok, queued, in_flight, proofs_per_hour)
_Sample = tuple[str, int, "int | None", "int | None", "float | None"]


def proof_waits(conn: sqlite3.Connection, config: Config, now: datetime) -> ProofWaits:
    """Proofs done within agent.max_wait over the last day, estimated from the demand samples alone (the file
    records no proof's own wait): a proof that arrives behind `queued + in_flight` proofs waits about that backlog
    over the rate proofs are done (the sample's proofs_per_hour: Little's law), so each stretch between two good
    samples counts the proofs done in it (that rate × its length) as within when that wait is at most max_wait.
    `within_share` is None while no proof was done; `wait_now_s` is the newest good sample's wait (None when it
    gives no rate, or when nothing is being done: `stuck_now`). Samples without a rate are not judged."""
    cursor = conn.cursor()
    cursor.row_factory = None  # (at, ok, queued, in_flight, proofs_per_hour): a day of samples per page
    rows: list[_Sample] = cursor.execute("SELECT at, ok, queued, in_flight, proofs_per_hour FROM demand_samples WHERE at >= ? AND"
                          " at <= ? ORDER BY id", (clock.to_iso(now - HISTORY), clock.to_iso(now))).fetchall()
    times = [stored_moment(row[0]) for row in rows] + [now]
    done = within = 0.0
    wait_now = None
    if len(_STRETCHES) > STRETCHES_KEPT:
        _STRETCHES.clear()
    for index, (row, start, end) in enumerate(zip(rows, times, times[1:])):
        if index + 1 < len(rows):  # a stretch between two samples: the same at every page while both are kept
            key = (row, rows[index + 1][0], config.agent.max_wait)
            stretch = _STRETCHES.get(key)
            if stretch is None:
                stretch = _STRETCHES[key] = _stretch(row, start, end, config.agent.max_wait)
        else:
            stretch = _stretch(row, start, end, config.agent.max_wait)
        if stretch is None:
            continue
        if not stretch:  # a source that reports only its queue: no rate to judge the wait by
            wait_now = None
            continue
        proofs, counted, wait_now = stretch
        done += proofs
        within += counted
    return {"max_wait_s": config.agent.max_wait, "proofs": round(done, 1),
            "within_share": round(within / done, 4) if done > 0 else None,
            "wait_now_s": None if wait_now is None or validate.real(wait_now) is None else round(wait_now, 1),
            "stuck_now": wait_now is not None and validate.real(wait_now) is None}  # endless: nothing proves


def _stretch(row: _Sample, start: datetime | None, end: datetime | None,
             max_wait: float) -> tuple[float, ...] | None:
    """One stretch of proof_waits: (proofs done in it, those within max_wait, the wait in seconds); () for a sample
    without a rate, None for one not judged (failed, or a time that does not parse)."""
    _, ok, queued, in_flight, per_hour = row
    if not ok or start is None or end is None:
        return None
    if per_hour is None:
        return ()
    rate = float(per_hour)
    backlog = float(queued or 0) + float(in_flight or 0)
    wait_h = backlog / rate if rate > 0 else (0.0 if backlog == 0 else math.inf)
    proofs = rate * max(0.0, (end - start).total_seconds()) / 3600
    return proofs, proofs if wait_h * 3600 <= max_wait else 0.0, wait_h * 3600


STRETCHES_KEPT = 20_000
_STRETCHES: dict[tuple[_Sample, str, float], tuple[float, ...] | None] = {}  # (sample, the next one's time, max_wait) → stretch


def stored_moment(text: object) -> datetime | None:
    """A stored time as an aware datetime; None when absent or unreadable."""
    try:
        moment = clock.from_iso(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment
