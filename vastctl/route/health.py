"""What the router reads about a prover's health: an attempt's result as one of dispatch's outcomes, a daemon's
queues as its work, and a change of health told in the log (the rules themselves: dispatch.py).

A prover not reached was sent nothing, so it is told apart from one that dropped a call: cut_through.send says
"unreached" for a refused connect, a connection closed before any HTTP/2 came back (sshd's forward whose far side
is gone), and a call the daemon said it never took (GOAWAY below it, REFUSED_STREAM).
"""

from __future__ import annotations

import logging
from typing import Any

from vastctl.route import status
from vastctl.route.dispatch import Change

log = logging.getLogger("vastctl.route")

UNREACHED_PREFIX = "UNAVAILABLE could not connect"
# a caller whose deadline passes cancels the call (grpc-go sends RST_STREAM at its deadline) a moment before the
# router's own reading of that deadline, which began when the call's headers came: a cancel this close to it is it
DEADLINE_SLACK_S = 1.0


def of_cut_through(label: str, gone: bool, outcome: str, answer: Any, *, at_deadline: bool = False) -> tuple[str, Any]:
    """(outcome, what came back) of cut_through.send's result, worded as grpcio's are. `at_deadline`: it ended
    within DEADLINE_SLACK_S of the call's deadline, so a caller that went away then was its deadline passing."""
    if outcome == "abandoned" and at_deadline:
        return "expired", f"the call's deadline passed while {label} proved it"
    if outcome == "unreached" or (outcome == "dropped" and str(answer).startswith(UNREACHED_PREFIX)):
        return "unreached", f"{label}: {answer}"[:300]
    if outcome == "dropped" and gone:
        return "moved", f"{label} left the joined set while proving it"
    if outcome == "dropped":  # the prover, then the status a client would see
        return outcome, f"{label}: {answer}"[:300]
    return outcome, answer


def work(answer: Any) -> int:
    """A daemon's calls pending or in progress over its queues (a GetStatusResponse already judged sane)."""
    return sum(min(q.pending, status.MAX_QUEUED) + min(q.in_progress, status.MAX_QUEUED) for q in answer.queues)


def tell(label: str, change: Change) -> None:
    """One line for a change of a prover's health; a second when it makes the machine one to kill."""
    if change.kind == "retrying":
        log.info("prover %s not reached (%s): its calls wait or go elsewhere; tried again in %gs", label, change.why,
                 change.seconds)
    else:
        log.warning("prover %s ejected for %gs: %s", label, change.seconds, change.why)
    if change.report is not None:
        log.warning("prover %s set aside: %s", label, change.report)
