"""Operator commands on the state file: init, fleet, events, kill, notify, settings."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Annotated, Mapping, Optional

import typer

from vastctl import clock
from vastctl.cli.app import JsonOpt, app, echo, fmt_num, globals_of, print_json, print_table, say
from vastctl.config import Config
from vastctl.facts import demand
from vastctl.state import lifecycle, settings, tokens
from vastctl.views import fleet, proof_waits, work_waiting


@app.command("init")
def init_cmd(ctx: typer.Context) -> None:
    """Create the state file and the machine-token secret (safe to run again).

    Example: VASTCTL_DB=/var/lib/vastctl/vastctl.db vastctl init
    """
    g = globals_of(ctx)
    g.connect(create=True).close()
    made = tokens.ensure_secret(g.config.secret_path)
    say(f"state file {g.config.db_path} ready; token secret {g.config.secret_path} {'created' if made else 'kept'}")


def _age(iso: str | None, now: datetime) -> str:
    return "-" if iso is None else clock.human_age(clock.from_iso(iso), now)


@app.command("fleet")
def fleet_cmd(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    include_killed: Annotated[bool, typer.Option("--all", help=(
        "Also list killed machines that vast confirmed destroyed or that were never rented (no vast id)."))] = False,
) -> None:
    """Every machine we pay for, our state beside vast's, and a summary line.

    Without --all: every machine not killed, and every killed machine with a vast id whose destroy vast
    has not confirmed yet (it may still bill).

    vast's status comes from the last good listing (`vastctl reconcile`); its age ends the summary line,
    and a `!` marks a machine where vast disagrees with us (the `why` column says how). `contact` is the
    age of a machine's last report of any kind; a warning follows when no machine has reported for half of
    launch.orphan_after (they destroy themselves at the end of it). `routed/h` (once the proof router sent a
    machine calls) is what the router saw it prove over the last hour; a `*` marks a machine counted at the
    router's figure rather than at its heartbeats' or bench rate. `counted/h` is the rate the capacity counts
    a machine at, and the capacity their sum: a machine counts while running, not stopped or gone at vast,
    and joined when it has a tunnel (`joined`: yes, or no and for how long; the agent also counts one not
    joined yet, shown as `+N not joined`). An interruptible machine shows its `bid`, and `outbid` with for
    how long once vast stopped it for a higher bid. A line under the table says what the columns mean.

    Example: vastctl fleet --json | jq '.instances[] | select(.disagreement)'
    """
    g = globals_of(ctx)
    now = g.clock.now()
    conn = g.connect()
    view = fleet.fleet_view(conn, g.config, include_killed=include_killed, now=now)
    work = _work(conn, g.config, view["summary"], now)
    if as_json:
        print_json({**view, "work": work})
        return
    rows, columns = _fleet_table(view["instances"], now)
    print_table(rows, columns)
    if rows:
        echo(_legend(columns, rows))
    echo(work_waiting.line(work))  # the dashboard's first card, before the summary line its figures come from
    s = view["summary"]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(s["by_state"].items())) or "no machines"
    listing = f" · vast listed {_age(s['listing_at'], now)} ago" if s["listing_at"] else ""
    waiting = f" (+{s['not_joined_proofs_per_hour']:g} not joined)" if s["not_joined_proofs_per_hour"] else ""
    echo(
        f"{counts} · capacity {s['capacity_proofs_per_hour']:g}/{s['target_proofs_per_hour']:g} proofs/h{waiting}"
        f" · ${s['spend_per_hour']:.2f}/h{listing}"
    )
    router = s["router"]
    wait = router["proof_wait_last_day"]
    if router["router_running"] or wait["calls"]:
        # waits in the dashboard's words (clock.human_duration); --json keeps the exact seconds
        oldest = f" (oldest {clock.human_duration(router['oldest_held_s'] or 0)})" if router["held"] else ""
        state = f"{router['held']} held{oldest}, {router['in_flight']} on provers" if router["router_running"] \
            else "not running"
        quantiles = "/".join(clock.human_duration(wait[q] or 0) for q in ("p50_s", "p95_s", "p99_s"))
        waits = (f" · proof wait p50/p95/p99 {quantiles}, {wait['within_max_wait']:.1%} within agent.max_wait"
                 f" ({wait['calls']} calls answered in the last 24 h)" if wait["calls"] else "")
        echo(f"router: {state}{waits}")
    if s.get("orphan_warning"):
        say(f"warning: {s['orphan_warning']}")
    if s["listing_error"]:
        say(f"warning: the last vast listing failed: {s['listing_error']}")
    elif not s["listing_at"] and view["instances"]:
        say("vast has not been listed yet: vast statuses are unknown until `vastctl reconcile` runs")


def _work(conn: sqlite3.Connection, config: Config, s: fleet.Summary, now: datetime) -> work_waiting.WorkWaiting:
    """The dashboard's "Work waiting" figures (views/work_waiting.py), read as its page reads them."""
    sample = demand.current(conn, config, now=now)
    router = s["router"]
    shown = router if router["router_running"] or router["proof_wait_last_day"]["calls"] else None
    return work_waiting.work_waiting(proof_waits.proof_waits(conn, config, now), None if sample.at is None else sample.view(),
                                     float(s["capacity_proofs_per_hour"] or 0.0), shown)


