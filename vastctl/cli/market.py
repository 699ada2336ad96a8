"""Operator commands that spend money at the market: offers, launch, stop, start."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from vastctl import launches, markets, operations
from vastctl.cli.app import JsonOpt, app, echo, fmt_num, globals_of, print_json, print_table, say
from vastctl.config import Config
from vastctl.errors import Refused, Unavailable
from vastctl.state import lifecycle
from vastctl.state.lifecycle import State
from vastctl.state.rows import InstanceRow


@app.command("offers")
def offers_cmd(
    ctx: typer.Context,
    gpu: Annotated[Optional[List[str]], typer.Option("--gpu", help="GPU model, e.g. 'RTX 4090' (repeatable; default: the config's fleet.gpus).")] = None,
    max_dph: Annotated[Optional[float], typer.Option("--max-dph", help="Highest $/h (default: the max_dph setting).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Show at most N offers.")] = 20,
    min_reliability: Annotated[Optional[float], typer.Option("--min-reliability", min=0.0, max=1.0, help=f"Lowest vast reliability score (default {launches.DEFAULT_MIN_RELIABILITY}).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Offers we would rent, cheapest first (RAM, bandwidth floors applied; blocklisted machines left out).

    Example: vastctl offers --gpu "RTX 4090" --max-dph 0.6 --limit 5
    """
    g = globals_of(ctx)
    provider = markets.get_provider(g.config, clock=g.clock)
    found = launches.find_offers(g.connect(), provider, g.config, gpu_names=gpu, max_dph=max_dph,
                                   min_reliability=min_reliability, limit=limit, now=g.clock.now())
    views = [launches.offer_view(offer) for offer in found]
    if as_json:
        print_json(views)
        return
    if not views:
        say("no matching offers")
        return
    print_table(
        [{"offer": v["id"], "machine": v["machine_id"], "gpu": f"{v['num_gpus']}x {v['gpu_name']}",
          "$/h": fmt_num(v["dph_total"], 3), "ram_gb": fmt_num(v["cpu_ram_gb"], 0),
          "down_mbps": fmt_num(v["inet_down_mbps"], 0), "reliability": fmt_num(v["reliability"], 3)} for v in views],
        ["offer", "machine", "gpu", "$/h", "ram_gb", "down_mbps", "reliability"],
    )


@app.command("launch")
def launch_cmd(
    ctx: typer.Context,
    offer: Annotated[Optional[int], typer.Option("--offer", min=0, help="Rent this offer id (from `vastctl offers`).")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Rent the cheapest offers of this GPU model.")] = None,
    count: Annotated[int, typer.Option("--count", min=1, help="How many machines (one per offer).")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Rent machines; each boots the vastctl boot script and reports back.

    Refused before anything is rented when the boot cannot work: the default launch.image has no vastctl,
    curio or cuzk, so launch.vastctl_source and launch.install must say where they come from.

    Example: vastctl launch --gpu "RTX 4090" --count 2
    """
    g = globals_of(ctx)
    launches.check_launch_request(g.config, offer_id=offer, gpu=gpu, count=count)
    conn = g.connect()
    provider = markets.get_provider(g.config, clock=g.clock)
    result = launches.launch(conn, provider, g.config, offer_id=offer, gpu=gpu, count=count, actor="operator",
                               now=g.clock.now())
    if as_json:
        print_json(result.view())
    else:
        print_table(
            [{"label": row["label"], "vast_id": row["vast_id"], "offer": row["offer_id"],
              "gpu": f"{row['num_gpus'] or 1}x {row['gpu_name']}", "$/h": fmt_num(row["dph"], 3)}
             for row in result.launched],
            ["label", "vast_id", "offer", "gpu", "$/h"],
        )
        for item in result.failed:
            say(f"{item['label']}: not rented ({item['reason']})")
    if result.error:
        raise Unavailable(result.error)


ForceOpt = Annotated[bool, typer.Option("--force", help="Even if it is the last machine proving while work is queued or demand is unknown (recorded as forced).")]


@app.command("stop")
def stop_cmd(ctx: typer.Context, instance: Annotated[str, typer.Argument(help="Label or uuid.")],
             force: ForceOpt = False) -> None:
    """Stop a machine at vast: it keeps its disk (and bills storage) until started or killed.

    Refused (exit 4) when it is the last machine really proving (running here and at vast, heartbeat fresh)
    while work is queued or demand is unknown.

    Example: vastctl stop vastctl-3f2a9c1d
    """
    g = globals_of(ctx)
    conn = g.connect()
    _check_rented(lifecycle.resolve(conn, instance), "stop", g.config)  # fails before the key is needed
    row = operations.stop(conn, markets.get_provider(g.config, clock=g.clock), instance, config=g.config, actor="operator",
                          force=force, now=g.clock.now())
    echo(f"{row['label']} {row['state']}")


@app.command("start")
def start_cmd(ctx: typer.Context, instance: Annotated[str, typer.Argument(help="Label or uuid.")]) -> None:
    """Resume a stopped machine; it must be scheduled and boot again within the launching timeout.

    Example: vastctl start vastctl-3f2a9c1d
    """
    g = globals_of(ctx)
    conn = g.connect()
    _check_rented(lifecycle.resolve(conn, instance), "start", g.config)  # fails before the key is needed
    row = operations.start(conn, markets.get_provider(g.config, clock=g.clock), g.config, instance, actor="operator",
                           now=g.clock.now())
    echo(f"{row['label']} {row['state']} (resumed)")


def _check_rented(row: InstanceRow, verb: str, config: Config) -> None:
    """A machine past launching without a confirmed vast id was registered by hand (perhaps claiming an id):
    there is nothing vastctl may act on at vast."""
    if row["vast_id"] is None and row["state"] not in (State.LAUNCHING, State.KILLED):
        raise Refused(operations.without_vast_id(row, verb, config.vast.label_prefix))
