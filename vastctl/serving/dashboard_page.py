"""The dashboard's HTML: the page, the live fragment it refreshes, the sign-in form, the last-day chart.

Every value that reaches the page goes through `esc()`: labels, GPU names,
vast's status messages and kill reasons come from rented machines or from
vast, and a label like `<img src=x onerror=alert(1)>` must show as text. The
page carries no inline script or style (the content security policy forbids
both): behaviour is /static/dashboard.js, looks are /static/dashboard.css, and
the chart is inline SVG drawn here with presentation classes only.

Read at a glance: a machine's `why` is vastctl's own word (kill reason, the
guard's refusal, a disagreement with vast) and vast's raw status message waits
in a <details> behind its status; the steps --if-events skipped are folded in
another (dashboard.js keeps an opened one open across refreshes). Every time is
UTC.

The top row (`_glance`) answers three questions before anything else: is work
waiting too long (proofs done within agent.max_wait over the last day), is money
leaking (spend now, today against max_daily_spend, what idle machines bill), is
anything broken (the safety net, demand, vast's word, the agent, the floor).
Its figures are the CLI's: `vastctl cost` (whole file, --since 24h, --since
00:00 UTC) and `fleet`'s summary, read at the page's one `now`. The proof
router's held calls and proof wait take their place at its end (`_router`), and its measured proof wait replaces
the estimate of the first card when it answered calls.
Agent steps that changed nothing are folded into one row per run, with the
hold reason `agent history` prints. Below 600 px the page is one column and
tables become stacked cards: nothing scrolls sideways on a phone.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from html import escape
from typing import Any, Iterable, Sequence

from vastctl import clock
from vastctl.state import settings
from vastctl.upstream import cut

LIVE_URL = "/dashboard/live"
REFRESH_MS = 5000
CHART_WIDTH, CHART_HEIGHT = 720, 96
NARROW_WIDTH = 340  # the phone's chart: drawn for its width, so its text stays ~10 px there
Y_GUTTER = 44  # user units left of each panel for its y-axis numbers
STEPS_READ = 60  # agent steps that ran, read for the page: folded, the newest STEPS_SHOWN rows are shown
STEPS_SHOWN = 10
EVENTS_SHOWN = 10  # the newest events shown; the rest of those read wait behind a detail


def esc(value: Any, empty: str = "-") -> str:
    """Text for HTML content or a quoted attribute (a page has tens of thousands: most need no escape)."""
    if value is None or value == "":
        return escape(empty)
    text = str(value)
    if "&" in text or "<" in text or ">" in text or '"' in text or "'" in text:
        return escape(text, quote=True)
    return text


def num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    text = f"{float(value):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def age(iso: str | None, now: datetime) -> str:
    return "-" if not iso else clock.human_age(clock.from_iso(iso), now)


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
        f'</aside>{_logs(data.get("logs") or [])}</main>'
    )
    return _document("vastctl · fleet", body, script=True)


def live_fragment(data: dict[str, Any]) -> str:
    """The part of the page that refreshes itself: summary, chart, fleet, events, agent steps."""
    now = data["now"]
    labels = "".join(f'<option value="{esc(i["label"])}">' for i in data["instances"] if i["state"] != "killed")
    parts = [
        _orphan_warning(data["summary"]),
        _glance(data, now) if "waits" in data else "",
        _summary(data["summary"], now),
        _cost(data["cost"]) if "cost" in data else "",
        _chart(data["history"], data["summary"]["settings"]) if "history" in data else "",
        _fleet(data["instances"], now, refusals=_refusals(data["steps"])),
        f'<datalist id="machine-labels">{labels}</datalist>',
        _events(data["events"], now),
        _steps(data["steps"], now, skipped=data.get("skipped_steps", []), skipped_count=data.get("skipped_step_count", 0)),
    ]
    return "".join(parts)


# --- the live parts ---------------------------------------------------------------------------------


def _card(ident: str, title: str, status: str, body: str) -> str:
    return f'<div class="card glance {status}" id="{ident}"><h3>{title}</h3>{body}</div>'


def _glance(data: dict[str, Any], now: datetime) -> str:
    """The top row: waiting, money, broken; then the proof router's figures when it reports them."""
    cards = [_waiting(data), _money(data), _broken(data, now), _router(data.get("router"))]
    return f'<section id="glance" class="cards top">{"".join(cards)}</section>'


