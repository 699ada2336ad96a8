"""Time in one place: aware UTC datetimes in code, ISO-8601 strings ending in Z in the file.

Nothing outside this module reads the system clock. The CLI holds `SYSTEM`
(cli.app.Globals.system_clock) and hands it down: functions that need one moment take
`now`, those that sleep, time a deadline or read the time more than once take
the Clock. The simulator hands the same code a VirtualClock.
"""

from __future__ import annotations

import functools
import time
from datetime import datetime, timedelta, timezone
from typing import overload


class Clock:
    """The one source of time: `now()` (aware UTC), `sleep()`, `monotonic()`.

    The command that starts the work builds one and passes it down; nothing
    below the CLI reads the system clock itself, so the simulator can run the
    same code on virtual time (VirtualClock).
    """

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def monotonic(self) -> float:
        return time.monotonic()


class VirtualClock(Clock):
    """Time that moves only when told: `sleep()` and `advance()` move it forward at once."""

    def __init__(self, start: datetime):
        if start.tzinfo is None:
            start = start.replace(tzinfo=timezone.utc)
        self._now = start
        self._elapsed = 0.0

    def now(self) -> datetime:
        return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        self._now += timedelta(seconds=seconds)
        self._elapsed += seconds


class StillClock(Clock):
    """A state file as of one moment (`--as-of`): `now()` stays there, so a kept day's figures do not run on
    while it is looked at; sleeps and deadlines still take real time."""

    def __init__(self, real: Clock, moment: datetime):
        self.real = real
        self.moment = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

    def now(self) -> datetime:
        return self.moment

    def sleep(self, seconds: float) -> None:
        self.real.sleep(seconds)

    def monotonic(self) -> float:
        return self.real.monotonic()


SYSTEM = Clock()


@overload
def to_iso(moment: datetime) -> str: ...
@overload
def to_iso(moment: None) -> None: ...
@overload
def to_iso(moment: datetime | None) -> str | None: ...


def to_iso(moment: datetime | None) -> str | None:
    """Render as `2026-11-30T05:02:13.123456Z` (sortable as text, readable in sqlite3)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=1 << 16)
def from_iso(text: str | None) -> datetime | None:
    """A stored time (to_iso's text) as an aware datetime. Kept for the texts last read: a page or a pass over
    thousands of machines reads the same few stored times many times (datetimes do not change)."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@functools.lru_cache(maxsize=1 << 15)
def display_iso(text: str | None) -> str | None:
    """The contract's JSON shape: whole seconds, trailing Z. Kept for the texts last shown: a page of a thousand
    machines shows the same stored times at every refresh."""
    moment = from_iso(text)
    if moment is None:
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    """A time read from a NOT NULL column (from_iso() for one that is always written)."""
    moment = from_iso(text)
    if moment is None:
        raise ValueError(f"not a stored time: {text!r}")
    return moment


def display_moment(moment: datetime) -> str:
    """A moment as display_iso() shows it: whole seconds, UTC, trailing Z."""
    text = display_iso(to_iso(moment))
    assert text is not None  # to_iso() of a moment is never empty
    return text


def human_duration(seconds: float) -> str:
    """`45s`, `14m`, `2h`, `1h30m`: how event reasons and tables speak of time."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes}m" if minutes else f"{hours}h"


def human_age(moment: datetime | None, now: datetime) -> str:
    """How long ago `moment` was, or `?` when unknown."""
    return "?" if moment is None else human_duration((now - moment).total_seconds())
