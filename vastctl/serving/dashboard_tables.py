"""The dashboard's tables: the fleet, the events, the agent's steps, and the machines' log tails.

Read at a glance: a machine's `why` is vastctl's own word (kill reason, the
guard's refusal, a disagreement with vast) and vast's raw status message waits
in a <details> behind its status; the steps --if-events skipped are folded in
another (dashboard.js keeps an opened one open across refreshes).
Agent steps that changed nothing are folded into one row per run, with the
hold reason `agent history` prints.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Sequence

from vastctl import clock
from vastctl.serving.dashboard_html import age, brief, esc, num, table, when

if TYPE_CHECKING:
    from vastctl.facts.machine_logs import RecentLog
    from vastctl.views.fleet import EventView, InstanceView
    from vastctl.views.overview import AgentStep

STEPS_SHOWN = 10
EVENTS_SHOWN = 10  # the newest events shown; the rest of those read wait behind a detail


def logs(tails: list[RecentLog]) -> str:
    """The machines' log tails (machine_logs.recent, as `vastctl logs`): hostile text, shown as text only."""
    if not tails:
        return '<section id="logs"><h2>Machine logs</h2><p class="empty">no machine has pushed a log</p></section>'
    items = []
    for tail in tails:
        cut_note = " (cut to its tail)" if tail["cut"] else ""
        items.append(
            f'<details class="log" data-label="{esc(tail["label"])}" data-name="{esc(tail["name"])}">'
            f'<summary>{esc(tail["label"])} · {esc(tail["name"])} · <span class="at">{esc(tail["at"])}</span>{cut_note}</summary>'
            f'<pre>{esc(tail["text"], "")}</pre></details>')
    return f'<section id="logs"><h2>Machine logs</h2>{"".join(items)}</section>'


def step_refusals(steps: list[AgentStep]) -> dict[str, str]:
    """label → what the guard refused for that machine in the newest step that ran (older ones are history)."""
    refused = steps[0].get("refused") if steps else None
    if not isinstance(refused, list):
        return {}
    found: dict[str, str] = {}
    for item in refused:
        if isinstance(item, dict) and item.get("label"):
            limit = f' [{item["limit"]}]' if item.get("limit") else ""
            found.setdefault(str(item["label"]), f'{item.get("kind", "action")} refused{limit}: {item.get("why") or ""}')
    return found


def fleet(instances: list[InstanceView], now: datetime, *, refusals: dict[str, str] | None = None) -> str:
    """The machines. `why` is vastctl's own word (kill reason, the guard's refusal, a disagreement with vast);
    vast's raw status message is behind the vast status, opened on demand. The columns `vastctl fleet` has:
    `routed/h` once the router saw a machine prove, `joined` once a machine has a tunnel, `counted/h` always."""
    routed = any(i["routed_rate"] is not None for i in instances)
    tunnels = any(i["tunnel_port"] is not None for i in instances)
    head = tuple(name for name in FLEET_HEAD if (routed or name != "routed/h") and (tunnels or name != "joined"))
    rows = []
    if len(_ROWS) > ROWS_KEPT:
        _ROWS.clear()
    for i in instances:
        refusal = (refusals or {}).get(i["label"])
        since, beat = age(i["state_since"], now), age(i["last_heartbeat_at"], now)
        joined, outbid = _joined(i, now), age(i["outbid_since"], now) if i["outbid_since"] else None
        key = (*map(i.get, _ROW_FIELDS), repr(i.get("boot_stages")), refusal, since, beat, joined, outbid, head)
        row = _ROWS.get(key)
        if row is None:
            row = _ROWS[key] = _fleet_row(i, refusal, head, since=since, beat=beat, joined=joined, outbid=outbid)
        rows.append(row)
    if not rows:
        rows.append(f'<tr><td colspan="{len(head)}" class="empty">no machines</td></tr>')
    legend = " · ".join(text for name, text in FLEET_LEGEND.items() if name in head)
    # _fleet_row names its cells
    return table("fleet", "Fleet", head, rows, named=True, after=f'<p class="note" id="fleet-legend">{esc(legend)}</p>')


