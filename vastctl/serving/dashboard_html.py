"""The text every part of the dashboard writes with: escaping, numbers, ages and times, and the stacked table.

Every value that reaches the page goes through `esc()`: labels, GPU names,
vast's status messages and kill reasons come from rented machines or from
vast, and a label like `<img src=x onerror=alert(1)>` must show as text. Every time is
UTC. Below 600 px the page is one column and tables become stacked cards (each cell named by its column:
`table()`): nothing scrolls sideways on a phone.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from html import escape
from typing import Any, Iterable

from vastctl import clock
from vastctl.upstream import cut


def esc(value: object, empty: str = "-") -> str:
    """Text for HTML content or a quoted attribute (a page has tens of thousands: most need no escape)."""
    if value is None or value == "":
        return escape(empty)
    shown = str(value)
    if "&" in shown or "<" in shown or ">" in shown or '"' in shown or "'" in shown:
        return escape(shown, quote=True)
    return shown


def num(value: Any, digits: int = 1) -> str:  # a number, or a figure read from JSON as one (None: -)
    if value is None:
        return "-"
    shown = f"{float(value):.{digits}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def age(iso: str | None, now: datetime) -> str:
    """clock.human_age of a stored time, each whole second's words kept (a page words two ages a machine)."""
    if not iso:
        return "-"
    moment = clock.from_iso(iso)
    return "?" if moment is None else _worded(max(0, int((now - moment).total_seconds())))


_worded = functools.lru_cache(maxsize=100_000)(clock.human_duration)  # whole seconds → their words


def when(iso: str | None, now: datetime) -> str:
    """A stored time in UTC, as the CLI speaks it: `07:40:16` today, `03-02 07:40` another day; the whole
    ISO time in the cell's title."""
    try:
        moment = clock.from_iso(iso) if iso else None
    except ValueError:
        return esc(iso)
    if moment is None:
        return "-"
    moment = moment.astimezone(timezone.utc)
    short = moment.strftime("%H:%M:%S" if moment.date() == now.astimezone(timezone.utc).date() else "%m-%d %H:%M")
    return f'<time datetime="{esc(clock.display_iso(iso))}" title="{esc(clock.display_iso(iso))}">{short}</time>'


def table(ident: str, title: str, head: Iterable[str], rows: list[str], *, after: str = "", named: bool = False) -> str:
    """`named`: the rows' cells already carry their column's name (a kept row is not split again at each page)."""
    head = list(head)
    th = "".join(f"<th>{esc(h, '')}</th>" for h in head)
    heading = f"<h2>{esc(title)}</h2>" if title else ""
    body = "".join(rows if named else _named(rows, head))
    return (f'<section id="{ident}">{heading}<div class="scroll"><table class="stack">'
            f'<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>{after}</section>')


def _named(rows: list[str], head: list[str]) -> Iterable[str]:
    """Each plain `<td>` of a row named by its column (`data-h`): a phone shows the name beside the value."""
    named = [f'<td data-h="{esc(name, "")}">' for name in head]
    for row in rows:
        parts = row.split("<td>")
        yield parts[0] + "".join((named[i] if i < len(named) else "<td>") + part for i, part in enumerate(parts[1:]))


def brief(value: object, limit: int) -> str:
    return cut(_compact(value), limit)


def _compact(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
