"""Simulated machines join (launch.join ssh): a proving one gets a stand-in cuzk daemon at its tunnel port.

A real machine, once its bench passed, opens a reverse tunnel from the manager's 127.0.0.1:PORT (the port
vastctl assigned it, VASTCTL_TUNNEL_PORT) to its cuzk daemon, then reports `running`. A simulated machine of the
playground (`provider: sim` on the wall clock) gets, at that moment, a stand-in daemon listening on the
manager's 127.0.0.1:PORT itself (sim_daemon.py), so the manager's check, `vastctl provers` and `vastctl route`
reach it as they reach a real machine's forwarded port; only the sshd and the tunnel in between are missing. It
stops listening when the machine stops proving: stopped, outbid, refused, dead or destroyed.

What each machine's daemon should be doing is kept in a JSON file beside the state file (`<db>.sim-daemons`),
written under the market's hold at each save; one process (sim_daemon.py, started here when a machine is up
and none runs) serves every port the file says is up and exits by itself once none is. The demo's virtual
clock (and a command reading a moment of the past) starts nothing: its machines are not on wall time.

A real machine's heartbeat carries its daemon's completed count (onstart.sh: `counters.total_completed`); a
joined simulated one's carries its stand-in's, which the process keeps in `<db>.sim-daemons.proofs` (it alone
writes that file, this one only reads it): the proofs the router's calls had it prove, counted from nothing
each time its stand-in starts (a resumed machine's daemon restarts), not the demo's simulated work.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Mapping, TypedDict

from vastctl import atomicfile
from vastctl.clock import Clock, StillClock, VirtualClock
from vastctl.providers.sim_store import Machine

SUFFIX = ".sim-daemons"  # the JSON file beside the state file; its lock and the process's output beside it
PROOFS_SUFFIX = ".proofs"  # beside that file: each served machine's completed count, written by the process
DEFAULT_SLOTS = 5  # launch.bench_concurrency's default: the proofs a daemon proves at once
START_WAIT_S = 15.0  # a stand-in started for a machine coming up listens within this (grpc's import)
_started: list[subprocess.Popen[bytes]] = []  # the processes this one started, reaped once they end


class Daemon(TypedDict):
    """One simulated machine's stand-in daemon as the file keeps it (by vast id)."""

    port: int  # its tunnel port on the manager's 127.0.0.1
    uuid: str
    label: str
    gpu_name: str
    slots: int  # proofs it proves at once (launch.bench_concurrency, which the router also counts on)
    proof_s: float  # wall seconds one proof takes with its slots full: slots × 3600 / its true rate, scaled
    up: bool  # its machine proves now: the port is served


class Daemons(TypedDict):
    machines: dict[str, Daemon]


def wall_speed(clock: Clock) -> float:
    """Simulated seconds per wall second: 1 on the wall clock; a clock that runs faster says so in `speed`."""
    speed = getattr(clock, "speed", 1.0)
    return float(speed) if isinstance(speed, (int, float)) and speed > 0 else 1.0


def state_path(conn: sqlite3.Connection) -> Path | None:
    """`<state file>.sim-daemons`, or None for a state file that is not a file (in memory)."""
    for row in conn.execute("PRAGMA database_list"):
        if row[1] == "main":
            return Path(str(row[2]) + SUFFIX) if row[2] else None
    return None


def read(path: Path) -> Daemons:
    """The file's machines (none when it is missing or not ours: the process then exits)."""
    text = atomicfile.read(path)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("machines"), dict):
        return {"machines": {}}
    return {"machines": data["machines"]}


def proofs_path(path: Path) -> Path:
    """`<db>.sim-daemons.proofs`: vast id → the proofs its stand-in completed since it started."""
    return Path(str(path) + PROOFS_SUFFIX)


def read_proofs(path: Path) -> dict[str, int]:
    """The completed counts the process wrote (none when it is missing or not ours)."""
    text = atomicfile.read(proofs_path(path))
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {}
    return {vast_id: n for vast_id, n in data.items() if isinstance(n, int) and not isinstance(n, bool) and n >= 0}


def proving(machine: Machine | None) -> bool:
    """Whether the machine's daemon runs and its script beats: a proving boot's heartbeat loop is under way."""
    return (machine is not None and machine.destroyed_at is None and bool(machine.listed)
            and machine.actual_status == "running" and machine.step == "heartbeat")


