"""`vastctl demo`: a simulated day of the control loop on a scratch file, with a summary and a chart."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vastctl import clock
from vastctl.cli.app import JsonOpt, app, globals_of, print_json, print_table, say

SUMMARY = [
    ("proofs done within {max_wait} of arriving", "proofs_within_max_wait", "pct"),  # agent.max_wait, as the dashboard says it
    ("proof wait p50 / p95 / p99", ("proof_wait_p50_s", "proof_wait_p95_s", "proof_wait_p99_s"), "wait"),
    ("target met (after warm-up, work queued)", "target_attainment", "pct"),
    ("proofs done / arrived", ("proofs", "proofs_arrived"), "pair"),
    ("cost (simulated billing)", "cost", "usd"),
    ("cost per 1000 proofs", "cost_per_1000_proofs", "usd"),
    ("vastctl's account: cost / proofs answered", ("vastctl_cost", "vastctl_proofs"), "account"),
    ("lower bound per 1000 proofs", "lower_bound_cost_per_1000_proofs", "usd"),
    ("cost / lower bound", "cost_ratio_to_lower_bound", "ratio"),
    ("cost / any-host bound", "cost_ratio_to_any_host_bound", "ratio"),
    ("cost / bid-aware bound (min_bid)", "cost_ratio_to_interruptible_bound", "ratio"),
    ("machines launched", "machines_launched", "int"),
    ("billed instance-hours", "billed_instance_hours", "hours"),
    ("leaked instance-hours (billed after a kill)", "leaked_instance_hours", "hours"),
    ("dead machines detected p50 / p95", ("detection_latency_p50_s", "detection_latency_p95_s"), "seconds"),
    ("agent steps that ran", "agent_steps", "int"),
]


EXPLAINED = (
    "lower bound: the least any fleet could pay for the day's proofs on this market (a linear program over"
    " the hosts the fleet may rent, its filters, knowing every host's true rate, fractions of a machine):"
    " it may keep a host through an hour another renter takes, keep the price it rented at while the offer's"
    " rises, stop a host at its disk's price, and let proofs wait up to agent.max_wait; no fleet pays less.",
    "any-host bound: the same on every host of the market, no filter of the fleet's; bid-aware bound: the"
    " fleet's hosts by bid from their min_bid, proving only while no higher rival bid holds the host (the"
    " market's rivals, known in hindsight), else on demand (the bound for interruptible and mixed rental).",
    "proof wait: from a proof's arrival to its answer (held, then proving), each proof a call as the proof router"
    " records it in the state file; here over the day's {judged} calls (those answered just after its end"
    " included; proofs still waiting past agent.max_wait at the end count as late), in `fleet`, the dashboard and"
    " /metrics over the {last_day} answered in the 24 h up to its end, so their seconds may differ a little.",
    "vastctl's account: what the state file says at the day's end (`vastctl cost`, the dashboard's Cost card,"
    " /metrics' vastctl_cost_*), above the simulated billing by the first minutes of each boot (counted at the"
    " full price). {proofs_why}",
    "cost / lower bound: how many times that bound the run paid (1.00x is out of reach; above it is whole"
    " machines, boot and benchmark time, failures and the headroom kept for bursts).",
)


@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    hours: Annotated[float, typer.Option("--hours", help="Simulated hours to run (24: the whole demand curve).")] = 24.0,
    seed: Annotated[Optional[int], typer.Option("--seed", help="The market's and the demand's seed: same seed, same run (default 351).")] = None,
    rental: Annotated[Optional[str], typer.Option("--rental", help="How the fleet rents: on-demand, interruptible (bids at min_bid + launch.bid_margin) or mixed (default: launch.rental of --config, else on-demand).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="plan (the planning policy, as agent.policy auto without ANTHROPIC_API_KEY), rules, or llm (spends real tokens; needs ANTHROPIC_API_KEY).")] = "plan",
    failures: Annotated[str, typer.Option("--failures", help="How often machines fail: low, default or high.")] = "default",
    chart: Annotated[Optional[Path], typer.Option("--chart", help="Write target, capacity, queue and spend over time to FILE (.svg or .png).")] = None,
    keep: Annotated[Optional[Path], typer.Option("--keep", help="Keep the simulated day's state file as FILE (a new file; its token secret beside it as FILE.secret, an admin token for its dashboard as FILE.admin-token): `vastctl --db FILE serve` shows it.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the control loop against a simulated market for a day, on virtual time, in seconds.

    A scratch state file in a temporary directory (your own file is never touched), a demand curve
    (daily swing, a burst, a quiet spell, an outage of the demand source), reconcile and
    agent-step every simulated minute as cron would. Prints what it cost, how often the target was
    met and how fast dead machines were caught.

    Example: vastctl demo --hours 24 --seed 1 --chart demo.svg --keep demo.db
    """
    from vastctl.demo import chart as day_chart
    from vastctl.demo import day, setting
    from vastctl.demo import keep as day_file
    from vastctl.errors import BadInput

    if rental is None and globals_of(ctx).config_path is not None:  # --config given: its launch.rental
        rental = globals_of(ctx).config.launch.rental
    options = setting.DemoOptions(hours=hours, seed=setting.DEFAULT_SEED if seed is None else seed, policy=policy,
                               failures=failures, rental=rental)
    options.check()
    if chart is not None and chart.suffix.lower() not in (".svg", ".png"):
        raise BadInput(f"--chart {chart}: the file must end in .svg or .png")
    if chart is not None and not chart.resolve().parent.is_dir():
        raise BadInput(f"--chart {chart}: the directory {chart.resolve().parent} does not exist")
    if keep is not None:
        day_file.check_keep(keep)
    if policy == "llm" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise BadInput("--policy llm needs ANTHROPIC_API_KEY (it spends real tokens): set it, or use --policy plan")
    token = None
    with tempfile.TemporaryDirectory(prefix="vastctl-demo-") as scratch:
        result = day.run(options, Path(scratch), env=os.environ, progress=_progress_bar() if sys.stderr.isatty() else None)
        result.figures.update(_account(Path(scratch) / "demo.db", setting.end_of(options)))
        if keep is not None:
            token = day_file.keep_state(Path(scratch), keep)
    if chart is not None:
        day_chart.write_chart(result, chart)
    if as_json:
        print_json(result.to_json())
    else:
        _print_summary(result.figures)
    if chart is not None:
        say(f"chart written to {chart}")
    if keep is not None:
        say(f"state file kept at {keep}; every command reads it at the day's end (`--as-of {setting.end_of(options)}`):"
            f" `vastctl --db {keep} fleet --all`, `cost`, `events --label LABEL` (one machine's whole path)")
        say(f"its dashboard: `vastctl --db {keep} serve`, then http://127.0.0.1:8080/ and sign in with {token}"
            f" (shown once; kept in {keep}.admin-token)")


