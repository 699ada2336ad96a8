"""Curio loses no proof at the fleet's edge, end to end with real parts on loopback: `vastctl route` in its own
process on a config file, stand-in cuzk daemons in theirs (tests/fakes/cuzk_daemon.py: the real service and
messages, proving by sleeping, failing a proof, dying mid-call), joined through real reverse SSH tunnels to
Debian's sshd on the shipped tunnel config (or, where sshd cannot run, with the daemons' own loopback ports as
the tunnel ends), and a client that behaves as Curio does (helpers/curio_client.py: per-call deadline, MaxPending,
its PoRep retry schedule run at SCALE of its real length).

A machine is a running row with a tunnel port, as launch makes it; it joins as the product sees a join: either
the manager's tunnel check (`vastctl provers`, which reconcile also runs) records joined_at, or the router's own
HTTP/2 probe reaches the daemon through the port.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml
from fakes.cuzk_daemon import proof_for
from helpers.curio_client import SCHEDULES, CurioClient, Task, prove_request
from helpers.route_processes import RouteHost, proof_of
from helpers.serving import free_port, free_port_block, query, run_vastctl, stop_process, wait_for
from helpers.tunnel_parts import Sshd

from vastctl import config as config_module
from vastctl.cli.route import DRAIN_MARGIN_S
from vastctl.clock import SYSTEM
from vastctl.facts import deliveries, tunnel
from vastctl.route import wire
from vastctl.state import db, lifecycle
from vastctl.state.lifecycle import State

DAEMON = Path(__file__).resolve().parent / "fakes" / "cuzk_daemon.py"
SLOTS = 2  # launch.bench_concurrency: what the router lets each prover hold
SCALE = 0.01  # Curio's retry waits run at 1/100 of their length: PoRep's ~8 min schedule takes ~4.9 s
PROVE_TIMEOUT_S = 60.0  # Curio's per-call deadline ([Cuzk] ProveTimeout, 30 min), cut to bound the test
ANSWERED = ("completed", "failed")


class StandIn:
    """One stand-in cuzk daemon process on 127.0.0.1 and its call log."""

    def __init__(self, home: Path, name: str, *args: str, prove_seconds: float = 0.5, slots: int = SLOTS):
        self.name = name
        self.port = free_port()
        self.log = home / f"{name}.calls"
        self.err = home / f"{name}.err"
        self.proc = subprocess.Popen(
            [sys.executable, str(DAEMON), "--port", str(self.port), "--slots", str(slots),
             "--prove-seconds", str(prove_seconds), "--log", str(self.log), *args],
            stdout=subprocess.DEVNULL, stderr=self.err.open("w"))
        wait_for(lambda: tunnel.probe(self.port, 1), f"stand-in {name} listens", proc=self.proc, log=self.err)

    def lines(self) -> list[tuple[str, str, dict[str, str]]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            event, request_id, *fields = line.split()
            out.append((event, request_id, dict(f.split("=", 1) for f in fields)))
        return out

    def received(self) -> list[str]:
        return [rid for event, rid, _ in self.lines() if event == "received"]

    def answered(self) -> list[str]:
        return [rid for event, rid, _ in self.lines() if event == "answered"]

    def unanswered(self) -> list[str]:
        done = set(self.answered())
        return [rid for rid in self.received() if rid not in done]

    def max_inflight(self, ids: set[str] | None = None) -> int:
        return max((int(f["inflight"]) for event, rid, f in self.lines()
                    if event == "received" and (ids is None or rid in ids)), default=0)

    def die(self) -> None:
        """Gone mid-call, as a crashed daemon: no answers, no goodbye."""
        self.proc.send_signal(signal.SIGUSR1)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_process(self.proc)


class Machine:
    """A launched machine's row (running, its tunnel port) and, with sshd, its reverse tunnel to the manager."""

    def __init__(self, site: Site, name: str, daemon: StandIn, *, rate: float):
        self.site, self.name, self.daemon = site, name, daemon
        self.uuid, self.label = f"uuid-{name}", f"vastctl-{name}"
        self.ssh: subprocess.Popen | None = None
        fields: dict = {"offer_id": 1, "bench_rate": rate, "num_gpus": 1, "gpu_name": "RTX 4090"}
        if site.sshd is None:
            self.port = daemon.port  # no sshd: the daemon's own port is the tunnel's end
        else:
            self.port = free_port_block(1)
            private, public = tunnel.new_key_pair(self.label)
            self.key = site.home / f"{name}.key"
            self.key.write_text(private)
            self.key.chmod(0o600)
            fields["tunnel_public_key"] = public
        fields["tunnel_port"] = self.port
        with site.connect() as conn:
            lifecycle.create(conn, uuid=self.uuid, label=self.label, state=State.RUNNING, source="operator",
                             reason="test: launched and benched", now=SYSTEM.now(), fields=fields)
            if site.sshd is not None:
                assert tunnel.write_authorized_keys(conn, site.config)

    def open_tunnel(self) -> Machine:
        """The boot script's `ssh -N -R 127.0.0.1:PORT:<daemon>` to the manager's sshd, the host key pinned."""
        sshd = self.site.sshd
        if sshd is None:
            return self
        self.ssh = subprocess.Popen(
            ["ssh", "-i", str(self.key), "-p", str(sshd.port), "-F", "/dev/null", "-o", "BatchMode=yes",
             "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={sshd.known_hosts}",
             "-o", "HostKeyAlias=vastctl-manager", "-o", "ExitOnForwardFailure=yes", "-o", "ConnectTimeout=10",
             "-N", "-R", f"127.0.0.1:{self.port}:127.0.0.1:{self.daemon.port}", f"{sshd.user}@127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=(self.site.home / f"{self.name}.ssh").open("w"))
        wait_for(lambda: tunnel.probe(self.port, 1), f"{self.name}'s daemon answers through its tunnel",
                 proc=self.ssh, log=self.site.home / f"{self.name}.ssh")
        return self

    def close_tunnel(self) -> None:
        if self.ssh is not None and self.ssh.poll() is None:
            stop_process(self.ssh)


class Site:
    """The manager host: a state file and config, sshd (or none), the router process, the machines."""

    def __init__(self, home: Path, *, via_ssh: bool, **route):
        self.home = home
        self.db_path = home / "manager.db"
        db.connect(self.db_path, create=True, now=SYSTEM.now()).close()
        self.sshd = Sshd(home / "sshd", home / "tunnel" / "authorized_keys") if via_ssh else None
        self.port = free_port()
        raw = {
            "launch": {"bench_concurrency": SLOTS, "join": "ssh" if via_ssh else "none"},
            "tunnel": {"authorized_keys": str(home / "tunnel" / "authorized_keys"), "check_timeout": 1,
                       "keys_reader": "root"},  # tunnel_parts' sshd reads the keys file as root
            "route": {"listen": f"127.0.0.1:{self.port}", "refresh": 0.2, "fail_threshold": 3, "max_retries": 3,
                      "drain_timeout": 5, **route},
        }
        self.config = config_module.from_mapping(raw)
        self.config_path = home / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(raw))
        self.env = {"HOME": str(home), "VASTCTL_DB": str(self.db_path), "VASTCTL_CONFIG": str(self.config_path)}
        self.router_log = home / "route.log"
        self.router: subprocess.Popen | None = None
        self.daemons: list[StandIn] = []
        self.machines: list[Machine] = []

    def connect(self):
        conn = db.connect(self.db_path, now=SYSTEM.now())
        return _Closing(conn)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_router(self) -> Site:
        self.router = subprocess.Popen([sys.executable, "-m", "vastctl", "route"], env={**os.environ, **self.env},
                                       stdout=subprocess.DEVNULL, stderr=self.router_log.open("w"))
        wait_for(lambda: f"routing on {self.address}" in self.router_log.read_text(), "the router listens",
                 proc=self.router, log=self.router_log)
        return self

    def daemon(self, name: str, *args: str, **knobs) -> StandIn:
        daemon = StandIn(self.home, name, *args, **knobs)
        self.daemons.append(daemon)
        return daemon

    def join(self, name: str, daemon: StandIn, *, checked: bool, rate: float = 50.0) -> Machine:
        """A machine comes up: its row, its tunnel, then (checked) the manager's tunnel check records joined_at."""
        machine = Machine(self, name, daemon, rate=rate)
        self.machines.append(machine)
        machine.open_tunnel()
        if checked:
            self.check_tunnels()
            assert query(self.db_path, "SELECT joined_at FROM instances WHERE uuid = ?", machine.uuid)[0]["joined_at"]
        return machine

    def one_prover(self, *args: str, **knobs) -> StandIn:
        """Machine `a` joined (the manager's check) with a stand-in daemon, and the router sending to it."""
        daemon = self.daemon("a", *args, **knobs)
        self.join("a", daemon, checked=True)
        wait_for(lambda: self.status()["provers"] == 1, "the router sends to a")
        return daemon

    def check_tunnels(self) -> dict:
        """`vastctl provers`: the manager's tunnel check (reconcile runs the same), joined_at/tunnel_down_since."""
        listed = run_vastctl("provers", "--json", env=self.env)
        assert listed.returncode == 0, listed.stderr
        return json.loads(listed.stdout)

    def status(self) -> dict:
        rows = query(self.db_path, "SELECT * FROM route_status WHERE id = 1")
        return rows[0] if rows else {"held": None, "provers": None, "oldest_held_s": None, "in_flight": None}

    def calls(self) -> list[dict]:
        return query(self.db_path, "SELECT * FROM proof_calls ORDER BY id")

    def log(self) -> str:
        return self.router_log.read_text()

    def stop(self) -> None:
        for machine in self.machines:
            machine.close_tunnel()
        for daemon in self.daemons:
            daemon.stop()
        if self.router is not None and self.router.poll() is None:
            stop_process(self.router)
        if self.sshd is not None:
            self.sshd.stop()


class _Closing:
    def __init__(self, conn):
        self.conn = conn

    def __enter__(self):
        return self.conn

    def __exit__(self, *exc):
        self.conn.close()


@pytest.fixture(params=["as it arrives", "read whole"])
def make_site(tmp_path, request):
    """Each test twice: every Prove sent on by the front end as it arrives (route.cut_through_mb 0), and every
    Prove under 129 MiB passed to grpcio, read whole, then sent (route.cut_through_mb 129)."""
    made: list[Site] = []
    cut_through_mb = 0 if request.param == "as it arrives" else 129

    def make(*, via_ssh: bool = False, **route) -> Site:
        site = Site(tmp_path, via_ssh=via_ssh, **{"cut_through_mb": cut_through_mb, **route})
        made.append(site)
        return site

    yield make
    for site in made:
        site.stop()


def all_done(tasks: list[Task]) -> bool:
    return all(task.done.is_set() for task in tasks)


def assert_never_failed(tasks: list[Task]) -> None:
    """What Curio saw of each task: one call, no failure, its own proof."""
    for task in tasks:
        assert task.outcome == "completed" and task.failures == [] and task.attempts == 1, task
        assert task.proof == proof_for(task.request_id), f"{task.request_id} got another call's proof"


# --- the scenario ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("via", ["ssh", "direct"])
def test_no_proof_is_lost_as_the_fleet_empties_fills_and_a_daemon_dies_mid_call(make_site, via):
    site = make_site(via_ssh=via == "ssh").start_router()
    curio = CurioClient(site.address, max_pending=32, prove_timeout=PROVE_TIMEOUT_S, scale=SCALE)
    try:
        # 1. no prover has joined while 10 PoRep calls arrive: every one is held, none fails
        first = [curio.submit(f"porep-1000-{n}") for n in range(10)]
        wait_for(lambda: site.status()["held"] == 10, "route_status shows the 10 calls held")
        assert not any(task.done.is_set() or task.failures for task in first)
        assert all(task.attempts == 1 for task in first)
        status = wire.GetStatusResponse.FromString(curio.channel.unary_unary(wire.GET_STATUS)(b"", timeout=5))
        assert [(q.proof_kind, q.pending) for q in status.queues] == [("router-held", 10)]  # marked as the router's

        # 2. a machine joins (the manager's tunnel check): they complete on it, at most its slots at once
        a = site.join("a", site.daemon("a"), checked=True)
        wait_for(lambda: all_done(first), "the held calls complete on a", timeout=60)
        assert_never_failed(first)
        assert sorted(a.daemon.answered()) == sorted(task.request_id for task in first)
        assert a.daemon.max_inflight() == SLOTS

        # 3. a second joins (the router's own probe reaches it): new calls spread by free slots
        b = site.join("b", site.daemon("b"), checked=False)
        wait_for(lambda: site.status()["provers"] == 2, "the router sends to a and b")
        second = [curio.submit(f"porep-1000-{n}") for n in range(10, 18)]
        wait_for(lambda: all_done(second), "the second calls complete", timeout=60)
        assert_never_failed(second)
        ids = {task.request_id for task in second}
        on_a, on_b = (set(m.daemon.answered()) & ids for m in (a, b))
        assert on_a | on_b == ids and not on_a & on_b
        assert len(on_a) >= 2 and len(on_b) >= 2, (on_a, on_b)
        assert a.daemon.max_inflight(ids) == SLOTS and b.daemon.max_inflight(ids) == SLOTS  # both filled, never over
        status = wire.GetStatusResponse.FromString(curio.channel.unary_unary(wire.GET_STATUS)(b"", timeout=5))
        assert status.total_proofs_completed == 18 and len(status.gpus) == 2  # the fleet's, summed
        assert ("router-held", 0) in [(q.proof_kind, q.pending) for q in status.queues]

        # 4. a's daemon dies with calls on it, its tunnel still up: those calls complete on b
        third = [curio.submit(f"porep-1000-{n}") for n in range(18, 22)]
        ids = {task.request_id for task in third}
        wait_for(lambda: set(a.daemon.unanswered()) & ids, "a is proving some of the calls")
        a.daemon.die()
        lost = set(a.daemon.unanswered()) & ids  # what it held when it died (its log is written through)
        assert lost
        if a.ssh is not None:
            assert a.ssh.poll() is None  # the tunnel is live; only what is behind it is gone
        wait_for(lambda: all_done(third), "a's calls complete on b", timeout=60)
        assert_never_failed(third)
        assert lost <= set(b.daemon.answered())
        wait_for(lambda: {(c["request_id"], c["label"], c["result"]) for c in site.calls()} >=
                 {(rid, label, result) for rid in lost for label, result in ((a.label, "dropped"), (b.label, "completed"))},
                 "proof_calls shows a's calls dropped on a, completed on b")

        # 5. the fleet is empty again, for longer than Curio's whole PoRep retry schedule: no call fails
        b.daemon.stop()
        a.close_tunnel()
        b.close_tunnel()
        site.check_tunnels()  # a's tunnel is down (tunnel_down_since); b never joined by the manager's check
        wait_for(lambda: site.status()["provers"] == 0 and site.status()["in_flight"] == 0, "the router has no prover")
        fourth = [curio.submit(f"porep-1000-{n}") for n in range(22, 28)]
        schedule = SCHEDULES["porep"].total() * SCALE
        wait_for(lambda: site.status()["held"] == 6 and (site.status()["oldest_held_s"] or 0) > schedule + 1,
                 f"6 calls held past Curio's {schedule:.1f}s (scaled) PoRep schedule", timeout=schedule + 30)
        assert not any(task.done.is_set() or task.failures for task in fourth)
        site.join("c", site.daemon("c"), checked=True)
        wait_for(lambda: all_done(fourth), "the held calls complete on c", timeout=60)
        assert_never_failed(fourth)

        # over the scenario: no call failed, none was answered twice, none went over a prover's slots
        tasks = first + second + third + fourth
        answered = [rid for daemon in site.daemons for rid in daemon.answered()]
        assert sorted(answered) == sorted(task.request_id for task in tasks)  # each exactly once
        assert all(daemon.max_inflight() <= SLOTS for daemon in site.daemons)
        wait_for(lambda: sum(c["result"] in ANSWERED for c in site.calls()) == len(tasks), "every call recorded")
        calls = site.calls()
        per_id = collections.Counter(c["request_id"] for c in calls if c["result"] in ANSWERED)
        assert set(per_id.values()) == {1} and set(per_id) == {task.request_id for task in tasks}
        results = collections.Counter(c["result"] for c in calls)
        assert set(results) <= {"completed", "dropped"} and results["completed"] == len(tasks), results
        with site.connect() as conn:
            counted = deliveries.delivered(conn)
        for machine in site.machines:
            assert counted.get(machine.uuid, {}).get("completed", 0) == len(machine.daemon.answered())
    finally:
        curio.close()


# --- what a prover answered goes back as it came ---------------------------------------------------------------


@pytest.mark.slow
def test_a_proof_failed_inside_grpc_ok_is_passed_back_once_counted_against_its_machine_then_it_is_set_aside(
        make_site):
    site = make_site(ejection_base=1).start_router()
    failing = site.daemon("f", "--fail-every", "1", prove_seconds=0.05)
    good = site.daemon("g", prove_seconds=0.05)
    f = site.join("f", failing, checked=True, rate=90.0)  # the better rate: it takes the calls while both are free
    g = site.join("g", good, checked=True, rate=50.0)
    wait_for(lambda: site.status()["provers"] == 2, "the router sends to f and g")
    curio = CurioClient(site.address, prove_timeout=PROVE_TIMEOUT_S)
    try:
        code, message, result = curio.call(prove_request("porep-1000-1"))
        assert code == grpc.StatusCode.OK and result is not None
        assert result.status == wire.STATUS_FAILED and "failed (--fail-every 1)" in result.error_message
        assert failing.received() == ["porep-1000-1"] and good.received() == []  # not sent again
        wait_for(lambda: [(c["label"], c["result"], c["attempt"]) for c in site.calls()] == [(f.label, "failed", 1)],
                 "proof_calls: one failed proof on f")
        with site.connect() as conn:
            assert deliveries.delivered(conn) == {f.uuid: {"failed": 1}}

        # a status the daemon chose is passed back too, never sent again
        code, message, _ = curio.call(wire.ProveRequest().SerializeToString())
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message == "missing submit field"
        code, message, _ = curio.call(prove_request("porep-1000-2", kind=9))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "proof kind" in message
        assert failing.received() == ["porep-1000-1", "-", "porep-1000-2"] and good.received() == []

        # fail_threshold (3) failed proofs in a row: f is ejected (route.ejection_base), not reported
        for n in (3, 4, 5):
            assert curio.call(prove_request(f"porep-1000-{n}"))[2].status == wire.STATUS_FAILED
        wait_for(lambda: f"prover {f.label} ejected for 1s" in site.log(), "f ejected")
        wait_for(lambda: f"prover {f.label} taken back" in site.log(), "f taken back after its ejection")
        assert query(site.db_path, "SELECT route_failing_since FROM instances WHERE uuid = ?", f.uuid) == [
            {"route_failing_since": None}]
        # taken back, it fails three more in a row: ejected again with no good answer between, it is reported:
        # it takes no new call, its row says why, one event (reconcile kills it)
        for n in (6, 7, 8):
            assert curio.call(prove_request(f"porep-1000-{n}"))[2].status == wire.STATUS_FAILED
        wait_for(lambda: query(site.db_path, "SELECT route_failing_since FROM instances WHERE uuid = ?",
                               f.uuid)[0]["route_failing_since"], "f is set aside in the state file")
        events = query(site.db_path, "SELECT * FROM events WHERE kind = ?", deliveries.SET_ASIDE)
        assert [e["uuid"] for e in events] == [f.uuid] and "ejected 2 times" in events[0]["reason"]
        assert "3 calls in a row" in events[0]["reason"]
        code, _, result = curio.call(prove_request("porep-1000-9"))
        assert code == grpc.StatusCode.OK and result.status == wire.STATUS_COMPLETED
        assert good.received() == ["porep-1000-9"] and "porep-1000-9" not in failing.received()
        assert f"prover {f.label} set aside" in site.log()
        assert g.uuid not in {e["uuid"] for e in events}
    finally:
        curio.close()


@pytest.mark.slow
def test_a_call_over_128_mib_is_refused_at_once_and_a_120_mb_call_passes(make_site):
    site = make_site().start_router()
    daemon = site.one_prover(prove_seconds=0.05)
    curio = CurioClient(site.address, prove_timeout=PROVE_TIMEOUT_S)
    try:
        too_big = prove_request("porep-big-129", payload_bytes=129 * 1024 * 1024)
        code, message, _ = curio.call(too_big)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, message)
        assert "134217728" in message and "128 MiB" in message and "no prover was tried" in message
        del too_big
        assert daemon.received() == []
        code, message, result = curio.call(prove_request("porep-big-120", payload_bytes=120_000_000))
        assert code == grpc.StatusCode.OK and result.status == wire.STATUS_COMPLETED, (code, message)
        assert result.proof == proof_for("porep-big-120")
        assert daemon.received() == ["porep-big-120"]
        assert int(daemon.lines()[0][2]["size"]) > 120_000_000
        wait_for(lambda: [(c["request_id"], c["result"], c["attempt"]) for c in site.calls()] ==
                 [("porep-big-129", "refused", 0), ("porep-big-120", "completed", 1)], "both calls recorded")
    finally:
        curio.close()


