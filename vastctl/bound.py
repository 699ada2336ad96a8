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
  bids         a host may be offered twice, by bid (from its min_bid) and on demand, one of them at a time;
               a share rented by bid proves in a block at its price or at the least bid another renter holds
               the host with in that block (`rival`), whichever is higher: a machine whose bid is under a
               rival's holding its host is stopped, so one proving then pays at least the rival's bid (and
               a bid is raised, never lowered, so it pays at least what it was rented at)

Each simplification (the hour's lowest price, the free first block and
resumes, fractions, a block's least rival bid) can only lower the figure, so it stays a bound.
A rental is held no longer than until the host's next hour offered as cheap
(cohorts_of): that changes no least cost, and keeps the program's size linear in
the horizon's length. The hosts that cannot lower it are left out, and it is checked that they cannot: a
left-out host's every hour is dearer per proof than what a proof's capacity is
worth in any block it could prove in (the program's dual prices); if not, it
is added and the program solved again. Likewise each rental is first held only through the blocks it may take
any share in, and held longer only where the program's prices say a longer hold would lower the cost
(_held_longer), then solved again: the same least cost, without the long holds that could not lower it (they
couple the whole horizon: holding every rental as long as it may be made a week's program ~15 times a day's to
solve, not 7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # imported where the program is built: the demo's alone
    import numpy as np
    from scipy.sparse import csr_matrix

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
    # one per block of the horizon, for a rental by bid: the least another renter's bid for the host is at any
    # moment of the block (0: a moment with none); a share rented for less proves in it only at that bid
    rival: Sequence[float] | None = None
    machine: int | None = None  # the host this is an offer of (None: key); at most one of a host's offers at a time


@dataclass(frozen=True)
class Bound:
    cost: float  # $
    proofs: float  # proofs the bound does (every one that arrived)
    hosts_priced: int  # hosts in the final program (the others proved unable to lower it)


def minutes(arrival_minutes: int, max_wait_s: float) -> int:
    """Minutes of the horizon: the arrivals and max_wait past them, in whole blocks."""
    wait = int(math.ceil(max_wait_s / 60))
    return int(math.ceil((arrival_minutes + wait) / BLOCK_MIN)) * BLOCK_MIN


@dataclass(frozen=True)
class Work:
    """The arrivals as the program sees them, by block."""

    blocks: int
    may: list[float]  # proofs that may be done by the end of each block (those arrived)
    due: list[float]  # proofs that must be done by then (those that arrived max_wait before)
    total: float  # proofs arrived


def work_by_block(arrivals: Sequence[float], max_wait_s: float) -> Work:
    """`arrivals` (proofs arriving at each minute's start) as the blocks' may and due totals."""
    wait = int(math.floor(max_wait_s / 60))
    horizon = minutes(len(arrivals), max_wait_s)
    arrived = [0.0]
    for minute in range(horizon):
        arrived.append(arrived[-1] + (arrivals[minute] if minute < len(arrivals) else 0.0))
    blocks = horizon // BLOCK_MIN
    return Work(blocks=blocks, may=[arrived[min(horizon, (t + 1) * BLOCK_MIN)] for t in range(blocks)],
                due=[arrived[max(0, min(horizon, (t + 1) * BLOCK_MIN - wait))] for t in range(blocks)],
                total=arrived[-1])


def least_cost(hosts: Sequence[Rentable], arrivals: Sequence[float], max_wait_s: float) -> Bound:
    """The least cost of doing `arrivals` (proofs arriving at each minute's start) within max_wait on `hosts`."""
    work = work_by_block(arrivals, max_wait_s)
    blocks, may, due, total = work.blocks, work.may, work.due, work.total
    if total <= 0:
        return Bound(cost=0.0, proofs=0.0, hosts_priced=0)
    cohorts = {host.key: cohorts_of(host, blocks) for host in hosts}
    by_key = {host.key: host for host in hosts}
    ranked = sorted((h for h in hosts if cohorts[h.key]),
                    key=lambda h: min(c.price for c in cohorts[h.key]) / h.rate)
    peak = max(arrivals) * 60 if arrivals else 0.0
    chosen: list[Rentable] = []
    for host in ranked:
        if sum(h.rate for h in chosen) >= 2 * peak + 1e-9 and len(chosen) >= 4:
            break
        chosen.append(host)
    held = {(host.key, c.hour): min(c.last, c.first + COHORT_BLOCKS) for host in hosts for c in cohorts[host.key]}
    while True:
        program = {h.key: [replace(c, last=held[h.key, c.hour]) for c in cohorts[h.key]] for h in chosen}
        try:
            cost, duals = _solve(chosen, program, blocks, may, due)
        except ArithmeticError:  # rentals held only through their own hour do not cover every block: hold them all
            if all(held[h.key, c.hour] == c.last for h in chosen for c in cohorts[h.key]):
                raise
            held.update({(h.key, c.hour): c.last for h in chosen for c in cohorts[h.key]})
            continue
        best = [0.0] * (blocks + 1)  # the most a proof's capacity is worth from block t on
        for t in range(blocks - 1, -1, -1):
            best[t] = max(duals.worth[t], best[t + 1])
        inside = {h.key for h in chosen}
        missing = [host for host in ranked if host.key not in inside and any(
            c.price < host.rate * best[c.first] - 1e-9 for c in cohorts[host.key])]
        longer = _held_longer(chosen, cohorts, held, duals, blocks)
        if not missing and not longer:
            return Bound(cost=cost, proofs=total, hosts_priced=len(chosen))
        held.update(longer)
        chosen.extend(by_key[host.key] for host in missing)


def _held_longer(hosts: Sequence[Rentable], cohorts: dict[int, list[Cohort]], held: dict[tuple[int, int], int],
                 duals: _Duals, blocks: int) -> dict[tuple[int, int], int]:
    """The rentals that would lower the cost if held past where the program cut them, and until when.

    A share held one more block, proving, costs its price and takes the host for that block (the host's
    one-at-a-time row's price) and gives its capacity's worth; stopped, it costs its disk and takes the host,
    never less than nothing. If no rental's next blocks are worth more than they cost at the program's prices,
    its least cost is the least with every rental held as long as it may be (its prices stay feasible for the
    longer program); else those rentals are held through the last block that is, and it is solved again.
    """
    import numpy as np

    hours = BLOCK_MIN / 60
    longer: dict[tuple[int, int], int] = {}
    for host in hosts:
        machine = duals.machines[host.machine if host.machine is not None else host.key]
        rival = None if host.rival is None else np.asarray(host.rival, dtype=float)
        for cohort in cohorts[host.key]:
            cut = held[host.key, cohort.hour]
            if cut >= cohort.last:
                continue
            t = np.arange(cut, cohort.last)
            price = np.full(len(t), cohort.price) if rival is None else np.maximum(cohort.price, rival[t])
            gain = host.rate * hours * duals.worth[t] - price * hours - duals.held[machine * blocks + t]
            worth_it = np.nonzero(gain > 1e-9)[0]
            if len(worth_it):
                longer[host.key, cohort.hour] = int(t[worth_it[-1]]) + 1
    return longer


@dataclass(frozen=True)
class Cohort:
    """The rentals of one host begun in one hour: their price, and the blocks they may be held in."""

    hour: int
    price: float  # the lowest $/h offered in the hour
    first: int  # the block it proves from (the one after the hour's first)
    last: int  # the last block it may be held in (exclusive)


def cohorts_of(host: Rentable, blocks: int) -> list[Cohort]:
    """Each hour the host may be rented in and prove after, at the lowest price offered in it.

    A cohort is held no further than the start of the host's next hour offered at its price or less: from
    that hour's first proving block on, what it holds may as well be held by the later cohort (as cheap or
    cheaper, and still in its own hour, so free to take any share), which changes no cost, capacity or
    one-at-a-time total. So the program's size grows with the horizon, not with its square, and its least
    cost is the same.
    """
    found: list[tuple[int, float]] = []
    for hour in range(blocks // COHORT_BLOCKS + 1):
        if hour * COHORT_BLOCKS + 1 >= blocks:
            break
        offered = [p for p in host.prices[hour * 60:(hour + 1) * 60] if p is not None]
        if offered:
            found.append((hour, min(offered)))
    cohorts: list[Cohort] = []
    waiting: list[int] = []  # cohorts (indices) not yet cut short by a later one as cheap: prices rise along it
    lasts = [blocks] * len(found)
    for index, (hour, price) in enumerate(found):
        while waiting and found[waiting[-1]][1] >= price:
            lasts[waiting.pop()] = hour * COHORT_BLOCKS + 1
        waiting.append(index)
    for (hour, price), last in zip(found, lasts):
        cohorts.append(Cohort(hour=hour, price=price, first=hour * COHORT_BLOCKS + 1, last=last))
    return cohorts


@dataclass(frozen=True)
class _Duals:
    """The solved program's prices: of a proof's capacity in each block, and of each host's block (≥ 0)."""

    worth: np.ndarray  # $ per proof of capacity, by block
    held: np.ndarray  # $ of a whole host for a block, at machines[host] × blocks + block (0: no row)
    machines: dict[int, int]  # a host (its machine) → its index


def _solve(hosts: Sequence[Rentable], cohorts: dict[int, list[Cohort]], blocks: int,
           may: Sequence[float], due: Sequence[float]) -> tuple[float, _Duals]:
    """Solve the program over `hosts` (program()): its cost and its prices (_Duals)."""
    import numpy as np
    from scipy.optimize import linprog

    built = program(hosts, cohorts, blocks, may, due)
    # HiGHS's presolve finds little to remove here and holds a second copy of the program: a week's is a third
    # faster and ~100 MB smaller without it (the same least cost)
    result = linprog(built.cost, A_ub=built.matrix, b_ub=built.upper, bounds=built.limits, method="highs",
                     options={"presolve": False})
    if result.status != 0:
        raise ArithmeticError(f"the lower bound's program has no solution: {result.message}")
    marginals = np.asarray(result.ineqlin.marginals)
    falling, first_capacity, machine_blocks = built.falling, built.first_capacity, built.machine_blocks
    held_price = np.zeros(len(built.machines) * blocks)
    held_price[machine_blocks] = np.maximum(0.0, -marginals[falling:falling + len(machine_blocks)])
    worth = np.maximum(0.0, -marginals[first_capacity:first_capacity + blocks])
    return float(result.fun), _Duals(worth=worth, held=held_price, machines=built.machines)


@dataclass(frozen=True)
class Program:
    """The bound's program in linprog's form (cost · x, matrix · x ≤ upper, limits per column) and where its
    parts are: the rows _solve() reads its prices from, and each rental's proving shares."""

    cost: np.ndarray
    matrix: csr_matrix
    upper: np.ndarray
    limits: np.ndarray  # (lowest, highest) of each column
    proving: list[tuple[float, np.ndarray]]  # each cohort's price and its y columns, block by block
    falling: int  # rows of held shares that only fall (the first rows)
    machine_blocks: np.ndarray  # a host's one-at-a-time row for each (machine · blocks + block), after them
    first_capacity: int  # the first of the blocks' capacity rows
    machines: dict[int, int]  # a host (its machine) → its index


def program(hosts: Sequence[Rentable], cohorts: dict[int, list[Cohort]], blocks: int,
            may: Sequence[float], due: Sequence[float]) -> Program:
    """Build the program over `hosts`.

    Its first variables are the proofs done by the end of each block (D_t, between due and may); each
    block's done ones (D_t − D_{t−1}, never negative) are at most the capacity held proving in it. Then, for
    each cohort and block it may be held in, its share proving (y) and stopped (z). Built as arrays: the
    program of a week has some 10⁵ variables.
    """
    import numpy as np
    from scipy.sparse import coo_matrix

    hours = BLOCK_MIN / 60
    costs = [np.zeros(blocks)]
    proving: list[tuple[float, np.ndarray]] = []
    columns = blocks
    capacity: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (block, y, −rate·hours): the y in each block
    held: list[tuple[np.ndarray, np.ndarray]] = []  # (machine·blocks + block, y or z): a host's share, one at a time
    falls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # y+z − previous y+z ≤ 0, once the hour is over
    falling = 0
    machines: dict[int, int] = {}
    for host in hosts:
        machine = machines.setdefault(host.machine if host.machine is not None else host.key, len(machines))
        rival = None if host.rival is None else np.asarray(host.rival, dtype=float)
        for cohort in cohorts[host.key]:
            t = np.arange(cohort.first, cohort.last)
            y = columns + 2 * np.arange(len(t))
            z = y + 1
            columns += 2 * len(t)
            price = np.full(len(t), cohort.price) if rival is None else np.maximum(cohort.price, rival[t])
            cost = np.empty(2 * len(t))
            cost[0::2], cost[1::2] = price * hours, host.storage_dph * hours
            costs.append(cost)
            capacity.append((t, y, np.full(len(t), -host.rate * hours)))
            proving.append((cohort.price, y))
            held.append((np.repeat(machine * blocks + t, 2), np.column_stack((y, z)).ravel()))
            later = np.nonzero(t[1:] > (cohort.hour + 1) * COHORT_BLOCKS)[0] + 1
            if len(later):
                rows = falling + np.arange(len(later))
                falling += len(later)
                falls.append((np.repeat(rows, 4), np.column_stack((y[later], z[later], y[later - 1], z[later - 1])).ravel(),
                              np.tile([1.0, 1.0, -1.0, -1.0], len(later))))
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    keys = np.concatenate([k for k, _ in held] or [empty_i])
    machine_blocks, held_row = np.unique(keys, return_inverse=True)
    first_capacity = falling + len(machine_blocks)
    first_order = first_capacity + blocks
    steps = np.arange(1, blocks)
    row_parts = [r for r, _, _ in falls] + [falling + held_row] + [first_capacity + t for t, _, _ in capacity] + [
        first_capacity + np.arange(blocks), first_capacity + steps, first_order + steps - 1, first_order + steps - 1]
    col_parts = [c for _, c, _ in falls] + [np.concatenate([c for _, c in held] or [empty_i])] + [
        y for _, y, _ in capacity] + [np.arange(blocks), steps - 1, steps - 1, steps]
    val_parts = [v for _, _, v in falls] + [np.ones(len(keys))] + [v for _, _, v in capacity] + [
        np.ones(blocks), -np.ones(blocks - 1), np.ones(blocks - 1), -np.ones(blocks - 1)]
    upper = np.concatenate([np.zeros(falling), np.ones(len(machine_blocks)), np.zeros(blocks), np.zeros(blocks - 1)])
    cost = np.concatenate(costs)
    limits = np.column_stack((np.concatenate([np.asarray(due, dtype=float), np.zeros(columns - blocks)]),
                              np.concatenate([np.asarray(may, dtype=float), np.full(columns - blocks, np.inf)])))
    matrix = coo_matrix((np.concatenate(val_parts or [empty_f]), (np.concatenate(row_parts), np.concatenate(col_parts))),
                        shape=(len(upper), columns)).tocsr()
    return Program(cost=cost, matrix=matrix, upper=upper, limits=limits, proving=proving, falling=falling,
                   machine_blocks=machine_blocks, first_capacity=first_capacity, machines=machines)
