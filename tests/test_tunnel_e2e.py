"""Work reaches the fleet, end to end with real parts on loopback: `vastctl launch` (launch.join ssh) against the
fake vast, the boot script under bash joining after its bench with the OpenSSH client, Debian's sshd on the
shipped tunnel-account config, Debian's nginx on the shipped gRPC balancer config, and a gRPC health server
standing in for each machine's cuzk. A gRPC call made to nginx's address is what Curio's cuzk client makes.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.boot import GATE
from helpers.fake_vast import FakeVast
from helpers.joining_machine import JoiningMachine
from helpers.serving import ADMIN_TOKEN, Manager, free_port, free_port_block, on_a_thread, run_vastctl
from helpers.tunnel_parts import FakeDaemon, Nginx, Sshd, health_check, wait_for

from vastctl.facts import tunnel


@pytest.fixture
def vast():
    with on_a_thread(FakeVast()) as server:
        yield server


@pytest.fixture
def site(tmp_path):
    """sshd, the manager (serve) configured for launch.join ssh, and nginx in front of the upstream file."""
    sshd = Sshd(tmp_path / "sshd", tmp_path / "manager" / "tunnel" / "authorized_keys")
    manager = Manager(tmp_path / "manager")
    upstream = tmp_path / "manager" / "nginx" / "cuzk-upstream.conf"
    nginx = Nginx(tmp_path / "nginx", upstream)
    port, first = free_port(), free_port_block(21)
    launch_env = {"VASTCTL_HEARTBEAT_S": "0.3", "VASTCTL_CUZK_WAIT_S": "60", "VASTCTL_RETRY_FOR": "10s"}
    manager.config_path.write_text(
        f"server:\n  url: http://127.0.0.1:{port}\n  admin_token: {ADMIN_TOKEN}\n"
        f"fleet:\n  min_bench_rate: {GATE}\n  max_dph: 1.0\n"
        "launch:\n  vastctl_source: vastctl==0.1.0\n  install: 'true'\n  bench_count: 4\n  bench_concurrency: 2\n"
        f"  env: {json.dumps(launch_env)}\n  join: ssh\n"
        f"tunnel:\n  host: 127.0.0.1\n  ssh_port: {sshd.port}\n  user: {sshd.user}\n"
        f"  authorized_keys: {sshd.authorized_keys}\n  keys_reader: root\n  host_key_file: {sshd.host_public_key}\n"
        f"  first_port: {first}\n  last_port: {first + 20}\n  down_timeout: 10m\n"
        f"provers:\n  upstream_file: {upstream}\n  reload_command: {json.dumps(nginx.reload_command)}\n")
    manager.start(port)
    first_list = run_vastctl("provers", "--json", env=manager.env)  # nginx needs the include to start
    assert first_list.returncode == 1 and "reload" in first_list.stderr  # nothing to reload yet: not running
    assert upstream.exists()
    nginx.start()
    yield sshd, manager, nginx, upstream
    nginx.stop()
    manager.stop()
    sshd.stop()


def served_by(daemons: list[FakeDaemon], nginx: Nginx, calls: int) -> list[int]:
    """Make `calls` gRPC calls to nginx's address; how many each daemon answered."""
    before = [d.calls for d in daemons]
    for _ in range(calls):
        assert health_check(nginx.port) == "SERVING"
    return [d.calls - b for d, b in zip(daemons, before)]


def settled(daemons: list[FakeDaemon], nginx: Nginx, calls: int):
    """served_by once nginx's reload took (old workers answer the old set until then): None before."""
    import grpc

    try:
        return served_by(daemons, nginx, calls)
    except grpc.RpcError:
        return None


def provers(manager: Manager) -> dict:
    listed = run_vastctl("provers", "--json", env=manager.env)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


