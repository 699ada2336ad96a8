"""Real processes racing the same file: one transition and one event per real change, never a lock error."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys

import pytest

from vastctl.clock import SYSTEM
from vastctl.errors import Refused
from vastctl.state import db, lifecycle

pytestmark = pytest.mark.slow  # real processes and servers on loopback

RACERS = 12


def _race_kill(path, barrier, source, queue):
    conn = db.connect(path, now=SYSTEM.now())
    barrier.wait()
    try:
        lifecycle.kill(conn, "u1", f"killed by {source}", source="reconcile", code="exited", now=SYSTEM.now())
        queue.put("won")
    except Refused:
        queue.put("refused")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put(f"error: {exc!r}")


def test_racing_kills_make_exactly_one_event(db_path, cli):
    cli("init")
    cli("register", "--uuid", "u1", "--label", "vastctl-a")
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_race_kill, args=(str(db_path), barrier, i, queue)) for i in range(RACERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(queue.get(timeout=5) for _ in procs)
    assert outcomes == ["refused"] * (RACERS - 1) + ["won"]
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 1


def _spawn(*args):
    return subprocess.Popen([sys.executable, "-m", "vastctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=os.environ.copy())


def test_twelve_processes_racing_the_same_bench_report(db_path, cli):
    cli("init")
    cli("register", "--uuid", "u1", "--label", "vastctl-a")
    cli("params-done", "--uuid", "u1")
    procs = [_spawn("bench-report", "--uuid", "u1", "--rate", "3.5") for _ in range(RACERS)]
    results = [(p.wait(60), *p.communicate()) for p in procs]
    assert {code for code, _, _ in results} == {5}
    assert all("locked" not in err and "Traceback" not in err for _, _, err in results)
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 1
    assert conn.execute("SELECT state, kill_code FROM instances").fetchone() == ("killed", "bench_failed")


def test_twelve_parallel_full_lifecycles(db_path, cli):
    cli("init")
    script = (
        'set -e; U=$1; '
        'vastctl register --uuid $U --label vastctl-$U --gpu "RTX 4090"; '
        'vastctl params-done --uuid $U; '
        'vastctl bench-report --uuid $U --rate 70; '
        'vastctl running --uuid $U; '
        'vastctl heartbeat --uuid $U --proofs-done 1; '
        'vastctl heartbeat --uuid $U --proofs-done 2'
    )
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    procs = [subprocess.Popen(["bash", "-c", script, "lifecycle", f"m{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(RACERS)]
    results = [(p.wait(120), *p.communicate()) for p in procs]
    assert [code for code, _, _ in results] == [0] * RACERS, [err for _, _, err in results]
    assert all(err == "" for _, _, err in results)
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM instances WHERE state = 'running' AND proofs_done = 2").fetchone()[0] == RACERS
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == RACERS * 4
