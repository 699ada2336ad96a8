"""Each machine's tunnel (vastctl/facts/tunnel.py): its port, its key, the authorized_keys line that lets it open its own
port and nothing else — checked against Debian's real sshd on the shipped config — and the manager's own probe."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from helpers.tunnel_parts import FakeDaemon, Sshd, free_port, listening, wait_for

from vastctl import config as config_module
from vastctl.clock import SYSTEM
from vastctl.errors import BadInput, Unavailable
from vastctl.facts import tunnel
from vastctl.state import db, lifecycle
from vastctl.state.lifecycle import State


@pytest.fixture
def conn(tmp_path):
    connection = db.connect(tmp_path / "state.db", create=True, now=SYSTEM.now())
    yield connection
    connection.close()


def make_config(tmp_path: Path, **tunnel_keys) -> config_module.Config:
    return config_module.from_mapping({
        "launch": {"join": "ssh"},
        "tunnel": {"host": "manager.example.net", "authorized_keys": str(tmp_path / "keys" / "authorized_keys"),
                   "keys_reader": "root", "first_port": 20000, "last_port": 20002, **tunnel_keys},
    })


def add_machine(conn, name: str, port: int, public: str, state: State = State.RUNNING) -> dict:
    return lifecycle.create(conn, uuid=f"uuid-{name}", label=f"vastctl-{name}", state=state, source="operator",
                            reason="test", now=SYSTEM.now(),
                            fields={"tunnel_port": port, "tunnel_public_key": public, "offer_id": 1})


# --- keys, ports, the file -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_key_pair_is_fresh_each_time_and_the_private_half_is_left_nowhere(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    private_a, public_a = tunnel.new_key_pair("vastctl-a")
    private_b, public_b = tunnel.new_key_pair("vastctl-b")
    assert private_a.startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and private_a != private_b
    assert public_a.startswith("ssh-ed25519 ") and public_a.endswith(" vastctl-a") and public_a != public_b
    assert list(scratch.iterdir()) == []  # the temporary directory ssh-keygen wrote in is gone


@pytest.mark.slow
def test_the_line_lets_a_key_listen_on_its_own_port_and_nothing_else(conn, tmp_path):
    config = make_config(tmp_path)
    _, public = tunnel.new_key_pair("vastctl-a")
    add_machine(conn, "a", 20001, public)
    assert tunnel.write_authorized_keys(conn, config) is True
    lines = Path(config.tunnel.authorized_keys).read_text().splitlines()
    assert lines[1] == f'restrict,port-forwarding,permitlisten="127.0.0.1:20001" {" ".join(public.split()[:2])} vastctl-a'
    assert len(lines) == 2 and lines[0].startswith("#")
    assert oct(Path(config.tunnel.authorized_keys).stat().st_mode & 0o777) == "0o644"
    assert tunnel.write_authorized_keys(conn, config) is False  # unchanged: not rewritten


@pytest.mark.slow
def test_a_killed_machines_line_is_pruned_and_a_stopped_ones_kept(conn, tmp_path):
    config = make_config(tmp_path)
    keys = [tunnel.new_key_pair(name)[1] for name in ("a", "b")]
    add_machine(conn, "a", 20000, keys[0])
    add_machine(conn, "b", 20001, keys[1], state=State.STOPPED)
    tunnel.write_authorized_keys(conn, config)
    lifecycle.kill(conn, "uuid-a", "test", source="operator", code="operator", now=SYSTEM.now())
    assert tunnel.write_authorized_keys(conn, config) is True
    text = Path(config.tunnel.authorized_keys).read_text()
    assert keys[0].split()[1] not in text and keys[1].split()[1] in text


def test_a_public_key_that_is_not_one_never_reaches_the_file(conn, tmp_path):
    config = make_config(tmp_path)
    add_machine(conn, "a", 20000, 'ssh-ed25519 AAAA\ncommand="sh" ssh-ed25519 AAAA')
    add_machine(conn, "b", 20001, "ssh-ed25519 AAAAb")
    tunnel.write_authorized_keys(conn, config)
    lines = Path(config.tunnel.authorized_keys).read_text().splitlines()
    assert lines[1:] == ["# vastctl-a: no valid public key",
                         'restrict,port-forwarding,permitlisten="127.0.0.1:20001" ssh-ed25519 AAAAb vastctl-b']


def test_ports_are_unique_until_destroyed_and_a_full_range_is_an_error(conn, tmp_path):
    config = make_config(tmp_path)
    for name in ("a", "b", "c"):
        add_machine(conn, name, tunnel.allocate_port(conn, config), f"ssh-ed25519 AAAA{name}")
    assert sorted(r[0] for r in conn.execute("SELECT tunnel_port FROM instances")) == [20000, 20001, 20002]
    lifecycle.kill(conn, "uuid-b", "test", source="operator", code="operator", now=SYSTEM.now())
    with pytest.raises(Unavailable, match="every tunnel port of 20000-20002 is held"):
        tunnel.allocate_port(conn, config)  # killed, not yet destroyed: its session may still hold the port
    conn.execute("UPDATE instances SET destroyed_at = '2026-01-01T00:00:00Z' WHERE uuid = 'uuid-b'")
    assert tunnel.allocate_port(conn, config) == 20001
    with pytest.raises(Exception, match="UNIQUE"):  # the index stops a second holder whatever the code does
        add_machine(conn, "d", 20000, "ssh-ed25519 AAAAd")


def test_the_config_refuses_an_empty_range_and_a_join_command_without_command():
    with pytest.raises(BadInput, match="first_port must be ≤ last_port"):
        config_module.from_mapping({"tunnel": {"first_port": 20010, "last_port": 20000}})
    with pytest.raises(BadInput, match="launch.join_command is empty"):
        config_module.from_mapping({"launch": {"join": "command"}})
    with pytest.raises(BadInput, match="must be one of none, ssh, command"):
        config_module.from_mapping({"launch": {"join": "wireguard"}})
    assert config_module.Config().launch.join == "none"  # today's behaviour unless configured


def test_ssh_join_needs_a_host_and_a_readable_host_key(tmp_path):
    with pytest.raises(BadInput, match="tunnel.host is empty"):
        tunnel.check_config(make_config(tmp_path, host=""))
    with pytest.raises(BadInput, match="cannot be read as an SSH public key"):
        tunnel.check_config(make_config(tmp_path, host_key_file=str(tmp_path / "missing.pub")))
    (tmp_path / "bad.pub").write_text("not a key\n")
    with pytest.raises(BadInput, match="does not hold an SSH public key line"):
        tunnel.check_config(make_config(tmp_path, host_key_file=str(tmp_path / "bad.pub")))


# --- the manager's probe ----------------------------------------------------------------------------------


def _one_shot_server(reply: bytes) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer():
        with listener:
            peer, _ = listener.accept()
            with peer:
                peer.recv(1024)
                peer.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    return listener.getsockname()[1]


@pytest.mark.slow
def test_the_probe_needs_a_real_http2_server_not_just_an_open_port():
    daemon = FakeDaemon("a")
    try:
        assert tunnel.probe(daemon.port, 3) is True
    finally:
        daemon.stop()
    assert tunnel.probe(_one_shot_server(b"HTTP/1.1 400 Bad Request\r\n\r\n"), 3) is False
    assert tunnel.probe(_one_shot_server(b""), 3) is False  # what sshd does when the machine's end is gone
    assert tunnel.probe(free_port(), 1) is False


def test_check_records_joined_since_when_and_down_since_when_with_one_event_each(conn, tmp_path):
    config = make_config(tmp_path)
    add_machine(conn, "a", 20000, "ssh-ed25519 AAAAa")
    up = {"value": True}
    tunnel.check(conn, config, now=SYSTEM.now(), probe_fn=lambda port, timeout: up["value"])
    row = lifecycle.get(conn, "uuid-a")
    assert row["joined_at"] and row["tunnel_down_since"] is None and tunnel.joined(row) is True
    tunnel.check(conn, config, now=SYSTEM.now(), probe_fn=lambda port, timeout: True)  # no news: no event
    up["value"] = False
    tunnel.check(conn, config, now=SYSTEM.now(), probe_fn=lambda port, timeout: up["value"])
    row = lifecycle.get(conn, "uuid-a")
    assert row["tunnel_down_since"] and tunnel.joined(row) is False
    kinds = [r["kind"] for r in conn.execute("SELECT kind FROM events WHERE uuid = 'uuid-a' ORDER BY id")]
    assert kinds[1:] == [tunnel.JOINED, tunnel.LEFT]


# --- against the real sshd --------------------------------------------------------------------------------


@pytest.fixture
def sshd(tmp_path):
    server = Sshd(tmp_path / "sshd", tmp_path / "keys" / "authorized_keys")
    yield server
    server.stop()


def _key_file(directory: Path, name: str, private: str) -> Path:
    path = directory / name
    path.write_text(private)
    path.chmod(0o600)
    return path


@pytest.fixture
def two_machines(conn, tmp_path, sshd):
    config = make_config(tmp_path, authorized_keys=str(sshd.authorized_keys))
    keys = {}
    for name, port in (("a", free_port()), ("b", free_port())):
        private, public = tunnel.new_key_pair(f"vastctl-{name}")
        add_machine(conn, name, port, public)
        keys[name] = (_key_file(tmp_path, f"{name}.key", private), port)
    tunnel.write_authorized_keys(conn, config)
    return config, keys


@pytest.mark.slow
def test_a_machines_key_opens_its_own_port_to_its_daemon(sshd, two_machines):
    _, keys = two_machines
    key, port = keys["a"]
    daemon = FakeDaemon("a")
    forward = subprocess.Popen(["ssh", "-i", str(key), "-p", str(sshd.port), "-F", "/dev/null", "-N",
                                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                                "-o", f"UserKnownHostsFile={sshd.home / 'known_hosts'}",
                                "-o", "HostKeyAlias=vastctl-manager", "-o", "ExitOnForwardFailure=yes",
                                "-R", f"127.0.0.1:{port}:{daemon.address}", f"{sshd.user}@127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: tunnel.probe(port, 2), "the manager reaches the daemon through the tunnel", proc=forward,
                 log=sshd.log)
    finally:
        forward.terminate()
        forward.wait(timeout=10)
        daemon.stop()


@pytest.mark.slow
def test_a_machines_key_cannot_open_another_port(sshd, two_machines):
    _, keys = two_machines
    key, _ = keys["a"]
    for other in (keys["b"][1], free_port()):
        done = sshd.ssh(key, "-N", "-R", f"127.0.0.1:{other}:127.0.0.1:9")
        assert done.returncode == 255 and "remote port forwarding failed" in done.stderr, done.stderr
        assert not listening(other)


@pytest.mark.slow
def test_a_machines_key_cannot_run_a_command_nor_forward_locally(sshd, two_machines):
    _, keys = two_machines
    key, _ = keys["a"]
    done = sshd.ssh(key, command="id; echo ran")
    assert done.returncode != 0 and "uid=" not in done.stdout and "ran" not in done.stdout, done
    target = FakeDaemon("manager-side")
    local = free_port()
    forward = subprocess.Popen(["ssh", "-i", str(key), "-p", str(sshd.port), "-F", "/dev/null", "-N",
                                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                                "-o", f"UserKnownHostsFile={sshd.home / 'known_hosts'}",
                                "-o", "HostKeyAlias=vastctl-manager",
                                "-L", f"127.0.0.1:{local}:{target.address}", f"{sshd.user}@127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: listening(local), "ssh's local end listens", proc=forward)
        assert tunnel.probe(local, 3) is False  # sshd opens no channel to the manager's own ports
        assert target.calls == 0
    finally:
        forward.terminate()
        try:
            forward.wait(timeout=10)
        except subprocess.TimeoutExpired:  # ssh still closing its session with sshd on a loaded machine
            forward.kill()
            forward.wait(timeout=10)
        target.stop()


@pytest.mark.slow
def test_a_forged_or_killed_machines_key_is_refused(conn, tmp_path, sshd, two_machines):
    config, keys = two_machines
    forged, _ = tunnel.new_key_pair("forged")
    done = sshd.ssh(_key_file(tmp_path, "forged.key", forged), "-N", "-R", f"127.0.0.1:{keys['a'][1]}:127.0.0.1:9")
    assert done.returncode == 255 and "Permission denied (publickey)" in done.stderr, done.stderr
    lifecycle.kill(conn, "uuid-a", "test", source="operator", code="operator", now=SYSTEM.now())
    tunnel.write_authorized_keys(conn, config)
    key, port = keys["a"]
    done = sshd.ssh(key, "-N", "-R", f"127.0.0.1:{port}:127.0.0.1:9")
    assert done.returncode == 255 and "Permission denied (publickey)" in done.stderr, done.stderr
    assert "remote port forwarding failed" in sshd.ssh(keys["b"][0], "-N", "-R", f"127.0.0.1:{port}:127.0.0.1:9").stderr


def test_a_machine_back_in_running_joins_again_whatever_it_did_before():
    since = "2026-12-01T10:00:00Z"
    before = {"state": State.RUNNING, "tunnel_port": 20000, "state_since": since, "tunnel_down_since": None}
    assert tunnel.joined({**before, "joined_at": "2026-12-01T09:00:00Z"}) is False  # joined in an earlier run
    assert tunnel.down_since({**before, "joined_at": "2026-12-01T09:00:00Z"}) == since
    assert tunnel.joined({**before, "joined_at": "2026-12-01T10:00:05Z"}) is True
    assert tunnel.joined({**before, "tunnel_port": None, "joined_at": None}) is None


# --- quick: the file's lines and the rules read from a row (no ssh-keygen, no sshd) ----------------------


def test_a_killed_machines_line_is_pruned_at_once_and_a_stopped_ones_kept(conn, tmp_path):
    config = make_config(tmp_path)
    add_machine(conn, "a", 20000, "ssh-ed25519 AAAAa vastctl-a")
    add_machine(conn, "b", 20001, "ssh-ed25519 AAAAb vastctl-b", state=State.STOPPED)
    assert tunnel.write_authorized_keys(conn, config) is True
    lifecycle.kill(conn, "uuid-a", "test", source="operator", code="operator", now=SYSTEM.now())
    assert tunnel.write_authorized_keys(conn, config) is True  # changed: rewritten
    assert Path(config.tunnel.authorized_keys).read_text().splitlines()[1:] == [
        'restrict,port-forwarding,permitlisten="127.0.0.1:20001" ssh-ed25519 AAAAb vastctl-b']
    assert tunnel.write_authorized_keys(conn, config) is False  # nothing changed since


def test_a_config_switched_back_to_no_tunnel_still_prunes_the_killed(conn, tmp_path):
    config = make_config(tmp_path)
    add_machine(conn, "a", 20000, "ssh-ed25519 AAAAa")
    tunnel.write_authorized_keys(conn, config)
    lifecycle.kill(conn, "uuid-a", "test", source="operator", code="operator", now=SYSTEM.now())
    no_join = config_module.from_mapping({"tunnel": {"authorized_keys": config.tunnel.authorized_keys, "keys_reader": "root"}})
    assert tunnel.write_authorized_keys(conn, no_join) is True
    assert Path(config.tunnel.authorized_keys).read_text().splitlines()[1:] == []


RUN_SINCE = "2026-12-01T10:00:00.000000Z"


def tunnel_row(**fields) -> dict:
    return {"state": State.RUNNING, "state_since": RUN_SINCE, "tunnel_port": 20001, "joined_at": None,
            "tunnel_down_since": None, **fields}


def test_down_since_counts_a_machine_not_joined_this_run_from_running():
    assert tunnel.down_since(tunnel_row()) == RUN_SINCE  # never joined
    assert tunnel.down_since(tunnel_row(joined_at="2026-12-01T09:00:00.000000Z")) == RUN_SINCE  # joined a run before
    joined_now = tunnel_row(joined_at="2026-12-01T10:05:00.000000Z")
    assert tunnel.down_since(joined_now) is None and tunnel.joined(joined_now) is True
    lost = tunnel_row(joined_at=RUN_SINCE, tunnel_down_since="2026-12-01T10:30:00.000000Z")  # joined at the start
    assert tunnel.down_since(lost) == "2026-12-01T10:30:00.000000Z" and tunnel.joined(lost) is False


def test_no_tunnel_or_not_running_is_never_down():
    assert tunnel.down_since(tunnel_row(tunnel_port=None)) is None and tunnel.joined(tunnel_row(tunnel_port=None)) is None
    stopped = tunnel_row(state=State.STOPPED, joined_at="2026-12-01T10:05:00.000000Z")
    assert tunnel.down_since(stopped) is None and tunnel.joined(stopped) is False
    rows = [tunnel_row(joined_at="2026-12-01T10:05:00.000000Z"), tunnel_row(), stopped]
    assert tunnel.joined_rows(rows) == rows[:1]
