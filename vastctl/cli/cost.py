"""`vastctl cost`: what the fleet cost, as vastctl accounts for it (vast's invoice is the truth)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vastctl.cli.app import JsonOpt, app, echo, fmt_num, globals_of, print_json, print_table


@app.command("cost")
def cost_cmd(
    ctx: typer.Context,
    since: Annotated[Optional[str], typer.Option("--since", help="Only from then on: a duration before now (6h, 2d, 90m) or a UTC time (2026-11-30T06:00:00Z).")] = None,
    by: Annotated[Optional[str], typer.Option("--by", help="Break the figures down by machine, gpu, day (UTC) or reason (the kill code; live, stopped).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Money spent, proofs done and $ per 1,000 proofs, from what the state file recorded.

    This is vastctl's account of vast's billing, not the bill: vast's invoice is the truth. Rented hours
    count at the machine's price (GPU and disk), stopped hours at the disk price vast listed, and a killed
    machine at its full price until vast confirmed the destroy. "Never proved" is what machines that
    proved nothing cost (boots, failed benches, machines dead before a first proof).

    Example: vastctl cost --since 24h --by gpu
    """
    from vastctl.facts import cost

    g = globals_of(ctx)
    now = g.clock.now()
    start = cost.parse_since(since, now)
    figures = cost.account(g.connect(), now=now, since=start, by=by)
    if as_json:
        print_json(figures)
        return
    window = f"since {figures['since']}" if figures["since"] else "since the state file began"
    echo(f"{figures['source']} ({window}, as of {figures['as_of']})")
    echo(f"spent ${figures['cost']:.2f}: rented ${figures['rented']:.2f}, stopped disks"
         f" ${figures['stopped_storage']:.2f}, after kills until vast confirmed the destroy ${figures['after_kill']:.2f}")
    per = figures["cost_per_1000_proofs"]
    shared = ", each machine's shared over its time running since then" if figures["since"] else ""
    echo(f"proofs {figures['proofs']} (the calls the proof router answered{shared}; a machine it never sent to by its"
         " own count), " + ("no proofs yet" if per is None else f"${per:.2f} per 1,000 proofs"))
    share = figures["never_proved_share"]
    echo(f"never proved ${figures['never_proved_cost']:.2f}"
         + ("" if share is None else f" ({share * 100:.1f}% of the spend)")
         + f" on {figures['never_proved_machines']} of {figures['machines']} machines;"
         + f" dead until detected ${figures['dead_until_detected_cost']:.2f}")
    if figures["groups"]:
        assert by is not None  # the figures are grouped only --by something
        print_table([{by: group["key"], "cost": f"{group['cost']:.2f}", "rented": f"{group['rented']:.2f}",
                      "stopped": f"{group['stopped_storage']:.2f}", "after_kill": f"{group['after_kill']:.2f}",
                      "proofs": group["proofs"], "$/1000": fmt_num(group["cost_per_1000_proofs"], 2),
                      "never_proved": f"{group['never_proved_cost']:.2f}", "machines": group["machines"]}
                     for group in figures["groups"]],
                    [by, "cost", "rented", "stopped", "after_kill", "proofs", "$/1000", "never_proved", "machines"])
