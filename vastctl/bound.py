"""The least any fleet could pay for a day's proofs on a market: a linear program, solved exactly (HiGHS).

The demo and the benchmarks compare what a fleet paid with this. It is a true
lower bound: every freedom the market gives a fleet is allowed, and every
constraint below is one that every fleet meets, so no fleet can pay less.

  time         10-minute blocks (BLOCK_MIN) from the first arrival to max_wait past the last;
               the work: a proof arriving at minute m is done in minute m + max_wait at the latest (the
               demo's measure of a wait), none before it arrives
  hosts        each proves at its true rate, fractions of a host allowed, at most one of each at a time;
               a host is rented only in a minute it is offered (not held by another renter, price within
               the fleet's cap) and keeps the price it was rented at for as long as it is held, through
               hours another renter would have taken it and while the offer's price rises; it may be
               re-rented when the price falls
  rentals      grouped by the hour they begin in (a cohort), each priced at the lowest price of that hour;
               a rental proves from the block after the one it began in (the market's quickest boot is
               ~12 minutes: BOOT_MIN is 10) and pays nothing for that first block; once its hour is over,
               a cohort's held share only falls (a held host is released, never taken back at its old price)
  stopping     a held host may be stopped at its disk's price and proved on again at its rented price
               (a resume's boot, and a resume that finds its GPU gone, are not charged)

Each simplification (the hour's lowest price, the free first block and
resumes, fractions) can only lower the figure, so it stays a bound. The hosts
that cannot lower it are left out, and it is checked that they cannot: a
left-out host's every hour is dearer per proof than what a proof's capacity is
worth in any block it could prove in (the program's dual prices); if not, it
is added and the program solved again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

BLOCK_MIN = 10  # minutes of one block
BOOT_MIN = 10  # a rental proves no sooner than this after it begins (≥ BLOCK_MIN keeps the model a bound)
COHORT_BLOCKS = 6  # rentals are grouped by the hour they begin in
assert BOOT_MIN >= BLOCK_MIN and COHORT_BLOCKS * BLOCK_MIN == 60


@dataclass(frozen=True)
class Rentable:
    """One host: its true rate, its disk's $/h, and its $/h in each minute from the start (None: not rentable)."""

    key: int
    rate: float  # proofs/hour
    storage_dph: float
    prices: Sequence[float | None]  # one per minute of the horizon (minutes(len(arrivals), max_wait) of them)


@dataclass(frozen=True)
class Bound:
    cost: float  # $
    proofs: float  # proofs the bound does (every one that arrived)
    hosts_priced: int  # hosts in the final program (the others proved unable to lower it)


def minutes(arrival_minutes: int, max_wait_s: float) -> int:
    """Minutes of the horizon: the arrivals and max_wait past them, in whole blocks."""
    wait = int(math.ceil(max_wait_s / 60))
    return int(math.ceil((arrival_minutes + wait) / BLOCK_MIN)) * BLOCK_MIN


