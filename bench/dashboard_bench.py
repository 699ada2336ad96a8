"""The dashboard page, its live refresh and /metrics over 1,000 machines: server-side CPU per request.

The state file is a real SQLite file in a temp directory holding a day of a
busy fleet: `--machines` live machines (most running, some booting, stopped,
killed awaiting their destroy, or disagreeing with vast), as many more killed
and destroyed during the day, five transition events each, a listing and a
demand sample every minute, an agent step every five minutes. Each request
goes through serve's WSGI app in one process (sign-in cookie, HTML or text
out), so the figure is what the server spends, not the network or a browser.
Before every timed request another connection writes one machine's heartbeat,
as a live fleet does many times a second: no request finds the file unchanged
since the last one (a cache that only helps an idle file would not show here).

`--before REV` runs the same requests, on the same day's file, with the vastctl of
git revision REV (extracted to a temp directory) and then with this tree, each
in its own process: before and after side by side in one run. Each tree builds
the file itself (a revision opens only a schema it knows), the same rows as of
the same moment.

Target: each request in at most 100 ms of the server's CPU (median), at 1,000
machines with a day of history. The CPU column (the serving process's CPU
time) stays meaningful when other work shares the cores; wall times do not.

Rerun:
    python bench/dashboard_bench.py
    python bench/dashboard_bench.py --machines 1000 --rounds 15 --before 5d4e028
    python bench/dashboard_bench.py --machines 1000 --rounds 9 --before 5d4e028 --repeat 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from vastctl import clock
from vastctl.config import from_mapping
from vastctl.serving import server
from vastctl.state import db, tokens

ADMIN = "bench-admin-token-0123456789abcdef"
TARGET_S = 0.100
ROOT = Path(__file__).resolve().parent.parent
BOOTING = ("launching", "registered", "params_done", "bench_done")


def build(path: Path, machines: int, now) -> None:
    """A day of a fleet of `machines` live machines (and as many killed during the day)."""
    conn = db.connect(path, create=True, now=now)
    iso = clock.to_iso
    rows, events = [], []
    for i in range(2 * machines):
        uuid, label = f"u{i:06d}", f"vastctl-{i:06x}"
        born = now - timedelta(minutes=5 + (i * 37) % 1400)
        state, kill, destroyed, status = "running", None, None, "running"
        if i >= machines:
            state, kill, destroyed, status = "killed", ("heartbeat_timeout", "no heartbeat for 10m"), iso(now), "exited"
        elif i % 25 == 1:
            state, status = BOOTING[i % 4], "loading"
        elif i % 25 == 2:
            state, status = "stopped", "stopped"
        elif i % 25 == 3:
            state, kill, status = "killed", ("exited", "vast says exited"), "exited"
        elif i % 25 == 4:
            status = "exited"  # a disagreement
        rate = 45.0 + i % 40
        rows.append((uuid, label, state, 100000 + i, 5000 + i, "RTX 4090" if i % 3 else "RTX 5090", 1, 0.3 + (i % 7) / 20,
                     rate, rate * 0.97, 10 * i, iso(born), iso(born + timedelta(minutes=3)),
                     iso(now - timedelta(seconds=20 + i % 90)), kill and kill[1], kill and kill[0],
                     kill and iso(now - timedelta(minutes=i % 50)), destroyed, status, f"status message {i}",
                     iso(now - timedelta(seconds=40))))
        path_states = [None, "launching", "registered", "params_done", "bench_done", "running"]
        for step in range(5):
            at = born + timedelta(minutes=step * 3)
            events.append((iso(at), "transition", uuid, label, path_states[step], path_states[step + 1],
                           "report", "instance", None))
        if kill:
            events.append((iso(now - timedelta(minutes=i % 50)), "transition", uuid, label, "running", "killed",
                           kill[1], "reconcile", kill[0]))
    events.sort()
    with db.transaction(conn):
        conn.executemany(
            "INSERT INTO instances (uuid, label, state, vast_id, machine_id, gpu_name, num_gpus, dph, bench_rate,"
            " proofs_per_hour, proofs_done, created_at, state_since, last_heartbeat_at, kill_reason, kill_code,"
            " killed_at, destroyed_at, vast_status, vast_status_msg, vast_seen_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO events (at, kind, uuid, label, from_state, to_state, reason, source, code)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
        minutes = [now - timedelta(minutes=m) for m in range(1440, 0, -1)]
        conn.executemany("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, ?, ?, ?)",
                         [(iso(t), int(k % 97 != 0), machines, None if k % 97 else "HTTP 502")
                          for k, t in enumerate(minutes)])
        conn.executemany("INSERT INTO demand_samples (at, queued, proofs_per_hour, source, ok) VALUES (?, ?, ?, ?, 1)",
                         [(iso(t), 200 + (k * 7) % 300, 40.0 * machines, "report") for k, t in enumerate(minutes)])
        observation = json.dumps({"capacity": 50.0 * machines, "target": 52.0 * machines, "queued": 240})
        actions = json.dumps([{"kind": "launch", "count": 2, "reason": "below target", "result": "launched 2"}])
        conn.executemany(
            "INSERT INTO agent_steps (started_at, finished_at, policy, outcome, observation, actions, refused, errors,"
            " input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost)"
            " VALUES (?, ?, 'llm', 'ok', ?, ?, '[]', '[]', 5000, 300, 4000, 0, 0.004)",
            [(iso(t), iso(t + timedelta(seconds=4)), observation, actions) for t in minutes[::5]])
        conn.execute("INSERT INTO settings (key, value, updated_at) VALUES ('target_proofs_per_hour', ?, ?)",
                     (repr(52.0 * machines), iso(now - timedelta(hours=3))))
    conn.close()


def request(app: server.App, path: str, headers: dict) -> tuple[int, int]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http",
               "HTTP_HOST": "127.0.0.1:8080", "REMOTE_ADDR": "127.0.0.1", **headers}
    seen = {}
    body = b"".join(app(environ, lambda status, hdrs: seen.update(status=status)))
    return int(seen["status"].split()[0]), len(body)


REQUESTS = (("GET /", "/"), ("GET /dashboard/live", "/dashboard/live"), ("GET /metrics", "/metrics"))


def serve_requests(path: Path, rounds: int) -> dict:
    """Time each request `rounds` times against the file at `path` (after one untimed warm-up request)."""
    config = from_mapping({"server": {"admin_token": ADMIN}})
    config.db = str(path)
    tokens.ensure_secret(config.secret_path)
    app = server.App(config, tokens.Keyring(config.secret_path), clock=clock.SYSTEM)
    login = f"token={ADMIN}".encode()
    seen = {}
    app({"REQUEST_METHOD": "POST", "PATH_INFO": "/login", "wsgi.input": io.BytesIO(login),
         "CONTENT_LENGTH": str(len(login)), "wsgi.url_scheme": "http", "HTTP_HOST": "127.0.0.1:8080"},
        lambda status, hdrs: seen.update(headers=hdrs))
    cookie = {"HTTP_COOKIE": dict(seen["headers"])["Set-Cookie"].split(";")[0]}
    metrics = {"HTTP_AUTHORIZATION": f"Bearer {ADMIN}"}
    writer = sqlite3.connect(str(path), isolation_level=None)
    running = [uuid for (uuid,) in writer.execute("SELECT uuid FROM instances WHERE state = 'running'"
                                                  " AND destroyed_at IS NULL ORDER BY uuid")]
    beats = 0

    def heartbeat() -> None:  # one machine reports, from another connection (another request's thread)
        nonlocal beats
        uuid = running[beats % len(running)]
        beats += 1
        writer.execute("UPDATE instances SET last_heartbeat_at = ?, proofs_done = proofs_done + 1,"
                       " proofs_total = proofs_total + 1 WHERE uuid = ?", (clock.to_iso(clock.SYSTEM.now()), uuid))

    results = {}
    for name, path_ in REQUESTS:
        headers = metrics if path_ == "/metrics" else cookie
        request(app, path_, headers)  # warm: imports, first connection, what is kept between requests
        times, cpu = [], []
        for _ in range(rounds):
            heartbeat()
            started, started_cpu = time.perf_counter(), time.process_time()
            status, size = request(app, path_, headers)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
            assert status == 200, (name, status)
        results[name] = {"wall": statistics.median(times), "min": min(times), "max": max(times),
                         "cpu": statistics.median(cpu), "kib": size / 1024}
    writer.close()
    return results


def tree_of(rev: str, into: Path) -> Path:
    """vastctl as of git revision `rev`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "vastctl"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_tree(tree: Path, machines: int, at: str, rounds: int, path: Path) -> dict:
    """serve_requests() in a child process importing vastctl from `tree`, on a file that tree builds at `path` (a
    revision reads only a schema it knows: each tree builds the same day, as of the same moment, in its own)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--serve-db", str(path), "--build-at", at,
                          "--machines", str(machines), "--rounds", str(rounds)],
                         check=True, capture_output=True, text=True, env=env, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=1, help="run the trees one after the other this many times")
    parser.add_argument("--before", metavar="REV", help="also run git revision REV's vastctl, side by side")
    parser.add_argument("--serve-db", type=Path, help=argparse.SUPPRESS)  # the child of run_tree()
    parser.add_argument("--build-at", help=argparse.SUPPRESS)  # the child builds the file first, as of this moment
    args = parser.parse_args()
    if args.serve_db:
        if args.build_at:
            build(args.serve_db, args.machines, clock.parse_iso(args.build_at))
        print(json.dumps(serve_requests(args.serve_db, args.rounds)))
        return
    at = clock.to_iso(clock.SYSTEM.now())  # both trees' files hold the same day up to the same moment
    with tempfile.TemporaryDirectory() as tmp:
        trees = [(f"before ({args.before})", tree_of(args.before, Path(tmp)))] if args.before else []
        trees.append(("after" if args.before else "this tree", ROOT))
        pairs: dict[str, list[dict]] = {name: [] for name, _ in trees}
        for repeat in range(args.repeat):  # the trees one after the other, `repeat` times: a moving load hits both
            for index, (name, tree) in enumerate(trees):
                path = Path(tmp) / f"bench-{repeat}-{index}.db"  # a fresh file each run
                pairs[name].append(run_tree(tree, args.machines, at, args.rounds, path))
        runs = {name: {request: {key: statistics.median(run[request][key] for run in found) for key in found[0][request]}
                       for request in found[0]} for name, found in pairs.items()}  # the median of the runs' medians
    flags = f" --before {args.before}" if args.before else ""
    flags += f" --repeat {args.repeat}" if args.repeat > 1 else ""
    print(f"python bench/dashboard_bench.py --machines {args.machines} --rounds {args.rounds}{flags}")
    if args.repeat > 1:
        for name, found in pairs.items():
            print(f"{name}, each run's median CPU ms: " + "; ".join(
                f"{request} " + " ".join(f"{run[request]['cpu'] * 1000:.0f}" for run in found) for request in found[0]))
    print(f"Python {sys.version.split()[0]}; {args.machines:,} live machines, {args.machines:,} killed today;"
          f" median of {args.rounds} requests each, a heartbeat written before each")
    names = list(runs)
    print("| request | " + " | ".join(f"CPU ms, {n}" for n in names) + " | "
          + " | ".join(f"wall ms, {n}" for n in names) + " | KiB |")
    print("|---|" + "---|" * (2 * len(names) + 1))
    for name, _ in REQUESTS:
        cpu = " | ".join(f"{runs[n][name]['cpu'] * 1000:.0f}" for n in names)
        wall = " | ".join(f"{runs[n][name]['wall'] * 1000:.0f}" for n in names)
        print(f"| `{name}` | {cpu} | {wall} | {runs[names[-1]][name]['kib']:.0f} |")
    last = runs[names[-1]]
    for name, _ in REQUESTS:
        verdict = "meets" if last[name]["cpu"] <= TARGET_S else "MISSES"
        print(f"{name}: median CPU {last[name]['cpu'] * 1000:.0f} ms {verdict} the {TARGET_S * 1000:.0f} ms target")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
