"""The forecast-error figures of bench/forecast_error.py: recorded forecasts against the arrivals of each minute.

A forecast made at minute m covers minutes m+1 .. m+60 (the arrivals of minute m are queued already) and, for
the profile, m+61 .. m+120; the figures are the mean |err| per hour, its share of the hours' arrivals, the bias
over the day and the worst hour."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("forecast_error", ROOT / "bench" / "forecast_error.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("forecast_error", module)
    spec.loader.exec_module(module)
    return module


forecast_error = _load()
HourForecast = forecast_error.HourForecast


def test_the_figures_of_a_day_from_forecast_and_arrived_hours():
    figures = forecast_error.errors([(0, 70.0, 60.0), (1, 57.0, 60.0), (2, 5.0, 0.0)])  # +10, -3, +5 over 120

    assert figures.hours == 3
    assert figures.mean_abs == pytest.approx(6.0)
    assert figures.mean_abs_pct == pytest.approx(15.0)  # 18 / 120: the quiet hour's error counts, not as a ratio
    assert figures.bias_pct == pytest.approx(10.0)  # +12 / 120
    assert (figures.worst, figures.worst_hour) == (pytest.approx(10.0), 0)
    assert figures.arrived == pytest.approx(120.0)
    assert figures.mean() == "6.0 (15.0%)"
    assert figures.bias_and_worst() == "+10.0% / +10 at h0"


def test_no_hour_gives_no_figures_and_nothing_arrived_no_ratio():
    assert forecast_error.errors([]) is None
    quiet = forecast_error.errors([(16, 4.0, 0.0), (17, -2.0, 0.0)])
    assert quiet.mean_abs == pytest.approx(3.0)
    assert quiet.mean_abs_pct is None and quiet.bias_pct is None
    assert (quiet.worst, quiet.worst_hour) == (pytest.approx(4.0), 16)
    assert quiet.mean() == "3.0 (-)"


def test_forecasts_are_set_against_the_minutes_they_cover():
    # proofs/hour of each minute: minute 0 is queued before the forecast (never counted), then 60/h, 120/h, 30/h
    rates = [6000.0] + [60.0] * 60 + [120.0] * 60 + [30.0] * 60  # hours of 60, 120 and 30 proofs; 181 minutes
    made = [HourForecast(minute=0, next_hour=66.0, after=100.0, timed=27.0, timed_minutes=30),
            HourForecast(minute=60, next_hour=108.0, after=45.0),
            HourForecast(minute=120, next_hour=33.0, after=999.0)]  # its hour after is past the run: left out

    day = forecast_error.compare(made, rates)

    # next hour: +6, -12, +3 against 60, 120, 30
    assert day.next_hour.hours == 3
    assert day.next_hour.mean_abs == pytest.approx(7.0)
    assert day.next_hour.mean_abs_pct == pytest.approx(21 / 210 * 100)
    assert day.next_hour.bias_pct == pytest.approx(-3 / 210 * 100)
    assert (day.next_hour.worst, day.next_hour.worst_hour) == (pytest.approx(-12.0), 1)
    assert day.next_hour.bias_and_worst() == "-1.4% / -12 at h1"
    # the timed part: its first 30 minutes held 30 proofs, 27 forecast; the others time none
    assert day.timed.hours == 1
    assert day.timed.mean_abs == pytest.approx(3.0)
    assert day.timed.bias_pct == pytest.approx(-10.0)
    # 60-120 min: the hours the forecasts at 0 and 60 reach, -20 against 120, +15 against 30, named by the hour covered
    assert day.after.hours == 2
    assert day.after.mean_abs == pytest.approx(17.5)
    assert day.after.mean_abs_pct == pytest.approx(35 / 150 * 100)
    assert day.after.bias_pct == pytest.approx(-5 / 150 * 100)
    assert (day.after.worst, day.after.worst_hour) == (pytest.approx(-20.0), 1)


def test_an_hour_the_run_does_not_reach_in_full_is_left_out():
    rates = [60.0] * 60  # minutes 0 .. 59: the hour from minute 0 needs minute 60 too
    assert forecast_error.arrived_between(rates, 1, 60) is None
    assert forecast_error.arrived_between(rates, 0, 60) == pytest.approx(60.0)
    day = forecast_error.compare([HourForecast(minute=0, next_hour=60.0, after=60.0)], rates)
    assert day.next_hour is None and day.after is None and day.timed is None