# A machine's row is the same text while what it shows is the same (its ages as shown included): kept, so a
# refresh of a thousand machines formats the few that changed. _fleet_row reads these fields and boot_stages.
_ROW_FIELDS = ("uuid", "label", "state", "kill_reason", "disagreement", "num_gpus", "gpu_name", "dph", "bench_rate",
               "proofs_per_hour", "vast_missing", "vast_status", "vast_id", "vast_status_msg", "routed_rate",
               "rate_source", "counted_rate", "bid", "outbid_since")
ROWS_KEPT = 20_000
FLEET_HEAD = ("label", "state", "vast", "GPU", "$/h", "bench", "proofs/h", "routed/h", "counted/h", "for", "beat",
              "joined", "why", "")
# the line under the table: what `vastctl fleet`'s says of the same columns, for those the table has
FLEET_LEGEND = {
    "counted/h": "counted/h: the rate the capacity counts a machine at (they sum to the capacity; - not counted:"
                 " not running, stopped or gone at vast, or not joined)",
    "routed/h": "routed/h: proved through the proof router in the last hour, * where its figures set the rate counted",
    "joined": "joined: the manager reaches its daemon through its tunnel, for how long (- no tunnel)",
}
_NAMED = {name: f'<td data-h="{esc(name, "")}">' for name in FLEET_HEAD}
_ROWS: dict[tuple[object, ...], str] = {}


def _joined(i: InstanceView, now: datetime) -> str:
    """As `vastctl fleet` says it: `yes 12m`, `no 3m` (running and unreachable that long: not counted), `no`, `-`."""
    if i["joined"] is None:
        return "-"
    if i["joined"]:
        return f'yes {age(i["joined_at"], now)}'
    return f'no {age(i["not_joined_since"], now)}' if i["not_joined_since"] else "no"


def _fleet_row(i: InstanceView, refusal: str | None, head: tuple[str, ...], *, since: str, beat: str, joined: str,
               outbid: str | None) -> str:
    """One machine's row of the fleet table, its cells those `head` names (its ages already worded; `outbid`:
    for how long, once vast stopped it for a higher bid)."""
    paused = f'vast stopped it for a bid over its ${i["bid"]:g}/h' if outbid and i["bid"] is not None else None
    why = " · ".join(str(x) for x in (i["kill_reason"], refusal, paused or i["disagreement"]) if x)
    flag = ' class="disagree"' if i["disagreement"] else ""
    kill = "" if i["state"] == "killed" else (
        f'<button type="button" class="kill" data-kill="{esc(i["label"])}" title="kill {esc(i["label"])}">'
        'kill…</button>')
    gpu = f'{i["num_gpus"] or 1}x {i["gpu_name"]}' if i["gpu_name"] else None
    cells = {"label": esc(i["label"]),
             "state": f'<span class="state {esc(i["state"])}"{_boot_title(i)}>{esc(i["state"])}</span>',
             "vast": _vast_cell(i, outbid), "GPU": esc(gpu), "$/h": num(i["dph"], 3), "bench": num(i["bench_rate"]),
             "proofs/h": num(i["proofs_per_hour"]),
             "routed/h": num(i["routed_rate"]) + ("*" if i["rate_source"] == "router" else ""),
             "counted/h": num(i["counted_rate"]), "for": since, "beat": beat, "joined": esc(joined),
             "why": esc(why, ""), "": kill}
    # each cell already named by its column, as dashboard_html's _named would name it
    return (f'<tr{flag} data-label="{esc(i["label"])}">' + "".join(f"{_NAMED[name]}{cells[name]}</td>" for name in head)
            + "</tr>")


def _boot_title(i: InstanceView) -> str:
    """Where its boot went, on hover over its state: the whole and each stage as its boot script timed them
    (fleet --json's boot_stages); nothing before `running`."""
    stages = {name: float(v) for name, v in (i.get("boot_stages") or {}).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not stages:
        return ""
    parts = " · ".join(f"{name} {clock.human_duration(v)}" for name, v in stages.items())
    return f' title="boot {esc(clock.human_duration(sum(stages.values())))}: {esc(parts)}"'


def _vast_cell(i: InstanceView, outbid: str | None = None) -> str:
    """vast's status (`outbid` and for how long, for an interruptible machine vast stopped for a higher bid) and
    instance id; its raw status message (as vast wrote it) in a detail view."""
    status = esc(f"outbid {outbid}" if outbid else "missing" if i["vast_missing"] else i["vast_status"])
    ident = "" if i["vast_id"] is None else f' <span class="note">#{esc(i["vast_id"])}</span>'
    if not i.get("vast_status_msg"):
        return status + ident
    return (f'<details class="vastmsg" data-key="vastmsg {esc(i["uuid"])}"><summary>{status}{ident}</summary>'
            f'<span class="msg">{esc(i["vast_status_msg"])}</span></details>')


EVENT_HEAD = ("id", "at", "label", "change", "source", "reason")


def events(events: list[EventView], now: datetime) -> str:
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
        f' event{"s" if len(older) != 1 else ""}</summary>{table("older", "", EVENT_HEAD, older)}</details>')
    return table("events", "Latest events (times UTC)", EVENT_HEAD, rows[:EVENTS_SHOWN], after=folded)


