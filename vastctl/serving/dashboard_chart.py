"""The dashboard's chart of the last day: capacity against target, the queue, and spend, as inline SVG.

The page carries no inline script or style (the content security policy forbids both): the chart is drawn here
with presentation classes only, twice (a wide window and a phone; dashboard.css shows one).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Mapping, Sequence, TypedDict

from vastctl import clock
from vastctl.serving.dashboard_html import esc, num

if TYPE_CHECKING:
    from vastctl.views.overview import History

CHART_WIDTH, CHART_HEIGHT = 720, 96
NARROW_WIDTH = 340  # the phone's chart: drawn for its width, so its text stays ~10 px there
Y_GUTTER = 44  # user units left of each panel for its y-axis numbers


Line = tuple[str, list[tuple[datetime, float]]]  # a line's name (its class) and its points


class _Marks(TypedDict, total=False):
    """What a panel shows beside its lines (_panel's keywords)."""

    ticks: Sequence[datetime]
    tick_name: str
    empty: str | None


def chart(history: History, limits: Mapping[str, float]) -> str:
    """The last day in three panels, each with its y-axis numbered; drawn twice, for a wide window and for a
    phone (dashboard.css shows one), so the text keeps its size on both."""
    start, end = _chart_span(history)
    limit = float(limits["max_hourly_spend"])
    spent = max((value for _, value in history["spend"]), default=0.0)
    limit_shown = limit <= LIMIT_IN_VIEW * max(spent, 0.01)  # else the spend would be a flat line under it
    spend_title = ("Spend, $/hour (dashed: max_hourly_spend)" if limit_shown
                   else f"Spend, $/hour (max_hourly_spend ${num(limit, 2)}/h is above this scale)")
    specs: list[tuple[str, list[Line], _Marks]] = [
        ("Proofs/hour: capacity vastctl counts, and target", [("capacity", history["capacity"]),
                                                              ("target", history["target"])],
         {"ticks": history["reconcile_failures"], "tick_name": "failed listing"}),
        ("Queued proofs", [("queue", history["queue"])],
         {"empty": "no demand samples in this span" if not history["queue"] else None}),
        (spend_title, [("spend", history["spend"])]
         + ([("limit", [(start, limit), (end, limit)])] if limit_shown else []), {}),
    ]
    drawn = []
    for width, kind in ((CHART_WIDTH, "wide"), (NARROW_WIDTH, "narrow")):
        panels = "".join(_panel(title, _top([v for _, points in lines for _, v in points]), start, end, lines,
                                width=width, **extra) for title, lines, extra in specs)
        drawn.append(f'<div class="charts {kind}">{panels}</div>')
    hours = (end - start).total_seconds() / 3600
    first = history.get("first")
    age = (end - first).total_seconds() if first is not None else hours * 3600
    span = "Last 24 hours" if hours > 23.9 else f"Since the fleet began ({clock.human_duration(age)} ago)"
    return f'<section id="chart"><h2>{span} · UTC</h2>{"".join(drawn)}</section>'


MIN_SPAN = timedelta(hours=1)
LIMIT_IN_VIEW = 3.0  # max_hourly_spend is drawn when under this many times the highest spend shown


def _chart_span(history: History) -> tuple[datetime, datetime]:
    """The last day, or less for a fleet younger than that: from a little before its first record, at least
    an hour, so a new fleet's first hour is not a sliver at the right edge of a flat day."""
    start, end = history["start"], history["end"]
    first = history.get("first")
    if first is None or first <= start:
        return start, end
    begin = min(first - (end - first) * 0.05, end - MIN_SPAN)
    return max(start, begin), end


TICK_STEPS_MIN = (5, 10, 15, 30, 60, 120, 180, 240, 360)


def _time_ticks(start: datetime, end: datetime, most: int = 8) -> list[datetime]:
    """Round UTC times between start and end, at most `most` of them, at the finest step that allows it."""
    span_min = max(1.0, (end - start).total_seconds() / 60)
    step = next((m for m in TICK_STEPS_MIN if span_min / m <= most), TICK_STEPS_MIN[-1])
    midnight = start.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    tick = midnight + timedelta(minutes=step * (((start - midnight).total_seconds() / 60) // step + 1))
    ticks = []
    while tick < end:
        ticks.append(tick)
        tick += timedelta(minutes=step)
    return ticks


def _top(values: list[float]) -> float:
    return max([v for v in values if v is not None] + [1.0]) * 1.1


def y_ticks(top: float) -> list[float]:
    """Round numbers from 0 up to `top` for a y-axis: steps of 1, 2, 2.5 or 5 × a power of ten, 3 or 4 of them."""
    raw = top / 1.1 / 3
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(top // step) + 1)]


def _panel(title: str, top: float, start: datetime, end: datetime, lines: list[Line], *,
           width: int = CHART_WIDTH, ticks: Sequence[datetime] = (), tick_name: str = "",
           empty: str | None = None) -> str:
    height, span = CHART_HEIGHT, max(1.0, (end - start).total_seconds())

    def x(moment: datetime) -> float:
        return round(min(1.0, max(0.0, (moment - start).total_seconds() / span)) * width, 1)

    def y(value: float) -> float:
        return round(height - min(1.0, max(0.0, value / top)) * (height - 4), 1)

    shapes = []
    for moment in _time_ticks(start, end, most=8 if width >= CHART_WIDTH else 4):
        if not 0.04 * width <= x(moment) <= 0.96 * width:  # its label would be cut at the edge
            continue
        shapes.append(f'<line class="grid" x1="{x(moment)}" x2="{x(moment)}" y1="0" y2="{height}"/>'
                      f'<text class="axis time" x="{x(moment)}" y="{height + 12}" text-anchor="middle">'
                      f'{moment.strftime("%H:%M")}</text>')
    steps = y_ticks(top)
    digits = 2 if steps[-1] < 2 else 1 if steps[-1] < 20 and any(v % 1 for v in steps) else 0
    for value in steps:
        shapes.append(f'<line class="grid" x1="0" x2="{width}" y1="{y(value)}" y2="{y(value)}"/>'
                      f'<text class="axis y" x="-4" y="{y(value) + 4}" text-anchor="end">{num(value, digits)}</text>')
    x_text: dict[datetime, str] = {}  # each moment and value placed and worded once for the panel
    y_text: dict[float, str] = {}
    for name, points in lines:
        points = [(moment, value) for moment, value in points if moment <= end]
        if not points:
            continue
        coords, last = [], None  # each point placed once: a step to it holds the last height, then rises to its own
        for moment, value in points:
            at, height_ = x_text.get(moment), y_text.get(value)
            if at is None:
                at = x_text[moment] = str(x(moment))
            if height_ is None:
                height_ = y_text[value] = str(y(value))
            if last is not None:
                coords.append(f"{at},{last}")
            coords.append(f"{at},{height_}")
            last = height_
        coords.append(f"{width},{last}")  # the last value holds to the right edge
        shapes.append(f'<polyline class="line {name}" points="{" ".join(coords)}"/>')
    shown = [t for t in ticks if start <= t <= end]
    shapes.extend(f'<line class="tick fail" x1="{x(t)}" x2="{x(t)}" y1="{height - 8}" y2="{height}"/>'
                  for t in shown)
    if empty:
        shapes.append(f'<text class="empty" x="{width / 2}" y="{height / 2}" text-anchor="middle">{esc(empty)}</text>')
    keys = [(name, name) for name, points in lines if points]
    if shown and tick_name:
        keys.append(("fail", f"| {tick_name}"))
    legend = " · ".join(f'<tspan class="key {name}">{esc(text)}</tspan>' for name, text in keys)
    return (
        f'<svg class="chart" viewBox="{-Y_GUTTER} -14 {width + Y_GUTTER + 4} {height + 42}" role="img"'
        f' aria-label="{esc(title)}"><title>{esc(title)}</title>'
        f'<text class="axis" x="{-Y_GUTTER}" y="-3">{esc(title)}</text>'
        f'<text class="axis" x="0" y="{height + 26}">{legend}</text>'
        f'<rect class="frame" x="0" y="0" width="{width}" height="{height}"/>{"".join(shapes)}</svg>'
    )
