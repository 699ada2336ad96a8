"""A live playground manager for docs/playground.png and docs/playground-phone.png (docs/dashboard_screenshot.py).

docs/demo.md's playground (`provider: sim`) with launch.join ssh, as "Joining and routing in the playground"
sets it up: demand reported every two minutes, `vastctl agent-step` (the rules) launching machines for it and
`vastctl reconcile` after each step, until they booted, benched and joined (their stand-in daemons listening on
127.0.0.1 at their tunnel ports). A boot takes half an hour of the market's time, so the commands run in this
process on a clock that starts `BEHIND` before the wall and jumps a step at a time, never past the wall: once it
reaches the wall it is the wall clock. Then `vastctl route` (its own process) is sent `CALLS` PoRep calls as
Curio sends them, which the joined machines prove at their true rates in wall time (about a minute each, one at
a time), and the `vastctl serve` started then (its own process, on the wall clock) shows the manager live, at
the same moment as the file, some calls done and the rest proving or held.

Everything it starts goes at the end, also on failure: the calls still open (cancelled), the router, the
stand-in process (its file removed, it exits; else it is stopped by its id) and the scratch directory (the
caller's).
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import math
import random
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Iterator

from vastctl.cli import main as vastctl_main
from vastctl.cli.app import Globals
from vastctl.clock import SYSTEM, Clock
from vastctl.providers import sim_join
from vastctl.route import wire

BEHIND = timedelta(hours=3)  # where the market's day starts: the chart's last day has this much in it
STEP_S = 120.0  # each step: the clock jumps this far, demand is reported, then agent-step and reconcile
MACHINES = 3  # fleet.max_instances: the rules launch up to this many
TUNNEL_PORTS = 6  # the block of loopback ports the machines' tunnel ports come from
CALLS = 8  # PoRep calls sent to the router: one proving on each machine, the rest held behind them
DONE_BEFORE_SHOTS = 3  # calls answered before the screenshots (about a minute: one round of proofs)


class CatchUpClock(Clock):
    """The wall clock `lag` behind; `jump(seconds)` shortens the lag, never below none (then it is the wall)."""

    def __init__(self, lag: timedelta):
        self.lag = lag

    def now(self) -> datetime:
        return SYSTEM.now() - self.lag

    def jump(self, seconds: float) -> None:
        self.lag = max(self.lag - timedelta(seconds=seconds), timedelta(0))


def vastctl(*args: str) -> str:
    """`vastctl ARGS…` in this process (on Globals.system_clock); its stdout, or SystemExit with what it said."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            vastctl_main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if code != 0:
        raise SystemExit(f"vastctl {' '.join(args)} exited {code}: {err.getvalue()}{out.getvalue()}")
    return out.getvalue()


def write_config(home: Path, token: str) -> Path:
    """docs/demo.md's playground config, launch.join ssh with its tunnel keys, and the admin token."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_key")], check=True)
    first = _free_port_block(TUNNEL_PORTS)
    config = home / "config.yaml"
    config.write_text(json.dumps({
        "provider": "sim", "db": str(home / "sim.db"), "sim": {"seed": 3, "failures": "low"},
        "fleet": {"max_instances": MACHINES, "max_dph": 1.0, "max_hourly_spend": 5, "target_proofs_per_hour": 150},
        "agent": {"policy": "rules"},
        "launch": {"join": "ssh", "bench_concurrency": 1},
        "tunnel": {"host": "127.0.0.1", "host_key_file": str(home / "host_key.pub"), "keys_reader": getpass.getuser(),
                   "authorized_keys": str(home / "tunnel" / "authorized_keys"), "first_port": first,
                   "last_port": first + TUNNEL_PORTS - 1},
        "route": {"listen": f"127.0.0.1:{_free_port_block(1)}", "refresh": 1},
        "server": {"admin_token": token},
    }, indent=2) + "\n")
    return config


def demand_at(fraction: float) -> list[str]:
    """`demand report`'s options `fraction` of the way through the run: a burst of sealing that rises and ebbs."""
    burst = math.exp(-((fraction - 0.55) / 0.2) ** 2)
    queued = round(6 + 54 * burst + random.uniform(0, 5))
    return ["--queued", str(queued), "--proofs-per-hour", str(round(40 + 60 * burst)), "--in-flight", str(round(4 * burst))]


