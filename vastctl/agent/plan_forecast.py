"""The planning policy's forecast: proofs arriving in each slot of its horizon, and how long the queue has waited.

Within demand.lookahead_window the look-ahead count says how many proofs come; its shape is a straight line
through two figures, the rate of the past window (the look-ahead of the good sample taken one window ago: what
was then coming has arrived since) and the coming window's, scaled so the window holds exactly the count. Past
the window: the same slot a day earlier (the look-ahead then), scaled by today's level against that day's, when
the state file has it; else the line's rate at the window's end, held. A source silent on the look-ahead gives
its proofs_per_hour, flat.

When the source also says when its look-ahead comes (Demand.arrivals: the count of each ARRIVAL_BUCKET_S from
now), those counts replace the line where the source knows them: within the look-ahead window each bucket's proofs
fall in its own 10 minutes (spread evenly inside it), and the look-ahead's proofs no bucket times (no seed epoch
yet) come at the window's end, or in the window's part past the last bucket. Buckets past the window count only
sectors already precommitted, so there a slot gets the larger of its buckets' count and the profile's. Past the
buckets and the window, the profile as above, except that the level held (no day-old profile) is the rate of the
window's last 20 timed minutes instead of the line's end; without arrivals, all as above.

The queue's age is not in a sample: first come first proved, the proofs waiting are the newest arrivals, so the
oldest has waited about queued / the arrival rate of the past window. read_past() is the only part that reads the
file (a few indexed reads of demand_samples); the rest is pure.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta

from vastctl import clock
from vastctl.config import Config
from vastctl.facts.demand import ARRIVAL_BUCKET_S
from vastctl.observe import Observation

DAY = timedelta(days=1)
END_S = 20 * 60.0  # the source's last 20 minutes within the window give the level held past it (seeds 1 2 3)
LEVEL_SCALE = (0.5, 2.0)  # a day-old profile is scaled by today's level against its own, within these bounds


@dataclass(frozen=True)
class DemandPast:
    """What the state file's demand samples say beyond the observation's window (read_past)."""

    last_window: int | None = None  # arrivals in the past lookahead window: the look-ahead one window ago
    ago: tuple[int | None, ...] = ()  # the look-ahead one, two, ... slots ago, up to one window ago
    day_before_now: float | None = None  # the look-ahead a day ago (proofs in the window then)
    day_before: tuple[float | None, ...] = ()  # the look-ahead a day ago at each slot's start


@dataclass(frozen=True)
class Forecast:
    """Proofs arriving in each slot, and what the queue now is made of."""

    arrivals: tuple[float, ...]  # proofs per slot
    backlog: float  # queued + in flight (or held at the proof router)
    backlog_age_s: float  # how long the oldest of it has waited (estimated, first come first proved)
    past_rate: float | None  # proofs/h arriving over the past window, when known
    coming_rate: float  # proofs/h the coming window brings
    beyond: str  # how the slots past the look-ahead window were forecast, in words
    # proofs that arrived in the last k slots (k = 0, 1, ...): the queue is the newest of them; empty when unknown
    arrived_within: tuple[float, ...] = ()
    timed: bool = False  # the look-ahead window's proofs are where the source's arrival buckets put them


def read_past(conn: sqlite3.Connection, config: Config, now: datetime, slots: int, slot_s: float) -> DemandPast:
    """The look-ahead one window ago, and a day ago at each slot of the horizon (good samples only, none older
    than demand.stale_after at the time asked)."""
    window = config.demand.lookahead_window
    if window <= 0:
        return DemandPast()
    then = _lookahead_at(conn, now - timedelta(seconds=window), config.demand.stale_after)
    ago = tuple(_lookahead_at(conn, now - timedelta(seconds=k * slot_s), config.demand.stale_after)
                for k in range(1, int(window // slot_s) + 1))
    day_now = _lookahead_at(conn, now - DAY, config.demand.stale_after)
    day: tuple[float | None, ...] = ()
    if day_now is not None:
        day = tuple(_lookahead_at(conn, now - DAY + timedelta(seconds=k * slot_s), config.demand.stale_after)
                    for k in range(slots))
    return DemandPast(last_window=then, ago=ago, day_before_now=day_now, day_before=tuple(float(v) if v is not None else None
                                                                                  for v in day))


def _lookahead_at(conn: sqlite3.Connection, at: datetime, stale_after: float) -> int | None:
    row = conn.execute("SELECT at, lookahead FROM demand_samples WHERE ok = 1 AND lookahead IS NOT NULL AND at <= ?"
                       " ORDER BY at DESC LIMIT 1", (clock.to_iso(at),)).fetchone()
    if row is None:
        return None
    taken = clock.from_iso(row["at"])
    if taken is None or (at - taken).total_seconds() > stale_after:
        return None
    return int(row["lookahead"])


def forecast(obs: Observation, config: Config, past: DemandPast, slots: int, slot_s: float) -> Forecast:
    """The arrivals of each slot of the horizon, and the queue's size and age now."""
    demand = obs.demand
    backlog = float((demand.queued or 0) + max(demand.in_flight or 0, demand.held or 0))
    window = config.demand.lookahead_window
    hours = slot_s / 3600
    coming = coming_rate(demand.lookahead, demand.proofs_per_hour, window)
    if demand.lookahead is None or window <= 0:
        return Forecast(arrivals=tuple(coming * hours for _ in range(slots)), backlog=backlog,
                        backlog_age_s=_age(backlog, coming), past_rate=coming if coming > 0 else None,
                        coming_rate=coming, beyond="the source's proofs/h, flat (no look-ahead)")
    earlier = None if past.last_window is None else float(past.last_window) / (window / 3600)
    slope = 0.0 if earlier is None else (coming - earlier) / window  # proofs/h per second
    line = [max(0.0, coming + slope * ((k + 0.5) * slot_s - window / 2)) for k in range(slots)]
    partial = [min(slot_s, max(0.0, window - k * slot_s)) / slot_s for k in range(slots)]
    held = sum(line[k] * hours * partial[k] for k in range(slots))
    scale = float(demand.lookahead) / held if held > 0 else 0.0
    edge = max(0.0, coming + slope * window / 2)
    end_rate = _timed_end_rate(demand.arrivals or (), float(demand.lookahead), window)
    if end_rate is not None:
        edge = end_rate
    arrivals = []
    day_scale = None
    if past.day_before_now and past.day_before_now > 0:
        day_scale = min(LEVEL_SCALE[1], max(LEVEL_SCALE[0], float(demand.lookahead) / past.day_before_now))
    beyond = f"held at the window's end rate {edge:.0f}/h" + (" (its last timed 20m)" if end_rate is not None else "")
    beyond_rates: list[float] = []  # proofs/h of each slot past the window (the profile)
    for k in range(slots):
        share = partial[k]
        inside = line[k] * scale * hours * share if held > 0 else (coming * hours * share)
        later = edge
        day = past.day_before[k] if k < len(past.day_before) else None
        if day_scale is not None and day is not None:
            later = day / (window / 3600) * day_scale
            beyond = f"a day ago at the same time, × {day_scale:.2f} for today's level"
        arrivals.append(inside + later * hours * (1 - share))
        beyond_rates.append(later)
    if demand.arrivals:  # the source times its look-ahead (an empty list times nothing)
        arrivals = timed(demand.arrivals, float(demand.lookahead), beyond_rates, slot_s, window)
    arrived = _arrived_within(past, arrivals, slots, slot_s, window)
    age = _age(backlog, earlier if earlier else coming)
    if arrived and backlog > 0:
        age = _age_from(arrived, backlog, slot_s, earlier if earlier else coming)
    router = obs.router.oldest_held_s if obs.router.fresh else None
    return Forecast(arrivals=tuple(arrivals), backlog=backlog, backlog_age_s=max(age, router or 0.0),
                    past_rate=earlier, coming_rate=coming, beyond=beyond, arrived_within=arrived,
                    timed=bool(demand.arrivals))


