"""The root Typer app, global options, and the shared pieces every command uses."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Mapping, Optional, Sequence, cast

import typer

from vastctl import __version__, clock
from vastctl import config as config_module
from vastctl.clock import SYSTEM, Clock
from vastctl.errors import BadInput
from vastctl.state import db
from vastctl.state.lifecycle import printable

if TYPE_CHECKING:
    import tempfile

app = typer.Typer(
    name="vastctl",
    help="Keep a fleet of rented vast.ai GPU provers the right size, cheaply, and never lose track of one.",
    no_args_is_help=True,
    add_completion=True,
    suggest_commands=False,  # click already suggests the closest command once
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@dataclass
class Globals:
    """What the root options say; the config is loaded once, on first use.

    `clock` is every command's one source of time: the system clock, read nowhere
    else, moved to `--as-of` when given, or to the end of a kept simulated day when
    the state file holds one that lies ahead of it; everything below the CLI is
    handed it (or the moment it gave).
    """

    system_clock: ClassVar[Clock] = SYSTEM

    config_path: str | None = None
    db_path: str | None = None
    as_of: str | None = None
    debug: bool = False
    _config: config_module.Config | None = field(default=None, repr=False)
    _clock: Clock | None = field(default=None, repr=False)
    _as_of_copy: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def config(self) -> config_module.Config:
        if self._config is None:
            self._config = config_module.load(self.config_path)
            if self.db_path:
                self._config.db = self.db_path
            config_module.admin_token_beside(self._config)
            if self.as_of is not None:
                self._read_as_of(self._config, self.as_of)
        return self._config

    def _read_as_of(self, config: config_module.Config, as_of_text: str) -> None:
        """`--as-of`: the command reads a copy of the state file as it stood then (state/as_of.py), which lives as
        long as the command; one that would change the file is refused, as the past cannot be written."""
        import tempfile

        from vastctl.state import as_of

        refuse_as_of_unless_read(command_words())
        moment = moment_option(as_of_text, "--as-of")
        if moment >= self._present(config):  # the file as it is: nothing was written after the moment yet
            return
        self._as_of_copy = tempfile.TemporaryDirectory(prefix="vastctl-as-of-")
        config.db = str(as_of.copy_as_of(config.db_path, moment, Path(self._as_of_copy.name)))

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            self._clock = self._read_clock()
        return self._clock

    def _read_clock(self) -> Clock:
        if self.as_of is not None:
            return clock.StillClock(self.system_clock, moment_option(self.as_of, "--as-of"))
        from vastctl.providers.sim_store import simulated_until

        until = simulated_until(self.config.db_path)
        if until is not None and until > self.system_clock.now():  # a kept demo day: read at its own end
            return clock.StillClock(self.system_clock, until)
        return self.system_clock

    def _present(self, config: config_module.Config) -> datetime:
        """The state file's own now: the end of a kept simulated day that lies ahead of the wall clock (its last
        minutes' calls, answered after it, are the day's: docs/demo.md), else the wall clock's."""
        from vastctl.providers.sim_store import simulated_until

        now = self.system_clock.now()
        until = simulated_until(config.db_path)
        return max(until, now) if until is not None else now

    @property
    def db_file(self) -> str | None:
        """The state file's path once the config is loaded (for errors raised after it was opened)."""
        return str(self._config.db_path) if self._config is not None else None

    def connect(self, *, create: bool = False) -> sqlite3.Connection:
        return db.connect(self.config.db_path, now=self.clock.now(), create=create)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"vastctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[Optional[str], typer.Option("--config", help="YAML config file (beats $VASTCTL_CONFIG).")] = None,
    db_path: Annotated[Optional[str], typer.Option("--db", help="SQLite state file (beats $VASTCTL_DB and the config).")] = None,
    as_of: Annotated[Optional[str], typer.Option(
        "--as-of", help="Show the state file as it stood at this UTC time, e.g. 2031-03-03T12:00:00Z (commands that"
                        " only read it); a day `demo --keep` left is read at its own end without it.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show a traceback on unexpected errors.")] = False,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print vastctl's version and exit.")] = False,
) -> None:
    g = ctx.obj if isinstance(ctx.obj, Globals) else Globals()  # main() passes one in to read after a failure
    g.config_path, g.db_path, g.as_of, g.debug = config, db_path, as_of, debug
    ctx.obj = g
    if as_of is not None and ctx.invoked_subcommand is not None:
        refuse_as_of_unless_read((ctx.invoked_subcommand,))


