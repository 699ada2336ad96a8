"""The boot script's join step (launch.join command and ssh's failure), run for real under bash with the boot
harness of helpers/boot.py: only a joined machine reports running."""

from __future__ import annotations

import pytest
from helpers.boot import Machine, start_manager
from helpers.serving import free_port


@pytest.fixture
def booted(tmp_path, vast):
    made = []

    def boot(launch: str, **knobs) -> Machine:
        manager = start_manager(tmp_path, launch)
        machine = Machine(manager, vast, tmp_path / "machine")
        made.append((manager, machine))
        return machine.boot(**knobs)

    yield boot
    for manager, machine in made:
        machine.stop()
        manager.stop()


@pytest.mark.slow
def test_join_command_runs_on_the_machine_with_its_details_then_it_reports_running(booted):
    machine = booted('  join: command\n  join_command: \'echo "$VASTCTL_LABEL $VASTCTL_UUID $VASTCTL_CUZK_LISTEN'
                     ' $VASTCTL_CUZK_STATUS_LISTEN" > joined.txt\'\n')
    assert machine.create["env"]["VASTCTL_JOIN"] == "command"
    machine.wait_for(lambda r: r["state"] == "running", "running after the join command")
    assert (machine.zk / "joined.txt").read_text().split() == [
        machine.label, machine.uuid, f"127.0.0.1:{machine.grpc}", f"127.0.0.1:{machine.status}"]
    events = [e["to_state"] for e in machine.manager.events(machine.uuid)]
    assert events[-2:] == ["bench_done", "running"]


@pytest.mark.slow
def test_a_failing_join_command_never_reports_running(booted):
    machine = booted("  join: command\n  join_command: 'echo no route to the cluster; exit 3'\n")
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    assert machine.current()["state"] == "bench_done"  # reconcile's bench_done timeout kills it
    assert "launch.join_command failed (exit 3): no route to the cluster" in machine.text("onstart.log")
    assert not machine.daemon_answers()  # the prover it started is stopped


@pytest.mark.slow
def test_an_ssh_join_to_a_manager_that_does_not_answer_never_reports_running(booted, tmp_path):
    key = tmp_path / "host_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    machine = booted(f"  join: ssh\ntunnel:\n  host: 127.0.0.1\n  ssh_port: {free_port()}\n"
                     f"  host_key_file: {key}.pub\n  authorized_keys: {tmp_path / 'ak'}\n  keys_reader: root\n",
                     VASTCTL_TUNNEL_WAIT_S="1")  # gives up after a second or two
    assert machine.wait_exit(timeout=60) == 1
    assert machine.current()["state"] == "bench_done"
    log = machine.text("onstart.log")
    assert "no tunnel to 127.0.0.1:" in log and "Connection refused" in log, log
    assert machine.create["env"]["VASTCTL_TUNNEL_KEY"] not in log
