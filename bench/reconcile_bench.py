"""One `reconcile` pass over 1,000 and 10,000 machines from a mocked listing: wall time, peak memory, ratio.

The state file is a real SQLite file in a temp directory; the market is an
in-process fake that returns prebuilt RemoteInstances (no HTTP: this measures
reconcile, not the network). 1% of the fleet has a stale heartbeat (killed and
destroyed in the pass), 1% is killed but not yet destroyed, and the listing
carries 5% strangers without our prefix. Each size runs: a first pass (empty
cache), then `--rounds` steady passes timed (median reported, wall and this
process's CPU time), then one more under tracemalloc for the pass's peak
Python allocation.

Target: the pass grows about linearly (10k ÷ 1k close to 10); the steady pass
at 10,000 machines takes under 0.5 s of CPU (the CPU column stays meaningful
when other work shares the cores).

`--before REV` measures git revision REV's vastctl and then this tree's, each in its own process, and prints
the two side by side.

Rerun:
    python bench/reconcile_bench.py
    python bench/reconcile_bench.py --sizes 1000 10000 --rounds 5
    python bench/reconcile_bench.py --sizes 10000 --rounds 7 --before 5d4e028
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

from vastctl import clock, reconcile
from vastctl.config import from_mapping
from vastctl.providers.base import RemoteInstance
from vastctl.state import db

ROOT = Path(__file__).resolve().parent.parent


class Market:
    def __init__(self, listing: list[RemoteInstance]):
        self.listing = listing
        self.destroyed = 0

    def list_instances(self) -> list[RemoteInstance]:
        return list(self.listing)

    def destroy_instance(self, vast_id: int) -> None:
        self.destroyed += 1


def build(path: Path, n: int, now) -> Market:
    conn = db.connect(path, create=True, now=now)
    fresh, stale = clock.to_iso(now - timedelta(seconds=30)), clock.to_iso(now - timedelta(minutes=30))
    since = clock.to_iso(now - timedelta(hours=2))
    rows, listing = [], []
    for i in range(n):
        label = f"vastctl-{i:06d}"
        state, beat = "running", fresh
        if i % 100 == 1:
            beat = stale  # heartbeat timeout: killed and destroyed in the pass
        if i % 100 == 2:
            state = "killed"  # killed, destroy still pending
        rows.append((f"u{i}", label, state, 100000 + i, 5000 + i, "RTX 4090", 1, 0.4, 68.0, since, since, beat))
        listing.append(RemoteInstance(id=100000 + i, label=label, actual_status="running", intended_status="running",
                                      cur_state="running", status_msg="success, running img/ssh",
                                      machine_id=5000 + i, gpu_name="RTX 4090", num_gpus=1, dph_total=0.4))
    for j in range(n // 20):
        listing.append(RemoteInstance(id=900000 + j, label=f"other-{j}", actual_status="running"))
    with db.transaction(conn):
        conn.executemany(
            "INSERT INTO instances (uuid, label, state, vast_id, machine_id, gpu_name, num_gpus, dph, bench_rate,"
            " created_at, state_since, last_heartbeat_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.close()
    return Market(listing)


def measure(n: int, rounds: int) -> dict:
    config = from_mapping({})
    now = clock.SYSTEM.now()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        market = build(path, n, now)
        conn = db.connect(path, now=now)
        started, started_cpu = time.perf_counter(), time.process_time()
        first = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(now))
        first_s, first_cpu = time.perf_counter() - started, time.process_time() - started_cpu
        kills = sum(1 for a in first.actions if a["kind"] == "kill")
        destroys = sum(1 for a in first.actions if a["kind"] == "destroy" and a["result"] == "destroyed")
        steady, steady_cpu = [], []
        for k in range(rounds):
            gc.collect()
            started, started_cpu = time.perf_counter(), time.process_time()
            reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(now + timedelta(seconds=20 * (k + 1))))
            steady.append(time.perf_counter() - started)
            steady_cpu.append(time.process_time() - started_cpu)
        gc.collect()
        tracemalloc.start()
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(now + timedelta(seconds=20 * (rounds + 1))))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        conn.close()
    return {"n": n, "first_s": first_s, "steady_s": statistics.median(steady), "peak_mb": peak / 2**20,
            "first_cpu": first_cpu, "steady_cpu": statistics.median(steady_cpu),
            "kills": kills, "destroys": destroys, "listed": len(market.listing)}


def run_tree(tree: Path, sizes: list[int], rounds: int) -> list[dict]:
    """measure() in a child process importing vastctl from `tree` (git revision REV's, or this tree's)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json", "--rounds", str(rounds),
                          "--sizes", *map(str, sizes)], check=True, capture_output=True, text=True, env=env, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", metavar="REV", help="also run git revision REV's vastctl, side by side")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child of run_tree()
    args = parser.parse_args()
    if args.json:
        print(json.dumps([measure(n, args.rounds) for n in args.sizes]))
        return
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "vastctl"], check=True,
                                     capture_output=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            before = run_tree(Path(tmp), args.sizes, args.rounds)
        after = run_tree(ROOT, args.sizes, args.rounds)
        print(f"python bench/reconcile_bench.py --sizes {' '.join(map(str, args.sizes))} --rounds {args.rounds}"
              f" --before {args.before}")
        print(f"Python {sys.version.split()[0]}; each tree in its own process, one after the other")
        print(f"| machines | steady pass CPU s, before ({args.before}) | after | steady pass s wall, before | after"
              " | first pass CPU s, before | after |")
        print("|---|---|---|---|---|---|---|")
        for b, a in zip(before, after):
            print(f"| {a['n']:,} | {b['steady_cpu']:.3f} | {a['steady_cpu']:.3f} | {b['steady_s']:.3f} |"
                  f" {a['steady_s']:.3f} | {b['first_cpu']:.3f} | {a['first_cpu']:.3f} |")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        return
    results = [measure(n, args.rounds) for n in args.sizes]
    print(f"python bench/reconcile_bench.py --sizes {' '.join(map(str, args.sizes))} --rounds {args.rounds}")
    print(f"Python {sys.version.split()[0]}")
    print("| machines | listed | first pass s | steady pass s (median) | first pass CPU s | steady pass CPU s (median)"
          " | peak traced MiB | kills | destroys |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['n']:,} | {r['listed']:,} | {r['first_s']:.3f} | {r['steady_s']:.3f} | {r['first_cpu']:.3f} |"
              f" {r['steady_cpu']:.3f} | {r['peak_mb']:.1f} | {r['kills']} | {r['destroys']} |")
    base = results[0]
    for r in results[1:]:
        size = r["n"] / base["n"]
        print(f"{r['n']:,} ÷ {base['n']:,} ({size:g}× machines): first pass {r['first_s'] / base['first_s']:.1f}×,"
              f" steady pass {r['steady_s'] / base['steady_s']:.1f}×, peak memory {r['peak_mb'] / base['peak_mb']:.1f}×")
    print(f"process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
