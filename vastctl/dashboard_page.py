"""The dashboard's HTML: the page, the live fragment it refreshes, the sign-in form, the last-day chart.

Every value that reaches the page goes through `esc()`: labels, GPU names,
vast's status messages and kill reasons come from rented machines or from
vast, and a label like `<img src=x onerror=alert(1)>` must show as text. The
page carries no inline script or style (the content security policy forbids
both): behaviour is /static/dashboard.js, looks are /static/dashboard.css, and
the chart is inline SVG drawn here with presentation classes only.
"""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from typing import Any, Iterable

from . import clock, settings
from .upstream import cut

LIVE_URL = "/dashboard/live"
REFRESH_MS = 5000
CHART_WIDTH, CHART_HEIGHT = 720, 96


def esc(value: Any, empty: str = "-") -> str:
    """Text for HTML content or a quoted attribute."""
    if value is None or value == "":
        return escape(empty)
    return escape(str(value), quote=True)


def num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    text = f"{float(value):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def age(iso: str | None, now: datetime) -> str:
    return "-" if not iso else clock.human_age(clock.from_iso(iso), now)


# --- pages ------------------------------------------------------------------------------------------


def _document(title: str, body: str, *, script: bool) -> str:
    js = '<script src="/static/dashboard.js" defer></script>' if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{esc(title)}</title><link rel="stylesheet" href="/static/dashboard.css">{js}</head>'
        f"<body>{body}</body></html>"
    )


def sign_in_page(message: str | None = None) -> str:
    note = f'<p class="flash error" role="alert">{esc(message)}</p>' if message else ""
    return _document("vastctl · sign in", (
        '<main class="signin"><h1>vastctl</h1>'
        "<p>Sign in with the manager's <code>server.admin_token</code>.</p>"
        f"{note}"
        '<form method="post" action="/login" id="signin-form">'
        '<label>Admin token <input type="password" name="token" autocomplete="current-password" required autofocus>'
        '</label><button type="submit">Sign in</button></form></main>'
    ), script=False)


def message_page(title: str, message: str) -> str:
    return _document(f"vastctl · {title}", (
        f'<main class="signin"><h1>{esc(title)}</h1><p class="flash error" role="alert">{esc(message)}</p>'
        '<p><a href="/">Back to the dashboard</a></p></main>'
    ), script=False)


def dashboard_page(data: dict[str, Any], *, csrf: str, flash: dict[str, str] | None = None) -> str:
    note = ""
    hidden = f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
    if flash:
        kind = "error" if flash.get("kind") == "error" else "ok"
        note = f'<p class="flash {kind}" role="status" id="flash">{esc(flash.get("text"))}</p>'
        note += _override_form(flash.get("override"), hidden)
    body = (
        '<header><h1>vastctl</h1><span id="refreshed" aria-live="polite"></span>'
        f'<form method="post" action="/logout" class="inline">{hidden}<button type="submit">Sign out</button></form>'
        f"</header>{note}<main>"
        f'<div id="live" data-src="{LIVE_URL}" data-every="{REFRESH_MS}">{live_fragment(data)}</div>'
        f'<aside id="actions">{_settings_forms(data["settings"], hidden)}{_kill_form(hidden)}{_note_form(hidden)}'
        "</aside></main>"
    )
    return _document("vastctl · fleet", body, script=True)


def live_fragment(data: dict[str, Any]) -> str:
    """The part of the page that refreshes itself: summary, chart, fleet, events, agent steps."""
    now = data["now"]
    labels = "".join(f'<option value="{esc(i["label"])}">' for i in data["instances"] if i["state"] != "killed")
    parts = [
        _orphan_warning(data["summary"]),
        _summary(data["summary"], now),
        _chart(data["history"], data["summary"]["settings"]) if "history" in data else "",
        _fleet(data["instances"], now),
        f'<datalist id="machine-labels">{labels}</datalist>',
        _events(data["events"]),
        _steps(data["steps"]),
    ]
    return "".join(parts)


# --- the live parts ---------------------------------------------------------------------------------