def least_cost(hosts: Sequence[Rentable], arrivals: Sequence[float], max_wait_s: float) -> Bound:
    """The least cost of doing `arrivals` (proofs arriving at each minute's start) within max_wait on `hosts`."""
    wait = int(math.floor(max_wait_s / 60))
    horizon = minutes(len(arrivals), max_wait_s)
    blocks = horizon // BLOCK_MIN
    arrived = [0.0]
    for minute in range(horizon):
        arrived.append(arrived[-1] + (arrivals[minute] if minute < len(arrivals) else 0.0))
    total = arrived[-1]
    if total <= 0:
        return Bound(cost=0.0, proofs=0.0, hosts_priced=0)
    # proofs that may be done by the end of block t (arrived) and that must be (due)
    may = [arrived[min(horizon, (t + 1) * BLOCK_MIN)] for t in range(blocks)]
    due = [arrived[max(0, min(horizon, (t + 1) * BLOCK_MIN - wait))] for t in range(blocks)]
    cohorts = {host.key: _cohorts(host, blocks) for host in hosts}
    by_key = {host.key: host for host in hosts}
    ranked = sorted((h for h in hosts if cohorts[h.key]),
                    key=lambda h: min(price for _k, price in cohorts[h.key]) / h.rate)
    peak = max(arrivals) * 60 if arrivals else 0.0
    chosen: list[Rentable] = []
    for host in ranked:
        if sum(h.rate for h in chosen) >= 2 * peak + 1e-9 and len(chosen) >= 4:
            break
        chosen.append(host)
    while True:
        cost, worth = _solve(chosen, cohorts, blocks, may, due)
        best = [max(worth[t:]) for t in range(blocks)]  # the most a proof's capacity is worth from block t on
        inside = {h.key for h in chosen}
        missing = [host for host in ranked if host.key not in inside and any(
            price < host.rate * best[k * COHORT_BLOCKS + 1] - 1e-9
            for k, price in cohorts[host.key] if k * COHORT_BLOCKS + 1 < blocks)]
        if not missing:
            return Bound(cost=cost, proofs=total, hosts_priced=len(chosen))
        chosen.extend(by_key[host.key] for host in missing)


def _cohorts(host: Rentable, blocks: int) -> list[tuple[int, float]]:
    """(hour, lowest $/h offered in it) for each hour the host may be rented in and prove after."""
    found = []
    for hour in range(blocks // COHORT_BLOCKS + 1):
        if hour * COHORT_BLOCKS + 1 >= blocks:
            break
        offered = [p for p in host.prices[hour * 60:(hour + 1) * 60] if p is not None]
        if offered:
            found.append((hour, min(offered)))
    return found


def _solve(hosts: Sequence[Rentable], cohorts: dict[int, list[tuple[int, float]]], blocks: int,
           may: Sequence[float], due: Sequence[float]) -> tuple[float, list[float]]:
    """Build and solve the program over `hosts`: its cost and each block's price of capacity."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    hours = BLOCK_MIN / 60
    cost: list[float] = [0.0] * blocks  # the served-proof variables S_t come first, free of cost
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []
    row = 0

    def add(entries: list[tuple[int, float]], bound: float) -> None:
        nonlocal row
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        upper.append(bound)
        row += 1

    capacity_terms: list[list[tuple[int, float]]] = [[(t, 1.0)] for t in range(blocks)]  # S_t − Σ rate·y ≤ 0
    for host in hosts:
        held_at: list[list[int]] = [[] for _ in range(blocks)]
        for hour, price in cohorts[host.key]:
            first = hour * COHORT_BLOCKS + 1
            previous: tuple[int, int] | None = None
            for t in range(first, blocks):
                y, z = len(cost), len(cost) + 1
                cost += [price * hours, host.storage_dph * hours]
                capacity_terms[t].append((y, -host.rate * hours))
                held_at[t] += [y, z]
                if previous is not None and t > (hour + 1) * COHORT_BLOCKS:  # its hour over: the share only falls
                    add([(y, 1.0), (z, 1.0), (previous[0], -1.0), (previous[1], -1.0)], 0.0)
                previous = (y, z)
        for t in range(blocks):
            if held_at[t]:
                add([(col, 1.0) for col in held_at[t]], 1.0)
    capacity_rows = []
    for t in range(blocks):
        capacity_rows.append(row)
        add(capacity_terms[t], 0.0)
    for t in range(blocks):
        add([(u, 1.0) for u in range(t + 1)], may[t])
        add([(u, -1.0) for u in range(t + 1)], -due[t])
    matrix = coo_matrix((vals, (rows, cols)), shape=(row, len(cost))).tocsr()
    result = linprog(np.array(cost), A_ub=matrix, b_ub=np.array(upper), bounds=(0, None), method="highs")
    if result.status != 0:
        raise ArithmeticError(f"the lower bound's program has no solution: {result.message}")
    worth = [max(0.0, -float(result.ineqlin.marginals[r])) for r in capacity_rows]
    return float(result.fun), worth
