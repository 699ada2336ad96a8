"""The demo's lower bounds on a day's market beside the old minute-by-minute figure, per seed ($ per 1,000 proofs).

No fleet is run: the market is built from its seed and each bound computed (vastctl/demo/figures.py: least_costs, the linear
program of vastctl/bound.py; lower_bound_cost, the old figure), with the CPU each took.

    python bench/bounds.py --seeds 22 23 351
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from vastctl import markets
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.demo import figures, setting
from vastctl.providers.sim import SimProvider
from vastctl.state import db


@contextmanager
def day_market(seed: int, hours: float) -> Iterator[tuple[SimProvider, Config, setting.DemandCurve, int]]:
    """The simulated market of a day, its config, its demand curve and its minutes, in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="vastctl-bounds-") as scratch:
        options = setting.DemoOptions(hours=hours, seed=seed)
        config = setting.demo_config(Path(scratch), options)
        clock = VirtualClock(setting.START)
        conn = db.connect(config.db_path, now=clock.now(), create=True)
        market = markets.get_provider(config, conn=conn, clock=clock)
        assert isinstance(market, SimProvider)
        try:
            yield market, config, setting.DemandCurve(seed), options.minutes
        finally:
            conn.close()


def one_seed(seed: int, hours: float) -> dict:
    with day_market(seed, hours) as (market, config, curve, minutes):
        arrived = sum(curve.rate(minute) / 60 for minute in range(minutes))
        started = time.process_time()
        least = figures.least_costs(market, config, curve, minutes)
        cpu = time.process_time() - started
        old = figures.lower_bound_cost(market, config, curve, minutes)
        old_any = figures.lower_bound_cost(market, config, curve, minutes, honest=False)

    def per(cost: float) -> str:
        return f"{cost / arrived * 1000:.3f}"

    return {"seed": seed, "old (minute by minute)": per(old), "lower bound": per(least["honest"].cost),
            "any host": per(least["any_host"].cost), "bid-aware (min_bid)": per(least["interruptible"].cost),
            "old any-host figure": per(old_any), "hosts priced": least["honest"].hosts_priced,
            "CPU s (3 bounds)": f"{cpu:.1f}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[22, 23, 351])
    parser.add_argument("--hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    from tabulate import tabulate

    print(tabulate([one_seed(seed, args.hours) for seed in args.seeds], headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
