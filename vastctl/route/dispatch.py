"""Which prover takes which call, and when: the router's slots, its queue of held calls, and each prover's health.

A prover takes at most `slots` calls at once. A call that no prover can take now is held, in order: PoSt
first (it cannot wait), then by arrival; a call sent again after a prover dropped it keeps its place. Only the
first held call that some prover can take is given a slot, so none overtakes another of its class. It goes
to the prover with the most free slots (ties: the best measured rate), avoiding provers that already dropped
it while another prover is joined; sent back to one that dropped it, it waits RESEND_PAUSE_S × its drops first.

Memory is decided before a call's message is read (`wait_to_read`): a call is read only while the bytes kept
for other calls leave room for `read_reserve` (what reading the largest message a daemon takes costs), in
arrival order; until then it waits unread, its sender paused by HTTP/2 flow control, at no memory cost. Once
read, its reserve becomes its own size (`admit`), so the kept bytes never pass `max_bytes`.

Health is outlier detection as Envoy does it, with a prover's answers and its connects counted apart:

  not reached      a connect that failed (refused, the tunnel's port closed): nothing was sent, so the call is
                   no attempt and no drop; it waits or goes elsewhere while the prover is tried again after
                   UNREACHED_FIRST_S, doubled each time, at most UNREACHED_MAX_S. route.fail_threshold of these
                   in a row eject it, unless no other prover could take the held calls then.
  failed answers   a call dropped after it was sent, a proof answered FAILED, or a call held to its deadline
                   unanswered for longer than a proof takes (proof_s): route.fail_threshold in a row eject it.
                   A good answer (a proof, or a status the daemon chose) resets every count.
  one cause        a failure of a call placed before the prover's last counted failure, within SAME_CAUSE_S of
                   it, is that failure again (calls lost together on one connection): it is not counted; so is a
                   drop of any call within SETTLE_S of it (a daemon going down). A proof answered FAILED always
                   counts; each connect placed after a pause is a try of its own.
  ejected          no new call for route.ejection_base × the times it was ejected since its last good answer
                   (at most EJECTION_CAP ×); then it is back by itself, its counts reset. At most
                   route.max_ejected_percent of the joined provers are out at once (at least one), so a fault of
                   the whole fleet never empties it.
  reported         ejected for failed answers KILL_AFTER times with no good answer between: it kept failing after
                   it was taken back. It takes no call again, and the router records it once
                   (facts/deliveries.set_aside: reconcile kills it, code route_failing). Connects alone never
                   report it: reconcile's tunnel check judges a daemon that stays unreachable.

A call whose caller gave up, or whose deadline passed, while a prover had it still occupies the daemon: cuzk does
not cancel a job whose waiter went away. Its slot stays taken (`lingering`) until the daemon's GetStatus shows
fewer calls pending or in progress than slots held so (`observe_work`), or for one proof's time (proof_s). Time
comes from the clock it is given (vastctl/clock.py).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from vastctl.clock import Clock

MiB = 1024 * 1024
CLASS_POST, CLASS_PROOF = 0, 1  # held order: PoSt ahead of PoRep, SnapDeals and PSProve
RESEND_PAUSE_S = 1.0  # a call sent back to a prover that dropped it waits this × its drops first
RESEND_PAUSE_MAX_S = 10.0
UNREACHED_FIRST_S = 0.5  # a prover not reached is tried again after this, doubled each time
UNREACHED_MAX_S = 5.0  # and at most this: a daemon back from a restart gets its held calls within seconds
SAME_CAUSE_S = 5.0  # calls on a prover when its connection went fail within ms of each other; keepalive-found, together
SETTLE_S = 1.0  # and a daemon going down takes the calls sent in its last moment with it (accepted, then closed)
EJECTION_CAP = 10  # an ejection lasts at most this × route.ejection_base (Envoy: max_ejection_time 300 s = 10 × 30 s)
KILL_AFTER = 2  # ejections for failed answers, with no good answer between, before the machine is reported
FALLBACK_RATE = 24.0  # proofs/h of a prover whose rate is unknown: the slowest host measured (128 GiB RAM)
OUTCOMES = frozenset({"completed", "failed", "error", "dropped", "unreached", "moved", "expired", "abandoned"})
LAST = {"dropped": "dropped", "failed": "failed", "expired": "held to its deadline unanswered"}


@dataclass(frozen=True)
class ProverSpec:
    """A joined prover as the state file says: its row, its tunnel's end, its slots and measured rate."""
    uuid: str
    label: str
    endpoint: str
    slots: int
    rate: float

    @property
    def proof_s(self) -> float:
        """Seconds one proof takes on it with its slots full (rate is proofs/h with `slots` at once)."""
        return self.slots * 3600.0 / (self.rate if self.rate > 0 else FALLBACK_RATE)


