"""`vastctl reconcile`: one pass of the safety net (cron runs it every minute)."""

from __future__ import annotations

from typing import Annotated

import typer

from vastctl import markets
from vastctl.cli.app import JsonOpt, app, globals_of, print_action_lines, print_json, quiet_unless_news, say


@app.command("reconcile")
def reconcile_cmd(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List every vast instance, kill what is dead or stuck, destroy what we no longer pay for.

    Prints one line per action (time, kind, label, vast id, result: reason [code]) and, when it did
    something or failed, one summary line on stderr: a pass with nothing to do is silent, so cron
    mails only when something happened. --json prints the pass as one JSON object per line.

    Exits 1, having killed nothing, when another pass holds the lease or the listing failed or
    is distrusted; failed destroys are reported and retried by the next pass (exit 0). A pass
    stops calling vast at `reconcile.deadline` (default 50s) and exits 1, naming what it skipped.

    Example: * * * * * vastctl reconcile >>/var/log/vastctl/reconcile.log 2>&1
    """
    from vastctl import reconcile
    from vastctl.errors import Unavailable

    g = globals_of(ctx)
    conn = g.connect()
    clock = g.clock  # the pass's time and its deadline
    result = reconcile.run_pass(conn, markets.get_provider(g.config, clock=clock), g.config, clock=clock, dry_run=dry_run)
    if as_json:
        print_json(result.to_json())
    else:
        print_action_lines(result.actions, clock.now())
    errors = result.errors[:-1] if result.deadline_passed else result.errors  # the last one says why it stopped
    kills = sum(1 for a in result.actions if a["kind"] == "kill")
    destroys = sum(1 for a in result.actions if a["kind"] == "destroy")
    if not quiet_unless_news(result.actions, errors, dry_run):
        prefix = "dry run: " if dry_run else ""
        say(f"{prefix}{result.listed} vast instances listed; {kills} kill(s), {destroys} destroy(s)"
            + (" planned" if dry_run else "")
            + (f"; {len(errors)} failed, retried next pass" if errors else ""))
    for error in errors:
        say(f"warning: {error}")
    if result.deadline_passed:
        raise Unavailable(result.errors[-1])
