"""The memory a large Prove is kept in while the router has it, used again by the next one.

Fresh memory costs a page fault on each 4 KiB the first time it is written, several times what the copy itself
costs (bench/README.md, "Fifth step"). Curio's
large calls come one after another at much the same size (a PoRep's C1 output), so a buffer given back is kept
for the next call that fits it. What is kept is bounded: kept buffers and the calls the router holds together
stay within route.max_held_mb, and a buffer no call used for IDLE_S seconds goes back to the system, so the
router's memory follows what it holds within a minute of the last large call.
"""

from __future__ import annotations

import mmap
import threading

from vastctl.clock import Clock

IDLE_S = 60.0
LARGEST_FIT = 1.25  # a kept buffer serves a call at most this much smaller than itself


class Buffers:
    def __init__(self, *, max_bytes: int, clock: Clock) -> None:
        self.max_bytes, self.clock = max_bytes, clock
        self.kept: list[tuple[float, mmap.mmap]] = []  # (given back at, buffer)
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(len(buffer) for _, buffer in self.kept)

    def take(self, size: int, *, in_use: int) -> mmap.mmap:
        """A buffer of at least `size` bytes: a kept one that fits, else a new one. `in_use`: what the calls
        the router holds keep, this one's reserve counted (kept buffers are let go, the oldest first, while
        they and it would pass the bound)."""
        with self._lock:
            fitting = [entry for entry in self.kept if size <= len(entry[1]) <= size * LARGEST_FIT]
            if fitting:
                entry = min(fitting, key=lambda e: len(e[1]))
                self.kept.remove(entry)
                return entry[1]
            while self.kept and in_use + sum(len(b) for _, b in self.kept) > self.max_bytes:
                self.kept.pop(0)  # the oldest first
        return mmap.mmap(-1, size)

    def give(self, buffer: mmap.mmap, *, in_use: int) -> None:
        """A call is over (`in_use` no longer counts it): keep its buffer for the next if the bound allows."""
        with self._lock:
            if in_use + len(buffer) + sum(len(b) for _, b in self.kept) <= self.max_bytes:
                self.kept.append((self.clock.monotonic(), buffer))

    def trim(self) -> None:
        """Give back every buffer no call used for IDLE_S seconds (the router's writer thread calls this)."""
        now = self.clock.monotonic()
        with self._lock:
            self.kept = [(at, buffer) for at, buffer in self.kept if now - at < IDLE_S]
