"""The playground (`provider: sim`, docs/demo.md) walks the guides with launch.join ssh (docs/joining-curio.md):
a simulated machine launched, registered, benched and joined, listed by `vastctl provers`, proving a call that
`vastctl route` (its own process, on the wall clock) sent it through its tunnel port, its pushed logs and boot
stages shown, its heartbeat counting what its stand-in proved (as a real machine's counts its daemon's proofs),
and its stand-in daemon gone once it is killed.

The commands run in this process on a clock `SPEED` times the wall (tests/helpers/playground.py), so the boot
is a few reconcile passes and a proof seconds; the stand-in daemon, a process of its own, proves at that pace.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from helpers.playground import FastClock
from helpers.serving import free_port, free_port_block, query, stop_process, wait_for

from vastctl.cli.app import Globals
from vastctl.facts import tunnel
from vastctl.providers import sim_daemon, sim_engine, sim_join
from vastctl.route import wire

pytestmark = pytest.mark.slow  # starts the stand-in daemon's process and the router's

SPEED = 30.0  # simulated seconds per wall second
STEP_S = 120.0  # each boot step: the clock jumps this far, then a reconcile pass (under tunnel.down_timeout)
V4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:a.b.c.d in /proc/net/tcp6
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl manager"


@pytest.fixture
def playground(tmp_path, db_path, monkeypatch, cli):
    """docs/demo.md's playground config with docs/joining-curio.md's launch.join ssh and a router address."""
    (tmp_path / "host_key.pub").write_text(HOST_KEY + "\n")
    first = free_port_block(4)
    route_port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({
        "provider": "sim", "db": str(db_path), "sim": {"seed": 3, "failures": "low"},
        "fleet": {"max_instances": 2, "max_dph": 1.0, "max_hourly_spend": 5},
        "launch": {"join": "ssh", "bench_concurrency": 1},
        "tunnel": {"host": "127.0.0.1", "host_key_file": str(tmp_path / "host_key.pub"), "keys_reader": getpass.getuser(),
                   "authorized_keys": str(tmp_path / "tunnel" / "authorized_keys"), "first_port": first,
                   "last_port": first + 3},
        "route": {"listen": f"127.0.0.1:{route_port}", "refresh": 0.2},
    }))
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    clock = FastClock(SPEED)
    monkeypatch.setattr(Globals, "system_clock", clock)
    daemons = Path(str(db_path) + sim_join.SUFFIX)
    yield clock, route_port, daemons
    if daemons.exists():  # a test that failed before its kill: the file gone, the process exits by itself
        daemons.unlink()
    wait_for(lambda: not sim_join.running(daemons), "the stand-in process exits")


def step_until(cli, clock, condition, what: str, step: float = STEP_S):
    """Jump the clock a boot step (or `step`), sample Curio's queue (empty until the call: a timer samples it every
    minute), run a reconcile pass, until `condition()` holds. With no sample, a heartbeat that counts no proofs
    could not tell idle from slow."""
    def stepped():
        clock.jump(step)
        assert cli("demand", "report", "--queued", "0").code == 0
        passed = cli("reconcile")
        assert passed.code == 0, passed.err
        return condition()
    return wait_for(stepped, what, timeout=120)


def listening_on(port: int) -> list[str]:
    """The addresses a socket listens on at `port`, from the kernel's tables: IPv4 ones (and IPv6 ones mapping an
    IPv4 address, as grpcio binds 127.0.0.1) dotted, other IPv6 ones as the table has them."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                v4 = address[-8:] if len(address) == 8 or address.startswith(V4_MAPPED) else None
                found.append(".".join(str(b) for b in reversed(bytes.fromhex(v4))) if v4 else address)
    return found


def prove(route_port: int, request_id: str):
    request = wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id=request_id, proof_kind=wire.POREP_SEAL_COMMIT, sector_size=32 << 30, vanilla_proof=b"c1" * 512))
    with grpc.insecure_channel(f"127.0.0.1:{route_port}") as channel:
        data = channel.unary_unary(wire.PROVE)(request.SerializeToString(), timeout=60)
    return wire.ProveResponse.FromString(data).result