def _fleet_table(instances: list[fleet.InstanceView], now: datetime) -> tuple[list[dict[str, object]], list[str]]:
    """`fleet`'s rows and columns: `routed/h` once the router saw a machine prove, `joined` once a machine has a
    tunnel, `bid` once one rents interruptible; `counted/h` always (the summary's capacity is its sum)."""
    rows: list[dict[str, object]] = []
    for i in instances:
        outbid = i["outbid_since"]
        vast = ("missing" if i["vast_missing"] else i["vast_status"] or "-") + (" !" if i["disagreement"] else "")
        rows.append({
            "label": i["label"], "state": i["state"],
            "vast": f"outbid {_age(outbid, now)}" if outbid else vast,
            "vast_id": i["vast_id"], "gpu": f"{i['num_gpus'] or 1}x {i['gpu_name']}" if i["gpu_name"] else "-",
            "$/h": fmt_num(i["dph"], 3), "bid": fmt_num(i["bid"], 3), "bench": fmt_num(i["bench_rate"]),
            "proofs/h": fmt_num(i["proofs_per_hour"]),
            "routed/h": fmt_num(i["routed_rate"]) + ("*" if i["rate_source"] == "router" else ""),
            "counted/h": fmt_num(i["counted_rate"]), "for": _age(i["state_since"], now),
            "heartbeat": _age(i["last_heartbeat_at"], now), "contact": _age(i["last_contact_at"], now),
            "joined": _joined(i, now),
            "why": i["kill_reason"] or (f"vast stopped it for a bid over its ${i['bid']:g}/h" if outbid else "")
            or i["disagreement"] or "",
        })
    columns = ["label", "state", "vast", "vast_id", "gpu", "$/h", "bench", "proofs/h", "counted/h", "for", "heartbeat",
               "contact", "why"]
    if any(i["bid"] is not None for i in instances):  # launch.rental interruptible or mixed: each one's bid
        columns.insert(columns.index("$/h") + 1, "bid")
    if any(i["routed_rate"] is not None for i in instances):  # what the proof router saw each one prove
        columns.insert(columns.index("proofs/h") + 1, "routed/h")
    if any(i["tunnel_port"] is not None for i in instances):  # launch.join ssh: joined, and for how long
        columns.insert(columns.index("why"), "joined")
    return rows, columns


def _joined(i: fleet.InstanceView, now: datetime) -> str:
    """`yes 12m` (joined for that long), `no 3m` (running, unreachable through its tunnel for that long: not
    counted, killed past tunnel.down_timeout), `no` (not running yet), `-` (no tunnel)."""
    if i["joined"] is None:
        return "-"
    if i["joined"]:
        return f"yes {_age(i['joined_at'], now)}"
    return f"no {_age(i['not_joined_since'], now)}" if i["not_joined_since"] else "no"


LEGEND = {
    "counted/h": "counted/h: the rate capacity counts it at (they sum to the capacity below; - not counted)",
    "routed/h": "routed/h: proved through the proof router in the last hour, * where its figures set the rate counted",
    "joined": "joined: the manager reaches its daemon through its tunnel (not joined: not counted)",
    "bid": "bid: $/h bid for an interruptible machine (outbid: vast stopped it for a higher one)",
    "contact": "contact: its last report of any kind",
}


def _legend(columns: list[str], rows: list[dict[str, object]]) -> str:
    """One line under the table naming what its less obvious columns and marks mean (those it has)."""
    parts = [text for name, text in LEGEND.items() if name in columns]
    if any(str(row["vast"]).endswith(" !") for row in rows):
        parts.append("! vast disagrees (why says how)")
    return " · ".join(parts)


