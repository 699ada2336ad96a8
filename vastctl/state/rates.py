"""What a machine's rate counts for: the benchmark gate, the heartbeat's counters, and their bounds.

What a machine says it proves is a claim. Before it is stored it is bounded by what is physically plausible
(plausible.py): a bench rate by rate_ceiling(), a rate measured from heartbeats by measured_rate_bound(), a
counter's rise by what the machine could have proved since its last heartbeat; a claim bounded is kept in an
`implausible_rate` event. What is stored is what counts: nothing bounds it again when it is read. The reports
themselves (bench_report, heartbeat) are idempotent like every instance report, and move the row through
lifecycle.py's transitions.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime

from vastctl import clock, validate
from vastctl.errors import BenchFailed, Refused
from vastctl.state.db import transaction
from vastctl.state.lifecycle import KillCode, S, get, kill_in_tx, record_event, transition_in_tx, update_fields
from vastctl.state.plausible import (
    HEARTBEAT_RATE_FACTOR,
    MAX_RATE_PER_GPU,
    measured_rate_bound,
    rate_ceiling,
    within,
)
from vastctl.state.rows import InstanceChanges, InstanceRow
from vastctl.validate import Invalid

RATE_TIME_CONSTANT_S = 30 * 60  # proofs/hour is smoothed over about half an hour of heartbeats
RATE_MIN_WINDOW_S = 10 * 60  # with no benchmark to start from, a first rate needs at least this much counting
BUSY_WINDOW_S = 10 * 60  # work for this long at the fleet's rate keeps every machine busy between two heartbeats
WORK_SAMPLE_AGE_S = 5 * 60  # a demand sample older than this says nothing of whether work waited at a heartbeat
BURST_PROOFS = 10  # proofs one heartbeat may add beyond its plausible share (a -j 5 batch landing at once)
IMPLAUSIBLE = "implausible_rate"  # the event kind of a claim bounded because it was not plausible
IMPLAUSIBLE_EVENT_EVERY_S = 60 * 60  # a machine that keeps over-claiming is recorded once an hour, not every beat


# --- a report's rate and count: their rules, applied once where each enters (lifecycle.py, "the reports", says
# where and why); bench_report and heartbeat take them typed and check nothing again.


def validate_rate(rate: object) -> float:
    """A benchmark rate is a finite number ≥ 0 (proofs per hour); from a command line, its text."""
    if validate.number(rate, text=True) is None and not isinstance(rate, bool):
        raise Invalid("rate", f"must be a number of proofs per hour, got {validate.shown(rate)}")
    return validate.finite(rate, "rate", what=" (proofs per hour)", text=True)


def validate_proofs(proofs_done: object) -> int:
    """A heartbeat's count is a whole number the file can store (the prover's cumulative count)."""
    return validate.whole(proofs_done, "proofs_done", what=" (the cumulative count)")


def _record_implausible(conn: sqlite3.Connection, row: InstanceRow, reason: str, *, now: datetime,
                        throttle: bool) -> None:
    if throttle:
        last = conn.execute("SELECT at FROM events WHERE uuid = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                            (row["uuid"], IMPLAUSIBLE)).fetchone()
        since = clock.from_iso(last["at"]) if last else None
        if since is not None and (now - since).total_seconds() < IMPLAUSIBLE_EVENT_EVERY_S:
            return
    record_event(conn, kind=IMPLAUSIBLE, source="instance", reason=reason, now=now, uuid=row["uuid"],
                 label=row["label"], code=IMPLAUSIBLE)


def bench_report(
    conn: sqlite3.Connection, uuid: str, claimed: float, *, gate: float, now: datetime
) -> InstanceRow:
    """The benchmark gate: at or above `gate` → bench_done; below → killed, and BenchFailed is raised.

    `claimed` is a rate validate_rate() passed. One above the machine's rate_ceiling() is stored as that
    ceiling, with an `implausible_rate` event keeping the claim: no figure a machine makes up reaches capacity
    or the ranking. BenchFailed carries the row in `.row`; the kill is committed before it is raised.
    """
    with transaction(conn):
        row = get(conn, uuid)
        rate = min(claimed, rate_ceiling(row))
        updates = within(row, {"bench_rate": rate})  # a restarted machine's measured rate, under its new bench
        repeated = row["bench_rate"] == rate and (
            row["state"] == S.BENCH_DONE or (row["state"] == S.KILLED and row["kill_code"] == KillCode.BENCH_FAILED)
        )
        if repeated:  # the same report again: answer as before, no second event
            result = row
        elif rate >= gate:
            result = transition_in_tx(conn, uuid, S.BENCH_DONE, f"bench rate {rate:g} meets gate {gate:g}",
                                       "instance", updates=updates, now=now)
        else:
            result = kill_in_tx(conn, uuid, f"bench rate {rate:g} below gate {gate:g}", source="instance",
                                code=KillCode.BENCH_FAILED, updates=updates, now=now)
        if claimed > rate and not repeated:
            _record_implausible(conn, row, now=now, throttle=False, reason=(
                f"bench rate {claimed:g} proofs/h is not plausible for {row['num_gpus'] or 1} GPU(s): counted as"
                f" {rate:g} (at most {MAX_RATE_PER_GPU:g}/h per GPU)"))
    if result["state"] == S.BENCH_DONE:
        return result
    error = BenchFailed(f"instance {result['label']}: {result['kill_reason']}; it is being killed, do not prove")
    error.row = result
    raise error


def heartbeat(
    conn: sqlite3.Connection, uuid: str, *, proofs_done: int | None = None, now: datetime
) -> InstanceRow:
    """Keep the machine's liveness and proof counters fresh. Not a transition, so no event.

    proofs_per_hour is an exponentially weighted rate over the counter's
    increments, started from the benchmark, so each heartbeat moves it in
    proportion to the time it covers: two heartbeats 30 s apart cannot swing a
    machine benched at 70/h to 480/h. A counter that went down (the prover
    restarted) starts a new baseline, keeps the rate, and is recorded as a
    `counter_reset` event. proofs_done is the daemon's raw counter as last
    reported; proofs_total (what cost counts) adds up every run's proofs,
    each heartbeat crediting no more than counted_increment() allows. `proofs_done` is a count
    validate_proofs() passed.
    """
    with transaction(conn):
        row = get(conn, uuid)
        if row["state"] == S.KILLED:
            raise Refused(f"instance {row['label']} was killed ({row['kill_reason']}): stop proving and shut down")
        updates = InstanceChanges(last_heartbeat_at=clock.to_iso(now))
        if proofs_done is not None:
            updates["proofs_done"] = proofs_done
            rate, implausible = _smoothed_rate(row, proofs_done, now, busy=_work_waited(conn, now))
            updates["proofs_per_hour"] = rate
            reset = proofs_done < (row["proofs_done"] or 0)
            credited, over = counted_increment(row, proofs_done, now)
            total = updates["proofs_total"] = row["proofs_total"] + credited
            if implausible or over:
                _record_implausible(conn, row, implausible or over or "", now=now, throttle=True)
            if reset:
                record_event(conn, kind="counter_reset", source="instance", now=now, uuid=uuid, label=row["label"],
                             reason=f"proof counter fell from {row['proofs_done']} to {proofs_done}:"
                                    f" the prover restarted; its {proofs_done} count as a new run (total"
                                    f" {total}), the rate is kept")
        update_fields(conn, uuid, updates)
        return get(conn, uuid)


def counted_increment(row: InstanceRow, proofs_done: int, now: datetime) -> tuple[int, str | None]:
    """The proofs a heartbeat adds to the machine's total, and why fewer than it claimed (None: all of them).

    A count at or above the last one adds the difference; one below it is a new run (a restarted daemon,
    a resumed machine) and adds itself. Either way no more than the machine could have proved since its last
    heartbeat (or since it was rented, for the first) at measured_rate_bound(), plus BURST_PROOFS: the
    rate path's bounds, so one heartbeat of 10^18 adds what a minute of proving can.
    """
    last = row["proofs_done"] or 0
    claimed = proofs_done - last if proofs_done >= last else proofs_done
    since = clock.from_iso(row.get("last_heartbeat_at")) or clock.from_iso(row.get("created_at"))
    elapsed = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
    bound = measured_rate_bound(row)
    most = int(bound * elapsed / 3600) + BURST_PROOFS
    if claimed <= most:
        return claimed, None
    return most, (f"proof counter claimed {claimed} proofs in {clock.human_duration(elapsed)}: not plausible for"
                  f" a machine bounded at {bound:g} proofs/h ({_bound_source(row)}); {most} counted")


def _work_waited(conn: sqlite3.Connection, now: datetime) -> bool:
    """False when the newest demand sample (at most WORK_SAMPLE_AGE_S old) held less work than the machines
    running prove in BUSY_WINDOW_S: then they may have idled, and a heartbeat's count says how much work a
    machine was given, not how fast it proves. True otherwise (work waited, or nothing says it did not)."""
    newest = conn.execute("SELECT at, queued FROM demand_samples WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    at = clock.from_iso(newest["at"]) if newest is not None else None
    if at is None or newest["queued"] is None or (now - at).total_seconds() > WORK_SAMPLE_AGE_S:
        return True
    (fleet_rate,) = conn.execute("SELECT coalesce(sum(coalesce(proofs_per_hour, bench_rate, 0)), 0) FROM instances"
                                 " WHERE state = ?", (S.RUNNING,)).fetchone()
    return int(newest["queued"]) >= float(fleet_rate) * BUSY_WINDOW_S / 3600


def _smoothed_rate(row: InstanceRow, proofs_done: int, now: datetime, *,
                   busy: bool = True) -> tuple[float | None, str | None]:
    """The rate after this heartbeat, and why it was bounded when the counter rose implausibly fast.

    The sample since the last heartbeat is weighted by the time it covers; the rate never exceeds
    measured_rate_bound(), and a counter that rose by more than that bound allows (plus BURST_PROOFS)
    counts as that bound and is the reason returned: a leap by 2^63 moves the rate to the bound, no further.
    """
    last = clock.from_iso(row["last_heartbeat_at"])
    bound = measured_rate_bound(row)
    previous_rate: float | None = row["proofs_per_hour"]  # stored within its bound
    if last is None or row["state"] != S.RUNNING:
        return previous_rate, None
    elapsed = (now - last).total_seconds()
    increment = proofs_done - (row["proofs_done"] or 0)
    if elapsed <= 0 or increment < 0:
        return previous_rate, None
    why = None
    sample = increment * 3600.0 / elapsed  # a proof landing just after a beat reads high alone: the weight evens it
    if increment > bound * elapsed / 3600 + BURST_PROOFS:
        why = (f"proof counter rose by {increment} in {clock.human_duration(elapsed)}: not plausible for a machine"
               f" bounded at {bound:g} proofs/h ({_bound_source(row)}); counted at that rate")
        sample = bound
    start: float | None = previous_rate if previous_rate is not None else row["bench_rate"]
    if start is not None and sample < start and not busy:
        return start, why  # fewer proofs with no work waiting: idle, not slow (a count is not a capacity)
    if start is None:  # nothing measured before: a rate only from a window long enough to mean something
        return (min(sample, bound) if elapsed >= RATE_MIN_WINDOW_S else None), why
    weight = 1 - math.exp(-elapsed / RATE_TIME_CONSTANT_S)
    return min(start + weight * (sample - start), bound), why


def _bound_source(row: InstanceRow) -> str:
    bench = row.get("bench_rate")
    if bench is not None and measured_rate_bound(row) < rate_ceiling(row):
        return f"{HEARTBEAT_RATE_FACTOR:g} × its bench rate {float(bench):g}"
    return f"{MAX_RATE_PER_GPU:g}/h per GPU"