def _waiting(data: dict[str, Any]) -> str:
    """Is work waiting too long: the share of the last day's proofs done within agent.max_wait (estimated from the
    demand samples, overview.proof_waits), and how long a proof arriving now waits."""
    waits, s = data["waits"], data["summary"]
    limit = clock.human_duration(waits["max_wait_s"])
    share = waits["within_share"]
    demand = s["demand"] or {}
    measured = (data.get("router") or {}).get("proof_wait_last_day") or {}
    if measured.get("calls"):  # the proof router saw every call: its measure, not the estimate
        share = measured["within_max_wait"]
        headline = (f'<span class="big" id="within-max-wait">{share * 100:.1f}%</span> done within {esc(limit)}'
                    ' <span class="note" title="held + proving time of each call the proof router answered">'
                    '(24 h, measured)</span>')
    elif share is None:
        headline = '<span class="big" id="within-max-wait">-</span> no proofs done in the last day'
    else:
        headline = (f'<span class="big" id="within-max-wait">{share * 100:.1f}%</span> done within {esc(limit)}'
                    ' <span class="note" title="estimated from the demand samples: a proof waits about what is'
                    ' queued and in flight over the proofs done per hour">(24 h, est.)</span>')
    if not demand.get("known"):
        now_text, status = "demand unknown: the newest sample failed or is stale", "bad"
    elif waits["stuck_now"]:
        now_text, status = "work queued and no proof done in the last hour", "bad"
    else:
        wait = waits["wait_now_s"]
        if wait is None:  # the source gives no rate: what waits over the capacity running
            backlog = float(demand.get("queued") or 0) + float(demand.get("in_flight") or 0)
            capacity = float(s["capacity_proofs_per_hour"] or 0.0)
            wait = 0.0 if backlog == 0 else backlog / capacity * 3600 if capacity > 0 else math.inf
        now_text = ("work queued and nothing running to prove it" if math.isinf(wait)
                    else f'a proof arriving now waits ~{esc(clock.human_duration(wait))}')
        status = "bad" if wait > waits["max_wait_s"] else "warn" if wait > waits["max_wait_s"] / 2 else "ok"
    if share is not None and status == "ok":
        status = "bad" if share < 0.95 else "warn" if share < 0.99 else "ok"
    queue = " · ".join(f"{esc(demand[k])} {name}" for k, name, _ in DEMAND_FIGURES if demand.get(k) is not None)
    body = f'<p>{headline}</p><p class="note">{now_text}{" · " + queue if queue else ""}</p>'
    return _card("glance-waiting", "Work waiting", status, body)


def _money(data: dict[str, Any]) -> str:
    """Is money leaking: spend now, today against max_daily_spend, the last day's cost per proof, what idle machines
    bill. The day and today are `vastctl cost --since 24h` and `--since` 00:00 UTC, at the page's now."""
    s, day, idle = data["summary"], data["cost_day"], data.get("idle") or {"stopped": 0.0, "lost": 0.0}
    limits = s["settings"]
    spend, today = float(s["spend_per_hour"]), float(data["spent_today"])
    daily, hourly = float(limits.get("max_daily_spend") or 0.0), float(limits["max_hourly_spend"])
    per = day["cost_per_1000_proofs"]
    status = "ok"
    if idle["lost"] > 0 or s["destroys_pending"]["count"]:
        status = "warn"
    if spend > hourly + 1e-9 or (daily and today + spend > daily + 1e-9):
        status = "bad"
    body = (f'<p><span class="big" id="spend-now">${spend:.2f}</span>/h now (limit ${num(hourly, 2)}/h) ·'
            f' <span id="spent-today">${today:.2f}</span> today of ${num(daily, 2)}</p>'
            f'<p class="note">last 24 h <span id="cost-day">${day["cost"]:.2f}</span> for'
            f' <span id="proofs-day">{esc(day["proofs"])}</span> proofs'
            + ("" if per is None else f' · ${per:.2f} per 1,000') +
            f' · idle <span id="idle-lost">${idle["lost"]:.2f}/h</span> killed, dead or missing,'
            f' ${idle["stopped"]:.2f}/h stopped disks</p>')
    return _card("glance-money", "Money", status, body)