# --- stopping ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("cut_through_mb", [0, 129], ids=["as it arrives", "read whole"])
def test_sigterm_takes_no_new_call_answers_what_comes_back_within_drain_timeout_then_refuses_what_is_held_and_exits(
        tmp_path, cut_through_mb):
    """route.drain_timeout is what it says. The router's listening socket is held as systemd holds
    vastctl-route.socket's, so what Curio sends after the stop waits in its backlog for the next router."""
    host = RouteHost(tmp_path, drain_timeout=2, cut_through_mb=cut_through_mb)
    daemon = host.daemon("a")  # its 2 slots; every proof waits until the test releases it
    daemon.hold.clear()
    first = host.start_router()
    host.wait_provers(1)
    curio = CurioClient(host.address, max_pending=16, prove_timeout=PROVE_TIMEOUT_S, scale=SCALE)
    try:
        tasks = {n: curio.submit(f"porep-1000-{n}") for n in (1, 2)}
        wait_for(lambda: daemon.in_progress == SLOTS, "two calls on a (its slots)")
        for n in (3, 4):  # one after the other: 3 is held first, so it takes the first slot to come free
            tasks[n] = curio.submit(f"porep-1000-{n}")
            wait_for(lambda: host.status()["held"] == n - 2, f"{n - 2} call(s) held")
        first.terminate()
        signalled = time.monotonic()
        wait_for(lambda: "stopping: taking no new calls; 2 held, 2 on provers (route.drain_timeout 2s)" in first.log(),
                 "the router stops (GOAWAY sent)")
        daemon.release("porep-1000-2")  # answered during the drain: Curio gets it; 3 takes the slot, 4 stays held
        wait_for(lambda: tasks[4].failures, "at route.drain_timeout the held call is refused")
        # Curio's client saw GOAWAY before that refusal: its next calls (4's retry, a new one) open a new
        # connection, which waits in the socket's backlog while this router finishes
        tasks[5] = curio.submit("porep-1000-5")
        assert first.wait(timeout=30) == 0
        took = time.monotonic() - signalled
        assert 2 <= took < 2 + DRAIN_MARGIN_S + 3, took  # calls 1 and 3 never came back: cut after the margin
        log = first.log()
        assert "stopping: route.drain_timeout passed; refusing 1 held call(s)" in log, log
        assert "refused held porep call porep-1000-4" in log and "stopping: cut 2 call(s) still unanswered" in log, log
        assert re.search(r"^stopped$", log, re.M), log
        assert sorted(daemon.received) == [f"porep-1000-{n}" for n in (1, 2, 3)]  # nothing sent after the stop
        assert tasks[2].outcome == "completed" and tasks[2].proof == proof_of("porep-1000-2")
        assert not tasks[5].done.is_set() and tasks[5].attempts == 1  # waiting, not failed

        wait_for(lambda: daemon.in_progress == 0, "the cut calls are cancelled on a")
        daemon.hold.set()
        host.start_router()  # systemd starts the next router on the same socket
        wait_for(lambda: all(task.done.is_set() for task in tasks.values()), "every task ends", timeout=60)
    finally:
        curio.close()
        host.close()
    for n, task in tasks.items():
        assert task.outcome == "completed" and task.proof == proof_of(task.request_id), task
    assert [tasks[n].failures for n in (2, 5)] == [[], []]  # answered in the drain; sent after the stop
    assert tasks[4].failures == [("UNAVAILABLE", "vastctl route stopped while this call was held")]
    for n in (1, 3):  # on the prover past route.drain_timeout: cut, one failed try for Curio, then proved
        assert len(tasks[n].failures) == 1 and tasks[n].failures[0][0] != "OK", tasks[n]
    calls = host.calls()
    assert collections.Counter(c["request_id"] for c in calls if c["result"] == "completed") == collections.Counter(
        f"porep-1000-{n}" for n in range(1, 6))  # every proof recorded completed reached its caller, once
    assert [c["request_id"] for c in calls if c["result"] == "refused"] == ["porep-1000-4"]


