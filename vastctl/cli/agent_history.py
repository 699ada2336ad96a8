"""`vastctl agent history`: why the agent did what it did, step by step, skipped steps folded away."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Optional

import typer

from vastctl.cli.app import JsonOpt, app, echo, globals_of, print_json

agent_app = typer.Typer(help="What the agent did and why (agent-step runs a step).", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


def _num(value: Any) -> str:
    return "?" if value is None else f"{round(float(value), 1):g}"


def _saw(saw: dict[str, Any]) -> str:
    demand = saw["demand"]
    if not demand.get("known"):
        wanted = "demand unknown"
    else:
        parts = [f"{demand.get('queued') or 0} queued"]
        parts += [f"{demand[k]} {w}" for k, w in (("in_flight", "in flight"), ("lookahead", "coming"))
                  if demand.get(k) is not None]
        wanted = ", ".join(parts)
    spend = "?" if saw["spend_per_hour"] is None else f"${float(saw['spend_per_hour']):.2f}/h"
    return (f"capacity {_num(saw['capacity'])} + {_num(saw['pending_capacity'])} booting, target"
            f" {_num(saw['target'])}; {wanted}; spend {spend}")


@agent_app.command("history")
def history_cmd(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Steps that ran to show (the newest).")] = 20,
    label: Annotated[Optional[str], typer.Option(
        "--label", help="Only the steps that acted on this machine (label or uuid): launched, stopped, resumed,"
                        " killed it, or were refused doing so.")] = None,
    since: Annotated[Optional[str], typer.Option(
        "--since", help="Only the steps started then or later: a duration before now (6h, 2d, 90m) or a UTC time"
                        " (2026-11-30T06:00:00Z), as `cost --since`.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Each agent step that ran: what it saw, what it did, what the guard refused and why, why it held;
    for llm steps the model's notes, tokens and cost. Runs of skipped steps show as one line.

    --label finds why a machine was launched or killed: `vastctl events --label X` names the step that did it.

    Example: vastctl agent history --label vastctl-3f2a91c0 --since 24h
    """
    from vastctl.agent import history
    from vastctl.facts import cost
    from vastctl.state import lifecycle

    g = globals_of(ctx)
    start = cost.parse_since(since, g.clock.now())  # before the file is opened: a bad value changes nothing
    conn = g.connect()
    machine = None if label is None else lifecycle.resolve(conn, label)
    view = history.history(conn, limit=limit, since=start, machine=machine)
    if as_json:
        print_json(view)
        return
    if not view["entries"]:
        echo(_nothing(view))
        return
    for entry in view["entries"]:
        if entry["type"] == "skipped":
            when = entry["from"] if entry["count"] == 1 else f"{entry['from']} to {entry['to']}"
            echo(f"… {entry['count']} skipped step{'s' if entry['count'] != 1 else ''} ({when}: nothing new)")
            continue
        echo(f"#{entry['id']} {entry['started_at']} {entry['policy']} {entry['outcome']}: saw {_saw(entry['saw'])}")
        for action in entry["did"]:
            target = action.get("label") or action.get("gpu_name") or ""
            echo(f"  did {action['kind']} {target}: {action.get('result') or '-'} ({action.get('reason') or 'no reason'})")
        for item in entry["refused"]:
            target = item.get("label") or item.get("gpu_name") or ""
            echo(f"  refused {item['kind']} {target} ({item.get('limit')}): {item.get('why')}")
        for error in entry["errors"]:
            echo(f"  error: {error}")
        if entry["hold"]:
            echo(f"  held: {entry['hold']}")
        if entry.get("suggested"):
            echo(f"  suggested: {entry['suggested']}")
        for note in entry["notes"]:
            echo(f"  note: {note['text']}")
        tokens = entry["tokens"]
        if entry["policy"] == "llm" or any(tokens.values()):
            echo(f"  model: {tokens['input']} in, {tokens['output']} out, {tokens['cache_read']} cached,"
                 f" ${entry['cost']:.4f}")


def _nothing(view: Mapping[str, object]) -> str:
    """The line for an empty history: no step yet, or none the filters let through (naming them)."""
    filters = []
    if view["label"]:
        filters.append(f"acted on {view['label']}")
    if view["since"]:
        filters.append(f"started at or after {view['since']}")
    return "no agent steps yet" if not filters else f"no agent step matches: none {' and '.join(filters)}"
