"""Which prover takes which call, and when: the router's slots and its queue of held calls.

A prover takes at most `slots` calls at once. A call that no prover can take now is held, in order: PoSt
first (it cannot wait), then by arrival; a call sent again after a prover dropped it keeps its place. Only the
first held call that some prover can take is given a slot, so none overtakes another of its class. It goes
to the prover with the most free slots (ties: the best measured rate), avoiding provers that already dropped
it while another prover is joined.

Memory is decided before a call's message is read (`wait_to_read`): a call is read only while the bytes kept
for other calls leave room for `read_reserve` (what reading the largest message a daemon takes costs), in
arrival order; until then it waits unread, its sender paused by HTTP/2 flow control, at no memory cost. Once
read, its reserve becomes its own size (`admit`), so the kept bytes never pass `max_bytes`.

A prover that drops or fails `fail_threshold` calls in a row is set aside: it takes no new call, and the
router reports it (reconcile kills it). Time comes from the clock it is given (vastctl/clock.py).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

from vastctl.clock import Clock

MiB = 1024 * 1024
CLASS_POST, CLASS_PROOF = 0, 1  # held order: PoSt ahead of PoRep, SnapDeals and PSProve


@dataclass(frozen=True)
class ProverSpec:
    """A joined prover as the state file says: its row, its tunnel's end, its slots and measured rate."""
    uuid: str
    label: str
    endpoint: str
    slots: int
    rate: float


@dataclass
class Prover:
    spec: ProverSpec
    busy: int = 0
    streak: int = 0  # dropped or failed calls in a row
    set_aside: str | None = None  # why it takes no new calls
    gone: bool = False

    @property
    def free(self) -> int:
        return 0 if (self.gone or self.set_aside) else max(0, self.spec.slots - self.busy)


@dataclass
class Ticket:
    """One call while the router has it: its place in the queue, what it weighs, where it was dropped."""
    seq: int
    klass: int
    size: int
    arrived: float
    dropped_by: set[str] = field(default_factory=set)
    held: bool = True


@dataclass(eq=False)
class Unread:
    """A call whose message is not read yet: its place in arrival order (kept once it is held), its arrival,
    and the reserve it holds while it is read."""
    seq: int
    arrived: float
    reserved: int = 0


class Closed(Exception):
    """The router stopped taking calls while this one was held."""


class Full(Exception):
    """Holding this call would pass route.max_held (calls) or route.max_held_mb (its memory: a call's `size` is
    what keeping it costs, the server's copies counted)."""