# --- found while benchmarking -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_call_without_a_deadline_is_proved(make_site):
    """grpcio says ~9.2e18 s remain of a call without a deadline: the router holds and proves it for at most a day."""
    site = make_site().start_router()
    site.one_prover(prove_seconds=0.05)
    with grpc.insecure_channel(site.address) as channel:
        answer = channel.unary_unary(wire.PROVE)(prove_request("porep-1000-1"))  # no timeout: no deadline
    assert wire.ProveResponse.FromString(answer).result.status == wire.STATUS_COMPLETED


# --- the bounds of holding, and PoSt ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_held_call_is_refused_past_max_held_expires_at_its_deadline_and_is_dropped_when_curio_gives_up(make_site):
    site = make_site(max_held=3).start_router()  # no prover at all
    curio = CurioClient(site.address, max_pending=16, prove_timeout=PROVE_TIMEOUT_S)
    try:
        held = [curio.submit(f"porep-1000-{n}") for n in range(3)]
        wait_for(lambda: site.status()["held"] == 3, "three calls held")
        code, message, _ = curio.call(prove_request("porep-1000-3"), timeout=10)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "route.max_held 3" in message, (code, message)
        assert not any(task.done.is_set() for task in held)  # the held ones are still held

        gone = curio._prove.future(prove_request("porep-1000-4"), timeout=PROVE_TIMEOUT_S)  # over max_held too
        assert gone.exception(timeout=10).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        curio.close()  # Curio stops (its tasks' calls are cancelled): the router lets go of what it held
        wait_for(lambda: site.status()["held"] == 0, "the router holds nothing once the caller went away")
        wait_for(lambda: sorted(c["result"] for c in site.calls()) == ["abandoned"] * 3 + ["refused"] * 2,
                 "proof_calls: two refused, three abandoned")

        short = CurioClient(site.address, prove_timeout=1.0)  # a deadline shorter than any machine's boot
        try:
            code, message, _ = short.call(prove_request("porep-1000-5"))
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, message)
        finally:
            short.close()
        wait_for(lambda: [c["result"] for c in site.calls() if c["request_id"] == "porep-1000-5"] == ["expired"],
                 "proof_calls: the call held past its deadline expired")
    finally:
        curio.close()


