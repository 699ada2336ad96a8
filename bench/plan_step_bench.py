"""The planning policy's decision at fleet size: CPU time of one plan.decide() over 50 machines and 500 offers.

The observation is built in memory (no state file, no market): 40 machines running at prices 0.25-0.60 $/h,
5 booting, 5 stopped; 500 offers over the sim market's models, prices and RAM; work queued, in flight and
coming, with a day-old profile. What is timed is what agent-step adds for the policy: the forecast, the two
programs at most (HiGHS) and the rounding to whole machines. Target: well under 1 s of CPU per step.

Rerun:
    python bench/plan_step_bench.py                 # 50 machines, 500 offers, 30 runs
    python bench/plan_step_bench.py --machines 200 --offers 1000 --runs 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone

from vastctl import config as config_module
from vastctl.agent import plan
from vastctl.agent.plan_forecast import DemandPast
from vastctl.facts.demand import Demand
from vastctl.observe import Observation
from vastctl.providers.base import Offer

NOW = datetime(2031, 3, 3, 12, 0, tzinfo=timezone.utc)
MODELS = (("RTX 3090", 50.0, 0.20), ("RTX 4090", 80.0, 0.35), ("RTX 5070 Ti", 90.0, 0.30), ("RTX 5090", 100.0, 0.55))
STATES = ["running"] * 8 + ["launching", "stopped"]


def machines(count: int, rng: random.Random) -> list:
    fleet = []
    for i in range(count):
        name, rate, price = MODELS[i % len(MODELS)]
        state = STATES[i % len(STATES)]
        fleet.append({"uuid": f"u-{i}", "label": f"vastctl-{i:04d}", "state": state, "vast_id": 1000 + i,
                      "vast_status": "exited" if state == "stopped" else "running", "vast_missing": 0,
                      "gpu_name": name, "expected_rate": rate * rng.uniform(0.9, 1.05),
                      "dph": round(price * rng.uniform(0.8, 1.7), 4), "bid": None, "resumes": 0,
                      "state_since": (NOW - timedelta(minutes=rng.randint(5, 600))).isoformat(),
                      "billed_per_hour": 0.01, "machine_id": 50_000 + i})
    return fleet


def offers(count: int, rng: random.Random) -> list[Offer]:
    found = []
    for i in range(count):
        name, _rate, price = MODELS[i % len(MODELS)]
        found.append(Offer(id=i + 1, machine_id=10_000 + i, gpu_name=name, num_gpus=1,
                           dph_total=round(price * rng.uniform(0.8, 2.0), 4), cpu_ram_gb=rng.choice([256, 384, 512])))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=50)
    parser.add_argument("--offers", type=int, default=500)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    rng = random.Random(1)
    fleet = machines(args.machines, rng)
    market = offers(args.offers, rng)
    config = config_module.from_mapping({"fleet": {"gpus": [name for name, _r, _p in MODELS], "max_dph": 1.2,
                                                   "max_instances": args.machines + 50, "max_hourly_spend": 1000.0}})
    settings = {"target_proofs_per_hour": 5000.0, "min_bench_rate": 40.0, "max_instances": args.machines + 50,
                "max_hourly_spend": 1000.0, "max_dph": 1.2}
    demand = Demand(queued=900, proofs_per_hour=3200.0, at=NOW, age_s=30, source="command", known=True,
                    in_flight=300, lookahead=3600)
    obs = Observation(now=NOW, settings=settings, demand=demand, machines=fleet,
                      capacity=sum(m["expected_rate"] for m in fleet if m["state"] == "running"),
                      pending_capacity=0.0, spend_per_hour=sum(m["dph"] for m in fleet if m["state"] != "stopped"),
                      events=[], last_actions=[], model_rates={name: rate for name, rate, _p in MODELS},
                      spent_today=0.0)
    past = DemandPast(last_window=3000, ago=tuple(3600 - 50 * k for k in range(1, 7)), day_before_now=3400.0,
                      day_before=tuple(3400.0 + 100 * k for k in range(plan.HORIZON_SLOTS)))
    plan.decide(obs, config, market, past)  # the first call imports scipy: not a step's cost once loaded
    times = []
    decision = None
    for _ in range(args.runs):
        started = time.process_time()
        decision = plan.decide(obs, config, market, past)
        times.append(time.process_time() - started)
    assert decision is not None
    print(f"plan.decide: {args.machines} machines, {args.offers} offers, {args.runs} runs:"
          f" median {statistics.median(times) * 1000:.0f} ms CPU, max {max(times) * 1000:.0f} ms;"
          f" {len(decision.actions)} action(s): {', '.join(sorted({str(a.kind) for a in decision.actions})) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
