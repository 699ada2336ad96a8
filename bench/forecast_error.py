"""The planning policy's forecast against what came: per simulated hour, proofs forecast beside proofs arrived.

At the start of each hour of a `vastctl demo` day (the demo's progress callback, once an hour: one observe),
the forecast the planning policy makes then: vastctl/agent/plan_forecast.py's forecast() of HORIZON_SLOTS
slots of SLOT_S on observe() and read_past(), as agent-step builds them (vastctl/agent/step.py), the demand
held to its newest good sample while it is unknown, as plan.decide() does. Two hours of it are kept:

  next hour     the first 60 minutes (slots 0-5), of which the part the source times exactly: the slots
                within demand.lookahead_window when the source gives its arrival buckets (Forecast.timed)
  60-120 min    the hour after (slots 6-11): past the look-ahead, the profile (a day-old one, or a level held)

After the run each is set against the proofs the demo delivered in those minutes (DemoResult.samples: the
arrivals of each minute; a forecast made at minute m covers minutes m+1 .. m+60, as the demo's look-ahead
counts them, the arrivals of minute m being queued already). An hour the run does not reach in full is left out.

Figures of a day, over its hours (errors()):
  |err|/h   mean |forecast − arrived| per hour, in proofs, and as % of the hours' arrivals (Σ|err| / Σ arrived:
            an hour with nothing arriving counts its error, not a ratio)
  bias      Σ(forecast − arrived) / Σ arrived: + forecast too many over the day, − too few
  worst     the hour of the largest |err| (signed), named by the hour of the run it covers (h22: 22:00-23:00)

    python bench/control_loop.py --seeds 11 --levels default --fleets plan   # reports these beside the cost
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

from vastctl.agent import plan, plan_forecast
from vastctl.config import Config
from vastctl.demo import setting
from vastctl.observe import observe

HOUR_MINUTES = 60
SLOTS_PER_HOUR = round(HOUR_MINUTES * 60 / plan.SLOT_S)  # 6 slots of 10 min


@dataclass(frozen=True)
class HourForecast:
    """What the plan forecast at the start of one hour of the run."""

    minute: int  # the minute of the run it was made at (a whole hour)
    next_hour: float  # proofs in minutes minute+1 .. minute+60
    after: float  # proofs in minutes minute+61 .. minute+120 (the profile)
    timed: float | None = None  # of next_hour, the proofs of the slots the source times (None: it times none)
    timed_minutes: int = 0  # those slots' minutes, from minute+1
    known: bool = True  # False: demand unknown, the forecast is on its newest good sample


@dataclass(frozen=True)
class Errors:
    """A day's forecast error over its hours (module docstring)."""

    hours: int
    mean_abs: float  # proofs per hour
    mean_abs_pct: float | None  # Σ|err| / Σ arrived, %; None when nothing arrived
    bias_pct: float | None  # Σ(forecast − arrived) / Σ arrived, %
    worst: float  # the signed error of the worst hour
    worst_hour: int  # the hour of the run it covers
    arrived: float  # proofs arrived over the hours compared

    def mean(self) -> str:
        pct = "-" if self.mean_abs_pct is None else f"{self.mean_abs_pct:.1f}%"
        return f"{self.mean_abs:.1f} ({pct})"

    def bias_and_worst(self) -> str:
        bias = "-" if self.bias_pct is None else f"{self.bias_pct:+.1f}%"
        return f"{bias} / {self.worst:+.0f} at h{self.worst_hour}"


@dataclass(frozen=True)
class DayErrors:
    next_hour: Errors | None
    timed: Errors | None  # the timed part of the next hour, over the hours the source timed
    after: Errors | None  # 60-120 min ahead


def errors(compared: Sequence[tuple[int, float, float]]) -> Errors | None:
    """(hour of the run, forecast, arrived) of each hour → the day's figures; None without an hour."""
    if not compared:
        return None
    gaps = [(hour, forecast - arrived) for hour, forecast, arrived in compared]
    arrived = sum(actual for _hour, _forecast, actual in compared)
    absolute = sum(abs(gap) for _hour, gap in gaps)
    worst_hour, worst = max(gaps, key=lambda item: abs(item[1]))  # the first of equals
    return Errors(hours=len(gaps), mean_abs=absolute / len(gaps),
                  mean_abs_pct=absolute / arrived * 100 if arrived > 0 else None,
                  bias_pct=sum(gap for _hour, gap in gaps) / arrived * 100 if arrived > 0 else None,
                  worst=worst, worst_hour=worst_hour, arrived=arrived)