def problems(data: dict[str, Any], now: datetime) -> list[str]:
    """What is broken, in words (empty: nothing): the safety net, demand, vast's word, destroys, the agent, the
    floor of agent.min_machines."""
    s, found = data["summary"], []
    rec = s["reconcile"]
    if rec["last_success"] is None:
        found.append("vast never listed: is the reconcile timer running?")
    elif (now - rec["last_success"]).total_seconds() > 600:
        found.append(f'vast last listed {clock.human_age(rec["last_success"], now)} ago (reconcile)')
    if rec["consecutive_failures"]:
        found.append(f'{rec["consecutive_failures"]} listing(s) failed in a row: {rec["last_error"] or "?"}')
    if s["demand"] is not None and not s["demand"]["known"]:
        found.append("demand unknown: the newest sample failed or is stale")
    if s["disagreements"]:
        found.append(f'{s["disagreements"]} machine(s) where vast disagrees (see why)')
    pending = s["destroys_pending"]
    if pending["count"] and pending["oldest_age_s"] > 900:
        found.append(f'{pending["count"]} killed machine(s) not destroyed at vast for'
                     f' {clock.human_duration(pending["oldest_age_s"])} (still billed)')
    steps, agent = data.get("steps") or [], data.get("agent") or {}
    if not steps:
        found.append("the agent has not run a step")
    else:
        last = clock.from_iso(steps[0].get("finished_at") or steps[0]["started_at"])
        interval = float(agent.get("interval_s") or 300)
        if last is not None and (now - last).total_seconds() > 3 * interval:
            found.append(f"the agent last ran {clock.human_age(last, now)} ago")
        if isinstance(steps[0].get("errors"), list) and steps[0]["errors"]:
            found.append(f'the agent\'s last step failed: {_brief(steps[0]["errors"][0], 120)}')
    floor = int(agent.get("min_machines") or 0)
    if floor and data.get("warm", floor) < floor:
        found.append(f'{data["warm"]} warm machine(s), under agent.min_machines {floor}')
    if s.get("orphan_warning"):
        found.append(str(s["orphan_warning"]))
    return found


def _broken(data: dict[str, Any], now: datetime) -> str:
    found = problems(data, now)
    if not found:
        return _card("glance-broken", "Broken", "ok", '<p><span class="big" id="problems">nothing</span></p>'
                     '<p class="note">safety net, demand, vast, destroys and the agent all answer</p>')
    items = "".join(f"<li>{esc(text)}</li>" for text in found)
    return _card("glance-broken", "Broken", "bad",
                 f'<p><span class="big" id="problems">{len(found)}</span> to look at</p><ul class="problems">{items}</ul>')


def _router(router: dict[str, Any] | None) -> str:
    """The proof router's card: the calls it holds for a free prover (the oldest one's age), the calls on provers,
    and the proof wait it measured over the last day (fleet --json's summary.router); nothing without a router."""
    if not router:
        return ""
    wait = router["proof_wait_last_day"]
    if not router["router_running"]:
        status, held = "bad", '<span class="big" id="held-calls">-</span> not running (its status is over 30 s old)'
    else:
        oldest = router["oldest_held_s"]
        status = "ok" if not router["held"] else "warn" if (oldest or 0) < 600 else "bad"
        held = (f'<span class="big" id="held-calls">{esc(router["held"])}</span> held'
                + (f' (oldest {esc(clock.human_duration(float(oldest)))})' if router["held"] and oldest else "")
                + f' · {esc(router["in_flight"])} on provers')
    waits = ("no call answered in the last day" if not wait["calls"] else
             f'proof wait p50 <span id="proof-wait">{esc(clock.human_duration(wait["p50_s"]))}</span>'
             f' · p95 {esc(clock.human_duration(wait["p95_s"]))} · p99 {esc(clock.human_duration(wait["p99_s"]))}'
             f' ({esc(wait["calls"])} calls)')
    return _card("glance-router", "Proof router", status, f'<p>{held}</p><p class="note">{waits}</p>')