def _summary(s: dict[str, Any], now: datetime) -> str:
    capacity, target = s["capacity_proofs_per_hour"], s["target_proofs_per_hour"]
    limits = s["settings"]
    short = " short" if capacity < target else ""
    demand = s["demand"]
    if demand is None:
        demand_text, demand_note = "-", "no demand samples kept"
    else:
        demand_text = f'{esc(demand["queued"])} queued'
        stale = "" if demand["known"] else " (stale)"
        demand_note = f'{esc(num(demand["proofs_per_hour"]))} proofs/h wanted · {clock.human_duration(demand["age_s"] or 0)} old{stale}'
    states = ", ".join(f"{n} {esc(state)}" for state, n in sorted(s["by_state"].items())) or "no machines"
    rec = s["reconcile"]
    if rec["last_success"] is None:
        listing = "vast never listed"
    else:
        listing = f'vast listed {clock.human_age(rec["last_success"], now)} ago'
    if rec["last_error"]:
        listing += f' · last listing failed: {rec["last_error"]}'
    pending = s["destroys_pending"]
    destroys = f' · {pending["count"]} destroy pending' if pending["count"] else ""
    cards = [
        ("Capacity", f'<span class="big{short}" id="capacity">{num(capacity)}</span> / '
                     f'<span id="target">{num(target)}</span> proofs/h',
         f'+{num(s["pending_capacity_proofs_per_hour"])} proofs/h on the way'),
        ("Spend", f'<span class="big">${s["spend_per_hour"]:.2f}</span>/h',
         f'limit ${num(limits["max_hourly_spend"], 2)}/h · max ${num(limits["max_dph"], 3)}/h a machine'),
        ("Demand", f'<span class="big">{demand_text}</span>', demand_note),
        ("Machines", f'<span class="big">{sum(s["by_state"].values())}</span> of {esc(limits["max_instances"])}',
         f'{states} · {s["disagreements"]} disagree'),
        ("Safety net", esc(listing, ""), f'{rec["failures_last_day"]} failed listings today{destroys}'),
    ]
    body = "".join(f'<div class="card"><h3>{title}</h3><p>{value}</p><p class="note">{note}</p></div>'
                   for title, value, note in cards)
    return f'<section id="summary" class="cards">{body}</section>'


def _orphan_warning(s: dict[str, Any]) -> str:
    """The machines' dead-man switch is counting down (fleet.contact_status): say so above everything."""
    text = s.get("orphan_warning")
    return f'<p class="flash error" role="alert" id="orphan-warning">{esc(text)}</p>' if text else ""


def _fleet(instances: list[dict[str, Any]], now: datetime) -> str:
    head = ("label", "state", "vast", "vast id", "GPU", "$/h", "bench", "proofs/h", "for", "heartbeat", "why", "")
    rows = []
    for i in instances:
        vast = "missing" if i["vast_missing"] else i["vast_status"]
        gpu = f'{i["num_gpus"] or 1}x {i["gpu_name"]}' if i["gpu_name"] else None
        why = " · ".join(str(x) for x in (i["kill_reason"], i["disagreement"], i["vast_status_msg"]) if x)
        flag = ' class="disagree"' if i["disagreement"] else ""
        kill = "" if i["state"] == "killed" else (
            f'<button type="button" class="kill" data-kill="{esc(i["label"])}">kill…</button>')
        cells = (esc(i["label"]), f'<span class="state {esc(i["state"])}">{esc(i["state"])}</span>', esc(vast),
                 esc(i["vast_id"]), esc(gpu), num(i["dph"], 3), num(i["bench_rate"]), num(i["proofs_per_hour"]),
                 age(i["state_since"], now), age(i["last_heartbeat_at"], now), esc(why, ""), kill)
        rows.append(f'<tr{flag} data-label="{esc(i["label"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(head)}" class="empty">no machines</td></tr>')
    return _table("fleet", "Fleet", head, rows)


