"""Is work waiting too long: one answer for the dashboard's "Work waiting" card and `fleet`'s `work:` line.

The share of the last day's proofs done within agent.max_wait is the proof router's measure when it answered
calls (each call's held + proving time), else an estimate from the demand samples Curio reported (Curio's own
counts, not vastctl's measurement: overview.proof_waits). A proof arriving now waits about the newest sample's
backlog over its rate; a source that gives no rate is read against the capacity running.
"""

from __future__ import annotations

import math
from typing import Literal, TypedDict

from vastctl import clock, validate
from vastctl.facts.demand import DemandView
from vastctl.views.fleet import RouterStatus
from vastctl.views.proof_waits import ProofWaits

Source = Literal["router", "curio"]  # who counted the share: the router's calls, or Curio's reported counts


class WorkWaiting(TypedDict):
    max_wait_s: float
    within_max_wait: float | None  # None: no proof done in the last day
    source: Source | None
    sampled: bool  # False: no demand sample kept at all
    known: bool  # False: demand unknown (none, or the newest sample failed or is stale): no wait now
    wait_now_s: float | None  # None when unknown; math.inf when work is queued and nothing proves it
    stuck: bool  # work queued and no proof done in the last hour


def work_waiting(waits: ProofWaits, demand: DemandView | None, capacity: float,
                 router: RouterStatus | None) -> WorkWaiting:
    measured = router["proof_wait_last_day"] if router else None
    share: float | None
    source: Source | None
    if measured and measured["calls"] and measured["within_max_wait"] is not None:
        share, source = measured["within_max_wait"], "router"
    else:
        share = waits["within_share"]
        source = None if share is None else "curio"
    known = demand is not None and demand["known"]
    wait = None
    if known and demand is not None and not waits["stuck_now"]:
        wait = waits["wait_now_s"]
        if wait is None:  # the source gives no rate: what waits over the capacity running
            backlog = float(demand["queued"] or 0) + float(demand["in_flight"] or 0)
            wait = 0.0 if backlog == 0 else backlog / capacity * 3600 if capacity > 0 else math.inf
    return {"max_wait_s": waits["max_wait_s"], "within_max_wait": share, "source": source,
            "sampled": demand is not None, "known": known,
            "wait_now_s": wait, "stuck": known and waits["stuck_now"]}


def endless(wait: float | None) -> bool:
    """Work queued and nothing running to prove it."""
    return wait is not None and validate.real(wait) is None


def line(work: WorkWaiting) -> str:
    """`fleet`'s `work:` line: the card's words, without its markup."""
    limit = clock.human_duration(work["max_wait_s"])
    share = work["within_max_wait"]
    done = ("no proofs done in the last day" if share is None else
            f"{share:.1%} done within {limit} (24 h, {'measured' if work['source'] == 'router' else CURIO_WORDS})")
    wait = work["wait_now_s"]
    if not work["sampled"]:
        now = "no demand sample yet (demand.command, or `vastctl demand report`)"
    elif not work["known"]:
        now = "demand unknown: the newest sample failed or is stale"
    elif work["stuck"]:
        now = "work queued and no proof done in the last hour"
    elif endless(wait):
        now = "work queued and nothing running to prove it"
    else:
        now = f"a proof arriving now waits ~{clock.human_duration(wait or 0.0)}"
    return f"work: {now} · {done}"


CURIO_WORDS = "Curio's counts, not measured"
