"""The simulator's cost per simulated minute: a simulated day beside a simulated week, the same seed.

Each run is one `vastctl demo` (vastctl/demo/: the market, reconcile and
agent-step every simulated minute, the figures at the end) in a fresh process,
so that no cache of one run warms the next; the wall time is taken around
demo/day.run only (not the interpreter's start). Rounds interleave the day and the
week, the one run first alternating, so that machine noise hits them alike. Prints each run's wall time per
simulated minute, the medians, and the ratio of the week's wall time to the
day's: 7 means a minute costs the same at the end of a week as on the first
day. The CPU time of each run is printed beside it: on a machine shared with
other work it is the steadier of the two. So is each run's peak resident
memory (the child's ru_maxrss: the interpreter, its imports, the run and the
lower bounds' programs at its end).

Target: week ≤ 7.5 × day. Every run of a length must give the same figures
(the same seed): the script says so, or stops.

Rerun:
    python bench/sim_scaling.py                    # seed 351 (the demo's default), 3 rounds (~5 min on 2 cores)
    python bench/sim_scaling.py --seed 5 --rounds 5
    python bench/sim_scaling.py --policy rules     # the day and week of the rules (default: the demo's, plan)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAY_H, WEEK_H = 24.0, 168.0
TARGET_RATIO = 7.5


def one(hours: float, seed: int, policy: str | None) -> dict:
    """One demo run in this process: wall seconds around demo/day.run, and a digest of its figures."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from vastctl.demo import day, setting

    with tempfile.TemporaryDirectory() as directory:
        started, cpu = time.perf_counter(), time.process_time()
        options = setting.DemoOptions(hours=hours, seed=seed)
        result = day.run(options if policy is None else dataclasses.replace(options, policy=policy), Path(directory))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    digest = hashlib.sha256(json.dumps(result.to_json(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"hours": hours, "wall_s": wall, "cpu_s": cpu, "rss_mb": peak, "minutes": result.options.minutes,
            "figures": digest}


def spawn(hours: float, seed: int, policy: str | None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", str(hours), "--seed", str(seed),
                          *(["--policy", policy] if policy else [])],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=351)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policy", choices=("plan", "rules"), help="the fleet's policy (default: the demo's)")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # the child: run one demo of this many hours
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.seed, args.policy)))
        return 0

    runs: dict[float, list[dict]] = {DAY_H: [], WEEK_H: []}
    for number in range(1, args.rounds + 1):
        for hours in (DAY_H, WEEK_H) if number % 2 else (WEEK_H, DAY_H):  # the first of a round alternates
            run = spawn(hours, args.seed, args.policy)
            runs[hours].append(run)
            print(f"round {number}: {hours:4g} h  wall {run['wall_s']:6.2f} s"
                  f" ({1000 * run['wall_s'] / run['minutes']:5.2f} ms per simulated minute)  CPU {run['cpu_s']:6.2f} s"
                  f" ({1000 * run['cpu_s'] / run['minutes']:5.2f} ms)  peak RSS {run['rss_mb']:5.0f} MB"
                  f"  figures {run['figures']}", flush=True)
    for hours, done in runs.items():
        if len({run["figures"] for run in done}) != 1:
            print(f"error: the {hours:g} h runs of seed {args.seed} gave different figures", file=sys.stderr)
            return 1
    day_minutes, week_minutes = runs[DAY_H][0]["minutes"], runs[WEEK_H][0]["minutes"]
    print()
    print(f"seed {args.seed}, policy {args.policy or 'plan (the demo default)'}, {args.rounds} rounds (medians); every run of a length gave the same figures")
    print("| run | simulated minutes | wall s | wall ms per simulated minute | CPU s | CPU ms per simulated minute"
          " | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    medians = {}
    for hours, name, minutes in ((DAY_H, "day", day_minutes), (WEEK_H, "week", week_minutes)):
        wall = statistics.median(run["wall_s"] for run in runs[hours])
        cpu = statistics.median(run["cpu_s"] for run in runs[hours])
        rss = statistics.median(run["rss_mb"] for run in runs[hours])
        medians[name] = (wall, cpu, rss)
        print(f"| {name} | {minutes} | {wall:.2f} | {1000 * wall / minutes:.2f} | {cpu:.2f} | {1000 * cpu / minutes:.2f}"
              f" | {rss:.0f} |")
    ratios = {what: medians["week"][i] / medians["day"][i] for i, what in enumerate(("wall", "CPU", "RSS"))}
    print(f"week / day: wall {ratios['wall']:.2f}×, CPU {ratios['CPU']:.2f}× (target ≤ {TARGET_RATIO}×;"
          f" 7× is a constant cost per minute), peak RSS {ratios['RSS']:.2f}×")
    return 0 if ratios["wall"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