STEP_HEAD = ("started", "policy", "outcome", "saw", "did", "refused", "errors", "tokens", "cost")


def steps(steps: list[AgentStep], now: datetime, *, skipped: Sequence[AgentStep] = (),
           skipped_count: int = 0) -> str:
    """The steps that acted (did, were refused or failed), each a row; a run of steps that changed nothing one
    row with how many and the newest one's hold reason (as `agent history` prints it); those --if-events skipped
    (nothing new happened) folded away below."""
    rows: list[str] = []
    held: list[AgentStep] = []  # newest first

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
                  f' {shown}</summary>{table("skipped", "", STEP_HEAD, [_step_row(step, now) for step in skipped])}'
                  "</details>")
    return table("steps", "Agent steps (times UTC)", STEP_HEAD, rows, after=folded)


def _acted(step: AgentStep) -> bool:
    """It did something, was refused something or failed: worth its own row."""
    return any(step.get(name) not in (None, "", [], {}) for name in ("actions", "refused", "errors"))


def _held_row(run: list[AgentStep], now: datetime) -> str:
    """A run of steps that changed nothing (newest first): when, how many, and why the newest one held."""
    newest, oldest = run[0], run[-1]
    span = when(newest["started_at"], now) if len(run) == 1 else (
        f'{when(oldest["started_at"], now)}–{when(newest["started_at"], now)}')
    why = newest.get("hold") or "nothing to do"
    count = f"{len(run)} steps held" if len(run) > 1 else "held"
    return (f'<tr class="held"><td>{span}</td><td>{esc(newest["policy"])}</td><td>{count}</td>'
            f'<td class="hold" colspan="{len(STEP_HEAD) - 3}">{esc(why)}</td></tr>')


def _step_row(step: AgentStep, now: datetime) -> str:
    tokens = step["tokens"]
    used = f'{tokens["input"]} in · {tokens["output"]} out' + (
        f' · {tokens["cache_read"]} cached' if tokens["cache_read"] else "")
    cells = (when(step["started_at"], now), esc(step["policy"]), esc(step["outcome"]),
             esc(_saw(step["observation"]), ""), esc(_items(step["actions"]), ""),
             esc(_items(step["refused"]), ""), esc(_items(step["errors"]), ""), esc(used),
             f'${step["cost"]:.4f}')
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _saw(observation: object) -> str:
    """The headline of what a step saw (agent.step.observation_summary): capacity against target, machines
    on their way, spend, demand, the fleet by state and how many new events; a stored value of another
    shape (a file edited by hand) is shown as its text."""
    if not isinstance(observation, dict) or "demand" not in observation:
        return brief(observation, 160)
    target = (observation.get("settings") or {}).get("target_proofs_per_hour")
    demand = observation["demand"] or {}
    queued = f'{demand.get("queued")} queued' if demand.get("known") else "demand unknown"
    states = ", ".join(f"{n} {state}" for state, n in sorted((observation.get("by_state") or {}).items()))
    parts = [f'capacity {num(observation.get("capacity"))} / {num(target)}',
             f'+{num(observation.get("pending_capacity"))} on the way',
             f'${observation.get("spend_per_hour") or 0:.2f}/h', queued, states or "no machines",
             f'{len(observation.get("events") or [])} new events']
    return " · ".join(parts)


ITEM_HEAD = ("kind", "label", "count", "gpu_name")  # as guard.Action.view() names them


def _items(value: object) -> str:
    """Actions, refusals or errors as `kind label: reason → result` lines joined by ' · '."""
    if value in (None, "", [], {}):
        return ""
    if not isinstance(value, list):
        return brief(value, 300)
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
    return brief(" · ".join(lines) + more, 400)
