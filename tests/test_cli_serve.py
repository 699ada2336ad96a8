"""`serve`, `token`, and the instance commands in remote mode against a real `vastctl serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from helpers.serving import Manager, free_port, run_vastctl

from vastctl.state import tokens


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("manager"), gate=40).start()
    yield m
    assert m.stop() == 0


@pytest.fixture
def remote_env(monkeypatch, manager):
    """This test's machine reports to `manager`; returns a function that switches the uuid and its token."""

    def machine(uuid, token=None):
        monkeypatch.setenv("VASTCTL_SERVER", manager.url)
        monkeypatch.setenv("VASTCTL_TOKEN", manager.token(uuid) if token is None else token)
        monkeypatch.setenv("VASTCTL_UUID", uuid)
        monkeypatch.setenv("VASTCTL_RETRY_FOR", "3s")

    return machine


# --- token ------------------------------------------------------------------------------------


def test_token_prints_the_machine_token(cli, db_path):
    assert cli("init").code == 0
    result = cli("token", "--uuid", "u1")
    secret = tokens.read_secret(db_path.with_name(db_path.name + ".secret"))
    assert (result.code, result.out, result.err) == (0, tokens.machine_token(secret, "u1") + "\n", "")
    assert cli("token", "--uuid", "u2").out != result.out


def test_token_without_a_secret_is_exit_2(cli):
    result = cli("token", "--uuid", "u1")
    assert result.code == 2
    assert result.err.startswith("error: no token secret") and "vastctl init" in result.err


def test_token_rejects_a_bad_uuid(cli):
    assert cli("init").code == 0
    assert cli("token", "--uuid", "").code == 2


# --- serve ------------------------------------------------------------------------------------


def test_serve_without_init_is_exit_2(cli):
    result = cli("serve", "--port", "0")
    assert result.code == 2
    assert result.err.startswith("error:") and "vastctl init" in result.err
    assert len(result.err.splitlines()) == 1


@pytest.mark.slow
def test_serve_on_a_taken_port_is_exit_1(cli):
    assert cli("init").code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = cli("serve", "--port", str(taken.getsockname()[1]))
    assert result.code == 1
    assert result.err.startswith("error: cannot listen on 127.0.0.1:")


@pytest.mark.slow
def test_serve_stops_cleanly_on_sigterm(tmp_path):
    m = Manager(tmp_path / "m").start()
    assert requests.get(f"{m.url}/healthz", timeout=10).status_code == 200
    assert m.stop() == 0
    assert m.log().rstrip().endswith("stopped")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{m.url}/healthz", timeout=2)


@pytest.mark.slow
@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("127.0.0.1", False), ("::1", False)])
def test_serve_off_loopback_warns_it_belongs_behind_the_tls_proxy(tmp_path, host, warned):
    m = Manager(tmp_path / "m")
    log = m.log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "vastctl", "serve", "--host", host, "--port", "0"], env=m.env,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while "serving on" not in m.log() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "serving on" in m.log(), m.log()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
    warning = f"warning: --host {host} takes connections from other machines"
    assert (warning in m.log()) is warned
    if warned:
        assert "behind the TLS proxy" in m.log().split(warning, 1)[1].splitlines()[0]


