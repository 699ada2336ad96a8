"""The dashboard's cards at the top: the glance row (work waiting, money, what is broken, the proof router) and
the summary under it (capacity, spend, demand, machines, the safety net, the cost).

The top row (`glance`) answers three questions before anything else: is work
waiting too long (proofs done within agent.max_wait over the last day), is money
leaking (spend now, today against max_daily_spend, what idle machines bill), is
anything broken (the safety net, demand, vast's word, the agent, the floor).
Its figures are the CLI's: `vastctl cost` (whole file, --since 24h, --since
00:00 UTC) and `fleet`'s summary, read at the page's one `now`. The proof
router's held calls and proof wait take their place at its end (`_router`), and its measured proof wait replaces
the estimate of the first card when it answered calls.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Mapping

from vastctl import clock
from vastctl.serving.dashboard_html import brief, esc, num
from vastctl.views.work_waiting import CURIO_WORDS, endless, work_waiting

if TYPE_CHECKING:
    from vastctl.facts.cost import CostView
    from vastctl.facts.demand import DemandView
    from vastctl.serving.dashboard_data import PageData
    from vastctl.views.fleet import RouterStatus
    from vastctl.views.overview import PageSummary


def _card(ident: str, title: str, status: str, body: str) -> str:
    return f'<div class="card glance {status}" id="{ident}"><h3>{title}</h3>{body}</div>'


def glance(data: PageData, now: datetime) -> str:
    """The top row: waiting, money, broken; then the proof router's figures when it reports them."""
    cards = [_waiting(data), _money(data, now), _broken(data, now), _router(data.get("router"))]
    return f'<section id="glance" class="cards top">{"".join(cards)}</section>'


def _waiting(data: PageData) -> str:
    """Is work waiting too long: the share of the last day's proofs done within agent.max_wait (the router's
    measure, else Curio's counts: views/work_waiting.py, as `fleet`'s work line), and how long a proof arriving
    now waits."""
    s = data["summary"]
    work = work_waiting(data["waits"], s["demand"], float(s["capacity_proofs_per_hour"] or 0.0), data.get("router"))
    limit = clock.human_duration(work["max_wait_s"])
    share = work["within_max_wait"]
    if share is None:
        headline = '<span class="big" id="within-max-wait">-</span> no proofs done in the last day'
    elif work["source"] == "router":
        headline = (f'<span class="big" id="within-max-wait">{share * 100:.1f}%</span> done within {esc(limit)}'
                    ' <span class="note" title="held + proving time of each call the proof router answered">'
                    '(24 h, measured)</span>')
    else:
        headline = (f'<span class="big" id="within-max-wait">{share * 100:.1f}%</span> done within {esc(limit)}'
                    ' <span class="note" title="estimated from the demand samples Curio reported: a proof waits about'
                    ' what is queued and in flight over the proofs Curio finished per hour; not measured by vastctl">'
                    f"(24 h, {CURIO_WORDS})</span>")
    wait = work["wait_now_s"]
    if not work["known"]:
        now_text, status = "demand unknown: the newest sample failed or is stale", "bad"
    elif work["stuck"]:
        now_text, status = "work queued and no proof done in the last hour", "bad"
    else:
        assert wait is not None  # known and not stuck: work_waiting always gives a wait
        now_text = ("work queued and nothing running to prove it" if endless(wait)
                    else f'a proof arriving now waits ~{esc(clock.human_duration(wait))}')
        status = "bad" if wait > work["max_wait_s"] else "warn" if wait > work["max_wait_s"] / 2 else "ok"
    if share is not None and status == "ok":
        status = "bad" if share < 0.95 else "warn" if share < 0.99 else "ok"
    figures: Mapping[str, object] = s["demand"] or {}
    queue = " · ".join(f"{esc(figures[k])} {name}" for k, name, _ in DEMAND_FIGURES if figures.get(k) is not None)
    body = f'<p>{headline}</p><p class="note">{now_text}{" · " + queue if queue else ""}</p>'
    return _card("glance-waiting", "Work waiting", status, body)


