"""What `vastctl serve` answers a machine's report with (the HTTP API's 200 body), as types.

They sit at the base layer because both sides name them: the reports that write the state file
(machine/reports.py) or post to the manager (machine/remote.py), and the simulated market that reports through
them (providers/reports_sink.py), which may not import the reports themselves.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["Answer", "Stated"]


class Stated(TypedDict):
    """What every answer to a machine carries: its state after the report (a lifecycle.State's value)."""

    state: str


class Answer(Stated, total=False):
    """A report's answer (the HTTP API's 200 body): bench_report's says whether the rate passed the gate (and,
    from serve, why not), register's notes a label outside the configured prefix."""

    passed: bool
    reason: str
    note: str
