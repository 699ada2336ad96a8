"""The day's proofs as the proof router's calls: whole calls in proof_calls, and the proof waits read from them.

The router (vastctl/route/) records every call it delivered, and vastctl believes those rows over what a
machine claims (facts/deliveries.py): a machine's proofs in `cost`, its routed rate in the observation, the
proof waits of `fleet --json`, /metrics and the dashboard. The simulated day writes the same rows, so it
runs through that accounting, and its proof-wait figures are production's function over them.
"""

from __future__ import annotations

import bisect
import heapq
import math
import sqlite3
from datetime import timedelta
from typing import TypedDict

from vastctl import clock as clocks
from vastctl.demo.setting import START, STEP_S
from vastctl.facts import deliveries
from vastctl.facts.deliveries import CallRecord
from vastctl.providers.sim_engine import Share


class RoutedCalls:
    """The day's proofs as the proof router records them: whole calls, each a proof_calls row.

    The market proves in fractions of a proof a minute (sim_engine.Share). Each machine keeps the fraction it
    has not yet made a call of, and takes a call at the moment within the minute its share reaches the next
    whole proof, so its calls stay within one of its proofs. Calls are first come first proved: a call taken
    at a moment is the proof at the head of the queue then, the one whose arrival the proofs done so far (the
    market's, in fractions, spread evenly over each minute as the arrivals are) have reached; counting whole
    calls instead would hold a fraction left on a machine through a quiet spell as a proof waiting. Its row, in the router's shape (route/server.py): kind porep, the machine's uuid and label, result
    completed, attempt 1, held = taken − arrived, on the prover the time one proof takes that machine at its
    true rate with `slots` calls at once (slots × 3600 / rate; the daemon's total_ms the same, its queue and
    SRS load nothing: the simulator does not split a proof further), answered (`at`) when that ends.

    A row is written (deliveries.record_calls) once the clock passes its end, as the router writes a call
    when it ends. `finish` writes, at the day's end, the calls still on a prover (taken before the end,
    answered after it) and, for each proof still queued that has waited past max_wait, a call the router
    held until the end: result expired, never sent (attempt 0, no machine), its held time its wait so far.
    Those are the late the answered calls' figures leave out (`late`); younger ones are not judged.
    """

    KIND = "porep"  # route/wire.KIND_NAMES: the demand curve's work is PoRep
    REQUEST_BYTES = 51_000_000  # a 32 GiB PoRep's C1 output, as Curio sends it (the published c1.json: ~51 MB)

    def __init__(self, conn: sqlite3.Connection, *, slots: int):
        self.conn = conn
        self.slots = slots
        self.taken = 0  # calls taken so far (the number of the last)
        self.late = 0  # expired calls `finish` wrote
        self.until = START  # past the end of every row written
        self._arrived = [0.0]  # proofs arrived by the start of each minute (and the end of the last)
        self._done = 0.0  # the market's proofs so far, in fractions
        self._remainder: dict[int, float] = {}  # vast id → the fraction of a proof not yet a call
        self._pending: list[tuple[float, int, CallRecord]] = []  # (end s, order, row) not yet written
        self._queued = 0

    def arrive(self, proofs: float) -> None:
        """The next minute's arrivals."""
        self._arrived.append(self._arrived[-1] + max(0.0, proofs))

    def take(self, minute: int, shares: list[Share]) -> None:
        """The machines' shares of minute `minute`'s work as calls; the calls ended by its end written."""
        begin = minute * STEP_S
        done, served = self._done, sum(share.proofs for share in shares)
        moments = []
        for share in shares:
            before = self._remainder.get(share.vast_id, 0.0)
            whole = math.floor(before + share.proofs + 1e-9)
            for j in range(1, whole + 1):  # the share of the minute at which it reaches the j-th proof
                moments.append((min(1.0, max(0.0, (j - before) / share.proofs)), share.vast_id, share))
            self._remainder[share.vast_id] = max(0.0, before + share.proofs - whole)
        self._done += served
        for part, _vast_id, share in sorted(moments, key=lambda item: item[:2]):
            self.taken += 1
            at = begin + STEP_S * part
            held = max(0.0, at - self._arrival(done + served * part))  # every machine's share runs evenly
            prover = self.slots * 3600 / share.rate
            self._queue(at + prover, {"request_id": f"sim-{self.taken}", "kind": self.KIND, "uuid": share.uuid,
                                      "label": share.label, "result": "completed", "held_ms": _ms(held),
                                      "prover_ms": _ms(prover), "attempt": 1, "size_bytes": self.REQUEST_BYTES,
                                      "queue_wait_ms": 0, "srs_load_ms": 0, "total_ms": _ms(prover)})
        self._write(begin + STEP_S)

    def finish(self, minutes: int, max_wait_s: float) -> None:
        """At the end of minute `minutes`: every call taken written, and the late proofs still queued."""
        end = minutes * STEP_S
        self._write(math.inf)
        head = math.floor(self._done + 1e-9)  # the whole proofs the market did; the next is (partly) still queued
        while head + 1 <= self._arrived[-1] + 1e-9:
            head += 1
            waited = end - self._arrival(head)
            if waited <= max_wait_s:
                break  # the rest arrived later still: not yet late, not judged
            self.late += 1
            self._queue(end, {"request_id": f"sim-{self.taken + self.late}", "kind": self.KIND, "result": "expired",
                              "held_ms": _ms(waited), "attempt": 0, "size_bytes": self.REQUEST_BYTES,
                              "detail": "still held at the end of the simulated day, past agent.max_wait"})
        self._write(math.inf)

    def _arrival(self, number: float) -> float:
        """Seconds from the start at which the arrivals reached `number` proofs."""
        index = min(len(self._arrived) - 1, max(1, bisect.bisect_left(self._arrived, number - 1e-9)))
        low, high = self._arrived[index - 1], self._arrived[index]
        return (index - 1 + (min(1.0, (number - low) / (high - low)) if high > low else 1.0)) * STEP_S

    def _queue(self, end: float, row: CallRecord) -> None:
        self._queued += 1  # ties in the order queued
        heapq.heappush(self._pending, (end, self._queued, row))

    def _write(self, until: float) -> None:
        rows: list[CallRecord] = []
        while self._pending and self._pending[0][0] <= until:
            end, _order, row = heapq.heappop(self._pending)
            moment = START + timedelta(seconds=end)
            rows.append({**row, "at": clocks.to_iso(moment)})
            self.until = max(self.until, moment + timedelta(microseconds=1))
        deliveries.record_calls(self.conn, rows)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class DayWaits(TypedDict):
    """The day's proof waits (proof_waits): the calls judged, the share within max_wait, the answered calls'
    percentiles (s; None without any)."""

    judged: int
    within: float | None
    p50: float | None
    p95: float | None
    p99: float | None