class Joins:
    """The market's stand-in daemons: `rented` notes a machine launched to join, `sync` brings the file (and the
    process) in line with the machines after each advance."""

    def __init__(self, path: Path, speed: float = 1.0):
        self.path = path
        self.speed = speed

    @classmethod
    def for_market(cls, conn: sqlite3.Connection, clock: Clock) -> "Joins | None":
        """The playground's joins; None on a virtual or a still clock (the demo, a moment of the past)."""
        if isinstance(clock, (VirtualClock, StillClock)):
            return None
        path = state_path(conn)
        return None if path is None else cls(path, wall_speed(clock))

    def rented(self, vast_id: int, env: Mapping[str, str], label: str, gpu_name: str, true_rate: float) -> None:
        """A machine launched with launch.join ssh: noted, not up (it joins once its bench passed)."""
        if env.get("VASTCTL_JOIN") != "ssh" or not env.get("VASTCTL_UUID"):
            return
        try:
            port = int(env.get("VASTCTL_TUNNEL_PORT", ""))
            slots = max(1, int(env.get("VASTCTL_BENCH_CONCURRENCY") or DEFAULT_SLOTS))
        except ValueError:
            return
        if not 0 < port < 65536:
            return
        daemons = read(self.path)
        daemons["machines"][str(vast_id)] = {
            "port": port, "uuid": env["VASTCTL_UUID"], "label": label, "gpu_name": gpu_name, "slots": slots,
            "proof_s": round(slots * 3600.0 / max(true_rate, 1.0) / self.speed, 3), "up": False}
        self._write(daemons)

    def sync(self, machines: Mapping[int, Machine]) -> None:
        """Each noted machine up when it proves, dropped once destroyed; the process started for a machine that
        came up (and waited for, as a boot script waits for its tunnel). Never raises: a market call goes on."""
        for process in list(_started):  # reaped once it ended (it exits by itself)
            if process.poll() is not None:
                _started.remove(process)
        if not self.path.exists():
            return
        try:
            daemons = read(self.path)
            came_up = []
            kept: dict[str, Daemon] = {}
            for vast_id, daemon in daemons["machines"].items():
                machine = machines.get(int(vast_id))
                if machine is None or machine.destroyed_at is not None:
                    continue
                up = proving(machine)
                if up and not daemon["up"]:
                    came_up.append(daemon["port"])
                kept[vast_id] = {**daemon, "up": up}
            if kept != daemons["machines"]:
                self._write({"machines": kept})
            if came_up or any(d["up"] for d in kept.values()):
                self._serve(came_up)
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def completed(self, vast_id: int) -> int | None:
        """What the machine's heartbeat counts, as a real one's counts its daemon's completed proofs: its
        stand-in's count (0 before it has one, or while none serves it), or None for a machine that does not
        join (launched without launch.join ssh: its heartbeat counts the simulated work, sim_engine)."""
        if str(vast_id) not in read(self.path)["machines"]:
            return None
        return read_proofs(self.path).get(str(vast_id), 0)

    def _write(self, daemons: Daemons) -> None:
        atomicfile.write(self.path, json.dumps(daemons, sort_keys=True) + "\n", mode=0o600)

    def _serve(self, ports: list[int]) -> None:
        """Start the process unless one holds the lock, then wait (bounded) for the ports that came up."""
        if not running(self.path):
            with open(str(self.path) + ".log", "ab") as out:
                _started.append(subprocess.Popen(
                    [sys.executable, "-m", "vastctl.providers.sim_daemon", str(self.path)], stdin=subprocess.DEVNULL,
                    stdout=out, stderr=out, start_new_session=True, close_fds=True))
        for port in ports:
            listening(port, START_WAIT_S)


def running(path: Path) -> bool:
    """Whether a stand-in process serves this file now (it holds `<file>.lock` while it lives)."""
    try:
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def listening(port: int, within: float) -> bool:
    """Whether something accepts on 127.0.0.1:port within `within` seconds (tried every 50 ms)."""
    from vastctl.clock import SYSTEM

    end = SYSTEM.monotonic() + within
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            if SYSTEM.monotonic() >= end:
                return False
            SYSTEM.sleep(0.05)