@contextlib.contextmanager
def live_manager(config: Path, env: dict[str, str]) -> Iterator[None]:
    """Run the playground up to the wall clock: machines launched for the demand, booted and joined, proving the
    router's calls; yield with the stand-in daemons and the router serving; at the end stop them however the
    block ends."""
    daemons = Path(str(json.loads(config.read_text())["db"]) + sim_join.SUFFIX)
    clock = CatchUpClock(BEHIND)
    was = Globals.system_clock
    Globals.system_clock = clock
    random.seed(4)
    try:
        run = ["--config", str(config)]
        vastctl(*run, "init")
        steps = math.ceil(BEHIND.total_seconds() / STEP_S)
        for step in range(steps):
            vastctl(*run, "demand", "report", *demand_at(step / steps))
            if step == steps // 2:  # the operator raises the target for the burst
                vastctl(*run, "settings", "set", "target_proofs_per_hour", "200")
            vastctl(*run, "agent-step")
            vastctl(*run, "reconcile")
            clock.jump(STEP_S)
        vastctl(*run, "reconcile")  # at the wall: what serve reads from here on is now
        with routing(config, env) as open_calls:
            # Curio's word as the calls stand: those not answered are in flight (held at the router or proving)
            vastctl(*run, "demand", "report", *demand_at(1.0)[:4], "--in-flight", str(open_calls()))
            vastctl(*run, "reconcile")
            print(vastctl(*run, "fleet"), end="")
            yield
    finally:
        Globals.system_clock = was
        _stop_stand_ins(daemons)


@contextlib.contextmanager
def routing(config: Path, env: dict[str, str]) -> Iterator[Callable[[], int]]:
    """`vastctl route` sent CALLS calls; yields (how many are not answered yet) once DONE_BEFORE_SHOTS are
    answered, then cancels the rest and stops the router."""
    import grpc

    settings = json.loads(config.read_text())
    listen, db = settings["route"]["listen"], settings["db"]
    log = config.parent / "route.log"
    router = subprocess.Popen([sys.executable, "-m", "vastctl", "route"], env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT)
    channel = grpc.insecure_channel(listen)
    calls: list[grpc.Future] = []
    try:
        _wait_for(lambda: listen in log.read_text(), "the router listens", router, log, 30)
        prove = channel.unary_unary(wire.PROVE)
        calls = [prove.future(_porep(f"playground-{n}"), timeout=1800) for n in range(CALLS)]

        def answered() -> bool:
            failed = [call.exception() for call in calls if call.done() and call.exception() is not None]
            if failed:
                raise SystemExit(f"a call failed: {failed[0]}\n{log.read_text()}")
            return _answered_in_file(db) >= DONE_BEFORE_SHOTS  # as the router recorded them: what the page reads
        _wait_for(answered, f"{DONE_BEFORE_SHOTS} calls answered", router, log, 600)
        yield lambda: sum(not call.done() for call in calls)
    finally:
        for call in calls:
            call.cancel()
        channel.close()
        _stop(router, grace_s=20)


def _answered_in_file(db: str) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        count: int = conn.execute("SELECT count(*) FROM proof_calls WHERE result = 'completed'").fetchone()[0]
        return count


def _porep(request_id: str) -> bytes:
    """A PoRep call as Curio's cuzk client sends it (its vanilla proof made up: the stand-ins prove no proof)."""
    request = wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id=request_id, proof_kind=wire.POREP_SEAL_COMMIT, sector_size=32 << 30, vanilla_proof=b"c1" * 512))
    data: bytes = request.SerializeToString()
    return data


def _wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if proc.poll() is not None:
            raise SystemExit(f"waiting for {what}: the process exited {proc.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {within:.0f}s: {log.read_text()}")
        time.sleep(0.2)


def _stop_stand_ins(daemons: Path) -> None:
    """The file gone, the stand-in process exits by itself (sim_join); one that does not is stopped by its id."""
    daemons.unlink(missing_ok=True)
    deadline = time.monotonic() + 20
    while sim_join.running(daemons) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in sim_join._started:  # the processes this one started
        if proc.poll() is None:
            _stop(proc, grace_s=10)


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after grace_s."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _free_port_block(count: int) -> int:
    """The first of `count` consecutive loopback ports free now, below the kernel's ephemeral range."""
    for _ in range(200):
        first = random.randrange(20000, 32768 - count)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise SystemExit(f"no {count} consecutive free loopback ports below 32768")