def proof_waits(conn: sqlite3.Connection, calls: RoutedCalls, max_wait_s: float) -> DayWaits:
    """The day's proof waits as production measures them (deliveries.proof_wait over the day's calls: held +
    proving time of each answered call, `fleet --json`'s and /metrics' figures), with the proofs still held
    past max_wait at the end counted as late in the share within it (the percentiles are the answered calls')."""
    waits = deliveries.proof_wait(conn, since=START, until=calls.until, max_wait_s=max_wait_s)
    judged = waits["calls"] + calls.late
    within = waits["within_max_wait"]
    if calls.late and judged:
        within = round((within or 0.0) * waits["calls"] / judged, 4)
    return {"judged": judged, "within": within, "p50": waits["p50_s"], "p95": waits["p95_s"], "p99": waits["p99_s"]}


def wait_minutes(conn: sqlite3.Connection, calls: RoutedCalls) -> dict[int, float]:
    """Whole minutes waited → calls judged (answered, and the late still held): the chart's histogram."""
    weights: dict[int, float] = {}
    for (wait_ms,) in conn.execute(
            "SELECT held_ms + coalesce(prover_ms, 0) FROM proof_calls WHERE at >= ? AND at < ?"
            " AND result IN ('completed', 'failed', 'expired')", (clocks.to_iso(START), clocks.to_iso(calls.until))):
        minute = int((wait_ms or 0) // 60_000)
        weights[minute] = weights.get(minute, 0.0) + 1
    return weights