def _summary(s: dict[str, Any], now: datetime) -> str:
    capacity, target = s["capacity_proofs_per_hour"], s["target_proofs_per_hour"]
    limits = s["settings"]
    short = " short" if capacity < target else ""
    demand = s["demand"]
    if demand is None:
        demand_text, demand_note = "-", "no demand samples kept"
    else:
        demand_text = _demand_figures(demand)
        stale = "" if demand["known"] else " · unknown: the newest sample failed or is stale"
        done = "-" if demand["proofs_per_hour"] is None else num(demand["proofs_per_hour"])
        demand_note = (f'<span id="demand-done">{esc(done)}</span> finished in the last hour'
                       f' · sample {clock.human_duration(demand["age_s"] or 0)} old{stale}')
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
        ("Demand", demand_text, demand_note),
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


def _cost(figures: dict[str, Any]) -> str:
    """What the fleet cost (cost.account, as `vastctl cost`): vastctl's account; vast's invoice is the truth."""
    per = figures["cost_per_1000_proofs"]
    share = figures["never_proved_share"]
    value = (f'<span class="big" id="cost-total">${figures["cost"]:.2f}</span> spent · '
             + ("no proofs yet" if per is None else f'<span id="cost-per-1000">${per:.2f}</span> per 1,000 proofs'))
    note = (f'rented ${figures["rented"]:.2f} · stopped disks ${figures["stopped_storage"]:.2f} · after kills'
            f' ${figures["after_kill"]:.2f} · {esc(figures["proofs"])} proofs · never proved'
            f' ${figures["never_proved_cost"]:.2f}' + ("" if share is None else f' ({share * 100:.1f}%)')
            + f' · dead until detected ${figures["dead_until_detected_cost"]:.2f} · {esc(figures["source"])}')
    return (f'<section id="cost" class="cards"><div class="card"><h3>Cost</h3><p>{value}</p>'
            f'<p class="note">{note}</p></div></section>')


def _logs(tails: list[dict[str, Any]]) -> str:
    """The machines' log tails (machine_logs.recent, as `vastctl logs`): hostile text, shown as text only."""
    if not tails:
        return '<section id="logs"><h2>Machine logs</h2><p class="empty">no machine has pushed a log</p></section>'
    items = []
    for tail in tails:
        cut_note = " (cut to its tail)" if tail["cut"] else ""
        items.append(
            f'<details class="log" data-label="{esc(tail["label"])}" data-name="{esc(tail["name"])}">'
            f'<summary>{esc(tail["label"])} · {esc(tail["name"])} · {esc(tail["at"])}{cut_note}</summary>'
            f'<pre>{esc(tail["text"], "")}</pre></details>')
    return f'<section id="logs"><h2>Machine logs</h2>{"".join(items)}</section>'


DEMAND_FIGURES = (  # demand.Demand.view() keys, as the card names them
    ("queued", "queued", "proofs waiting for a prover"),
    ("in_flight", "in flight", "claimed by a Curio node: waiting or proving at a daemon"),
    ("lookahead", "look-ahead", "PoRep tasks Curio will create within the hour"),
)


def _demand_figures(demand: dict[str, Any]) -> str:
    """Each figure of the demand sample with its name; one the source does not report says so."""
    parts = []
    for key, name, meaning in DEMAND_FIGURES:
        value, ident = demand.get(key), f'demand-{key.replace("_", "-")}'
        if value is None:
            figure = f'{name} <span class="note">not reported</span>'
        else:
            big = ' class="big"' if key == "queued" else ""
            figure = f"<span{big}>{esc(value)}</span> {name}"
        parts.append(f'<span id="{ident}" title="{name}: {esc(meaning)}">{figure}</span>')
    return " · ".join(parts)


