"""`vastctl log-push` (a machine sends the tail of a boot log) and `vastctl logs` (what a machine said)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vastctl import validate
from vastctl.cli.app import JsonOpt, app, echo, globals_of, print_json
from vastctl.cli.instance import UuidOpt, reports_for
from vastctl.errors import BadInput

NameOpt = Annotated[str, typer.Option("--name", help="Which log: onstart, fetch, cuzk or bench.")]


@app.command("log-push")
def log_push_cmd(
    ctx: typer.Context,
    uuid: UuidOpt,
    name: NameOpt,
    file: Annotated[Path, typer.Option("--file", help="The log file; its last 32 KiB are sent.")],
) -> None:
    """Send the tail of one of this machine's logs to the manager (kept escaped and cut; never run).

    Example: vastctl log-push --uuid "$VASTCTL_UUID" --name bench --file /var/log/vastctl/bench.log
    """
    from vastctl.facts import machine_logs

    validate.text(uuid, "uuid")  # where the push's values enter: checked once, before the file or the manager
    machine_logs.check_name(name)
    try:
        with open(file, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - machine_logs.PUSH_BYTES))
            data = handle.read(machine_logs.PUSH_BYTES)
    except OSError as exc:
        raise BadInput(f"--file {file}: cannot read it ({exc.strerror or exc}): give the path of the log") from None
    result = reports_for(ctx).log_push(uuid, name, machine_logs.tail_of_file(data))
    typer.echo(result["state"])


@app.command("logs")
def logs_cmd(
    ctx: typer.Context,
    label: Annotated[str, typer.Argument(help="The machine's label (or uuid).")],
    name: Annotated[Optional[str], typer.Option("--name", help="Only this log: onstart, fetch, cuzk or bench.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The tail of each log a machine pushed (its boot script pushes them at each step and on failure).

    The text is the machine's, made safe when it arrived: control and bidi characters escaped, cut to its
    last 16 KiB. Example: vastctl logs vastctl-3f2a9c1d --name bench
    """
    from vastctl.facts import machine_logs

    g = globals_of(ctx)
    view = machine_logs.tails(g.connect(), label, name)
    if as_json:
        print_json(view)
        return
    if not view["logs"]:
        echo(f"{view['label']} ({view['state']}) has pushed no " + (f"{name} log" if name else "logs"))
        return
    for log in view["logs"]:
        cut = ", cut to its tail" if log["cut"] else ""
        echo(f"== {view['label']} {log['name']} (pushed {log['at']}{cut}) ==")
        for line in log["text"].split("\n"):
            echo(line)
