"""A kept simulated day, and the same day's file as it really stood at one moment of it (for tests/test_as_of.py).

The moment's file is a copy taken while the day ran, once the minute at the moment was done (its reconcile,
agent step and the machines' reports up to it written), with what the run had already stamped later (the
router's calls of the minute under way) taken out: what an operator copying the file then would have had.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from vastctl import clock as clocks
from vastctl.demo import day as demo_day
from vastctl.demo import keep, setting

HOURS = 8
MOMENT = setting.START + timedelta(hours=4, minutes=30)

# The rows written as things happen, by the column that says when: a row stamped after the moment was not there yet.
APPENDED = {"events": "at", "actions": "at", "vast_listings": "at", "demand_samples": "at", "proof_calls": "at",
            "agent_steps": "started_at", "agent_notes": "at", "agent_messages": "at", "machine_logs": "at"}


@dataclass
class KeptDay:
    kept: Path  # the day's file as `demo --keep` leaves it (its token secret and admin token beside it)
    then: Path  # the same day's file as it stood at `moment`
    moment: datetime
    admin_token: str


class _Watched(clocks.VirtualClock):
    """The demo's clock, copying the day's file as the minute at `moment` ends."""

    moment: datetime
    source: Path
    target: Path

    def advance(self, seconds: float) -> None:
        if self.now() == self.moment:
            copy_file(self.source, self.target)
        super().advance(seconds)


def copy_file(source: Path, target: Path) -> None:
    """SQLite's backup: the write-ahead log folded in, as `demo --keep` copies."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def make(directory: Path, *, moment: datetime = MOMENT, hours: int = HOURS) -> KeptDay:
    """Run a day of `hours`, keep it as directory/day.db, and its file at `moment` as directory/then.db."""
    scratch = directory / "run"
    scratch.mkdir()
    then = directory / "then.db"

    class Watched(_Watched):
        pass

    Watched.moment, Watched.source, Watched.target = moment, scratch / "demo.db", then
    original = demo_day.VirtualClock
    demo_day.VirtualClock = Watched  # type: ignore[misc]
    try:
        # the rules' day: they launch and release on both sides of the moment (the plan holds its fleet through
        # these hours), and what a moment must take back is what test_as_of checks
        demo_day.run(setting.DemoOptions(hours=hours, policy="rules"), scratch)
    finally:
        demo_day.VirtualClock = original  # type: ignore[misc]
    assert then.exists(), f"the day never reached {moment}"
    with sqlite3.connect(then) as conn:
        at = clocks.to_iso(moment)
        for table, column in APPENDED.items():
            conn.execute(f"DELETE FROM {table} WHERE {column} > ?", (at,))
    kept = directory / "day.db"
    token = keep.keep_state(scratch, kept)
    return KeptDay(kept=kept, then=then, moment=moment, admin_token=token)