def coming_rate(lookahead: int | None, proofs_per_hour: float | None, window: float) -> float:
    """Proofs/h a sample has coming: its look-ahead over demand.lookahead_window, else its proofs/h."""
    if lookahead is None or window <= 0:
        return float(proofs_per_hour or 0.0)
    return float(lookahead) / (window / 3600)


def timed(buckets: tuple[int, ...], lookahead: float, beyond_rates: list[float], slot_s: float,
          window: float) -> list[float]:
    """The proofs of each slot from the source's arrival buckets (module docstring): exact within the window,
    at least the profile's (`beyond_rates`, proofs/h) past it, the look-ahead no bucket times at the window's end."""
    width = float(ARRIVAL_BUCKET_S)
    reach = len(buckets) * width
    exact_end = min(window, reach)
    untimed = max(0.0, lookahead - sum(buckets))
    untimed_from = max(0.0, min(reach, window - width))  # the window's end, or its part no bucket covers (as above)
    arrivals = []
    for k, rate in enumerate(beyond_rates):
        start, end = k * slot_s, (k + 1) * slot_s
        count = 0.0
        floor = 0.0  # what buckets past the window know for this slot: sectors precommitted so far
        for i, n in enumerate(buckets):
            count += n * _overlap(start, end, i * width, min((i + 1) * width, exact_end)) / width
            floor += n * _overlap(start, end, max(i * width, window), (i + 1) * width) / width
        if window > untimed_from:
            count += untimed * _overlap(start, end, untimed_from, window) / (window - untimed_from)
        profile = rate / 3600
        count += max(floor, profile * _overlap(start, end, window, max(window, reach)))
        count += profile * _overlap(start, end, max(window, reach), end)
        arrivals.append(count)
    return arrivals