@dataclass
class Prover:
    spec: ProverSpec
    busy: int = 0  # the router's calls on it now
    streak: int = 0  # failed answers in a row (module docstring), each cause once
    unreached: int = 0  # connects failed in a row, each cause once
    ejections: int = 0  # times ejected since its last good answer: the next ejection lasts this many bases
    answer_ejections: int = 0  # of those, for failed answers (KILL_AFTER: reported)
    out_until: float | None = None  # it takes no new call before this (monotonic): ejected, or not reached
    ejected: bool = False  # out_until is an ejection (counted against route.max_ejected_percent), not a retry
    set_aside: str | None = None  # why it takes no new call now
    reported: bool = False
    placed: int = 0  # calls placed on it so far: a call's place in this count tells which failures came before it
    answer_mark: tuple[int, float] | None = None  # (placed, when) at its last counted failed answer
    local_mark: tuple[int, float] | None = None  # the same for its last counted failed connect
    lingering: list[float] = field(default_factory=list)  # when each slot held by a call given up comes free
    gone: bool = False

    @property
    def free(self) -> int:
        if self.gone or self.set_aside:
            return 0
        return max(0, self.spec.slots - self.busy - len(self.lingering))


@dataclass(frozen=True)
class Change:
    """What a release did to a prover's health: `ejected` for `seconds`, or `retrying` (not reached) after
    `seconds`; `report` when this makes it a machine to kill (the reason recorded)."""
    kind: Literal["ejected", "retrying"]
    why: str
    seconds: float
    report: str | None = None