@pytest.mark.slow
def test_post_goes_ahead_of_every_held_porep_call(make_site, tmp_path):
    release = tmp_path / "release"  # a's two proofs finish only once this exists: the test frees the slots
    site = make_site(unverified_to_fleet=["winning_post"]).start_router()  # WinningPoSt to the fleet, by choice
    daemon = site.one_prover("--release-file", str(release), prove_seconds=0)
    curio = CurioClient(site.address, max_pending=16, prove_timeout=PROVE_TIMEOUT_S)
    try:
        porep = [curio.submit(f"porep-1000-{n}") for n in range(2)]
        wait_for(lambda: len(daemon.received()) == SLOTS, "a's two slots are taken")
        porep += [curio.submit(f"porep-1000-{n}") for n in range(2, 5)]
        wait_for(lambda: site.status()["held"] == 3, "three PoRep calls held")
        post = curio.submit("winning-1000-1", kind="winning_post")
        wait_for(lambda: site.status()["held"] == 4, "the WinningPoSt call held too")
        # nothing came free while they were held (the first two were submitted at once: either may be first)
        assert sorted(daemon.received()) == ["porep-1000-0", "porep-1000-1"]
        release.touch()
        wait_for(lambda: all_done(porep + [post]), "every call answered", timeout=60)
        assert_never_failed(porep + [post])
        # both slots come free at once (both proofs wait on the one release file), and each call goes over a
        # connection of its own, so the daemon takes the calls sent together in either order: the PoSt, held last,
        # takes one of the first slots that come free, ahead of the held PoRep calls behind it; without its
        # priority it would come last (the strict order of held calls: tests/test_route_dispatch.py)
        assert daemon.received().index("winning-1000-1") < 5, daemon.received()
    finally:
        curio.close()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["own_daemon", "post_address"])  # post_address: own_daemon's deprecated name
