"""Typed errors, each carrying its exit code (docs/operations.md, "Exit codes"), which scripts rely on.

Library code raises these; only the CLI turns them into one `error: …` line
and an exit status, so every failure reaches the operator the same way.
"""

from __future__ import annotations

from typing import Any, Mapping


class VastctlError(Exception):
    """Base of every error meant for the operator. The message names the fix."""

    exit_code = 1


class Unavailable(VastctlError):
    """Could not be done now (provider or manager unreachable, lock held): retry later."""

    exit_code = 1


class BadInput(VastctlError):
    """Usage error, invalid value or unknown instance: fix the call."""

    exit_code = 2


class UnknownInstance(BadInput):
    """No row for that uuid or label."""


class Refused(VastctlError):
    """Not allowed from the instance's current state: give up on this instance."""

    exit_code = 3


class GuardRefused(VastctlError):
    """Over a configured limit; `limit` names it (as guard.Verdict.limit does), for the lists of refusals."""

    exit_code = 4

    def __init__(self, message: str = "", *, limit: str | None = None):
        super().__init__(message)
        self.limit = limit


class BenchFailed(VastctlError):
    """The reported benchmark rate is below the gate: the instance is being killed."""

    exit_code = 5
    row: Mapping[str, Any]  # the killed row (or the server's answer), set by whoever raises it