@dataclass
class Ticket:
    """One call while the router has it: its place in the queue, what it weighs, where it was dropped."""
    seq: int
    klass: int
    size: int
    arrived: float
    dropped_by: set[str] = field(default_factory=set)
    held: bool = True
    drops: int = 0
    resend_at: float = 0.0  # not sent back to a prover that dropped it before this
    placed: int = 0  # its place in its prover's count of placed calls (Prover.placed)
    placed_at: float = 0.0


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
                 read_reserve: int = 0, ejection_base: float = 30.0, max_ejected_percent: int = 10) -> None:
        self.clock = clock
        self.read_reserve = read_reserve
        self.max_held = max_held
        self.max_bytes = max_bytes
        self.fail_threshold = fail_threshold
        self.ejection_base = ejection_base
        self.max_ejected_percent = max_ejected_percent
        self.provers: dict[str, Prover] = {}
        self.held: list[Ticket] = []
        self.kept_bytes = 0  # what every call admitted and not yet answered costs, and every reserve of a call being read
        self.unread: list[Unread] = []  # calls waiting for their message to be read, in arrival order
        self.closed = False
        self._returned: list[str] = []  # labels of provers whose ejection ended, not yet told (taken_back)
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
                    _rejoin(prover, spec)
                else:
                    prover.spec = spec
            self._cond.notify_all()
        return left

    def observe_work(self, uuid: str, work: int) -> int:
        """The daemon's own GetStatus: `work` calls pending or in progress over its queues. Slots held by calls
        given up (lingering) beyond that many come free, the earliest due first; returns how many. The router's
        own calls are not taken off `work`: one still uploading (a 100 MB call takes seconds) is not in it yet,
        so the daemon's jobs left of calls given up could only be guessed low, and a slot freed early."""
        with self._cond:
            prover = self.provers.get(uuid)
            if prover is None or not prover.lingering:
                return 0
            freed = max(0, len(prover.lingering) - max(0, work))
            if freed:
                prover.lingering = sorted(prover.lingering)[freed:]
                self._cond.notify_all()
            return freed

    def lingering_provers(self) -> list[str]:
        """The uuids of provers holding slots for calls given up: the ones whose GetStatus is worth asking."""
        with self._cond:
            self._tick(self.clock.monotonic())
            return [uuid for uuid, prover in self.provers.items() if prover.lingering and not prover.gone]

    def taken_back(self) -> list[str]:
        """The labels of provers whose ejection ended since the last call (once each)."""
        with self._cond:
            self._tick(self.clock.monotonic())
            returned, self._returned = self._returned, []
            return returned

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
        """A call read and kept outside the held queue (sent to the operator's own daemon): its reserve becomes
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
        moved, not reached) is held again with its first place. Raises Closed when the router stops while it
        is held. The wait also ends when an ejection, a retry's pause or a lingering slot ends, by the clock."""
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
                now = self.clock.monotonic()
                self._tick(now)
                prover = self._turn(ticket, now)
                if prover is not None:
                    self._unhold(ticket)
                    prover.busy += 1
                    prover.placed += 1
                    ticket.placed, ticket.placed_at = prover.placed, now
                    return prover
                remaining = deadline - now
                if remaining <= 0:
                    return None  # still held, in its place: the caller asks again or finishes it
                due = self._next_due(now)
                self._cond.wait(timeout=remaining if due is None else min(remaining, due))

    def release(self, ticket: Ticket, prover: Prover, outcome: str, detail: str = "") -> Change | None:
        """Give the slot back and judge the prover (module docstring). `outcome`: completed; failed (a proof it
        answered FAILED); error (a status the daemon chose); dropped (it failed after the call was sent, before
        answering); unreached (the connect failed: nothing sent); moved (taken back from a prover that left);
        expired (the deadline passed while it had the call) or abandoned (the caller went away meanwhile): their
        slot stays taken while the daemon proves on. `detail`: what went wrong, for the reason. Returns what
        this did to the prover's health, if anything."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._cond:
            now = self.clock.monotonic()
            self._tick(now)
            prover.busy -= 1
            change = None
            if outcome in ("completed", "error"):
                prover.streak = prover.unreached = prover.ejections = prover.answer_ejections = 0
                prover.answer_mark = prover.local_mark = None  # what failed before is over
            elif outcome == "unreached":
                change = self._unreached(ticket, prover, detail, now)
            elif outcome in LAST:
                prover.unreached = 0  # it was reached
                if outcome == "dropped":
                    ticket.dropped_by.add(prover.spec.uuid)
                    ticket.drops += 1
                    ticket.resend_at = now + min(RESEND_PAUSE_MAX_S, RESEND_PAUSE_S * ticket.drops)
                if outcome == "dropped":  # calls lost together on one connection: one failure
                    counts = _new_cause(prover, ticket, now, local=False)
                elif outcome == "expired":  # sent with less than a proof's time left, it was the queue's fault
                    counts = now - ticket.placed_at >= prover.spec.proof_s
                else:
                    counts = True
                if counts:
                    prover.answer_mark = (prover.placed, now)
                    prover.streak += 1
                    if prover.streak >= self.fail_threshold and not prover.ejected and self._may_eject(prover):
                        change = self._eject(prover, f"{prover.streak} calls in a row dropped, failed or held to"
                                             f" their deadline, the last {LAST[outcome]}"
                                             f"{f' ({detail})' if detail else ''}"
                                             f" (route.fail_threshold {self.fail_threshold})", now, answers=True)
            if outcome in ("expired", "abandoned"):  # cuzk proves on for a caller gone: the slot is not free yet
                prover.lingering.append(now + prover.spec.proof_s)
            if prover.gone and not prover.busy and self.provers.get(prover.spec.uuid) is prover:
                del self.provers[prover.spec.uuid]
            self._cond.notify_all()
            return change

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
            now = self.clock.monotonic()
            self._tick(now)
            oldest = min([t.arrived for t in self.held] + [u.arrived for u in self.unread], default=None)
            age = None if oldest is None else max(0.0, now - oldest)
            return {"held": len(self.held) + len(self.unread), "held_bytes": sum(t.size for t in self.held),
                    "unread": len(self.unread), "oldest_held_s": age,
                    "kept_bytes": self.kept_bytes,
                    "in_flight": sum(p.busy for p in self.provers.values()),
                    "provers": [{"uuid": p.spec.uuid, "label": p.spec.label, "endpoint": p.spec.endpoint,
                                 "slots": p.spec.slots, "busy": p.busy, "lingering": len(p.lingering),
                                 "streak": p.streak, "unreached": p.unreached, "ejections": p.ejections,
                                 "set_aside": p.set_aside,
                                 "back_in_s": None if p.out_until is None else max(0.0, p.out_until - now),
                                 "gone": p.gone}
                                for p in sorted(self.provers.values(), key=lambda p: p.spec.label)]}

    # --- inside the lock --------------------------------------------------------------------------------

    def _unreached(self, ticket: Ticket, prover: Prover, detail: str, now: float) -> Change | None:
        """A connect that failed: tried again after a pause that doubles, or ejected after fail_threshold in a
        row while another prover can take the held calls. A call placed before the last counted one is that
        failure again."""
        if not _new_cause(prover, ticket, now, local=True):
            return None
        prover.local_mark = (prover.placed, now)
        prover.unreached += 1
        why = f"{prover.unreached} connects in a row failed{f' ({detail})' if detail else ''}"
        if prover.ejected:
            return None
        if prover.unreached >= self.fail_threshold and self._may_eject(prover, connects=True):
            return self._eject(prover, f"{why} (route.fail_threshold {self.fail_threshold})", now, answers=False)
        pause = min(UNREACHED_MAX_S, UNREACHED_FIRST_S * 2 ** min(prover.unreached - 1, 30))
        prover.out_until = max(prover.out_until or now, now + pause)
        prover.set_aside = f"not reached: {why}; tried again in {pause:g}s"
        return Change(kind="retrying", why=why, seconds=pause)

    def _may_eject(self, prover: Prover, *, connects: bool = False) -> bool:
        """Within route.max_ejected_percent of the joined provers (at least one); for connects alone, only while
        another prover can take the held calls."""
        joined = [p for p in self.provers.values() if not p.gone]
        if sum(p.ejected for p in joined) >= max(1, len(joined) * self.max_ejected_percent // 100):
            return False
        return not connects or any(p is not prover and p.out_until is None for p in joined)

    def _eject(self, prover: Prover, why: str, now: float, *, answers: bool) -> Change:
        prover.ejections += 1
        prover.answer_ejections += answers
        seconds = self.ejection_base * min(prover.ejections, EJECTION_CAP)
        prover.out_until, prover.ejected = now + seconds, True
        prover.set_aside = f"ejected for {seconds:g}s (ejection {prover.ejections}): {why}"
        report = None
        if answers and prover.answer_ejections >= KILL_AFTER and not prover.reported:
            prover.reported = True  # out until it leaves the joined set (reconcile kills it)
            report = (f"ejected {prover.answer_ejections} times for failed answers with none good between, the"
                      f" last: {why}")
            prover.set_aside = f"reported: {report}"
        return Change(kind="ejected", why=why, seconds=seconds, report=report)

    def _tick(self, now: float) -> None:
        """What the clock ends: an ejection or a retry's pause (the prover is back), a lingering slot."""
        for prover in self.provers.values():
            if prover.lingering:
                prover.lingering = [until for until in prover.lingering if until > now]
            if prover.out_until is not None and now >= prover.out_until and not prover.reported:
                if prover.ejected:  # back by itself, its counts reset (as Envoy does); its ejections remembered
                    prover.streak = prover.unreached = 0
                    self._returned.append(prover.spec.label)
                prover.out_until, prover.ejected, prover.set_aside = None, False, None

    def _next_due(self, now: float) -> float | None:
        """Seconds until the clock ends something a held call may be waiting for."""
        due = [p.out_until for p in self.provers.values() if p.out_until is not None]
        due += [until for p in self.provers.values() for until in p.lingering]
        due += [t.resend_at for t in self.held if t.dropped_by]
        return min((at - now for at in due if at > now), default=None)

    def _turn(self, ticket: Ticket, now: float) -> Prover | None:
        """The prover this call takes now, if it is the first held call that can be placed."""
        for waiting in self.held:
            prover = self._best(waiting, now)
            if prover is not None:
                return prover if waiting is ticket else None
            if waiting is ticket:
                return None
        return None

    def _best(self, ticket: Ticket, now: float) -> Prover | None:
        joined = [p for p in self.provers.values() if not p.gone and not p.set_aside]
        fresh = [p for p in joined if p.spec.uuid not in ticket.dropped_by]
        if not fresh and now < ticket.resend_at:  # back to a prover that dropped it: give it a moment
            return None
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


def _new_cause(prover: Prover, ticket: Ticket, now: float, *, local: bool) -> bool:
    """Whether this failure has a cause of its own (module docstring, one cause)."""
    mark = prover.local_mark if local else prover.answer_mark
    if mark is None:
        return True
    age = now - mark[1]
    return not ((ticket.placed <= mark[0] and age <= SAME_CAUSE_S) or (not local and age <= SETTLE_S))


def _rejoin(prover: Prover, spec: ProverSpec) -> None:
    """A prover that left and joined again while calls of its last spell were out: the same object (those calls
    give their slots back to it), its health afresh."""
    fresh = Prover(spec=spec, busy=prover.busy, placed=prover.placed)
    for name in vars(fresh):
        setattr(prover, name, getattr(fresh, name))