def test_snapdeals_and_post_go_to_the_operators_own_daemon_when_it_is_set(make_site, tmp_path, key):
    own = StandIn(tmp_path, "own", prove_seconds=0.05)
    try:
        site = make_site(**{key: f"127.0.0.1:{own.port}"}).start_router()
        fleet = site.one_prover(prove_seconds=0.05)
        curio = CurioClient(site.address, prove_timeout=PROVE_TIMEOUT_S)
        try:
            tasks = [curio.submit("wdpost-1000-1", kind="window_post"), curio.submit("winning-1000-1", kind="winning_post"),
                     curio.submit("snap-1000-1", kind="snap"), curio.submit("porep-1000-1")]
            wait_for(lambda: all_done(tasks), "every call answered")
            assert_never_failed(tasks)
        finally:
            curio.close()
        assert sorted(own.received()) == ["snap-1000-1", "wdpost-1000-1", "winning-1000-1"]
        assert fleet.received() == ["porep-1000-1"]
        wait_for(lambda: sorted((c["request_id"], c["label"], c["uuid"]) for c in site.calls()) ==
                 [("porep-1000-1", "vastctl-a", site.machines[0].uuid), ("snap-1000-1", "own_daemon", None),
                  ("wdpost-1000-1", "own_daemon", None), ("winning-1000-1", "own_daemon", None)],
                 "proof_calls names where each went")
        log = site.log()
        said = f"SnapDeals, WindowPoSt and WinningPoSt to your own daemon 127.0.0.1:{own.port} (route.own_daemon)"
        assert said in log, log
        assert ("route.post_address is deprecated" in log) == (key == "post_address"), log
    finally:
        own.stop()


