"""Command-line entry point: wires the command modules and turns errors into one line and an exit code."""

from __future__ import annotations

import sys

import typer

from ..errors import VastctlError
from . import agent, instance, market, operator, reconcile, serve  # noqa: F401  (registers their commands)
from .app import app


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        result = app(args=args, prog_name="vastctl", standalone_mode=False)
    except VastctlError as exc:
        _fail(str(exc), exc.exit_code, debug)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 1, False)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors become a line, not a traceback
        if _is_usage_error(exc):
            message = exc.format_message().replace("\n", " ")
            _fail(f"{message} (see `vastctl --help`)", exc.exit_code, debug)
        _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1, debug)
    sys.exit(result if isinstance(result, int) else 0)


def _is_usage_error(exc: Exception) -> bool:
    """Typer's parse errors (bad option, missing argument, bad value) carry a message and an exit code."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _fail(message: str, code: int, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(f"error: {message}\n")
    sys.exit(code)