def test_a_simulated_machine_joins_proves_through_the_router_and_leaves(playground, cli, db_path, tmp_path):
    clock, route_port, daemons = playground
    assert cli("init").code == 0
    launched = cli("launch", "--gpu", "RTX 4090", "--json")
    assert launched.code == 0, launched.err
    machine = json.loads(launched.out)["launched"][0]
    label, uuid = machine["label"], machine["uuid"]
    (port,) = [row["tunnel_port"] for row in query(db_path, "SELECT tunnel_port FROM instances WHERE uuid = ?", uuid)]
    assert port is not None and not tunnel.probe(port, 0.5)  # nothing listens before it joins

    # registered, benched, running: then joined, as the manager's own HTTP/2 check finds its daemon at its port
    def joined():
        rows = query(db_path, "SELECT state, joined_at FROM instances WHERE uuid = ?", uuid)
        return rows[0]["state"] == "running" and rows[0]["joined_at"] is not None
    step_until(cli, clock, joined, f"{label} joins")
    path = [e["to_state"] or e["kind"] for e in query(db_path, "SELECT kind, to_state FROM events WHERE uuid = ?"
                                                            " ORDER BY id", uuid)]
    assert path[path.index("registered"):] == ["registered", "params_done", "bench_done", "running", "joined"], path
    assert tunnel.probe(port, 2) and listening_on(port) == ["127.0.0.1"]
    # Curio's queue is empty until the call: its heartbeats' count of nothing is idling, not slowness
    assert cli("demand", "report", "--queued", "0").code == 0
    provers = cli("provers", "--json")
    assert provers.code == 0, provers.err
    assert [(p["label"], p["endpoint"]) for p in json.loads(provers.out)["provers"]] == [(label, f"127.0.0.1:{port}")]

    # `vastctl route` on the wall clock sends a PoRep call to the joined machine's port; its stand-in proves it
    log = tmp_path / "route.log"
    router = subprocess.Popen([sys.executable, "-m", "vastctl", "route"], env={**os.environ},
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: f"127.0.0.1:{route_port}" in log.read_text(), "the router listens", proc=router, log=log)
        result = prove(route_port, "playground-1")
        assert result.status == wire.STATUS_COMPLETED, result.error_message
        assert result.proof == sim_daemon.proof_for("playground-1")
        proof_s = json.loads(daemons.read_text())["machines"][str(machine["vast_id"])]["proof_s"]
        assert result.total_ms >= 0.9 * 1000 * proof_s  # its machine's proof time, at the clock's pace
        wait_for(lambda: query(db_path, "SELECT label, result FROM proof_calls") == [
            {"label": label, "result": "completed"}], "the router records the call")
    finally:
        stop_process(router)

    # its next heartbeat counts the proof its stand-in completed (the demo's simulated work has none to count),
    # and capacity counts it at no less than its bench: one proof at an idle machine is no measure of its speed
    assert json.loads(sim_join.proofs_path(daemons).read_text()) == {str(machine["vast_id"]): 1}
    assert cli("demand", "report", "--queued", "0").code == 0
    beat_before = query(db_path, "SELECT last_heartbeat_at FROM instances WHERE uuid = ?", uuid)[0]["last_heartbeat_at"]
    step_until(cli, clock, lambda: query(db_path, "SELECT last_heartbeat_at FROM instances WHERE uuid = ?", uuid)[0][
        "last_heartbeat_at"] != beat_before, f"{label} beats again", step=sim_engine.HEARTBEAT_S)  # its demand fresh
    (row,) = query(db_path, "SELECT proofs_done, proofs_total, bench_rate FROM instances WHERE uuid = ?", uuid)
    assert (row["proofs_done"], row["proofs_total"]) == (1, 1), row
    fleet_json = json.loads(cli("fleet", "--json").out)
    (counted,) = [m["counted_rate"] for m in fleet_json["instances"] if m["label"] == label]
    assert counted is not None and counted >= round(row["bench_rate"], 1), (counted, row)

    # what it pushed, and where its boot's time went
    logs = cli("logs", label)
    assert logs.code == 0, logs.err
    assert "vastctl-onstart: stage bench took" in logs.out and "throughput:" in logs.out
    fleet = {m["label"]: m for m in json.loads(cli("fleet", "--json").out)["instances"]}
    assert set(fleet[label]["boot_stages"]) == {"fetch", "daemon", "warmup", "bench", "join"}

    # killed: its stand-in stops listening, and the process exits with no machine left up
    killed = cli("kill", label, "--reason", "done with the playground", "--force")
    assert killed.code == 0, killed.err
    wait_for(lambda: not listening_on(port), "the stand-in stops listening")
    wait_for(lambda: not sim_join.running(daemons), "the stand-in process exits")


def test_a_joined_machines_heartbeat_counts_its_stand_in_from_its_start(tmp_path):
    """A joined machine's count is its stand-in's completed proofs, 0 while it idles, and from nothing again once
    its stand-in restarts (its machine stopped, then resumed: a restarted daemon); a machine that does not join
    has none (its heartbeat counts the simulated work)."""
    state = tmp_path / "sim.db"
    state.write_bytes(b"")
    daemons = Path(str(state) + sim_join.SUFFIX)
    first = free_port_block(2)
    second = first + 1

    def machine(port: int, up: bool) -> sim_join.Daemon:
        return {"port": port, "uuid": f"u{port}", "label": f"m{port}", "gpu_name": "RTX 4090", "slots": 1,
                "proof_s": 0.2, "up": up}

    def write(up_7: bool) -> None:  # machine 8 stays up, so the process serves on while 7 comes and goes
        daemons.write_text(json.dumps({"machines": {"7": machine(first, up_7), "8": machine(second, True)}}))

    write(True)
    joins = sim_join.Joins(daemons)
    log = tmp_path / "daemons.log"
    process = subprocess.Popen([sys.executable, "-m", "vastctl.providers.sim_daemon", str(daemons)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: tunnel.probe(first, 0.2) and tunnel.probe(second, 0.2), "both ports listen", proc=process, log=log)
        assert (joins.completed(7), joins.completed(8), joins.completed(9)) == (0, 0, None)  # idle: nothing proved
        for n in (1, 2):
            assert prove(first, f"call-{n}").status == wire.STATUS_COMPLETED
        assert (joins.completed(7), joins.completed(8)) == (2, 0)

        write(False)  # 7 stops proving: its stand-in is gone, and with it its count
        wait_for(lambda: not tunnel.probe(first, 0.2) and joins.completed(7) == 0, "7's count is dropped", proc=process,
                 log=log)
        write(True)  # resumed: a new stand-in counting from nothing
        wait_for(lambda: tunnel.probe(first, 0.2), "7 listens again", proc=process, log=log)
        assert prove(first, "call-3").status == wire.STATUS_COMPLETED
        assert joins.completed(7) == 1

        daemons.unlink()  # no machine left: the process exits and takes its counts with it
        assert process.wait(timeout=30) == 0
        assert not sim_join.proofs_path(daemons).exists()
    finally:
        if process.poll() is None:
            stop_process(process)