@pytest.fixture
def homes():
    """Where the machines live: ssh's control socket (zk/tunnel.ctl and 17 characters more while it is made) must
    fit in a Unix socket's 108 bytes, which pytest's own directories may not (longer still under xdist)."""
    path = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_calls_to_nginx_reach_every_joined_machine_and_a_killed_one_is_out_of_the_upstream_and_the_keys(
        site, vast, homes):
    sshd, manager, nginx, upstream = site
    daemons = [FakeDaemon("a"), FakeDaemon("b")]
    machines: list[JoiningMachine] = []
    outputs: list[str] = []
    try:
        a = JoiningMachine(manager, vast, homes / "a", daemons[0]).join()
        machines.append(a)
        a.wait_for(lambda r: r["state"] == "running", "a joined and reports running", timeout=120)
        assert "joined: the manager's 127.0.0.1:" in a.text("onstart.log")
        view = provers(manager)
        port_a = a.current()["tunnel_port"]
        assert [p["endpoint"] for p in view["provers"]] == [f"127.0.0.1:{port_a}"] and view["reloaded"]
        assert f"server 127.0.0.1:{port_a} " in upstream.read_text()
        wait_for(lambda: settled(daemons, nginx, 1) == [1, 0], "a call to nginx lands on a", timeout=20)

        b = JoiningMachine(manager, vast, homes / "b", daemons[1]).join()
        machines.append(b)
        b.wait_for(lambda r: r["state"] == "running", "b joined and reports running", timeout=120)
        port_b = b.current()["tunnel_port"]
        assert port_b != port_a
        assert [p["label"] for p in provers(manager)["provers"]] == [a.label, b.label]
        wait_for(lambda: all(n > 0 for n in settled(daemons, nginx, 10) or [0]), "calls reach both", timeout=20)
        fleet = {m["label"]: m for m in json.loads(run_vastctl("fleet", "--json", env=manager.env).stdout)["instances"]}
        assert fleet[a.label]["joined"] is True and fleet[a.label]["joined_at"] and fleet[b.label]["tunnel_port"] == port_b
        table = run_vastctl("fleet", env=manager.env).stdout.splitlines()
        assert "joined" in table[0].split() and all(" yes " in line for line in table[1:3]), table

        killed = run_vastctl("kill", a.label, "--reason", "rotating the fleet", "--force", env=a.operator)
        assert a.current()["state"] == "killed", killed.stderr  # the fake vast shows no instance: reconcile destroys
        outputs += [killed.stdout, killed.stderr]
        keys = sshd.authorized_keys.read_text()
        assert f'permitlisten="127.0.0.1:{port_a}"' not in keys and f'permitlisten="127.0.0.1:{port_b}"' in keys
        reconciled = run_vastctl("reconcile", "--json", env=a.operator)  # keeps the upstream list current
        assert reconciled.returncode == 0, reconciled.stderr
        outputs += [reconciled.stdout, reconciled.stderr]
        assert f"127.0.0.1:{port_a}" not in upstream.read_text() and f"127.0.0.1:{port_b}" in upstream.read_text()
        wait_for(lambda: settled(daemons, nginx, 4) == [0, 4], "nginx reloaded without a", timeout=20)
        assert served_by(daemons, nginx, 8) == [0, 8]  # every call still succeeds, on b
        refused = sshd.ssh(a.zk / "tunnel.key", "-N", "-R", f"127.0.0.1:{port_a}:{daemons[0].address}")
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, refused.stderr
        assert a.wait_exit() == 0  # its heartbeat was refused: it stopped

        # b's connection drops (the manager restarted sshd, a network blip): its script reconnects by itself
        dropped = subprocess.run(["ssh", "-S", str(b.zk / "tunnel.ctl"), "-O", "exit", "vastctl-manager"],
                                 capture_output=True, text=True, timeout=10)
        assert dropped.returncode == 0, dropped.stderr
        wait_for(lambda: "tunnel reopened" in b.text("onstart.log"), "b reopens its tunnel", timeout=60)
        wait_for(lambda: tunnel.probe(port_b, 2), "the manager reaches b again", timeout=30)
        wait_for(lambda: settled(daemons, nginx, 2) == [0, 2], "calls reach b again", timeout=20)

        secrets_never_shown(manager, machines, outputs + a.outputs + b.outputs + [nginx.log.read_text()])
    finally:
        for machine in machines:
            machine.stop()
        for daemon in daemons:
            daemon.stop()


def secrets_never_shown(manager: Manager, machines: list[JoiningMachine], outputs: list[str]) -> None:
    """The token and the SSH private key handed to each machine: in no log, no output, nowhere in the state file."""
    conn = sqlite3.connect(manager.db_path)
    try:
        state = "\n".join(conn.iterdump())
    finally:
        conn.close()
    texts = {"serve log": manager.log(), "state file": state, "outputs": "\n".join(outputs)}
    for machine in machines:
        texts[f"{machine.label} onstart.log"] = machine.text("onstart.log")
        texts[f"{machine.label} tunnel.log"] = machine.text("data/zk/tunnel.log")
    for machine in machines:
        env = machine.create["env"]
        private = base64.b64decode(env["VASTCTL_TUNNEL_KEY"]).decode()
        body = [line for line in private.splitlines() if line and not line.startswith("-----")]
        secrets = [env["VASTCTL_TOKEN"], env["VASTCTL_TUNNEL_KEY"], *body]
        for where, text in texts.items():
            for secret in secrets:
                assert secret not in text, f"a secret of {machine.label} in the {where}"
        assert (machine.zk / "tunnel.key").stat().st_mode & 0o077 == 0  # the machine keeps its key private
