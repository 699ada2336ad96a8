"""Where the rules fleet's money goes above the lower bound: a per-minute ledger of one `vastctl demo` day.

Every minute of the day, each instance's billing of that minute (the market's
own `cost`, read from the demo's state file) goes to one cause:

  proving machines (the market has them proving: running, not paused, not dead), their cost C at capacity K
  (the sum of their true rates), against the minute-by-minute price b(x) (the cheapest allowed hosts no
  other renter holds, in fractions of a machine: demo/figures.lower_bound_cost's rule), with A the arrivals
  of the minute, W the capacity the rules wanted then (sizing.wanted_capacity), L the look-ahead's rate
  (lookahead / demand.lookahead_window), and while K ≥ A, w = W and l = L kept within [A, K]:
    bound                      b(A): what renting minute by minute would pay; the true lower bound (the
                               demo's, vastctl.bound) is below it by "the market's freedoms" (rows_of)
    wanted: look-ahead         b(min(l, w)) - b(A): the look-ahead's rate above the arrivals of the minute
    wanted: backlog drain      b(w) - b(min(l, w)): draining what waits within agent.plan_horizon
    whole machines             b(min(K, w + the smallest proving machine)) - b(w): the round-up to machines
    capacity above wanted      b(K) - b(min(K, w + the smallest proving machine)): a machine that could go
    capacity short of arrivals b(K) - b(A) while K < A (negative: the backlog it leaves is paid for later)
    host price                 C - b(K): hosts dearer than the cheapest free allowed ones of the same capacity
  every other billed instance:
    boot                       GPU billed before its first proof, on a boot that did reach proving
    failed boot                GPU billed on a boot (create or resume) that never proved
    dead, not yet killed       the market has it dead (exited, vanished, offline) and vastctl has not killed it
    leak                       billed after vastctl killed it (destroy refused, not yet landed)
    outbid pause               an interruptible machine paused by a rival bid (storage) and its restart
    stopped storage            storage of machines the policy stopped (kept for a quick resume)
    idle (refused)             up but told to stop proving (a refused report)

The fleet's cost per 1,000 proofs is divided by the proofs done, the bound's
by the proofs arrived (as bench/control_loop.py does): "proofs done vs
arrived" is that difference. Each cause is shown in $ per 1,000 proofs and as
its share of the ratio to the bound, so the rows add up to the ratio.

    python bench/cost_ledger.py                                  # seeds 1 2 3 9, default failures
    python bench/cost_ledger.py --seeds 4 5 6 7 --level high
    python bench/cost_ledger.py --seeds 1 --hourly               # one row per hour of each day
    python bench/cost_ledger.py --set launch.rental=mixed
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from control_loop import overrides

from vastctl.agent import sizing
from vastctl.config import Config
from vastctl.demo import day, setting
from vastctl.observe import observe
from vastctl.providers import sim_market

CAUSES = ("bound", "wanted: look-ahead", "wanted: backlog drain", "whole machines", "capacity above wanted",
          "capacity short of arrivals", "host price", "boot", "failed boot", "dead, not yet killed", "leak",
          "outbid pause", "stopped storage", "idle (refused)")
INSTANCE_COLUMNS = ("vast_id", "cost", "destroyed_at", "listed", "actual_status", "proving_since", "paused_at",
                    "died_at", "refused_at", "epoch", "machine_id", "intended_status")


class BoundPrices:
    """b(x) of each minute: the cheapest allowed free hosts for x proofs/hour, in fractions of a machine."""

    def __init__(self, seed: int, config: Config):
        self.config = config
        self.seed = seed
        everyone = sim_market.make_hosts(seed)
        self.everyone = everyone
        self.hosts = [host for host in everyone if host.gpu_name in config.fleet.gpus
                      and host.true_rate >= config.fleet.min_bench_rate
                      and host.cpu_ram_gb >= config.fleet.min_cpu_ram_gb
                      and host.inet_down_mbps >= config.fleet.min_inet_down_mbps]
        self._taken: tuple[int, frozenset[int]] = (-1, frozenset())

    def priced(self, minute: int) -> list[tuple[float, float]]:
        at = (setting.START + timedelta(minutes=minute)).timestamp()
        hour = int(at // 3600)
        if self._taken[0] != hour:
            self._taken = (hour, sim_market.taken_by_others(self.seed, self.everyone, hour))
        disk = self.config.launch.disk_gb
        priced = [(dph, host.true_rate) for host in self.hosts if host.machine_id not in self._taken[1]
                  and (dph := sim_market.gpu_price(host, at) + sim_market.storage_price(host, disk))
                  <= self.config.fleet.max_dph]
        return sorted(priced, key=lambda item: (item[0] / item[1], item[0]))


def price_of(priced: list[tuple[float, float]], need: float) -> float:
    """$/h of `need` proofs/hour from the cheapest per proof first, fractions allowed (past them all: the last
    one's price per proof)."""
    cost = 0.0
    for dph, rate in priced:
        if need <= 1e-9:
            return cost
        share = min(1.0, need / rate)
        cost += dph * share
        need -= rate * share
    if need > 1e-9 and priced:
        cost += need * priced[-1][0] / priced[-1][1]
    return cost


class Ledger:
    """Reads the demo's state file after each simulated minute and books that minute's billing to causes."""

    def __init__(self, path: Path, seed: int, config_box: dict[str, Config], curve: setting.DemandCurve):
        self.path = path
        self.seed = seed
        self.config_box = config_box
        self.curve = curve
        self.conn: sqlite3.Connection | None = None
        self.bound: BoundPrices | None = None
        self.rates: dict[int, float] = {}
        self.last_cost: dict[int, float] = defaultdict(float)
        self.boots: dict[tuple[int, int], float] = defaultdict(float)  # (vast_id, epoch) → GPU $ before proving
        self.proved: set[tuple[int, int]] = set()
        self.boot_hour: dict[tuple[int, int], int] = {}
        self.hours: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.wanted_minutes = self.capped_minutes = 0
        self.proof_hours = {"proving": 0.0, "wanted": 0.0, "arrived": 0.0}  # capacity × hours over the day
        self.hourly_proofs: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def minute(self, done: int, _total: int) -> None:
        minute = done - 1
        config = self.config_box["config"]
        if self.conn is None:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            self.conn.row_factory = sqlite3.Row
            self.bound = BoundPrices(self.seed, config)
            self.rates = {host.machine_id: host.true_rate for host in sim_market.make_hosts(self.seed)}
        assert self.bound is not None
        conn = self.conn
        now = setting.START + timedelta(minutes=minute)
        book = self.hours[minute // 60]
        killed = {row[0] for row in conn.execute("SELECT vast_id FROM instances WHERE killed_at IS NOT NULL"
                                                 " AND vast_id IS NOT NULL")}
        proving_cost = capacity = 0.0
        smallest = float("inf")
        for row in conn.execute(f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM sim_instances"):
            vast_id = row["vast_id"]
            spent = row["cost"] - self.last_cost[vast_id]
            self.last_cost[vast_id] = row["cost"]
            running = row["actual_status"] in ("running", "exited", "unknown") and row["listed"]
            paused = row["paused_at"] is not None
            if (row["proving_since"] is not None and not paused and row["died_at"] is None
                    and row["refused_at"] is None and row["actual_status"] == "running" and row["listed"]
                    and row["destroyed_at"] is None):
                proving_cost += spent
                rate = self.rates[row["machine_id"]]
                capacity += rate
                smallest = min(smallest, rate)
                self.proved.add((vast_id, row["epoch"]))
                continue
            if spent <= 0:
                continue
            if vast_id in killed:
                book["leak"] += spent
            elif row["died_at"] is not None:
                book["dead, not yet killed"] += spent
            elif paused:
                book["outbid pause"] += spent
            elif row["refused_at"] is not None:
                book["idle (refused)"] += spent
            elif running or row["intended_status"] == "running":
                key = (vast_id, row["epoch"])
                self.boots[key] += spent
                self.boot_hour.setdefault(key, minute // 60)
            else:
                book["stopped storage"] += spent
        obs = observe(conn, config, now=now)
        wanted = sizing.wanted_capacity(obs, config) if sizing.has_work(obs) else 0.0
        demand = obs.demand
        window = config.demand.lookahead_window
        if demand.known and demand.lookahead is not None and window > 0:
            coming = demand.lookahead / (window / 3600)
        else:
            coming = wanted
        self.wanted_minutes += 1
        self.capped_minutes += wanted >= sizing.ceiling(obs, config) - 1e-9
        arrivals = self.curve.rate(minute)
        for name, value in (("proving", capacity), ("wanted", wanted), ("arrived", arrivals)):
            self.proof_hours[name] += value / 60
            self.hourly_proofs[minute // 60][name] += value / 60
        priced = self.bound.priced(minute)

        def b(need: float) -> float:
            return price_of(priced, need) / 60

        book["bound"] += b(arrivals)
        if capacity >= arrivals:
            kept = min(max(wanted, arrivals), capacity)
            ahead = min(max(coming, arrivals), kept)
            rounded = min(capacity, kept + smallest)
            book["wanted: look-ahead"] += b(ahead) - b(arrivals)
            book["wanted: backlog drain"] += b(kept) - b(ahead)
            book["whole machines"] += b(rounded) - b(kept)
            book["capacity above wanted"] += b(capacity) - b(rounded)
        else:
            book["capacity short of arrivals"] += b(capacity) - b(arrivals)
        book["host price"] += proving_cost - b(capacity)

    def finish(self) -> None:
        for key, spent in self.boots.items():
            self.hours[self.boot_hour[key]]["boot" if key in self.proved else "failed boot"] += spent
        if self.conn is not None:
            self.conn.close()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for book in self.hours.values():
            for cause, value in book.items():
                out[cause] += value
        return out


def one_day(seed: int, level: str, hours: float, configure, policy: str = "rules") -> tuple[Ledger, dict[str, Any]]:
    box: dict[str, Config] = {}

    def keep(config: Config) -> None:
        if configure is not None:
            configure(config)
        box["config"] = config

    with tempfile.TemporaryDirectory(prefix="vastctl-ledger-") as scratch:
        ledger = Ledger(Path(scratch) / "demo.db", seed, box, setting.DemandCurve(seed))
        result = day.run(setting.DemoOptions(hours=hours, seed=seed, failures=level, policy=policy), Path(scratch),
                          configure=keep, progress=ledger.minute)
        ledger.finish()
    return ledger, result.figures


def rows_of(books: list[tuple[dict[str, float], dict[str, Any]]]) -> tuple[list[dict[str, Any]], float]:
    """One row per cause: mean $ per 1,000 proofs over the days (the fleet's proofs done; the bound's arrived),
    and its share of the ratio to the lower bound.

    The minutes are booked against the minute-by-minute price b(x); the true lower bound (the demo's
    lower_bound_cost_per_1000_proofs, vastctl.bound's program) is lower by what the market's freedoms save
    (keeping a host through a taken hour, keeping its rented price, letting proofs wait): the row
    "the market's freedoms" is that difference, so the rows add up to the ratio to the true bound."""
    table = []
    ratio = 0.0
    n = len(books)
    minute_bound = sum(book["bound"] / figures["proofs_arrived"] for book, figures in books) / n * 1000
    bound = sum(figures["lower_bound_cost_per_1000_proofs"] for _book, figures in books) / n
    table.append({"cause": "lower bound", "$/1000 proofs": f"{bound:.3f}", "× bound": "1.000"})
    ratio += 1.0
    per = minute_bound - bound
    table.append({"cause": "the market's freedoms", "$/1000 proofs": f"{per:.3f}", "× bound": f"{per / bound:.3f}"})
    ratio += per / bound
    for cause in CAUSES:
        if cause == "bound":
            continue
        per = sum(book.get(cause, 0.0) / figures["proofs"] for book, figures in books) / n * 1000
        table.append({"cause": cause, "$/1000 proofs": f"{per:.3f}", "× bound": f"{per / bound:.3f}"})
        ratio += per / bound
    gap = sum(book["bound"] * (1 / figures["proofs"] - 1 / figures["proofs_arrived"])
              for book, figures in books) / n * 1000
    table.append({"cause": "proofs done vs arrived", "$/1000 proofs": f"{gap:.3f}", "× bound": f"{gap / bound:.3f}"})
    ratio += gap / bound
    return table, ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 9])
    parser.add_argument("--level", default="default", choices=setting.FAILURE_LEVELS)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--policy", default="rules", choices=("rules", "plan"),
                        help="the policy whose fleet is booked (the wanted rows are the rules' sizing either way)")
    parser.add_argument("--hourly", action="store_true", help="also one row per simulated hour of each day")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        help="a config override for every run, e.g. agent.scale_down_after=10m")
    args = parser.parse_args(argv)
    from tabulate import tabulate

    configure = overrides(args.settings) if args.settings else None
    books = []
    for seed in args.seeds:
        ledger, figures = one_day(seed, args.level, args.hours, configure, args.policy)
        book = ledger.totals()
        books.append((book, figures))
        booked = sum(book.values())
        print(f"seed {seed}: cost ${figures['cost']:.2f}, booked ${booked:.2f}; × bound"
              f" {figures['cost_ratio_to_lower_bound']}, within {figures['proofs_within_max_wait']};"
              f" wanted at the ceiling {ledger.capped_minutes} of {ledger.wanted_minutes} min; proof-hours"
              + ", ".join(f" {name} {value:.0f}" for name, value in ledger.proof_hours.items()))
        if args.hourly:
            hourly = [{"hour": hour, **{f"{name} /h": round(value) for name, value in ledger.hourly_proofs[hour].items()},
                       **{cause: round(values.get(cause, 0.0), 2) for cause in CAUSES}}
                      for hour, values in sorted(ledger.hours.items())]
            print(tabulate(hourly, headers="keys", tablefmt="github"))
    table, ratio = rows_of(books)
    print(f"\nledger, {args.level} failures, seeds {' '.join(map(str, args.seeds))}"
          + (f", with {' '.join(args.settings)}" if args.settings else "") + f": {ratio:.3f} × the bound")
    print(tabulate(table, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