def _events(events: list[dict[str, Any]]) -> str:
    rows = []
    for e in events:
        change = f'{e["from_state"] or "∅"} → {e["to_state"]}' if e["to_state"] else e["kind"]
        reason = (e["reason"] or "") + (f' [{e["code"]}]' if e["code"] else "")
        cells = (esc(e["id"]), esc(e["at"]), esc(e["label"]), esc(change), esc(e["source"]), esc(reason, ""))
        rows.append(f'<tr data-kind="{esc(e["kind"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        rows.append('<tr><td colspan="6" class="empty">no events</td></tr>')
    return _table("events", "Latest events", ("id", "at", "label", "change", "source", "reason"), rows)


def _steps(steps: list[dict[str, Any]]) -> str:
    rows = []
    for step in steps:
        tokens = step["tokens"]
        used = f'{tokens["input"]} in · {tokens["output"]} out' + (
            f' · {tokens["cache_read"]} cached' if tokens["cache_read"] else "")
        cells = (esc(clock.display_iso(step["started_at"])), esc(step["policy"]), esc(step["outcome"]),
                 esc(_saw(step["observation"]), ""), esc(_items(step["actions"]), ""),
                 esc(_items(step["refused"]), ""), esc(_items(step["errors"]), ""), esc(used),
                 f'${step["cost"]:.4f}')
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        rows.append('<tr><td colspan="9" class="empty">no agent steps yet</td></tr>')
    head = ("started", "policy", "outcome", "saw", "did", "refused", "errors", "tokens", "cost")
    return _table("steps", "Agent steps", head, rows)


def _table(ident: str, title: str, head: Iterable[str], rows: list[str]) -> str:
    th = "".join(f"<th>{esc(h, '')}</th>" for h in head)
    return (f'<section id="{ident}"><h2>{esc(title)}</h2><div class="scroll"><table>'
            f'<thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table></div></section>')


def _saw(observation: Any) -> str:
    """The headline of what a step saw (agent.step.observation_summary): capacity against target, machines
    on their way, spend, demand, the fleet by state and how many new events; a stored value of another
    shape (a file edited by hand) is shown as its text."""
    if not isinstance(observation, dict) or "demand" not in observation:
        return _brief(observation, 160)
    target = (observation.get("settings") or {}).get("target_proofs_per_hour")
    demand = observation["demand"] or {}
    queued = f'{demand.get("queued")} queued' if demand.get("known") else "demand unknown"
    states = ", ".join(f"{n} {state}" for state, n in sorted((observation.get("by_state") or {}).items()))
    parts = [f'capacity {num(observation.get("capacity"))} / {num(target)}',
             f'+{num(observation.get("pending_capacity"))} on the way',
             f'${observation.get("spend_per_hour") or 0:.2f}/h', queued, states or "no machines",
             f'{len(observation.get("events") or [])} new events']
    return " · ".join(parts)


def _brief(value: Any, limit: int) -> str:
    return cut(_compact(value), limit)


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


ITEM_HEAD = ("kind", "label", "count", "gpu_name")  # as guard.Action.view() names them


def _items(value: Any) -> str:
    """Actions, refusals or errors as `kind label: reason → result` lines joined by ' · '."""
    if value in (None, "", [], {}):
        return ""
    if not isinstance(value, list):
        return _brief(value, 300)
    lines = []
    for item in value[:10]:
        if isinstance(item, dict):
            head = " ".join(str(item[k]) for k in ITEM_HEAD if item.get(k) not in (None, ""))
            head += f' [{item["limit"]}]' if item.get("limit") else ""
            tail = item.get("why") or item.get("reason") or item.get("error") or ""
            result = item.get("result")
            lines.append(head + (f": {tail}" if tail else "") + (f" → {result}" if result else ""))
        else:
            lines.append(str(item))
    more = f" · +{len(value) - 10} more" if len(value) > 10 else ""
    return _brief(" · ".join(lines) + more, 400)


# --- forms ------------------------------------------------------------------------------------------


def _settings_forms(items: list[dict[str, Any]], hidden: str) -> str:
    forms = []
    for item in items:
        key = item["key"]
        step = "1" if settings.KEYS[key] is int else "any"
        forms.append(
            f'<form method="post" action="/dashboard/settings" class="setting" id="set-{esc(key)}">{hidden}'
            f'<input type="hidden" name="key" value="{esc(key)}">'
            f'<label>{esc(key)} <input name="value" type="number" min="0" step="{step}" '
            f'value="{esc(num(item["value"], 6))}" required></label>'
            f'<span class="note">{esc(item["source"])}</span><button type="submit">Set</button></form>'
        )
    return f'<section><h2>Settings</h2>{"".join(forms)}</section>'


def _kill_form(hidden: str) -> str:
    return (
        '<section><h2>Kill a machine</h2>'
        f'<form method="post" action="/dashboard/kill" id="kill-form">{hidden}'
        '<label>Machine <input name="instance" list="machine-labels" required placeholder="label or uuid"></label>'
        '<label>Reason <input name="reason" required maxlength="500" placeholder="why, for the event log"></label>'
        '<button type="submit" class="danger">Kill and destroy</button></form></section>'
    )


OVERRIDE_WHY = {  # the guard's rule a forced kill goes past, as the confirm box says it
    "never_scale_to_zero": "it may be the last machine proving while work is queued or demand is unknown",
    "label_prefix": "its label lacks our prefix, and the machine vast lists under that label is destroyed",
}


def _override_form(override: Any, hidden: str) -> str:
    """The second step of a kill the guard refused: the same kill with --force, once the box is ticked."""
    if not isinstance(override, dict) or override.get("limit") not in OVERRIDE_WHY:
        return ""
    instance, reason = str(override.get("instance", "")), str(override.get("reason", ""))
    if reason:
        reason_field = f'<input type="hidden" name="reason" value="{esc(reason, "")}">'
    else:  # too long to carry back in the flash: asked for again
        reason_field = ('<label>Reason <input name="reason" required maxlength="500"'
                        ' placeholder="why, for the event log"></label>')
    return (
        f'<form method="post" action="/dashboard/kill" id="kill-override" class="override">{hidden}'
        f'<input type="hidden" name="instance" value="{esc(instance, "")}">{reason_field}'
        '<input type="hidden" name="force" value="1">'
        f'<label><input type="checkbox" name="confirm" value="yes" required> Kill {esc(instance)} anyway:'
        f' {esc(OVERRIDE_WHY[override["limit"]])}. Recorded as forced past the guard'
        f' ({esc(override["limit"])}).</label>'
        '<button type="submit" class="danger">Kill anyway</button></form>'
    )


def _note_form(hidden: str) -> str:
    return (
        '<section><h2>Note to the agent</h2>'
        f'<form method="post" action="/dashboard/note" id="note-form">{hidden}'
        '<textarea name="text" rows="3" maxlength="4000" required '
        'placeholder="e.g. Curio maintenance 02:00-03:00 UTC"></textarea>'
        '<button type="submit">Send note</button></form></section>'
    )


# --- the last day -----------------------------------------------------------------------------------


def _chart(history: dict[str, Any], limits: dict[str, Any]) -> str:
    start, end = history["start"], history["end"]
    proofs_top = _top([v for _, v in history["capacity"]] + [v for _, v in history["target"]])
    panels = [
        _panel("Proofs/hour: capacity and target", proofs_top, start, end,
               [("capacity", history["capacity"]), ("target", history["target"])],
               ticks=history["reconcile_failures"]),
        _panel("Queued proofs", _top([v for _, v in history["queue"]]), start, end, [("queue", history["queue"])],
               empty="no demand samples in the last day" if not history["queue"] else None),
        _panel("Spend, $/hour (dashed: max_hourly_spend)",
               _top([v for _, v in history["spend"]] + [float(limits["max_hourly_spend"])]), start, end,
               [("spend", history["spend"]), ("limit", [(start, float(limits["max_hourly_spend"])),
                                                        (end, float(limits["max_hourly_spend"]))])]),
    ]
    return f'<section id="chart"><h2>Last 24 hours</h2>{"".join(panels)}</section>'


def _top(values: list[float]) -> float:
    return max([v for v in values if v is not None] + [1.0]) * 1.1


def _panel(title: str, top: float, start: datetime, end: datetime, lines: list[tuple[str, list]], *,
           ticks: list[datetime] = (), empty: str | None = None) -> str:
    width, height, span = CHART_WIDTH, CHART_HEIGHT, max(1.0, (end - start).total_seconds())

    def x(moment: datetime) -> float:
        return round(min(1.0, max(0.0, (moment - start).total_seconds() / span)) * width, 1)

    def y(value: float) -> float:
        return round(height - min(1.0, max(0.0, value / top)) * (height - 4), 1)

    shapes = []
    for name, points in lines:
        if not points:
            continue
        coords, last = [], None
        for moment, value in points:
            if last is not None:
                coords.append(f"{x(moment)},{y(last)}")
            coords.append(f"{x(moment)},{y(value)}")
            last = value
        coords.append(f"{width},{y(last)}")
        shapes.append(f'<polyline class="line {name}" points="{" ".join(coords)}"/>')
    shapes.extend(f'<line class="tick fail" x1="{x(t)}" x2="{x(t)}" y1="{height - 8}" y2="{height}"/>'
                  for t in ticks)
    if empty:
        shapes.append(f'<text class="empty" x="{width / 2}" y="{height / 2}" text-anchor="middle">{esc(empty)}</text>')
    legend = " · ".join(f'<tspan class="key {name}">{esc(name)}</tspan>' for name, points in lines if points)
    return (
        f'<svg class="chart" viewBox="0 -14 {width} {height + 28}" role="img" aria-label="{esc(title)}">'
        f"<title>{esc(title)}</title>"
        f'<text class="axis" x="0" y="-3">{esc(title)} · top {num(top / 1.1, 2)}</text>'
        f'<text class="axis" x="{width}" y="-3" text-anchor="end">{legend}</text>'
        f'<rect class="frame" x="0" y="0" width="{width}" height="{height}"/>{"".join(shapes)}'
        f'<text class="axis" x="0" y="{height + 12}">24h ago</text>'
        f'<text class="axis" x="{width}" y="{height + 12}" text-anchor="end">now</text></svg>'
    )