@pytest.mark.slow
def test_calls_on_a_machine_that_leaves_the_fleet_while_proving_them_are_moved_and_complete_on_another(
        make_site, tmp_path):
    release = tmp_path / "release"  # a finishes nothing until the test lets it (after it has left)
    site = make_site().start_router()
    leaving = site.daemon("a", "--release-file", str(release), prove_seconds=0)
    staying = site.daemon("b", prove_seconds=0.2)
    a = site.join("a", leaving, checked=True, rate=90.0)  # the better rate: it takes the first calls
    site.join("b", staying, checked=True, rate=50.0)
    wait_for(lambda: site.status()["provers"] == 2, "the router sends to a and b")
    curio = CurioClient(site.address, prove_timeout=PROVE_TIMEOUT_S)
    try:
        tasks = [curio.submit("porep-1000-1")]
        wait_for(lambda: leaving.received() == ["porep-1000-1"], "a proves the first call")
        tasks.append(curio.submit("porep-1000-2"))
        wait_for(lambda: len(leaving.received()) + len(staying.received()) == 2, "the second call is on a prover")
        on_a = set(leaving.received())
        with site.connect() as conn:  # the machine is killed (vast took it back, an operator's kill): not running
            conn.execute("UPDATE instances SET state = 'killed', killed_at = state_since WHERE uuid = ?", (a.uuid,))
            conn.commit()
        wait_for(lambda: all_done(tasks), "the calls complete", timeout=30)
        assert_never_failed(tasks)
        assert on_a <= set(staying.answered()) and leaving.answered() == []
        wait_for(lambda: {(c["request_id"], c["label"], c["result"]) for c in site.calls()} >=
                 {(rid, a.label, "dropped") for rid in on_a}, "proof_calls: a's calls dropped (moved) on a")
        assert "prover uuid-a left the joined set: its calls are moved" in site.log()
        release.touch()
        wait_for(lambda: len(leaving.lines()) == 2 * len(on_a), "a finishes what it was proving, for nobody")
        assert {event for event, _, _ in leaving.lines()} <= {"received", "cancelled"}
    finally:
        curio.close()
