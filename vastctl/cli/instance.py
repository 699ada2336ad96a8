"""Commands a rented machine's boot script runs: register, params-done, bench-report, running, heartbeat.

On the manager host they write the state file; with VASTCTL_SERVER set they
report over HTTP instead (and never open or create a file). A command line is where a report's values enter:
each is checked here, once, before either is chosen (lifecycle's and rates' validate_* functions), so a bad one
is exit 2 with nothing opened and no request sent; the reports past this take them as checked.
"""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from vastctl import upstream, validate
from vastctl.cli.app import app, env_flag, globals_of, say
from vastctl.machine.reports import LocalReports
from vastctl.providers.reports_sink import Reports
from vastctl.state import lifecycle, rates

UuidOpt = Annotated[str, typer.Option("--uuid", envvar="VASTCTL_UUID", help="This machine's uuid ($VASTCTL_UUID).")]


def reports_for(ctx: typer.Context) -> Reports:
    """Remote reports when VASTCTL_SERVER is set (no state file is opened), else the local state file."""
    if env_flag("VASTCTL_SERVER"):
        from vastctl.machine.remote import RemoteReports

        return RemoteReports.from_env(os.environ, clock=globals_of(ctx).clock, on_retry=_say_retry)
    g = globals_of(ctx)
    return LocalReports(g.connect(), g.config, now=g.clock.now())


def _say_retry(problem: str, wait: float, remaining: float) -> None:
    say(f"manager not answering ({problem}); retrying in {wait:.1f}s ({remaining:.0f}s left of VASTCTL_RETRY_FOR)")


@app.command("register")
def register_cmd(
    ctx: typer.Context,
    uuid: UuidOpt,
    label: Annotated[Optional[str], typer.Option("--label", envvar="VASTCTL_LABEL", help="Human label ($VASTCTL_LABEL).")] = None,
    vast_id: Annotated[Optional[int], typer.Option("--vast-id", help="vast.ai instance id.")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU model, e.g. 'RTX 4090'.")] = None,
    num_gpus: Annotated[Optional[int], typer.Option("--num-gpus", help="GPUs on this machine.")] = None,
) -> None:
    """The boot script started (an unknown uuid is adopted; a live one records a restart).

    Example: vastctl register --uuid "$VASTCTL_UUID" --label "$VASTCTL_LABEL" --gpu "RTX 4090"
    """
    lifecycle.validate_register(uuid, label=label, vast_id=vast_id, gpu_name=gpu, num_gpus=num_gpus)
    result = reports_for(ctx).register(uuid, label=label, vast_id=vast_id, gpu_name=gpu, num_gpus=num_gpus)
    typer.echo(result["state"])
    if isinstance(result.get("note"), str):  # e.g. the label lacks our prefix
        say(f"note: {upstream.cut(result['note'], 500)}")


@app.command("params-done")
def params_done_cmd(ctx: typer.Context, uuid: UuidOpt) -> None:
    """Proving parameters are fetched; the benchmark starts.

    Example: vastctl params-done --uuid "$VASTCTL_UUID"
    """
    typer.echo(reports_for(ctx).params_done(validate.text(uuid, "uuid"))["state"])


@app.command("bench-report")
def bench_report_cmd(
    ctx: typer.Context,
    uuid: UuidOpt,
    rate: Annotated[Optional[str], typer.Option("--rate", help="Measured proofs per hour (a finite number ≥ 0).")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="No rate could be measured: the boot failed (killed, exit 5).")] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="With --failed: why, one line of at most 500 characters.")] = None,
) -> None:
    """Report the benchmark: at or above the gate → bench_done (exit 0); below, or --failed → killed (exit 5).

    Example: vastctl bench-report --uuid "$VASTCTL_UUID" --rate 68.2
    Example: vastctl bench-report --uuid "$VASTCTL_UUID" --failed --reason "parameter fetch failed: …"
    """
    validate.text(uuid, "uuid")
    if failed:
        if rate is not None:
            raise typer.BadParameter("give --rate or --failed, not both", param_hint="--failed")
        reports_for(ctx).bench_failed(uuid, None if reason is None else lifecycle.validate_reason(reason))
    if reason is not None:
        raise typer.BadParameter("--reason goes with --failed (a measured rate needs no reason)", param_hint="--reason")
    if rate is None:
        raise typer.BadParameter("give the measured --rate, or --failed when none could be measured", param_hint="--rate")
    checked = rates.validate_rate(rate)  # before anything is opened or sent
    typer.echo(reports_for(ctx).bench_report(uuid, checked)["state"])


@app.command("running")
def running_cmd(
    ctx: typer.Context,
    uuid: UuidOpt,
    stages: Annotated[Optional[str], typer.Option(
        "--stages", help="Where the boot's time went, seconds per stage: fetch=412,daemon=35,warmup=95,bench=310,join=3"
                         " (fleet --json: boot_stages).")] = None,
) -> None:
    """The prover is up and taking work.

    Example: vastctl running --uuid "$VASTCTL_UUID" --stages fetch=412,daemon=35,warmup=95,bench=310,join=3
    """
    validate.text(uuid, "uuid")
    checked = None if stages is None else lifecycle.validate_stages(_stages(stages))  # before anything is opened
    typer.echo(reports_for(ctx).running(uuid, checked)["state"])


def _stages(text: str) -> dict[str, str]:
    """`fetch=412,daemon=35` → {"fetch": "412", "daemon": "35"} (the numbers are checked with the report)."""
    from vastctl.errors import BadInput

    found = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, seconds = part.partition("=")
        if not sep:
            raise BadInput(f"--stages takes STAGE=SECONDS pairs separated by commas, e.g. fetch=412,bench=310; got {part!r}")
        found[name.strip()] = seconds.strip()
    return found


@app.command("heartbeat")
def heartbeat_cmd(
    ctx: typer.Context,
    uuid: UuidOpt,
    proofs_done: Annotated[Optional[int], typer.Option("--proofs-done", help="Cumulative proofs finished.")] = None,
) -> None:
    """Say this machine is alive, with its cumulative proof count (not a state change).

    Example: vastctl heartbeat --uuid "$VASTCTL_UUID" --proofs-done 117
    """
    validate.text(uuid, "uuid")
    checked = None if proofs_done is None else rates.validate_proofs(proofs_done)  # before anything is opened or sent
    typer.echo(reports_for(ctx).heartbeat(uuid, checked)["state"])