def _timed_end_rate(buckets: tuple[int, ...], lookahead: float, window: float) -> float | None:
    """Proofs/h of the window's last END_S as timed() lays them out (the buckets in it, the untimed at the window's
    end): the level held past it, counted where the line's end extrapolates. None when no bucket reaches into it."""
    width = float(ARRIVAL_BUCKET_S)
    reach = len(buckets) * width
    start = max(0.0, window - END_S)
    if not buckets or reach <= start:
        return None
    untimed_from = max(0.0, min(reach, window - width))
    count = sum(n * _overlap(start, window, i * width, min((i + 1) * width, window)) / width for i, n in enumerate(buckets))
    if window > untimed_from:
        count += max(0.0, lookahead - sum(buckets)) * _overlap(start, window, untimed_from, window) / (window - untimed_from)
    return count / ((window - start) / 3600)


def _overlap(start: float, end: float, low: float, high: float) -> float:
    """Seconds of [start, end) within [low, high)."""
    return max(0.0, min(end, high) - max(start, low))


def _arrived_within(past: DemandPast, arrivals: list[float], slots: int, slot_s: float,
                    window: float) -> tuple[float, ...]:
    """Proofs that arrived in the last k slots: what was coming k slots ago (its look-ahead) less what of it is
    still to come (the forecast's first window − k slots); () when a look-ahead of the past window is missing."""
    if not past.ago or any(value is None for value in past.ago):
        return ()
    found = [0.0]
    per_window = int(window // slot_s)
    for k, coming in enumerate(past.ago, start=1):
        still = sum(arrivals[:max(0, min(slots, per_window - k))])
        found.append(max(found[-1], float(coming or 0) - still))
    return tuple(found)


def _age_from(within: tuple[float, ...], backlog: float, slot_s: float, rate: float) -> float:
    """The oldest queued proof's age: the newest `backlog` arrivals reach back this far (past the window, at the
    past window's rate)."""
    for k in range(1, len(within)):
        if within[k] >= backlog:
            step = within[k] - within[k - 1]
            return (k - 1 + ((backlog - within[k - 1]) / step if step > 0 else 1.0)) * slot_s
    last = (len(within) - 1) * slot_s
    return last + (_age(backlog - within[-1], rate) if rate > 0 else DAY.total_seconds())


def _age(backlog: float, rate: float) -> float:
    """How long the oldest of `backlog` has waited if it is the newest arrivals at `rate` proofs/h (first come
    first proved); a queue with nothing arriving is taken as old as a day."""
    if backlog <= 0:
        return 0.0
    if rate <= 0:
        return DAY.total_seconds()
    return backlog / rate * 3600