def _refusals(steps: list[dict[str, Any]]) -> dict[str, str]:
    """label → what the guard refused for that machine in the newest step that ran (older ones are history)."""
    if not steps or not isinstance(steps[0].get("refused"), list):
        return {}
    found: dict[str, str] = {}
    for item in steps[0]["refused"]:
        if isinstance(item, dict) and item.get("label"):
            limit = f' [{item["limit"]}]' if item.get("limit") else ""
            found.setdefault(str(item["label"]), f'{item.get("kind", "action")} refused{limit}: {item.get("why") or ""}')
    return found


def _fleet(instances: list[dict[str, Any]], now: datetime, *, refusals: dict[str, str] | None = None) -> str:
    """The machines. `why` is vastctl's own word (kill reason, the guard's refusal, a disagreement with vast);
    vast's raw status message is behind the vast status, opened on demand."""
    head = FLEET_HEAD
    rows = []
    if len(_ROWS) > ROWS_KEPT:
        _ROWS.clear()
    for i in instances:
        refusal = (refusals or {}).get(i["label"])
        since, beat = age(i["state_since"], now), age(i["last_heartbeat_at"], now)
        key = (*(i.get(name) for name in _ROW_FIELDS), repr(i.get("boot_stages")), refusal, since, beat)
        row = _ROWS.get(key)
        if row is None:
            row = _ROWS[key] = _fleet_row(i, refusal, since, beat)
        rows.append(row)
    if not rows:
        rows.append(f'<tr><td colspan="{len(head)}" class="empty">no machines</td></tr>')
    return _table("fleet", "Fleet", head, rows)


# A machine's row is the same text while what it shows is the same (its ages as shown included): kept, so a
# refresh of a thousand machines formats the few that changed. _fleet_row reads these fields and boot_stages.
_ROW_FIELDS = ("uuid", "label", "state", "kill_reason", "disagreement", "num_gpus", "gpu_name", "dph", "bench_rate",
               "proofs_per_hour", "vast_missing", "vast_status", "vast_id", "vast_status_msg")
ROWS_KEPT = 20_000
FLEET_HEAD = ("label", "state", "vast", "GPU", "$/h", "bench", "proofs/h", "for", "beat", "why", "")
_NAMED = [f'<td data-h="{esc(name, "")}">' for name in FLEET_HEAD]
_ROWS: dict[tuple[Any, ...], str] = {}


def _fleet_row(i: dict[str, Any], refusal: str | None, since: str, beat: str) -> str:
    """One machine's row of the fleet table (its ages already worded)."""
    why = " · ".join(str(x) for x in (i["kill_reason"], refusal, i["disagreement"]) if x)
    flag = ' class="disagree"' if i["disagreement"] else ""
    kill = "" if i["state"] == "killed" else (
        f'<button type="button" class="kill" data-kill="{esc(i["label"])}" title="kill {esc(i["label"])}">'
        'kill…</button>')
    gpu = f'{i["num_gpus"] or 1}x {i["gpu_name"]}' if i["gpu_name"] else None
    cells = (esc(i["label"]), f'<span class="state {esc(i["state"])}"{_boot_title(i)}>{esc(i["state"])}</span>',
             _vast_cell(i), esc(gpu), num(i["dph"], 3), num(i["bench_rate"]), num(i["proofs_per_hour"]),
             since, beat, esc(why, ""), kill)
    # each cell already named by its column, as _table's _named would name it
    return (f'<tr{flag} data-label="{esc(i["label"])}">' + "".join(f"{name}{c}</td>" for name, c in zip(_NAMED, cells))
            + "</tr>")


