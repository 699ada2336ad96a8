"""The dashboard's HTML: the page, the live fragment it refreshes, the sign-in form, the forms that act.

The page carries no inline script or style (the content security policy forbids
both): behaviour is /static/dashboard.js, looks are /static/dashboard.css. What the live fragment holds is
written by dashboard_cards.py (the top rows), dashboard_chart.py (the last day), dashboard_tables.py (fleet,
events, agent steps, logs), all with dashboard_html.py's escaping: every value that reaches the page goes
through `esc()`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Mapping, Sequence

from vastctl.serving.dashboard_cards import cost, glance, orphan_warning, summary
from vastctl.serving.dashboard_chart import chart
from vastctl.serving.dashboard_html import esc, num
from vastctl.serving.dashboard_tables import events, fleet, logs, step_refusals, steps
from vastctl.state import settings

if TYPE_CHECKING:
    from vastctl.serving.dashboard_data import Flash, PageData

LIVE_URL = "/dashboard/live"
REFRESH_MS = 5000
STEPS_READ = 60  # agent steps that ran, read for the page: folded, the newest STEPS_SHOWN rows are shown (dashboard_tables)


# --- pages ------------------------------------------------------------------------------------------


def _document(title: str, body: str, *, script: bool) -> str:
    js = '<script src="/static/dashboard.js" defer></script>' if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{esc(title)}</title><link rel="stylesheet" href="/static/dashboard.css">{js}</head>'
        f"<body>{body}</body></html>"
    )


def sign_in_page(message: str | None = None, *, where: str = "the manager's <code>server.admin_token</code>") -> str:
    """`where`: HTML naming where the admin token is (admin_token_source.TokenSource.html)."""
    note = f'<p class="flash error" role="alert">{esc(message)}</p>' if message else ""
    return _document("vastctl · sign in", (
        '<main class="signin"><h1>vastctl</h1>'
        f"<p>Sign in with {where}.</p>"
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


def dashboard_page(data: PageData, *, csrf: str, flash: Flash | None = None, past: datetime | None = None) -> str:
    """The whole page. `past`: the moment a still file is shown at (`--as-of`, a kept demo day): the header says
    so and the page does not refresh, as nothing in it changes."""
    note = ""
    hidden = f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
    if flash:
        kind = "error" if flash.get("kind") == "error" else "ok"
        note = f'<p class="flash {kind}" role="status" id="flash">{esc(flash.get("text"))}</p>'
        note += _override_form(flash.get("override"), hidden)
    body = (
        f'<header><h1>vastctl</h1><span id="refreshed" aria-live="polite">{_moment(past)}</span>'
        f'<form method="post" action="/logout" class="inline">{hidden}<button type="submit">Sign out</button></form>'
        f"</header>{note}<main>"
        f'<div id="live" data-src="{LIVE_URL}" data-every="{0 if past else REFRESH_MS}">{live_fragment(data)}</div>'
        f'<aside id="actions">{_actions(data, hidden, past)}</aside>{logs(data.get("logs") or [])}</main>'
    )
    return _document("vastctl · fleet", body, script=True)


def _actions(data: PageData, hidden: str, past: datetime | None) -> str:
    """The forms that act; a past moment has none (`serve --as-of` reads a copy: nothing sent to it is kept)."""
    if past is not None:
        return ('<p class="note" id="no-actions">A past moment: nothing here can be changed. Settings, kills and'
                ' notes act on the live file, through `vastctl serve` without --as-of.</p>')
    return f'{_settings_forms(data["settings"], hidden)}{_kill_form(hidden)}{_note_form(hidden)}'


def _moment(past: datetime | None) -> str:
    """The header's word on time: empty for a live page (its script says when it refreshed), else the moment."""
    if past is None:
        return ""
    return f'<span id="past-moment">as of {past.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC: a past moment, not live</span>'


def live_fragment(data: PageData) -> str:
    """The part of the page that refreshes itself: summary, chart, fleet, events, agent steps."""
    now = data["now"]
    labels = "".join(f'<option value="{esc(i["label"])}">' for i in data["instances"] if i["state"] != "killed")
    parts = [
        orphan_warning(data["summary"]),
        glance(data, now) if "waits" in data else "",
        summary(data["summary"], now),
        cost(data["cost"]) if "cost" in data else "",
        chart(data["history"], data["summary"]["settings"]) if "history" in data else "",
        fleet(data["instances"], now, refusals=step_refusals(data["steps"])),
        f'<datalist id="machine-labels">{labels}</datalist>',
        events(data["events"], now),
        steps(data["steps"], now, skipped=data.get("skipped_steps", []), skipped_count=data.get("skipped_step_count", 0)),
    ]
    return "".join(parts)


# --- forms ------------------------------------------------------------------------------------------


def _settings_forms(items: Sequence[Mapping[str, object]], hidden: str) -> str:
    forms = []
    for item in items:
        key = str(item["key"])  # settings.listing's: each a key of settings.KEYS
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


def _override_form(override: object, hidden: str) -> str:
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