def _money(data: PageData, now: datetime) -> str:
    """Is money leaking: spend now, today against max_daily_spend, the last day's cost per proof, what idle machines
    bill. The day and today are `vastctl cost --since 24h` and `--since` 00:00 UTC, at the page's now (today is
    named by its date: at a past moment it is that moment's day)."""
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
            f' <span id="spent-today">${today:.2f}</span> today ({now.astimezone(timezone.utc):%m-%d} UTC) of'
            f' ${num(daily, 2)}</p>'
            f'<p class="note">last 24 h <span id="cost-day">${day["cost"]:.2f}</span> for'
            f' <span id="proofs-day">{esc(day["proofs"])}</span> proofs'
            + ("" if per is None else f' · ${per:.2f} per 1,000') +
            f' · idle <span id="idle-lost">${idle["lost"]:.2f}/h</span> killed, dead or missing,'
            f' ${idle["stopped"]:.2f}/h stopped disks</p>')
    return _card("glance-money", "Money", status, body)


def problems(data: PageData, now: datetime) -> list[str]:
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
    if s["not_joined_proofs_per_hour"]:
        found.append(f'running machine(s) the manager cannot reach through their tunnel: {num(s["not_joined_proofs_per_hour"])}'
                     ' proofs/h not counted (see joined)')
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
        errors = steps[0].get("errors")
        if isinstance(errors, list) and errors:
            found.append(f'the agent\'s last step failed: {brief(errors[0], 120)}')
    floor = int(agent.get("min_machines") or 0)
    if floor and data.get("warm", floor) < floor:
        found.append(f'{data["warm"]} warm machine(s), under agent.min_machines {floor}')
    if s.get("orphan_warning"):
        found.append(str(s["orphan_warning"]))
    return found


def _broken(data: PageData, now: datetime) -> str:
    found = problems(data, now)
    if not found:
        return _card("glance-broken", "Broken", "ok", '<p><span class="big" id="problems">nothing</span></p>'
                     '<p class="note">safety net, demand, vast, destroys and the agent all answer</p>')
    items = "".join(f"<li>{esc(text)}</li>" for text in found)
    return _card("glance-broken", "Broken", "bad",
                 f'<p><span class="big" id="problems">{len(found)}</span> to look at</p><ul class="problems">{items}</ul>')


def _router(router: RouterStatus | None) -> str:
    """The proof router's card: the calls it holds for a free prover (the oldest one's age), the calls on provers,
    and the proof wait it measured over the last day (fleet --json's summary.router); nothing without a router."""
    if not router:
        return ""
    wait = router["proof_wait_last_day"]
    if not router["router_running"] and router["updated_at"] is None:  # calls kept, no router ever wrote a status
        status, held = "ok", '<span class="big" id="held-calls">-</span> no router status in this file'
    elif not router["router_running"]:
        status, held = "bad", ('<span class="big" id="held-calls">-</span> not running (its last status,'
                               f' {esc(router["updated_at"])}, is over 30 s old)')
    else:
        oldest = router["oldest_held_s"]
        status = "ok" if not router["held"] else "warn" if (oldest or 0) < 600 else "bad"
        held = (f'<span class="big" id="held-calls">{esc(router["held"])}</span> held'
                + (f' (oldest {esc(clock.human_duration(float(oldest)))})' if router["held"] and oldest else "")
                + f' · {esc(router["in_flight"])} on provers')
    waits = ("no call answered in the last day" if not wait["calls"] else
             f'proof wait p50 <span id="proof-wait">{esc(_duration(wait["p50_s"]))}</span>'
             f' · p95 {esc(_duration(wait["p95_s"]))} · p99 {esc(_duration(wait["p99_s"]))}'
             f' ({esc(wait["calls"])} calls answered in the last 24 h)')
    unverified, risky = _unverified(router.get("routing")) if router["router_running"] else ("", False)
    if risky and status == "ok":
        status = "warn"
    return _card("glance-router", "Proof router", status, f'<p>{held}</p><p class="note">{waits}</p>{unverified}')