def arrived_between(rates: Sequence[float], first: int, minutes: int) -> float | None:
    """Proofs arrived in minutes first .. first+minutes-1 from the proofs/hour of each minute of the run; None when
    the run ends before."""
    if first < 0 or first + minutes > len(rates):
        return None
    return sum(rates[first:first + minutes]) / 60


def compare(forecasts: Sequence[HourForecast], rates: Sequence[float]) -> DayErrors:
    """The recorded forecasts against the arrivals (proofs/hour of each minute of the run)."""
    next_hour, timed, after = [], [], []
    for made in forecasts:
        hour = made.minute // HOUR_MINUTES
        came = arrived_between(rates, made.minute + 1, HOUR_MINUTES)
        if came is not None:
            next_hour.append((hour, made.next_hour, came))
        if made.timed is not None and made.timed_minutes > 0:
            part = arrived_between(rates, made.minute + 1, made.timed_minutes)
            if part is not None:
                timed.append((hour, made.timed, part))
        later = arrived_between(rates, made.minute + 1 + HOUR_MINUTES, HOUR_MINUTES)
        if later is not None:
            after.append((hour + 1, made.after, later))
    return DayErrors(next_hour=errors(next_hour), timed=errors(timed), after=errors(after))


class ForecastLog:
    """The demo's progress callback: the plan's forecast at the start of each simulated hour, read from the demo's
    state file (read-only) after that minute's agent-step."""

    def __init__(self) -> None:
        self.config: Config | None = None
        self.conn: sqlite3.Connection | None = None
        self.forecasts: list[HourForecast] = []

    def configure(self, then: Callable[[Config], None] | None) -> Callable[[Config], None]:
        """The `configure` for day.run: `then`'s changes, and the config kept for the callback."""
        def keep(config: Config) -> None:
            if then is not None:
                then(config)
            self.config = config
        return keep

    def minute(self, done: int, _total: int) -> None:
        minute = done - 1  # the minute just run; the clock is past it, its demand report is at its start
        if minute % HOUR_MINUTES:
            return
        config = self.config
        assert config is not None, "pass configure=log.configure(...) to day.run"
        if self.conn is None:
            self.conn = sqlite3.connect(f"file:{Path(config.db_path)}?mode=ro", uri=True)
            self.conn.row_factory = sqlite3.Row
        now = setting.START + timedelta(minutes=minute)
        obs = observe(self.conn, config, now=now)
        known = obs.demand.known
        if not known:
            held = plan._held_to_last(obs, config)  # what plan.decide forecasts on
            if held is None:  # never known: the plan sizes as the rules do, no forecast
                return
            obs = held
        past = plan_forecast.read_past(self.conn, config, now, plan.HORIZON_SLOTS, plan.SLOT_S)
        made = plan_forecast.forecast(obs, config, past, plan.HORIZON_SLOTS, plan.SLOT_S)
        ahead = made.arrivals
        # the slots the source times exactly: within the look-ahead window, its buckets of now (not a held sample's)
        exact = min(SLOTS_PER_HOUR, int(config.demand.lookahead_window // plan.SLOT_S)) if made.timed and known else 0
        self.forecasts.append(HourForecast(
            minute=minute, next_hour=sum(ahead[:SLOTS_PER_HOUR]), after=sum(ahead[SLOTS_PER_HOUR:2 * SLOTS_PER_HOUR]),
            timed=sum(ahead[:exact]) if exact else None, timed_minutes=round(exact * plan.SLOT_S / 60), known=known))

    def finish(self, rates: Sequence[float]) -> DayErrors:
        """Close the file; the day's figures against the arrivals of each minute (DemoResult.samples)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        return compare(self.forecasts, rates)
