"""`vastctl provers`: the joined machines, nginx's upstream file written whole and only on change, the reload run
only then, and a failing reload an error line and exit 1 with the previous file in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.tunnel_parts import FakeDaemon, free_port

from vastctl import atomicfile, clock
from vastctl.clock import SYSTEM
from vastctl.facts import provers
from vastctl.state import db, lifecycle
from vastctl.state.lifecycle import State


@pytest.fixture
def manager(tmp_path):
    state = tmp_path / "state.db"
    db.connect(state, create=True, now=SYSTEM.now()).close()
    upstream = tmp_path / "nginx" / "cuzk-upstream.conf"
    reloads = tmp_path / "reloads"
    config = tmp_path / "config.yaml"
    config.write_text(f"provers:\n  upstream_file: {upstream}\n  reload_command: echo reloaded >> {reloads}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VASTCTL_")}
    env.update(VASTCTL_DB=str(state), VASTCTL_CONFIG=str(config), HOME=str(tmp_path))
    return {"state": state, "upstream": upstream, "reloads": reloads, "config": config, "env": env}


def vastctl(manager, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vastctl", *args], env=manager["env"], capture_output=True,
                          text=True, timeout=60, check=False)


def add_joined(manager, name: str, port: int, *, joined: bool = True, state: State = State.RUNNING) -> None:
    conn = db.connect(manager["state"], now=SYSTEM.now())
    moment = SYSTEM.now()
    now = clock.to_iso(moment)
    lifecycle.create(conn, uuid=f"uuid-{name}", label=f"vastctl-{name}", state=state, source="operator",
                     reason="test", now=moment, fields={"tunnel_port": port, "tunnel_public_key": "ssh-ed25519 AAAA",
                                                             "joined_at": now if joined else None,
                                                             "tunnel_checked_at": now})
    conn.close()


def reloads(manager) -> int:
    path = manager["reloads"]
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_upstream_block_lists_each_joined_machine_and_one_down_server_when_none():
    text = provers.upstream_text([{"label": "vastctl-a", "endpoint": "127.0.0.1:20001"}])
    assert text.splitlines()[1:] == ["upstream vastctl_cuzk {",
                                     "    server 127.0.0.1:20001 max_fails=1 fail_timeout=10s;  # vastctl-a", "}"]
    assert "server 127.0.0.1:9 down;" in provers.upstream_text([])  # nginx refuses an empty upstream block


@pytest.mark.slow
def test_provers_lists_the_joined_writes_the_file_and_reloads_only_when_the_set_changed(manager):
    daemon = FakeDaemon("a")  # what the manager reaches through machine a's tunnel
    try:
        add_joined(manager, "a", daemon.port)
        add_joined(manager, "b", free_port())  # joined once, answers no more: no prover
        add_joined(manager, "c", free_port(), joined=False, state=State.BENCH_DONE)  # not running yet
        first = vastctl(manager, "provers", "--json")
        assert first.returncode == 0, first.stderr
        view = json.loads(first.stdout)
        assert [(p["label"], p["endpoint"]) for p in view["provers"]] == [("vastctl-a", f"127.0.0.1:{daemon.port}")]
        assert view["changed"] is True and view["reloaded"] is True and reloads(manager) == 1
        assert f"server 127.0.0.1:{daemon.port} " in manager["upstream"].read_text()
        again = vastctl(manager, "provers")
        assert again.returncode == 0 and again.stdout.split()[3:5] == ["vastctl-a", f"127.0.0.1:{daemon.port}"]
        assert reloads(manager) == 1  # the same set: the file is not rewritten, nginx not reloaded
    finally:
        daemon.stop()


def test_refresh_writes_whole_files_and_never_reloads_an_unchanged_set(manager):
    from vastctl import config as config_module

    add_joined(manager, "a", 20001)
    add_joined(manager, "b", 20002)
    config = config_module.load(str(manager["config"]))
    conn = db.connect(manager["state"], now=SYSTEM.now())
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        text = manager["upstream"].read_text()
        assert text == provers.upstream_text(provers.endpoints(conn)) and text.endswith("}\n")  # whole, first
        return subprocess.CompletedProcess(argv, 0, "", "")

    result = provers.refresh(conn, config, run=run)
    assert [p["endpoint"] for p in result.provers] == ["127.0.0.1:20001", "127.0.0.1:20002"]
    assert result.changed and result.reloaded and len(calls) == 1
    assert [p.name for p in manager["upstream"].parent.iterdir()] == ["cuzk-upstream.conf"]  # no temporary left
    assert not provers.refresh(conn, config, run=run).changed and len(calls) == 1
    lifecycle.kill(conn, "uuid-a", "test", source="operator", code="operator", now=SYSTEM.now())
    assert provers.refresh(conn, config, run=run).changed and len(calls) == 2
    assert "20001" not in manager["upstream"].read_text()


def test_a_crash_mid_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "nginx" / "upstream.conf"
    atomicfile.write(path, "old\n")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        atomicfile.write(path, "new and longer\n")
    assert path.read_text() == "old\n" and [p.name for p in path.parent.iterdir()] == ["upstream.conf"]


@pytest.mark.slow
def test_a_failing_reload_is_one_error_line_exit_1_and_the_previous_file_stays(manager):
    manager["config"].write_text(f"provers:\n  upstream_file: {manager['upstream']}\n"
                                 "  reload_command: \"echo 'nginx: [emerg] host not found in upstream' >&2; exit 7\"\n")
    atomicfile.write(manager["upstream"], "# the file nginx runs on\n")
    add_joined(manager, "a", 20001)
    done = vastctl(manager, "provers")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: provers.reload_command failed (exit 7):")
    assert "host not found in upstream" in done.stderr and "previous upstream file was put back" in done.stderr
    assert manager["upstream"].read_text() == "# the file nginx runs on\n"
    assert [p.name for p in manager["upstream"].parent.iterdir()] == ["cuzk-upstream.conf"]


def test_a_label_never_breaks_out_of_its_comment_in_the_upstream_file():
    text = provers.upstream_text([{"label": "vastctl-a\nserver 10.9.9.9:1;\r\u2028}", "endpoint": "127.0.0.1:20001"}])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[2].startswith("    server 127.0.0.1:20001 ") and "# vastctl-a server 10.9.9.9" in lines[2]
    assert not any(line.lstrip().startswith("server 10.9.9.9") for line in lines) and "\u2028" not in text


@pytest.mark.slow
def test_a_reload_that_leaves_a_child_holding_its_output_is_judged_by_its_exit(manager):
    manager["config"].write_text(f"provers:\n  upstream_file: {manager['upstream']}\n"
                                 f"  reload_command: \"(sleep 300 & echo $! > {manager['reloads']}.child);"
                                 f" echo reloaded >> {manager['reloads']}\"\n")
    daemon = FakeDaemon("a")
    try:
        add_joined(manager, "a", daemon.port)
        started = SYSTEM.monotonic()
        done = vastctl(manager, "provers", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["reloaded"] is True and reloads(manager) == 1
        assert SYSTEM.monotonic() - started < 30  # not the 60 s of a reload taken for hung
        assert f"127.0.0.1:{daemon.port}" in manager["upstream"].read_text()  # not put back
    finally:
        daemon.stop()
        child = manager["reloads"].with_name("reloads.child")
        if child.exists():
            os.kill(int(child.read_text()), 9)  # the background child the reload left


@pytest.mark.slow
def test_a_hanging_reload_is_bounded_by_the_passs_deadline(manager):
    from vastctl import config as config_module
    from vastctl.reconcile.effects import Budget
    from vastctl.reconcile.run import Live

    manager["config"].write_text(f"provers:\n  upstream_file: {manager['upstream']}\n  reload_command: sleep 600\n")
    atomicfile.write(manager["upstream"], "# the file nginx runs on\n")
    add_joined(manager, "a", 20001)
    config = config_module.load(str(manager["config"]))
    conn = db.connect(manager["state"], now=SYSTEM.now())
    budget = Budget(SYSTEM, 2.0)  # what is left of a pass's reconcile.deadline
    errors = Live(conn, config, SYSTEM).after(budget)
    assert SYSTEM.monotonic() - budget.deadline < 10  # killed near the deadline, not after 60 s
    (error,) = [e for e in errors if "reload_command" in e]
    assert "did not finish" in error and "previous upstream file was put back" in error
    assert manager["upstream"].read_text() == "# the file nginx runs on\n"
