"""Command-line entry point: wires the command modules and turns errors into one line and an exit code."""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
from typing import MutableMapping, Protocol, TypeGuard

import click
import typer
import typer.main

from vastctl.cli import agent, agent_history, cost, demo, instance, logs, market, operator, provers, reconcile, route, serve  # noqa: F401  (registers their commands)
from vastctl.cli.app import Globals, app
from vastctl.errors import BadInput, VastctlError
from vastctl.state import db
from vastctl.state.lifecycle import printable
from vastctl.validate import Invalid

COMPLETE_VAR = "_VASTCTL_COMPLETE"
# A refused value's field (validate.Invalid) → the flag that gives it on this command line, beside the reports'
# (reports.FIELD_FLAGS): the offer search's. A field not listed is named as it is (a setting's key).
OFFER_FLAGS = {"limit": "--limit", "max_dph": "--max-dph", "min_reliability": "--min-reliability"}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    state = Globals()
    _accept_click_completion_names(os.environ)
    try:
        _check_utf8(args)
        result = _command()(args=args, prog_name="vastctl", standalone_mode=False, obj=state)
    except VastctlError as exc:
        _fail(said(exc), exc.exit_code, False)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 1, False)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors become a line, not a traceback
        if isinstance(exc, sqlite3.Error) and (error := db.explain(exc, state.db_file)):  # damaged, full, read-only
            _fail(str(error), error.exit_code, debug)
        if _is_usage_error(exc):
            _usage_error(exc)
        _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1, debug)
    sys.exit(result if isinstance(result, int) else 0)


@functools.cache
def _command() -> click.Command:
    """The click command typer builds from the app, built once a process: calling the Typer app rebuilds it
    from every command's signature each time (its cost: bench/README.md, "Test suite"), which a process that
    runs many commands pays each time."""
    return typer.main.get_command(app)


def said(exc: VastctlError) -> str:
    """An error as this command line says it: a refused field named as its flag (`--rate must be …`)."""
    if isinstance(exc, Invalid):
        from vastctl.machine.reports import FIELD_FLAGS  # only when there is a refusal to word

        flags = {**FIELD_FLAGS, **OFFER_FLAGS}
        return exc.worded(flags.get(exc.field, exc.field))
    return str(exc)


def _check_utf8(args: list[str]) -> None:
    """An argument with bytes that are not UTF-8 (Python keeps them as lone surrogates) is bad input naming its flag."""
    for index, arg in enumerate(args):
        bad = next((ch for ch in arg if "\ud800" <= ch <= "\udfff"), None)
        if bad is None:
            continue
        if arg.startswith("--") and "=" in arg:
            where = arg.split("=", 1)[0]
        elif index > 0 and args[index - 1].startswith("-"):
            where = args[index - 1]
        else:
            where = f"the argument {printable(arg)!r}"
        byte = f" (the byte 0x{ord(bad) - 0xdc00:02x})" if "\udc80" <= bad <= "\udcff" else ""
        raise BadInput(f"{where} is not UTF-8 text{byte}: pass it in UTF-8")
def _accept_click_completion_names(env: MutableMapping[str, str]) -> None:
    """`_VASTCTL_COMPLETE=bash_source` (click's spelling) works as well as typer's `source_bash`."""
    value = env.get(COMPLETE_VAR, "")
    action, _, shell = value.partition("_")
    if action in ("bash", "zsh", "fish", "powershell", "pwsh") and shell in ("source", "complete"):
        env[COMPLETE_VAR] = f"{shell}_{action}"


class _UsageError(Protocol):
    """What click's usage errors carry (typer re-raises them with standalone_mode=False)."""

    exit_code: int

    def format_message(self) -> str: ...


def _is_usage_error(exc: Exception) -> TypeGuard[_UsageError]:
    """Typer's parse errors (bad option, missing argument, bad value) carry a message and an exit code."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _usage_error(exc: _UsageError) -> None:
    """One line naming the help of the command that was misused; bare `vastctl` shows the help itself."""
    import click

    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        sys.stdout.write(exc.format_message() + "\n")
        sys.exit(0)
    command = ctx.command_path if ctx is not None else "vastctl"
    message = " ".join(exc.format_message().split())
    _fail(f"{message} (see `{command} --help`)", exc.exit_code, False)


def _fail(message: str, code: int, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(f"error: {printable(message)}\n")
    sys.exit(code)
