"""The lower bound with whole hosts, and with every start paying a boot: how far integrality and boots alone lift it.

The demo's lower bound (vastctl/bound.py) lets a fleet hold fractions of a host and start, stop and resume for
free. Every fleet rents whole hosts and pays each start's boot, so two programs more, over the same day, hosts,
prices and work (the honest bound's: the hosts the fleet may rent, every rental held as long as it may be):

  whole hosts          each rental's share proving (y) and stopped (z) in a block is 0 or 1: a host is held
                       whole or not at all (held, it may idle; its price is paid either way)
  whole, boots paid    as above, and every block a rental's proving share rises in (a fresh start or a resume)
                       pays BOOT_MIN of its price: every boot in this market bills its GPU longer than that
                       (image, parameter digest checks, a five-proof benchmark) before its first proof

With --boot-min above BOOT_MIN (10) each start pays that much of its price instead, while it still proves from
the next block: no longer a bound, but what boots of that length would add to a fleet that knew the day in advance
(a fresh boot in this market bills ~20-35 minutes, a resume ~12-20).

Both are integer programs, solved by HiGHS (scipy.optimize.milp) over every honest host (the pruning the linear
program uses rests on its dual prices, which an integer program does not have). The figure reported is HiGHS's
proved lower bound on the program's least cost (its dual bound), so each is still a lower bound on what any
fleet pays, whatever the time limit: a program stopped early only gives a lower one.

    python bench/whole_hosts.py --seeds 41 42 43          # ~50 s of CPU a day
    python bench/whole_hosts.py --seeds 41 --boot-min 25
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
from bounds import day_market
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, hstack, vstack

from vastctl import bound
from vastctl.demo import figures


def honest_hosts(seed: int, hours: float) -> tuple[list[bound.Rentable], list[float], float, float]:
    """The honest bound's hosts, arrivals and max_wait (the demo's figures.bound_inputs), and its least cost."""
    with day_market(seed, hours) as (market, config, curve, minutes):
        inputs = figures.bound_inputs(market, config, curve, minutes)
    hosts = inputs.hosts["honest"]
    least = bound.least_cost(hosts, inputs.arrivals, inputs.max_wait_s)
    return hosts, inputs.arrivals, inputs.max_wait_s, least.cost


@contextmanager
def quiet_stdout() -> Iterator[None]:
    """HiGHS's MIP solver writes progress lines of its own to the process's stdout (not through Python): away."""
    sys.stdout.flush()
    kept = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(kept, 1)
        os.close(kept)


def whole_bound(hosts: Sequence[bound.Rentable], arrivals: Sequence[float], max_wait_s: float, *, boot_min: float,
                time_limit: float) -> tuple[float, str]:
    """HiGHS's proved lower bound on the whole-host program's least cost ($), and how the solve ended."""
    work = bound.work_by_block(arrivals, max_wait_s)
    cohorts = {host.key: bound.cohorts_of(host, work.blocks) for host in hosts}
    rentable = [host for host in hosts if cohorts[host.key]]
    built = bound.program(rentable, cohorts, work.blocks, work.may, work.due)
    cost, matrix, upper, limits = built.cost, built.matrix, built.upper, built.limits
    integral = np.ones(len(cost))
    integral[:work.blocks] = 0  # the proofs done by each block's end are not whole
    if boot_min > 0:  # s_t ≥ y_t − y_{t−1}: a start, paying boot_min of the rental's price
        columns = len(cost)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        paid: list[float] = []
        for price, proving in built.proving:
            for index, y in enumerate(proving):
                row, start = len(paid), columns + len(paid)
                paid.append(price * boot_min / 60)
                rows += [row, row]
                cols += [int(y), start]
                vals += [1.0, -1.0]
                if index:
                    rows.append(row)
                    cols.append(int(proving[index - 1]))
                    vals.append(-1.0)
        starts = len(paid)
        matrix = vstack([hstack([matrix, coo_matrix((matrix.shape[0], starts))]),
                         coo_matrix((vals, (rows, cols)), shape=(starts, columns + starts))]).tocsr()
        upper = np.concatenate([upper, np.zeros(starts)])
        cost = np.concatenate([cost, paid])
        limits = np.vstack([limits, np.column_stack([np.zeros(starts), np.full(starts, np.inf)])])
        integral = np.concatenate([integral, np.zeros(starts)])  # whole wherever y is
    with quiet_stdout():
        result = milp(cost, constraints=LinearConstraint(matrix, -np.inf, upper), integrality=integral,
                      bounds=Bounds(limits[:, 0], limits[:, 1]),
                      options={"time_limit": time_limit, "mip_rel_gap": 0.002})
    dual = getattr(result, "mip_dual_bound", None)
    if dual is None or not np.isfinite(dual):
        raise ArithmeticError(f"the whole-host program gave no bound: {result.message}")
    return float(dual), "optimal (gap ≤ 0.2%)" if result.status == 0 else str(result.message)


def one_seed(seed: int, hours: float, boot_min: float, time_limit: float) -> dict:
    hosts, arrivals, max_wait_s, least = honest_hosts(seed, hours)
    started = time.process_time()
    whole, whole_end = whole_bound(hosts, arrivals, max_wait_s, boot_min=0, time_limit=time_limit)
    booted, booted_end = whole_bound(hosts, arrivals, max_wait_s, boot_min=boot_min, time_limit=time_limit)
    paid = "whole, boots paid" if boot_min <= bound.BOOT_MIN else f"whole, {boot_min:g}-min boots (not a bound)"
    proofs = sum(arrivals)
    return {"seed": seed, "lower bound ($/1000)": f"{least / proofs * 1000:.3f}",
            "whole hosts": f"{whole / proofs * 1000:.3f} ({whole / least:.3f}×)",
            paid: f"{booted / proofs * 1000:.3f} ({booted / least:.3f}×)",
            "solves": whole_end if whole_end == booted_end else f"{whole_end} / {booted_end}",
            "CPU s": f"{time.process_time() - started:.0f}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[41, 42, 43])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--boot-min", type=float, default=bound.BOOT_MIN,
                        help="minutes of its price each start pays (above 10 the figure is not a bound)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds HiGHS may take per program")
    args = parser.parse_args(argv)
    from tabulate import tabulate

    if args.boot_min < bound.BOOT_MIN:
        parser.error(f"--boot-min {args.boot_min:g}: every boot in this market is longer than {bound.BOOT_MIN}"
                     " minutes; use 10 or more")
    rows = [one_seed(seed, args.hours, args.boot_min, args.time_limit) for seed in args.seeds]
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