def _account(path: Path, end: str) -> dict[str, Any]:
    """vastctl's own account of the day's file at its end (cost.account: what `vastctl --as-of END cost` and the
    dashboard of `serve --as-of END` show), beside the simulator's truth. It differs from the truth where the
    state file cannot know: a boot's first minutes count at the full price (vast bills the disk alone until the
    container runs), and its proofs are the calls the proof router delivered from each machine (cost.proofs_of).
    Beside it, the calls `fleet`, the dashboard and /metrics count at the end (answered in the 24 h up to it) and
    those answered after it (taken before the end, still on a prover then), which the account counts too."""
    from vastctl import clock
    from vastctl.facts import cost, deliveries
    from vastctl.state import db

    now = clock.parse_iso(end)
    since, until = deliveries.window(now)
    conn = db.connect(path, now=now)
    try:
        figures = cost.account(conn, now=now)
        last_day = deliveries.proof_wait(conn, since=since, until=until, max_wait_s=0)["calls"]
        after_end = deliveries.proof_wait(conn, since=until, until=until + timedelta(days=1), max_wait_s=0)["calls"]
    finally:
        conn.close()
    return {"vastctl_cost": figures["cost"], "vastctl_proofs": figures["proofs"],
            "vastctl_cost_per_1000_proofs": figures["cost_per_1000_proofs"], "vastctl_as_of": figures["as_of"],
            "vastctl_calls_last_day": last_day, "vastctl_calls_after_end": after_end}


