"""Start-up time: `vastctl --help` and `vastctl fleet --json` (1,000 machines) beside the official `vastai --help`.

Target: each vastctl command at most half the official CLI's time, measured side
by side in one run (rounds interleave the three commands so machine noise hits
them alike). Prints medians and ratios.

Rerun:
    python bench/startup_bench.py                 # installs vastai==1.9.1 into a cache venv if not found
    python bench/startup_bench.py --rounds 21 --vastai /path/to/vastai
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VASTAI_VERSION = "1.9.1"


def find_vastai(explicit: str | None) -> str:
    if explicit:
        return explicit
    found = shutil.which("vastai")
    if found:
        return found
    venv = Path(tempfile.gettempdir()) / f"vastai-{VASTAI_VERSION}-venv"
    binary = venv / "bin" / "vastai"
    if not binary.exists():
        print(f"installing vastai=={VASTAI_VERSION} into {venv} …", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vastai=={VASTAI_VERSION}"], check=True)
    return str(binary)


def make_fleet(path: Path, machines: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from vastctl import clock
    from vastctl.state import db

    conn = db.connect(path, create=True, now=clock.SYSTEM.now())
    now = clock.to_iso(clock.SYSTEM.now())
    states = ["running"] * 7 + ["params_done", "bench_done", "registered"]
    rows = [
        (f"uuid-{i:05d}", f"vastctl-{i:05d}", states[i % len(states)], 1_000_000 + i, "RTX 4090", 1, 0.42, 68.0,
         i, 66.5, now, now, now)
        for i in range(machines)
    ]
    with db.transaction(conn):
        conn.executemany(
            "INSERT INTO instances (uuid, label, state, vast_id, gpu_name, num_gpus, dph, bench_rate, proofs_done,"
            " proofs_per_hour, created_at, state_since, last_heartbeat_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
    conn.close()


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--vastai", help="path of the official vastai executable")
    args = parser.parse_args()

    vastai = find_vastai(args.vastai)
    beside = Path(sys.executable).with_name("vastctl")  # the console script of this interpreter, not a shim
    vastctl = str(beside) if beside.exists() else shutil.which("vastctl")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "fleet.db"
        make_fleet(state, args.machines)
        env = {**os.environ, "VASTCTL_DB": str(state), "VASTAI_NO_UPDATE_CHECK": "1", "HOME": tmp}
        commands = {
            "vastai --help": [vastai, "--help"],
            "vastctl --help": [vastctl, "--help"],
            f"vastctl fleet --json ({args.machines} machines)": [vastctl, "fleet", "--json"],
        }
        for argv in commands.values():  # warm the page cache and .pyc files
            timed(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                samples[name].append(timed(argv, env))

    baseline = statistics.median(samples["vastai --help"])
    print(f"{'command':<40} {'median s':>9} {'min s':>7} {'max s':>7} {'÷ vastai':>9}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<40} {median:9.3f} {min(values):7.3f} {max(values):7.3f} {median / baseline:9.2f}")
    print(f"\n{args.rounds} interleaved rounds, Python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print("rerun: python bench/startup_bench.py --rounds", args.rounds)
    worst = max(statistics.median(v) for k, v in samples.items() if k.startswith("vastctl"))
    verdict = "meets" if worst <= baseline / 2 else "MISSES"
    print(f"target (each vastctl command ≤ half of vastai --help): {verdict}")


if __name__ == "__main__":
    main()