@app.command("events")
def events_cmd(
    ctx: typer.Context,
    since: Annotated[Optional[int], typer.Option("--since", min=0, max=fleet.MAX_EVENT_ID,
                                                 help="Only events after this id.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, max=fleet.MAX_EVENT_ID,
                                                 help="Keep the newest N (default 50; every one with --label).")] = None,
    label: Annotated[Optional[str], typer.Option(
        "--label", help="One machine (label or uuid): its whole path, with the calls made to vast for it.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """State changes, notes and settings changes, oldest first: in id order, the order they were written.

    With --label, one machine's whole path: launch, boot reports, benchmark, join, kill, each call to vast
    for it (launch, stop, start, destroy) and where it stands now; --json lists its events alone.

    `at` is the moment the command that wrote an event judged it (a reconcile pass: when vast's listing
    came back); an agent step's events carry the time it observed, which a slow model call can put a few
    seconds before a machine's report written while it waited.

    A launch, stop, resume or kill says why its actor acted ("why: …", its `cause` in --json: the reason the
    agent's policy or the operator gave) and, when an agent step did it, the step (`agent history --label`).

    Example: vastctl events --since 120 --json
    """
    conn = globals_of(ctx).connect()
    if label is not None:
        row = lifecycle.resolve(conn, label)
        if as_json:
            print_json(fleet.events(conn, since=since, limit=limit or fleet.MAX_EVENT_ID, uuid=row["uuid"]))
            return
        path = [step for step in fleet.machine_path(conn, row) if since is None or step["id"] is None or step["id"] > since]
        rows = [{**step, "id": step["id"] or "-", "at": step["at"] or "-", "change": _change(step), "reason": _reason(step)}
                for step in path]
        print_table(rows[-(limit or len(rows)):], ["id", "at", "change", "source", "reason"])
        return
    items = fleet.events(conn, since=since, limit=limit or 50)
    if as_json:
        print_json(items)
        return
    if not items:
        echo("no events yet" if since is None else f"no events match: none after id {since}")
        return
    rows = [{**e, "change": _change({**e, "what": "event"}), "label": e["label"] or "-", "reason": _reason(e)}
            for e in items]
    print_table(rows, ["id", "at", "label", "change", "source", "reason"])


def _reason(step: Mapping[str, object]) -> str:
    """The event's reason, then why its actor acted (its cause, unless the reason says it already) and the agent
    step that did it, then its kill code."""
    reason = str(step["reason"] or "")
    cause = step.get("cause")
    if isinstance(cause, Mapping):
        why = str(cause.get("reason") or "")
        if why and why not in reason:
            reason += f"; why: {why}"
        if cause.get("step") is not None:
            reason += f" (agent step {cause['step']})"
    return reason + (f" [{step['code']}]" if step["code"] else "")


def _change(step: Mapping[str, object]) -> str:
    what = str(step["what"])
    if what != "event":
        return what
    return f"{step['from_state'] or '∅'} → {step['to_state']}" if step["to_state"] else str(step["kind"])


@app.command("kill")
def kill_cmd(
    ctx: typer.Context,
    instance: Annotated[str, typer.Argument(help="Label or uuid.")],
    reason: Annotated[str, typer.Option("--reason", help="Why, for the event log.")],
    force: Annotated[bool, typer.Option("--force", help="Even if it is the last machine proving while work is queued or demand is unknown, or its label lacks our prefix (recorded as forced).")] = False,
) -> None:
    """Kill a machine: it is marked killed (terminal) with your reason, then destroyed at vast.

    The machine is named by its full label or its uuid (no prefixes). A machine with a vast id needs the
    vast key (the destroy); one never rented does not. Refused (exit 4) when it is the last machine really
    proving (running here and at vast, heartbeat fresh) while work is queued or demand is unknown, or when it
    has a vast instance and its label lacks our prefix; --force overrides either, recorded as forced.

    Example: vastctl kill vastctl-3f2a91c0 --reason "GPU errors in dmesg"
    """
    if not reason.strip():
        raise typer.BadParameter("give a --reason for the event log", param_hint="--reason")
    from vastctl import markets, operations
    from vastctl.errors import Unavailable

    g = globals_of(ctx)
    row, error = operations.operator_kill(g.connect(), g.config, instance, reason, force=force, now=g.clock.now(),
                                          make_provider=lambda config: markets.get_provider(config, clock=g.clock))
    echo(f"{row['label']} killed")
    if error:
        raise Unavailable(f"{row['label']} is killed but not yet destroyed at vast ({error}); reconcile retries")
    if row["vast_id"] is not None:
        say(f"vast instance {row['vast_id']} destroyed")


@app.command("notify")
def notify_cmd(ctx: typer.Context, text: Annotated[str, typer.Argument(help="The note.")]) -> None:
    """Leave a note the agent reads at its next step.

    Example: vastctl notify "Curio maintenance 02:00-03:00 UTC, expect an empty queue"
    """
    g = globals_of(ctx)
    event_id = fleet.notify(g.connect(), text, now=g.clock.now())
    typer.echo(f"note recorded (event {event_id}); the agent reads it at its next step")


SETTINGS_HELP = {
    "target_proofs_per_hour": "proofs/hour the fleet should deliver",
    "min_bench_rate": "the benchmark gate, proofs/hour",
    "max_instances": "most machines at once, a whole number (0 pauses every launch)",
    "max_hourly_spend": "most $/hour across the fleet (above 0)",
    "max_daily_spend": "most $ a UTC day: spent since 00:00 UTC plus the next hour (above 0)",
    "max_dph": "most $/hour for one machine (above 0)",
}
KEYS_HELP = "\b\nKeys:\n" + "\n".join(f"  {key:<24}{meaning}" for key, meaning in SETTINGS_HELP.items())

settings_app = typer.Typer(help="Runtime settings: list, get KEY, set KEY VALUE.\n\n" + KEYS_HELP,
                           no_args_is_help=False)
app.add_typer(settings_app, name="settings")


@settings_app.callback(invoke_without_command=True)
def settings_root(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Runtime settings (target, gate, limits); with no sub-command, list them. Each change is an event.

    Example: vastctl settings set target_proofs_per_hour 400
    """
    ctx.meta["settings_json"] = as_json
    if ctx.invoked_subcommand is None:
        _list_settings(ctx, as_json)


def _wants_json(ctx: typer.Context, as_json: bool) -> bool:
    """`settings --json list` and `settings list --json` mean the same."""
    return as_json or bool(ctx.meta.get("settings_json"))


def _setting_text(value: float | int) -> str:
    """One format for a value in `get`, `list` and `set`: 0, 12, 0.6."""
    return f"{value:g}"


def _list_settings(ctx: typer.Context, as_json: bool) -> None:
    g = globals_of(ctx)
    items = settings.listing(g.connect(), g.config)
    if as_json:
        print_json({item["key"]: item["value"] for item in items})
    else:
        print_table([{**item, "value": _setting_text(item["value"])} for item in items],
                    ["key", "value", "source", "updated_at"])


@settings_app.command("list")
def settings_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List every runtime setting with where its value comes from.

    Example: vastctl settings list --json
    """
    _list_settings(ctx, _wants_json(ctx, as_json))


@settings_app.command("get", help="Print one setting's value.\n\n" + KEYS_HELP
                      + "\n\nExample: vastctl settings get min_bench_rate")
def settings_get(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help=f"One of: {', '.join(settings.KEYS)}.")],
    as_json: JsonOpt = False,
) -> None:
    g = globals_of(ctx)
    value = settings.get(g.connect(), g.config, key)
    if _wants_json(ctx, as_json):
        print_json({key: value})
    else:
        typer.echo(_setting_text(value))


# ignore_unknown_options: a negative VALUE such as -5 reaches the value check instead of being read as an option
@settings_app.command("set", context_settings={"ignore_unknown_options": True},
                      help="Change a setting; the change is an event the agent sees.\n\n" + KEYS_HELP
                      + "\n\nExample: vastctl settings set max_instances 12")
def settings_set(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help=f"One of: {', '.join(settings.KEYS)}.")],
    value: Annotated[str, typer.Argument(help="New value: a number ≥ 0 (above 0 for max_dph and max_hourly_spend).")],
) -> None:
    g = globals_of(ctx)
    parsed = settings.parse_value(key, value)
    changed = settings.set_value(g.connect(), g.config, key, value, now=g.clock.now())
    say(f"{key} = {_setting_text(parsed)}" + ("" if changed else " (unchanged)"))
    if key == "max_instances" and parsed == 0:
        say("warning: max_instances 0 pauses every launch (running machines are kept); set it above 0 to launch again")