def _duration(seconds: float | None) -> str:
    """A quantile of the calls answered (there are some: never None here)."""
    return clock.human_duration(seconds or 0.0)


UNVERIFIED_WORDS = {"snap": "SnapDeals", "winning_post": "WinningPoSt"}  # the kinds Curio does not verify
WAY_WORDS = {"own_daemon": "your own daemon", "fleet": "the rented fleet, unverified",
             "refused": "refused (route.own_daemon not set)"}


def _unverified(routing: Mapping[str, str] | None) -> tuple[str, bool]:
    """Where the running router sends the proofs Curio does not verify (route_status.routing), and whether that
    is anything but the operator's own daemon (refused, or the fleet by route.unverified_to_fleet)."""
    if not routing:
        return "", False
    shown = [(words, routing[kind]) for kind, words in UNVERIFIED_WORDS.items() if kind in routing]
    if not shown:
        return "", False
    text = " · ".join(f"{esc(words)} → {esc(WAY_WORDS.get(way, way))}" for words, way in shown)
    return (f'<p class="note" id="unverified-routing">unverified by Curio: {text}</p>',
            any(way != "own_daemon" for _, way in shown))


def summary(s: PageSummary, now: datetime) -> str:
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
         f'+{num(s["pending_capacity_proofs_per_hour"])} proofs/h on the way'
         + (f' · +{num(s["not_joined_proofs_per_hour"])} not joined' if s["not_joined_proofs_per_hour"] else "")),
        ("Spend", f'<span class="big">${s["spend_per_hour"]:.2f}</span>/h',
         f'limit ${num(limits["max_hourly_spend"], 2)}/h · max ${num(limits["max_dph"], 3)}/h a machine'),
        ("Demand", demand_text, demand_note),
        ("Machines", f'<span class="big">{sum(s["by_state"].values())}</span> of {esc(limits["max_instances"])}',
         f'{states} · {s["disagreements"]} disagree'),
        ("Safety net", esc(listing, ""), f'{rec["failures_last_day"]} failed listings in the last 24 h{destroys}'),
    ]
    body = "".join(f'<div class="card"><h3>{title}</h3><p>{value}</p><p class="note">{note}</p></div>'
                   for title, value, note in cards)
    return f'<section id="summary" class="cards">{body}</section>'


def orphan_warning(s: PageSummary) -> str:
    """The machines' dead-man switch is counting down (fleet.contact_status): say so above everything."""
    text = s.get("orphan_warning")
    return f'<p class="flash error" role="alert" id="orphan-warning">{esc(text)}</p>' if text else ""


def cost(figures: CostView) -> str:
    """What the fleet cost (cost.account, as `vastctl cost`): vastctl's account; vast's invoice is the truth."""
    per = figures["cost_per_1000_proofs"]
    share = figures["never_proved_share"]
    value = (f'<span class="big" id="cost-total">${figures["cost"]:.2f}</span> spent · '
             + ("no proofs yet" if per is None else f'<span id="cost-per-1000">${per:.2f}</span> per 1,000 proofs'))
    note = (f'rented ${figures["rented"]:.2f} · stopped disks ${figures["stopped_storage"]:.2f} · after kills'
            f' ${figures["after_kill"]:.2f} · {esc(figures["proofs"])} proofs since the file began (the calls the'
            ' proof router answered) · never proved'
            f' ${figures["never_proved_cost"]:.2f}' + ("" if share is None else f' ({share * 100:.1f}%)')
            + f' · dead until detected ${figures["dead_until_detected_cost"]:.2f} · {esc(figures["source"])}')
    return (f'<section id="cost" class="cards"><div class="card"><h3>Cost</h3><p>{value}</p>'
            f'<p class="note">{note}</p></div></section>')


DEMAND_FIGURES = (  # demand.Demand.view() keys, as the card names them
    ("queued", "queued", "proofs waiting for a prover"),
    ("in_flight", "in flight", "claimed by a Curio node: waiting or proving at a daemon"),
    ("lookahead", "look-ahead", "PoRep tasks Curio will create within the hour"),
)


def _demand_figures(demand: DemandView) -> str:
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