# The commands that only read the state file: the ones `--as-of` may show at a moment (docs/interface.md).
AS_OF_READS = frozenset({("fleet",), ("events",), ("cost",), ("logs",), ("serve",), ("demand", "show"),
                         ("settings", "get"), ("settings", "list"), ("agent", "history")})
AS_OF_GROUPS = frozenset(command[:1] for command in AS_OF_READS if len(command) > 1)  # their reads are told apart later


def refuse_as_of_unless_read(words: tuple[str, ...]) -> None:
    """`--as-of` shows the file as it stood then: a command that is not one of those that only read it (and may
    be one that would write the past) is refused before anything is read."""
    if words[:2] in AS_OF_READS or words[:1] in AS_OF_READS or (len(words) == 1 and (words[0],) in AS_OF_GROUPS):
        return
    reads = ", ".join(" ".join(command) for command in sorted(AS_OF_READS))
    raise BadInput(f"--as-of shows the state file as it stood then, to the commands that only read it ({reads});"
                   f" `vastctl {' '.join(words)}` is not one: run it without --as-of")


def command_words() -> tuple[str, ...]:
    """The command being run, as typed after the root options (`settings get`)."""
    import click

    words: list[str] = []
    ctx = click.get_current_context(silent=True)
    while ctx is not None and ctx.parent is not None:
        words.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return tuple(words)


def moment_option(text: str, option: str) -> datetime:
    """An option's UTC time (2031-03-04T00:00:00Z; a time without a zone is UTC), or one error line."""


    try:
        moment = clock.from_iso(text.strip())
    except ValueError:
        moment = None
    if moment is None:
        raise BadInput(f"{option} must be a UTC time like 2031-03-04T00:00:00Z, got {text!r}")
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]


def globals_of(ctx: typer.Context) -> Globals:
    return cast(Globals, ctx.find_root().obj)  # the root callback puts it there before any command runs


def print_json(value: Any) -> None:
    """Indented for a terminal; one compact line for a pipe (the C encoder, faster on a big fleet:
    bench/README.md, "Start-up")."""
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(value, indent=indent, default=str) + "\n")


def print_table(rows: Sequence[Mapping[str, Any]], columns: list[str]) -> None:
    """The one table renderer: plain text, headers, no colour, control characters escaped."""
    from tabulate import tabulate

    if not rows:
        return
    cells = [[None if row.get(c) is None else printable(str(row.get(c))) for c in columns] for row in rows]
    sys.stdout.write(tabulate(cells, headers=columns, tablefmt="plain", missingval="-", disable_numparse=True) + "\n")


def echo(text: str) -> None:
    """One line of data on stdout, control characters escaped (labels and reasons may come from vast)."""
    sys.stdout.write(printable(text) + "\n")


def action_line(action: Mapping[str, object], at: str) -> str:
    """One log line per action (reconcile, agent-step): time, kind, label, vast id, result, reason, code.

    Made for cron's mail and `>> file.log`: grep-able, one action per line, no table to realign.
    """
    vast = f" (vast {action['vast_id']})" if action.get("vast_id") is not None else ""
    code = f" [{action['code']}]" if action.get("code") else ""
    reason = " ".join(str(action.get("reason") or "").split())
    return f"{at} {action['kind']} {action.get('label') or '-'}{vast} {action.get('result')}: {reason}{code}"


def print_action_lines(actions: Sequence[Mapping[str, object]], now: datetime) -> None:
    """The actions of a pass or a step, one escaped line each (action_line), stamped with the time they ran."""
    at = clock.display_moment(now)
    for action in actions:
        echo(action_line(action, at))


def quiet_unless_news(*news: Any) -> bool:
    """Cron mails whatever a job prints: a tick that did nothing says nothing, except on a terminal."""
    return not any(news) and not sys.stderr.isatty()


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A table cell for an optional number."""
    return "-" if value is None else f"{value:.{digits}f}"


def say(text: str) -> None:
    """Talk goes to stderr, one line, control characters escaped; stdout is for data."""
    sys.stderr.write(printable(text) + "\n")


def env_flag(name: str) -> str | None:
    return os.environ.get(name) or None