def _progress_bar() -> Callable[[int, int], None]:
    width = 30

    def show(done: int, total: int) -> None:
        filled = width * done // total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done / 60:5.1f} of {total / 60:g} simulated hours")
        if done == total:
            sys.stderr.write("\r" + " " * (width + 40) + "\r")
        sys.stderr.flush()

    return show


def _print_summary(figures: dict[str, Any]) -> None:
    typer.echo(f"vastctl demo: {figures['hours']:g} simulated hours, seed {figures['seed']}, policy"
               f" {figures['policy']}, failures {figures['failures']}, rental {figures['rental']}")
    max_wait = clock.human_duration(figures["max_wait_s"])
    rows = [{"figure": label.format(max_wait=max_wait), "value": _cell(figures, key, kind)} for label, key, kind in SUMMARY
            if key != "cost_ratio_to_interruptible_bound" or figures["rental"] != "on-demand"]  # a bid's bound
    print_table(rows, ["figure", "value"])
    kills = ", ".join(f"{code} {n}" for code, n in figures["kills_by_reason"].items()) or "none"
    faults = ", ".join(f"{kind} {n}" for kind, n in figures["faults"].items() if n) or "none"
    typer.echo(f"kills by reason: {kills}")
    typer.echo(f"market faults: {faults}")
    for line in EXPLAINED:
        typer.echo(line.format(judged=figures["proofs_judged_for_wait"], last_day=figures["vastctl_calls_last_day"],
                               proofs_why=_proofs_why(figures)))


def _proofs_why(figures: dict[str, Any]) -> str:
    """Why the account's proofs differ from the simulated ones and from the calls answered in the last 24 h, and by
    how many (the simulator proves in fractions of a proof; the router records whole calls, each when answered)."""
    simulated, account = figures["proofs"], figures["vastctl_proofs"]
    after, last_day = figures["vastctl_calls_after_end"], figures["vastctl_calls_last_day"]
    if simulated > account:
        why = (f"Its {account} proofs are the calls the proof router answered, {simulated - account} fewer than the"
               f" {simulated} simulated: the market proves in fractions of a proof and the router records whole calls,"
               " so the part of a proof each machine had not finished (under one a machine) never became a call")
    else:
        why = f"Its {account} proofs are the calls the proof router answered ({simulated} simulated)"
    earlier = account - after - last_day  # answered over 24 h before the end (a day longer than 24 h)
    parts = ([f"{after} were still on a prover at the day's end (answered just after it)"] if after > 0 else []) + (
        [f"{earlier} were answered over 24 h before the end"] if earlier > 0 else [])
    if not parts:
        return why + "."
    return (why + f"; of them, {' and '.join(parts)}, so `fleet`, the dashboard's Proof router card and /metrics,"
            f" which count the calls answered in the last 24 h, show {last_day}.")


def _cell(figures: dict[str, Any], key: Any, kind: str) -> str:
    if kind == "pair":
        return f"{figures[key[0]]} / {figures[key[1]]}"
    if kind == "account":
        short = figures["proofs"] - figures[key[1]]
        why = f"; {short} fewer than simulated: the router counts whole proofs" if short > 0 else ""
        return f"${figures[key[0]]:,.2f} / {figures[key[1]]} (as `vastctl cost` and the dashboard show{why})"
    if kind == "wait":  # the dashboard's and `fleet`'s words for a wait; --json keeps the seconds
        return " / ".join("-" if figures[k] is None else clock.human_duration(figures[k]) for k in key)
    if kind == "seconds":
        return " / ".join("-" if figures[k] is None else f"{figures[k]:.0f}s" for k in key)
    value = figures[key]
    if value is None:
        return "-"
    return {"pct": f"{value * 100:.1f}%", "usd": f"${value:,.2f}", "ratio": f"{value:.2f}x",
            "hours": f"{value:.2f}", "int": f"{value}"}[kind]
