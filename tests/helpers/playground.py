"""The `provider: sim` playground on a clock that runs faster than the wall, for tests that follow its guides.

The playground runs on the wall clock: a machine takes half an hour to boot and a proof minutes. FastClock
runs `speed` times the wall (and jumps when told), so a boot is a handful of commands and a proof seconds; the
stand-in daemons read that speed (vastctl/providers/sim_join.wall_speed) and prove in their machine's time at
that pace. It starts hours before PINNED (below), behind the wall clock, so a `vastctl` started as a process
(the router), which reads the wall clock, finds the market behind it and runs on its own clock too.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from vastctl.clock import Clock

# The playground prices, offers and rents by the hour of its clock, so which host is the cheapest, and what its
# rental draws (a destroy refused for minutes: 3% of rentals at the low level), follows the wall clock's hour. A
# test that asserts one path through the market (a kill destroyed at once) runs it from this moment instead:
# FastClock(1, behind=timedelta(0)) is the wall's pace from it.
PINNED = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


class FastClock(Clock):
    """Simulated time at `speed` × the wall, from `behind` before PINNED; `jump(seconds)` moves it at once."""

    def __init__(self, speed: float, behind: timedelta = timedelta(hours=6)):
        self.speed = speed
        self._start = PINNED - behind
        self._wall = time.monotonic()
        self._jumped = 0.0

    def monotonic(self) -> float:
        return (time.monotonic() - self._wall) * self.speed + self._jumped

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self.monotonic())

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    def jump(self, seconds: float) -> None:
        self._jumped += seconds


def processes_with(argument: str) -> list[int]:
    """The ids of this host's processes with `argument` in their command line (as `pgrep -f` finds them): a stand-in
    daemon's process names its file, so a test finds its own and no other test's."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            if argument.encode() in words:
                found.append(int(entry.name))
    return found