def _boot_title(i: dict[str, Any]) -> str:
    """Where its boot went, on hover over its state: the whole and each stage as its boot script timed them
    (fleet --json's boot_stages); nothing before `running`."""
    stages = {name: float(v) for name, v in (i.get("boot_stages") or {}).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not stages:
        return ""
    parts = " · ".join(f"{name} {clock.human_duration(v)}" for name, v in stages.items())
    return f' title="boot {esc(clock.human_duration(sum(stages.values())))}: {esc(parts)}"'


def _vast_cell(i: dict[str, Any]) -> str:
    """vast's status and instance id; its raw status message (as vast wrote it) in a detail view."""
    status = esc("missing" if i["vast_missing"] else i["vast_status"])
    ident = "" if i["vast_id"] is None else f' <span class="note">#{esc(i["vast_id"])}</span>'
    if not i.get("vast_status_msg"):
        return status + ident
    return (f'<details class="vastmsg" data-key="vastmsg {esc(i["uuid"])}"><summary>{status}{ident}</summary>'
            f'<span class="msg">{esc(i["vast_status_msg"])}</span></details>')


EVENT_HEAD = ("id", "at", "label", "change", "source", "reason")


def _events(events: list[dict[str, Any]], now: datetime) -> str:
    """The newest events first-seen; older ones read behind a detail (a phone's page stays short)."""
    rows = []
    for e in events:
        change = f'{e["from_state"] or "∅"} → {e["to_state"]}' if e["to_state"] else e["kind"]
        reason = (e["reason"] or "") + (f' [{e["code"]}]' if e["code"] else "")
        cells = (esc(e["id"]), when(e["at"], now), esc(e["label"]), esc(change), esc(e["source"]), esc(reason, ""))
        rows.append(f'<tr data-kind="{esc(e["kind"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        rows.append('<tr><td colspan="6" class="empty">no events</td></tr>')
    older = rows[EVENTS_SHOWN:]
    folded = "" if not older else (
        f'<details class="older" id="older-events" data-key="older-events"><summary>{len(older)} older'
        f' event{"s" if len(older) != 1 else ""}</summary>{_table("older", "", EVENT_HEAD, older)}</details>')
    return _table("events", "Latest events (times UTC)", EVENT_HEAD, rows[:EVENTS_SHOWN], after=folded)


STEP_HEAD = ("started", "policy", "outcome", "saw", "did", "refused", "errors", "tokens", "cost")


def _steps(steps: list[dict[str, Any]], now: datetime, *, skipped: Sequence[dict[str, Any]] = (),
           skipped_count: int = 0) -> str:
    """The steps that acted (did, were refused or failed), each a row; a run of steps that changed nothing one
    row with how many and the newest one's hold reason (as `agent history` prints it); those --if-events skipped
    (nothing new happened) folded away below."""
    rows: list[str] = []
    held: list[dict[str, Any]] = []  # newest first

    def fold() -> None:
        if held:
            rows.append(_held_row(held, now))
            held.clear()

    for step in steps:  # newest first
        if len(rows) >= STEPS_SHOWN:
            break
        if _acted(step):
            fold()
            rows.append(_step_row(step, now))
        else:
            held.append(step)
    if len(rows) < STEPS_SHOWN:
        fold()
    if not rows:
        rows.append(f'<tr><td colspan="{len(STEP_HEAD)}" class="empty">no agent step has run yet</td></tr>')
    folded = ""
    if skipped_count:
        shown = f"the newest {len(skipped)} " if skipped_count > len(skipped) else ""
        folded = (f'<details class="skipped" id="skipped-steps" data-key="skipped-steps"><summary>{skipped_count}'
                  f' skipped step{"s" if skipped_count != 1 else ""} (nothing new since the step before): show'
                  f' {shown}</summary>{_table("skipped", "", STEP_HEAD, [_step_row(step, now) for step in skipped])}'
                  "</details>")
    return _table("steps", "Agent steps (times UTC)", STEP_HEAD, rows, after=folded)


def _acted(step: dict[str, Any]) -> bool:
    """It did something, was refused something or failed: worth its own row."""
    return any(step.get(name) not in (None, "", [], {}) for name in ("actions", "refused", "errors"))


def _held_row(run: list[dict[str, Any]], now: datetime) -> str:
    """A run of steps that changed nothing (newest first): when, how many, and why the newest one held."""
    newest, oldest = run[0], run[-1]
    span = when(newest["started_at"], now) if len(run) == 1 else (
        f'{when(oldest["started_at"], now)}–{when(newest["started_at"], now)}')
    why = newest.get("hold") or "nothing to do"
    count = f"{len(run)} steps held" if len(run) > 1 else "held"
    return (f'<tr class="held"><td>{span}</td><td>{esc(newest["policy"])}</td><td>{count}</td>'
            f'<td class="hold" colspan="{len(STEP_HEAD) - 3}">{esc(why)}</td></tr>')


def _step_row(step: dict[str, Any], now: datetime) -> str:
    tokens = step["tokens"]
    used = f'{tokens["input"]} in · {tokens["output"]} out' + (
        f' · {tokens["cache_read"]} cached' if tokens["cache_read"] else "")
    cells = (when(step["started_at"], now), esc(step["policy"]), esc(step["outcome"]),
             esc(_saw(step["observation"]), ""), esc(_items(step["actions"]), ""),
             esc(_items(step["refused"]), ""), esc(_items(step["errors"]), ""), esc(used),
             f'${step["cost"]:.4f}')
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _table(ident: str, title: str, head: Iterable[str], rows: list[str], *, after: str = "") -> str:
    head = list(head)
    th = "".join(f"<th>{esc(h, '')}</th>" for h in head)
    heading = f"<h2>{esc(title)}</h2>" if title else ""
    return (f'<section id="{ident}">{heading}<div class="scroll"><table class="stack">'
            f'<thead><tr>{th}</tr></thead><tbody>{"".join(_named(rows, head))}</tbody></table></div>{after}</section>')


def _named(rows: list[str], head: list[str]) -> Iterable[str]:
    """Each plain `<td>` of a row named by its column (`data-h`): a phone shows the name beside the value."""
    named = [f'<td data-h="{esc(name, "")}">' for name in head]
    for row in rows:
        parts = row.split("<td>")
        yield parts[0] + "".join((named[i] if i < len(named) else "<td>") + part for i, part in enumerate(parts[1:]))


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
    """The last day in three panels, each with its y-axis numbered; drawn twice, for a wide window and for a
    phone (dashboard.css shows one), so the text keeps its size on both."""
    start, end = _chart_span(history)
    limit = float(limits["max_hourly_spend"])
    specs = [
        ("Proofs/hour: capacity vastctl counts, and target", [("capacity", history["capacity"]),
                                                              ("target", history["target"])],
         {"ticks": history["reconcile_failures"], "tick_name": "failed listing"}),
        ("Queued proofs", [("queue", history["queue"])],
         {"empty": "no demand samples in this span" if not history["queue"] else None}),
        ("Spend, $/hour (dashed: max_hourly_spend)", [("spend", history["spend"]),
                                                      ("limit", [(start, limit), (end, limit)])], {}),
    ]
    drawn = []
    for width, kind in ((CHART_WIDTH, "wide"), (NARROW_WIDTH, "narrow")):
        panels = "".join(_panel(title, _top([v for _, points in lines for _, v in points]), start, end, lines,
                                width=width, **extra) for title, lines, extra in specs)
        drawn.append(f'<div class="charts {kind}">{panels}</div>')
    hours = (end - start).total_seconds() / 3600
    span = "Last 24 hours" if hours > 23.9 else f"Since the fleet began ({clock.human_duration(hours * 3600)})"
    return f'<section id="chart"><h2>{span} · UTC</h2>{"".join(drawn)}</section>'


MIN_SPAN = timedelta(hours=1)


def _chart_span(history: dict[str, Any]) -> tuple[datetime, datetime]:
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


def _panel(title: str, top: float, start: datetime, end: datetime, lines: list[tuple[str, list]], *,
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
    for name, points in lines:
        points = [(moment, value) for moment, value in points if moment <= end]
        if not points:
            continue
        coords, last = [], None  # each point placed once: a step to it holds the last height, then rises to its own
        for moment, value in points:
            at, height_ = x(moment), y(value)
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
