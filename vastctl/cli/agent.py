"""`vastctl demand` (what work is waiting) and `vastctl agent-step` (size the fleet to it)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vastctl import clock, markets
from vastctl.cli.app import JsonOpt, app, globals_of, print_action_lines, print_json, quiet_unless_news, say
from vastctl.errors import BadInput, Unavailable

demand_app = typer.Typer(help="Proving work waiting: report it, or show what the newest sample says.",
                         no_args_is_help=True)
app.add_typer(demand_app, name="demand")


@demand_app.command("report")
def demand_report(
    ctx: typer.Context,
    queued: Annotated[int, typer.Option("--queued", min=0, help="Proofs waiting (unclaimed proving tasks).")],
    proofs_per_hour: Annotated[Optional[float], typer.Option("--proofs-per-hour", min=0.0, help="Proofs finished in the last hour.")] = None,
    in_flight: Annotated[Optional[int], typer.Option("--in-flight", min=0, help="Proving tasks claimed by a Curio node (with cuzk: at a daemon).")] = None,
    lookahead: Annotated[Optional[int], typer.Option("--lookahead", min=0, help="PoRep tasks about to be created (sectors precommitted, seed pending).")] = None,
    arrivals: Annotated[Optional[str], typer.Option("--arrivals", help="When they come: PoRep tasks per 10 minutes from now, comma-separated (at most 18).")] = None,
    later: Annotated[Optional[int], typer.Option("--later", min=0, help="Sectors in earlier stages, their PoRep beyond those minutes.")] = None,
) -> None:
    """Record how much work is waiting now (for setups without demand.command).

    Example: vastctl demand report --queued 59 --in-flight 10 --lookahead 24 --arrivals 4,6,2,0,5,7,0,0,0 --proofs-per-hour 310
    """
    from vastctl.facts import demand
    from vastctl.validate import Invalid

    g = globals_of(ctx)
    try:
        counts = None if arrivals is None else demand.arrivals_from_text(arrivals)
    except Invalid as exc:
        raise BadInput(exc.worded("--arrivals")) from None
    demand.report(g.connect(), queued, proofs_per_hour, now=g.clock.now(), in_flight=in_flight, lookahead=lookahead,
                  arrivals=counts, later=later)
    say(f"demand: {queued} queued" + _extra_counts(in_flight, lookahead, counts, later)
        + ("" if proofs_per_hour is None else f", {proofs_per_hour:g} proofs/h"))


def _extra_counts(in_flight: int | None, lookahead: int | None, arrivals: tuple[int, ...] | None = None,
                  later: int | None = None) -> str:
    """", 10 in flight, 24 coming (per 10 min: 4 6 2 …), 40 later" for the counts a sample has."""
    coming = "" if lookahead is None else f", {lookahead} coming"
    if arrivals is not None:
        coming = (coming or ", coming") + f" (per 10 min: {' '.join(map(str, arrivals)) or 'none'})"
    return ("" if in_flight is None else f", {in_flight} in flight") + coming + ("" if later is None else f", {later} later")


@demand_app.command("show")
def demand_show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The demand decisions read now (demand.command is run first when set, not at an --as-of moment); unknown when
    stale or failed.

    Example: vastctl demand show --json
    """
    from vastctl.facts import demand

    g = globals_of(ctx)
    read = demand.current if g.as_of is not None else demand.refresh  # the past's work is not asked for today
    current = read(g.connect(), g.config, now=g.clock.now())
    view = current.view()
    if as_json:
        print_json(view)
        return
    if current.known:
        assert current.age_s is not None  # a known demand comes from a sample, which has an age
        rate = "" if current.proofs_per_hour is None else f", {current.proofs_per_hour:g} proofs/h"
        extra = _extra_counts(current.in_flight, current.lookahead, current.arrivals, current.later)
        typer.echo(f"{current.queued} queued{extra}{rate} ({current.source}, {clock.human_duration(current.age_s)} ago)")
    else:
        typer.echo(f"unknown: {current.error}")


@app.command("agent-step")
def agent_step_cmd(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and guard, print; buy and release nothing.")] = False,
    if_events: Annotated[bool, typer.Option("--if-events", help="Return at once unless something happened or agent.interval passed.")] = False,
    policy: Annotated[Optional[str], typer.Option("--policy", help="plan, rules or llm (default: the config's agent.policy; auto = llm with ANTHROPIC_API_KEY, else plan).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Observe the fleet and the demand, plan, pass every action through the guard, apply.

    Prints one line per action (time, kind, label, vast id, result: reason), as reconcile does, and a
    summary on stderr only when the step did or refused something, so cron mails only then; --json prints
    the step as one JSON object per line. Refused actions are listed (exit 0); a failed step (the llm's
    API down) exits 1 and buys nothing.

    Example: * * * * * vastctl agent-step --if-events >>/var/log/vastctl/agent-step.log 2>&1
    """
    from vastctl.agent import step

    g = globals_of(ctx)
    conn = g.connect()
    result = step.run_step(conn, markets.get_provider(g.config, clock=g.clock), g.config, clock=g.clock, policy=policy,
                           dry_run=dry_run, if_events=if_events)
    if as_json:
        print_json(result.to_json())
    else:
        print_action_lines(result.actions, g.clock.now())
    if result.skipped:
        if not quiet_unless_news():
            say(f"skipped: {result.reason}")
        return
    for item in result.refused:
        say(f"refused: {item['kind']} {item.get('label') or item.get('gpu_name') or ''} ({item['limit']}): {item['why']}")
    if not quiet_unless_news(result.actions, result.refused, result.errors, dry_run):
        prefix = "dry run: " if dry_run else ""
        say(f"{prefix}policy {result.policy}: {len(result.actions)} action(s), {len(result.refused)} refused"
            + (f", {len(result.errors)} error(s)" if result.errors else ""))
        if result.hold:
            say(f"holding: {result.hold}")
    if result.outcome == "error":
        raise Unavailable("; ".join(result.errors) or "the step failed")
    for error in result.errors:
        say(f"warning: {error}")
