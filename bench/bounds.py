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
from pathlib import Path

from vastctl import markets
from vastctl.clock import VirtualClock
from vastctl.demo import figures, setting
from vastctl.state import db


def one_seed(seed: int, hours: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="vastctl-bounds-") as scratch:
        options = setting.DemoOptions(hours=hours, seed=seed)
        config = setting.demo_config(Path(scratch), options)
        clock = VirtualClock(setting.START)
        conn = db.connect(config.db_path, now=clock.now(), create=True)
        market = markets.get_provider(config, conn=conn, clock=clock)
        curve = setting.DemandCurve(seed)
        arrived = sum(curve.rate(minute) / 60 for minute in range(options.minutes))
        started = time.process_time()
        least = figures.least_costs(market, config, curve, options.minutes)
        cpu = time.process_time() - started
        old = figures.lower_bound_cost(market, config, curve, options.minutes)
        old_any = figures.lower_bound_cost(market, config, curve, options.minutes, honest=False)
        conn.close()

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