@pytest.mark.slow
def test_serve_help_and_fleet_do_not_load_the_server_stack():
    code = (
        "import sys\nfrom vastctl.cli import main\n"
        "for args in (['--help'], ['serve', '--help'], ['token', '--help']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "print(','.join(m for m in ('waitress', 'vastctl.serving.server', 'vastctl.machine.remote') if m in sys.modules) or 'none')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.splitlines()[-1] == "none", result.stderr


@pytest.mark.slow
def test_local_instance_commands_do_not_load_http(cli, tmp_path):
    assert cli("init").code == 0
    code = (
        "import sys\nfrom vastctl.cli import main\n"
        "try:\n    main(['register', '--uuid', 'u1', '--label', 'vastctl-a'])\nexcept SystemExit:\n    pass\n"
        "print(','.join(m for m in ('requests', 'waitress', 'vastctl.machine.remote') if m in sys.modules) or 'none')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.splitlines()[-1] == "none", result.stderr


# --- remote mode ------------------------------------------------------------------------------


@pytest.mark.slow
def test_remote_lifecycle_writes_the_managers_file_not_a_local_one(cli, db_path, manager, remote_env):
    remote_env("rm-1")
    steps = [
        (["register", "--label", "vastctl-rm-1", "--vast-id", "5", "--gpu", "RTX 5090", "--num-gpus", "2"], "registered"),
        (["params-done"], "params_done"),
        (["bench-report", "--rate", "55.5"], "bench_done"),
        (["running"], "running"),
        (["heartbeat", "--proofs-done", "7"], "running"),  # a batch: more, a second after it registered, is a lie
        (["heartbeat", "--proofs-done", "7"], "running"),
    ]
    for args, state in steps:
        result = cli(*args)
        assert (result.code, result.out, result.err) == (0, f"{state}\n", ""), args
    row = manager.rows()["rm-1"]
    assert (row["state"], row["claimed_vast_id"], row["gpu_name"], row["num_gpus"], row["bench_rate"], row["proofs_done"]) == (
        "running", 5, "RTX 5090", 2, 55.5, 7)
    assert len(manager.events("rm-1")) == 4
    assert not db_path.exists()
    assert not db_path.with_name(db_path.name + ".secret").exists()


@pytest.mark.slow
def test_remote_below_gate_is_exit_5(cli, manager, remote_env):
    remote_env("rm-5")
    assert cli("register", "--label", "vastctl-rm-5").code == 0
    assert cli("params-done").code == 0
    for _ in range(2):
        result = cli("bench-report", "--rate", "3")
        assert (result.code, result.out) == (5, "")
        assert result.err == "error: instance vastctl-rm-5: bench rate 3 below gate 40; it is being killed, do not prove\n"
    assert manager.rows()["rm-5"]["state"] == "killed"
    assert [e["to_state"] for e in manager.events("rm-5")].count("killed") == 1


@pytest.mark.slow
def test_remote_refused_is_exit_3(cli, manager, remote_env):
    remote_env("rm-3")
    assert cli("register", "--label", "vastctl-rm-3").code == 0
    result = cli("running")
    assert result.code == 3
    assert result.err.startswith("error: instance vastctl-rm-3 is registered; it cannot go to running")


SCENARIOS = [  # (name, setup reports, the report that fails, exit code)
    ("refused", [["register", "--label", "vastctl-{name}"]], ["running"], 3),
    ("unknown", [], ["heartbeat", "--proofs-done", "1"], 2),
    ("no-label", [], ["register", "--gpu", "RTX 4090"], 2),
    ("below-gate", [["register", "--label", "vastctl-{name}"], ["params-done"]], ["bench-report", "--rate", "3"], 5),
    ("twice-below", [["register", "--label", "vastctl-{name}"], ["params-done"], ["bench-report", "--rate", "3"]],
     ["bench-report", "--rate", "3"], 5),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,setup,failing,code", SCENARIOS)
def test_remote_and_local_refusals_say_the_same(cli, manager, remote_env, monkeypatch, tmp_path, name, setup, failing, code):
    """One error line whichever way a report travels: the lifecycle's, in flags (never `the "rate" field`)."""
    said = {}
    for mode in ("local", "remote"):
        uuid = f"same-{name}-{mode}"
        if mode == "remote":
            remote_env(uuid)
        else:
            for variable in ("VASTCTL_SERVER", "VASTCTL_TOKEN"):
                monkeypatch.delenv(variable, raising=False)
            monkeypatch.setenv("VASTCTL_UUID", uuid)
            monkeypatch.setenv("VASTCTL_CONFIG", str(manager.config_path))  # the same gate
            monkeypatch.setenv("VASTCTL_DB", str(tmp_path / "local.db"))
            assert cli("init").code == 0
        for args in setup:
            cli(*[arg.format(name=f"{name}-{mode}") for arg in args])
        result = cli(*failing)
        assert result.code == code, (mode, result.err)
        assert result.err.startswith("error: ") and result.err.count("\n") == 1
        said[mode] = result.err.replace(mode, "MODE")
    assert said["remote"] == said["local"]
    assert "the manager:" not in said["remote"] and ' field' not in said["remote"]


@pytest.mark.slow
def test_remote_messages_name_flags_not_fields(cli, manager, remote_env):
    remote_env("rm-fields")
    result = cli("register", "--vast-id", "5")
    assert result.code == 2
    assert result.err == "error: instance rm-fields is new here: register it with --label\n"


def test_a_password_in_vastctl_server_is_refused_and_never_printed(cli, monkeypatch, db_path):
    for server in ("https://operator:hunter2-secret@manager.example.test", "http://hunter2-secret@127.0.0.1:9/x",
                   "operator:hunter2-secret@manager.example.test", "https://op:hun/ter2-secret@manager.example.test"):
        monkeypatch.setenv("VASTCTL_SERVER", server)
        monkeypatch.setenv("VASTCTL_TOKEN", "a" * 64)
        result = cli("heartbeat", "--uuid", "u1")
        assert result.code == 2, server
        assert result.err.startswith("error: VASTCTL_SERVER must not hold a user or password")
        assert "secret" not in result.err and "ter2" not in result.err and "operator" not in result.err
    assert not db_path.exists()


@pytest.mark.slow
def test_remote_unknown_uuid_is_exit_2(cli, remote_env):
    remote_env("rm-nobody")
    result = cli("heartbeat", "--proofs-done", "1")
    assert result.code == 2
    assert "no instance with uuid 'rm-nobody'" in result.err


@pytest.mark.slow
def test_remote_wrong_token_is_exit_2(cli, manager, remote_env):
    remote_env("rm-w", token="0" * 64)
    result = cli("register", "--label", "vastctl-rm-w")
    assert result.code == 2
    assert result.err.startswith("error: the manager refused the token") and "vastctl token --uuid rm-w" in result.err
    assert "0" * 64 not in result.err
    assert "rm-w" not in manager.rows()


@pytest.mark.slow
def test_remote_token_of_another_machine_is_exit_2(cli, manager, remote_env):
    remote_env("rm-owner")
    assert cli("register", "--label", "vastctl-rm-owner").code == 0
    remote_env("rm-thief", token=manager.token("rm-owner"))
    result = cli("register", "--label", "vastctl-rm-thief")
    assert result.code == 2
    assert "another machine" in result.err
    assert "rm-thief" not in manager.rows()


def test_remote_bad_input_is_exit_2_without_a_request(cli, db_path, monkeypatch):
    port = free_port()  # nothing listens: a request would retry for 5 minutes
    monkeypatch.setenv("VASTCTL_SERVER", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("VASTCTL_TOKEN", "a" * 64)
    started = time.monotonic()
    for args in (["bench-report", "--uuid", "u1", "--rate", "nan"], ["bench-report", "--uuid", "u1", "--rate", "-2"],
                 ["bench-report", "--uuid", "u1", "--rate", "fast"], ["heartbeat", "--uuid", "u1", "--proofs-done", "-1"]):
        result = cli(*args)
        assert result.code == 2, args
        assert result.err.startswith("error:") and len(result.err.splitlines()) == 1
    assert time.monotonic() - started < 5
    assert not db_path.exists()


def test_remote_without_a_token_is_exit_2(cli, monkeypatch, db_path):
    monkeypatch.setenv("VASTCTL_SERVER", "http://127.0.0.1:9")
    result = cli("heartbeat", "--uuid", "u1")
    assert result.code == 2
    assert "VASTCTL_TOKEN" in result.err
    assert not db_path.exists()


def test_remote_bad_retry_for_is_exit_2(cli, monkeypatch):
    monkeypatch.setenv("VASTCTL_SERVER", "http://127.0.0.1:9")
    monkeypatch.setenv("VASTCTL_TOKEN", "a" * 64)
    monkeypatch.setenv("VASTCTL_RETRY_FOR", "a while")
    result = cli("heartbeat", "--uuid", "u1")
    assert result.code == 2
    assert "VASTCTL_RETRY_FOR" in result.err


# --- the manager restarting -------------------------------------------------------------------


def remote_process(manager, port, uuid, *args, retry_for):
    env = {**manager.env, "VASTCTL_SERVER": f"http://127.0.0.1:{port}", "VASTCTL_TOKEN": manager.token(uuid),
           "VASTCTL_UUID": uuid, "VASTCTL_RETRY_FOR": retry_for, "VASTCTL_DB": str(manager.home / "machine.db")}
    return subprocess.Popen([sys.executable, "-m", "vastctl", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stderr_until(proc, text, timeout=30.0):
    """The process's stderr lines up to the first one holding `text`."""
    import selectors

    seen = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline and selector.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stderr.readline()
            seen.append(line)
            if not line or text in line:
                break
    assert seen and text in seen[-1], f"no {text!r} on stderr: {''.join(seen)!r}"
    return "".join(seen)


@pytest.mark.slow
def test_a_report_made_while_the_manager_restarts_lands_once_it_is_back(tmp_path):
    m = Manager(tmp_path / "restart")
    port = free_port()
    m.start(port)
    machine = "rm-restart"
    env = {"VASTCTL_SERVER": m.url, "VASTCTL_TOKEN": m.token(machine), "VASTCTL_UUID": machine}
    for args in (["register", "--label", "vastctl-rm-restart"], ["params-done"]):
        assert run_vastctl(*args, env=env).returncode == 0
    assert m.stop() == 0  # the manager goes down (a deploy, a reboot)

    bench = remote_process(m, port, machine, "bench-report", "--rate", "60", retry_for="60s")
    first = stderr_until(bench, "retrying in")  # it tried, failed, and waits: no fixed sleep
    assert bench.poll() is None  # still retrying
    m.start(port)
    out, err = bench.communicate(timeout=60)
    err = first + err
    assert (bench.returncode, out) == (0, "bench_done\n"), err
    assert "retrying in" in err and "error:" not in err
    assert m.rows()[machine]["state"] == "bench_done"
    assert [e["to_state"] for e in m.events(machine)] == ["registered", "params_done", "bench_done"]
    assert not (m.home / "machine.db").exists()
    assert m.stop() == 0


@pytest.mark.slow
def test_a_report_past_retry_for_is_exit_1(tmp_path):
    m = Manager(tmp_path / "down")
    started = time.monotonic()
    heartbeat = remote_process(m, free_port(), "rm-down", "heartbeat", "--proofs-done", "1", retry_for="2s")
    _, err = heartbeat.communicate(timeout=60)
    assert heartbeat.returncode == 1
    assert time.monotonic() - started < 20
    assert err.splitlines()[-1].startswith("error: the manager at http://127.0.0.1:")
    assert "did not take the report for 2s" in err and "retry later" in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.splitlines()[-1]]
    assert not (m.home / "machine.db").exists()


@pytest.mark.slow
def test_remote_mode_never_creates_a_state_file(tmp_path):
    machine_db = tmp_path / "nothing-here" / "vastctl.db"
    result = subprocess.run(
        [sys.executable, "-m", "vastctl", "heartbeat", "--uuid", "u1"],
        env={**os.environ, "VASTCTL_SERVER": f"http://127.0.0.1:{free_port()}", "VASTCTL_TOKEN": "a" * 64,
             "VASTCTL_RETRY_FOR": "0", "VASTCTL_DB": str(machine_db)},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1
    assert not machine_db.parent.exists()