class Dispatcher:
    def __init__(self, *, max_held: int, max_bytes: int, fail_threshold: int, clock: Clock,
                 read_reserve: int = 0) -> None:
        self.clock = clock
        self.read_reserve = read_reserve
        self.max_held = max_held
        self.max_bytes = max_bytes
        self.fail_threshold = fail_threshold
        self.provers: dict[str, Prover] = {}
        self.held: list[Ticket] = []
        self.kept_bytes = 0  # what every call admitted and not yet answered costs, and every reserve of a call being read
        self.unread: list[Unread] = []  # calls waiting for their message to be read, in arrival order
        self.closed = False
        self._seq = itertools.count()
        self._cond = threading.Condition()

    # --- the set of provers -----------------------------------------------------------------------------

    def update(self, specs: Iterable[ProverSpec]) -> list[str]:
        """Make the joined set `specs`; returns the uuids that left it (their calls in flight are to be moved)."""
        wanted = {spec.uuid: spec for spec in specs}
        with self._cond:
            left = [uuid for uuid, prover in self.provers.items() if uuid not in wanted and not prover.gone]
            for uuid in left:
                self.provers[uuid].gone = True
                if not self.provers[uuid].busy:
                    del self.provers[uuid]
            for uuid, spec in wanted.items():
                prover = self.provers.get(uuid)
                if prover is None:
                    self.provers[uuid] = Prover(spec=spec)
                elif prover.gone:  # back while calls of its last spell are out: the same prover, their slots its
                    prover.spec, prover.gone, prover.streak, prover.set_aside = spec, False, 0, None
                else:
                    prover.spec = spec
            self._cond.notify_all()
        return left

    # --- a call's way through ---------------------------------------------------------------------------

    def enter(self) -> Unread:
        """A call arrived, its message not read yet (raises Closed when the router stopped)."""
        with self._cond:
            if self.closed:
                raise Closed()
            call = Unread(seq=next(self._seq), arrived=self.clock.monotonic())
            self.unread.append(call)
            return call

    def wait_to_read(self, call: Unread, *, timeout: float, reserve: int | None = None) -> bool:
        """Wait (at most `timeout` seconds) until this call's message may be read: it is the first unread call
        and its reserve (`reserve`, when its size is known before it is read, else `read_reserve`) fits beside
        the kept bytes (or nothing is kept, so a budget under one reserve still reads one call at a time). True
        once its reserve counts; False on timeout (it keeps its place)."""
        needed = self.read_reserve if reserve is None else reserve
        with self._cond:
            deadline = self.clock.monotonic() + timeout
            while True:
                if self.closed:
                    self._leave(call)
                    raise Closed()
                if self.unread and self.unread[0] is call and (
                        self.kept_bytes + needed <= self.max_bytes or self.kept_bytes == 0):
                    self.unread.pop(0)
                    call.reserved = needed
                    self.kept_bytes += call.reserved
                    self._cond.notify_all()
                    return True
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(timeout=remaining)

    def keep(self, call: Unread, size: int) -> None:
        """A call read and kept outside the held queue (sent to route.post_address): its reserve becomes
        `size` until `leave`."""
        with self._cond:
            self.kept_bytes += size - call.reserved
            call.reserved = size
            self._cond.notify_all()

    def leave(self, call: Unread) -> None:
        """The call went away before it was admitted: its place and its reserve are given up."""
        with self._cond:
            self._leave(call)

    def admit(self, *, klass: int, size: int, read: Unread | None = None) -> Ticket:
        """Take a call in, or raise Full; its bytes count until `finish`. `read`: the reserve it was read
        under, given back in the same step (so no other call takes the room between)."""
        now = self.clock.monotonic()
        with self._cond:
            if read is not None:
                self._leave(read)
            if self.closed:
                raise Closed()
            if len(self.held) >= self.max_held:
                raise Full(f"{len(self.held)} calls already held (route.max_held {self.max_held})")
            if self.kept_bytes + size > self.max_bytes:
                raise Full(f"{-(-(self.kept_bytes + size) // MiB)} MiB of request memory would be in use"
                           f" (route.max_held_mb {self.max_bytes // MiB})")
            ticket = Ticket(seq=next(self._seq) if read is None else read.seq, klass=klass, size=size,
                            arrived=now if read is None else read.arrived)
            self.kept_bytes += size
            self.held.append(ticket)
            self.held.sort(key=lambda t: (t.klass, t.seq))
            return ticket

    def acquire(self, ticket: Ticket, *, timeout: float) -> Prover | None:
        """Wait until this call may take a slot (at most `timeout` seconds); the prover, or None on timeout
        (the call stays held in its place until it is placed or finished). A call a prover gave back (dropped,
        moved) is held again with its first place. Raises Closed when the router stops while it is held."""
        with self._cond:
            if not ticket.held:
                ticket.held = True
                self.held.append(ticket)
                self.held.sort(key=lambda t: (t.klass, t.seq))
            deadline = self.clock.monotonic() + timeout
            while True:
                if self.closed:
                    self._unhold(ticket)
                    raise Closed()
                prover = self._turn(ticket)
                if prover is not None:
                    self._unhold(ticket)
                    prover.busy += 1
                    return prover
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return None  # still held, in its place: the caller asks again or finishes it
                self._cond.wait(timeout=remaining)

    def release(self, ticket: Ticket, prover: Prover, outcome: str) -> str | None:
        """Give the slot back. `outcome`: completed; failed (a proof the prover answered FAILED); dropped (it
        failed before answering); error (a status the daemon chose); moved (taken back from a prover that
        left); expired or abandoned (the caller's deadline or the caller, not the prover). Returns why the
        prover was set aside, when this call did it."""
        with self._cond:
            prover.busy -= 1
            newly = None
            if outcome in ("dropped", "failed"):
                prover.streak += 1
                if outcome == "dropped":
                    ticket.dropped_by.add(prover.spec.uuid)
                if prover.streak >= self.fail_threshold and not prover.set_aside:
                    prover.set_aside = newly = (f"{prover.streak} calls in a row dropped or failed, the last"
                                                f" {outcome} (route.fail_threshold {self.fail_threshold})")
            elif outcome in ("completed", "error"):
                prover.streak = 0
            if prover.gone and not prover.busy and self.provers.get(prover.spec.uuid) is prover:
                del self.provers[prover.spec.uuid]
            self._cond.notify_all()
            return newly

    def finish(self, ticket: Ticket) -> None:
        """The call is answered (or given up): its bytes no longer count."""
        with self._cond:
            self._unhold(ticket)
            self.kept_bytes -= ticket.size
            self._cond.notify_all()

    def close(self) -> None:
        """Take no new call; every held call is refused (Closed)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    # --- what the router shows --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            oldest = min([t.arrived for t in self.held] + [u.arrived for u in self.unread], default=None)
            age = None if oldest is None else max(0.0, self.clock.monotonic() - oldest)
            return {"held": len(self.held) + len(self.unread), "held_bytes": sum(t.size for t in self.held),
                    "unread": len(self.unread), "oldest_held_s": age,
                    "kept_bytes": self.kept_bytes,
                    "in_flight": sum(p.busy for p in self.provers.values()),
                    "provers": [{"uuid": p.spec.uuid, "label": p.spec.label, "endpoint": p.spec.endpoint,
                                 "slots": p.spec.slots, "busy": p.busy, "streak": p.streak,
                                 "set_aside": p.set_aside, "gone": p.gone}
                                for p in sorted(self.provers.values(), key=lambda p: p.spec.label)]}

    # --- inside the lock --------------------------------------------------------------------------------

    def _turn(self, ticket: Ticket) -> Prover | None:
        """The prover this call takes now, if it is the first held call that can be placed."""
        for waiting in self.held:
            prover = self._best(waiting)
            if prover is not None:
                return prover if waiting is ticket else None
            if waiting is ticket:
                return None
        return None

    def _best(self, ticket: Ticket) -> Prover | None:
        joined = [p for p in self.provers.values() if not p.gone and not p.set_aside]
        fresh = [p for p in joined if p.spec.uuid not in ticket.dropped_by]
        candidates = [p for p in (fresh or joined) if p.free > 0]
        if not candidates:
            return None
        return max(candidates, key=lambda p: (p.free, p.spec.rate, p.spec.label))

    def _leave(self, call: Unread) -> None:
        if call in self.unread:
            self.unread.remove(call)
        self.kept_bytes -= call.reserved
        call.reserved = 0
        self._cond.notify_all()

    def _unhold(self, ticket: Ticket) -> None:
        if ticket.held:
            ticket.held = False
            self.held.remove(ticket)

