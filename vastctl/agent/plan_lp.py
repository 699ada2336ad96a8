"""The planning policy's linear program: the cheapest capacity per slot of the horizon that does every proof in time.

Sources of capacity, each a share in [0, 1] of one machine per slot:

  running   proving now at the price it was rented at; its share only falls (released, not taken back)
  booting   on its way: proves from the slot it is expected up in, paid whatever the plan (make before break)
  stopped   resumable from its first slot (a resume's boot), paying a resume's boot when started
  offer     rentable from its first slot (a fresh boot), paying BOOT_HOURS of its price when started

Each slot's proofs done are at most its capacity, never more than what has arrived (the queue plus the
forecast), and by the end of each slot at least what is due then (what arrived max_wait before, less the
planner's margin); a proof late costs late_cost a slot, and one past the hard line (due_hard: max_wait less a
few minutes) hard_late_cost more, so the program always has a solution and a shortfall it cannot cover shows.
Capacity stays within the operator's ceiling (target × (1 + headroom)) or what is already committed, whichever is
more; with an over_ceiling_cost, it may go above it at that cost (the planning policy prices it above what keeping
proofs within the margin is worth and below what keeping them from going late is). Solved exactly by HiGHS
(scipy.optimize.linprog), as the lower bound (vastctl/bound.py) is. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

EARLY = 1e-6  # a proof done a slot earlier is worth this much: of two plans of one cost, the queue is kept short


@dataclass(frozen=True)
class Source:
    """One machine or offer the program may plan capacity from."""

    key: str  # a machine's uuid, or "offer:<id>"
    kind: str  # running | booting | stopped | offer
    rate: float  # proofs/hour
    price: float  # $/hour while it is held
    first_slot: int  # the first slot it proves in (0 for a running machine)
    start_cost: float = 0.0  # $ a start costs before its first proof (stopped, offer)


@dataclass(frozen=True)
class Problem:
    slot_s: float
    arrivals: Sequence[float]  # proofs arriving in each slot
    backlog: float  # proofs waiting now
    due: Sequence[float]  # proofs that must be done by the end of each slot, cumulative
    sources: Sequence[Source]
    ceiling: float  # proofs/hour the fleet may be planned to (the committed capacity if more)
    late_cost: float  # $ per proof per slot past its due slot
    due_hard: Sequence[float] = ()  # proofs that must be done by the end of each slot at the latest (cumulative)
    hard_late_cost: float = 0.0  # $ per proof per slot past its hard due slot, on top of late_cost
    over_ceiling_cost: float | None = None  # $ per proof/h per slot planned above the ceiling (None: never above it)


@dataclass(frozen=True)
class Solution:
    shares: dict[str, tuple[float, ...]]  # source key → its share in each slot
    cost: float  # $ the capacity costs over the horizon (late proofs not counted)
    late: float  # proof-slots late (0 when every proof is done in time)
    done: tuple[float, ...]  # proofs done in each slot
    overdue: tuple[float, ...] = ()  # proofs behind the hard line at the end of each slot (due, without due_hard)
    above: tuple[float, ...] = ()  # proofs/h planned above the ceiling in each slot
    ceiling: float = 0.0  # the ceiling kept to: the problem's, or the capacity already committed if more


def solve(problem: Problem) -> Solution:
    """The cheapest plan; deterministic (HiGHS on the same program gives the same answer)."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    slots = len(problem.arrivals)
    hours = problem.slot_s / 3600
    cost: list[float] = []
    low: list[float] = []
    high: list[float] = []

    def variable(price: float, lower: float = 0.0, upper: float | None = 1.0) -> int:
        cost.append(price)
        low.append(lower)
        high.append(upper if upper is not None else np.inf)
        return len(cost) - 1

    done = [variable(-EARLY * (slots - t), upper=None) for t in range(slots)]
    late = [variable(problem.late_cost, upper=None) for t in range(slots)]
    hard = [variable(problem.hard_late_cost, upper=None) for t in range(len(problem.due_hard))]
    above = [variable(problem.over_ceiling_cost, upper=None) for t in range(slots)
             if problem.over_ceiling_cost is not None]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    bounds: list[float] = []

    def row(entries: Sequence[tuple[int, float]], bound: float) -> None:
        for col, val in entries:
            rows.append(len(bounds))
            cols.append(col)
            vals.append(val)
        bounds.append(bound)

    capacity: list[list[tuple[int, float]]] = [[(done[t], 1.0)] for t in range(slots)]
    planned: list[list[tuple[int, float]]] = [[] for _ in range(slots)]
    committed = 0.0
    shares: dict[str, list[int]] = {}
    for source in problem.sources:
        cols_of = []
        for t in range(slots):
            upper = 0.0 if t < source.first_slot else 1.0
            fixed = source.kind == "booting" and t >= source.first_slot
            x = variable(source.price * hours, lower=1.0 if fixed else 0.0, upper=upper)
            cols_of.append(x)
            capacity[t].append((x, -source.rate * hours))
            planned[t].append((x, source.rate))
            if source.kind == "running" and t > 0:
                row([(x, 1.0), (cols_of[t - 1], -1.0)], 0.0)  # released, never taken back
            elif source.kind in ("stopped", "offer") and t >= source.first_slot:
                start = variable(source.start_cost, upper=None)
                entries = [(x, 1.0), (start, -1.0)]
                if t > source.first_slot:
                    entries.append((cols_of[t - 1], -1.0))
                row(entries, 0.0)
        if source.kind in ("running", "booting"):
            committed += source.rate
        shares[source.key] = cols_of
    arrived = problem.backlog
    cumulative: list[tuple[int, float]] = []
    ceiling = max(problem.ceiling, committed)
    for t in range(slots):
        row(capacity[t], 0.0)
        cumulative.append((done[t], 1.0))
        arrived += problem.arrivals[t]
        row(cumulative, arrived + 1e-9)
        row([(col, -val) for col, val in cumulative] + [(late[t], -1.0)], -problem.due[t])
        if t < len(hard):
            row([(col, -val) for col, val in cumulative] + [(hard[t], -1.0)], -problem.due_hard[t])
        if planned[t]:
            row(planned[t] + ([(above[t], -1.0)] if above else []), ceiling + 1e-9)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(bounds), len(cost))).tocsr()
    result = linprog(np.array(cost), A_ub=matrix, b_ub=np.array(bounds), bounds=list(zip(low, high)), method="highs")
    if result.status != 0:
        raise ArithmeticError(f"the planning program has no solution: {result.message}")
    x = result.x
    lateness = float(sum(x[col] for col in late))
    hard_late = float(sum(x[col] for col in hard))
    over = [float(x[col]) for col in above]
    penalties = (problem.late_cost * lateness + problem.hard_late_cost * hard_late
                 + (problem.over_ceiling_cost or 0.0) * sum(over))
    spent = float(result.fun) - penalties + EARLY * sum((slots - t) * x[done[t]] for t in range(slots))
    return Solution(shares={key: tuple(float(x[col]) for col in cols_of) for key, cols_of in shares.items()},
                    cost=spent, late=lateness, done=tuple(float(x[col]) for col in done),
                    overdue=tuple(float(x[col]) for col in (hard or late)), above=tuple(over),
                    ceiling=ceiling)
