"""Operator commands on the state file: init, fleet, events, kill, notify, settings."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Mapping, Optional

import typer

from vastctl import clock
from vastctl.cli.app import JsonOpt, app, echo, fmt_num, globals_of, print_json, print_table, say
from vastctl.state import lifecycle, settings, tokens
from vastctl.views import fleet


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
    router's figure rather than at its heartbeats' or bench rate.

    Example: vastctl fleet --json | jq '.instances[] | select(.disagreement)'
    """
    g = globals_of(ctx)
    now = g.clock.now()
    view = fleet.fleet_view(g.connect(), g.config, include_killed=include_killed, now=now)
    if as_json:
        print_json(view)
        return
    rows = [
        {
            "label": i["label"], "state": i["state"],
            "vast": ("missing" if i["vast_missing"] else i["vast_status"] or "-") + (" !" if i["disagreement"] else ""),
            "vast_id": i["vast_id"], "gpu": f"{i['num_gpus'] or 1}x {i['gpu_name']}" if i["gpu_name"] else "-",
            "$/h": fmt_num(i["dph"], 3), "bench": fmt_num(i["bench_rate"]), "proofs/h": fmt_num(i["proofs_per_hour"]),
            "for": _age(i["state_since"], now), "heartbeat": _age(i["last_heartbeat_at"], now),
            "contact": _age(i["last_contact_at"], now), "why": i["kill_reason"] or i["disagreement"] or "",
        }
        for i in view["instances"]
    ]
    columns = ["label", "state", "vast", "vast_id", "gpu", "$/h", "bench", "proofs/h", "for", "heartbeat", "contact",
               "why"]
    if any(i["tunnel_port"] is not None for i in view["instances"]):  # launch.join ssh: joined, and for how long
        for row, i in zip(rows, view["instances"]):
            row["joined"] = {True: f"yes {_age(i['joined_at'], now)}", False: "no", None: "-"}[i["joined"]]
        columns.insert(columns.index("why"), "joined")
    if any(i["routed_rate"] is not None for i in view["instances"]):  # what the proof router saw each one prove
        for row, i in zip(rows, view["instances"]):
            row["routed/h"] = fmt_num(i["routed_rate"]) + ("*" if i["rate_source"] == "router" else "")
        columns.insert(columns.index("proofs/h") + 1, "routed/h")
    print_table(rows, columns)
    s = view["summary"]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(s["by_state"].items())) or "no machines"
    listing = f" · vast listed {_age(s['listing_at'], now)} ago" if s["listing_at"] else ""
    echo(
        f"{counts} · capacity {s['capacity_proofs_per_hour']:g}/{s['target_proofs_per_hour']:g} proofs/h"
        f" · ${s['spend_per_hour']:.2f}/h{listing}"
    )
    router = s["router"]
    wait = router["proof_wait_last_day"]
    if router["router_running"] or wait["calls"]:
        oldest = f" (oldest {router['oldest_held_s']:g}s)" if router["held"] else ""
        state = f"{router['held']} held{oldest}, {router['in_flight']} on provers" if router["router_running"] \
            else "not running"
        waits = (f" · proof wait p50/p95/p99 {wait['p50_s']:g}/{wait['p95_s']:g}/{wait['p99_s']:g}s,"
                 f" {wait['within_max_wait']:.1%} within agent.max_wait ({wait['calls']} calls, last day)"
                 if wait["calls"] else "")
        echo(f"router: {state}{waits}")
    if s.get("orphan_warning"):
        say(f"warning: {s['orphan_warning']}")
    if s["listing_error"]:
        say(f"warning: the last vast listing failed: {s['listing_error']}")
    elif not s["listing_at"] and view["instances"]:
        say("vast has not been listed yet: vast statuses are unknown until `vastctl reconcile` runs")


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
    rows = [{**e, "change": _change({**e, "what": "event"}), "label": e["label"] or "-", "reason": _reason(e)}
            for e in items]
    print_table(rows, ["id", "at", "label", "change", "source", "reason"])


def _reason(step: Mapping[str, object]) -> str:
    reason = str(step["reason"] or "")
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
