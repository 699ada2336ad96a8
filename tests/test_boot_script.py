"""The boot script `launch` hands a machine, run for real under bash against fakes of curio, cuzk and cuzk-bench.

The fakes (tests/fakes/) follow the upstream CLIs, defaults and output formats and refuse what the real tools
do not have, so a drift in the script fails here. The machine reports over HTTP to a real `vastctl serve`;
vast is the loopback fake of helpers/fake_vast.py. Also here: the failed-bench report itself (lifecycle, CLI, HTTP).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess

import pytest
import requests
import responses
from helpers.boot import FAKES, GATE, ROOT, VENV_BIN, Machine
from helpers.serving import Manager, run_vastctl

from vastctl import config as config_module
from vastctl.clock import SYSTEM
from vastctl.errors import BadInput, BenchFailed, Refused
from vastctl.machine import onstart
from vastctl.machine.remote import RemoteReports
from vastctl.state import blocklist, lifecycle, rates

SANE = re.compile(r"^[ -~]*$")  # what a reason may hold once the script and the manager have cleaned it


# --- one launched machine booting in a sandbox (its manager and the harness: helpers/boot.py) ---------


@pytest.fixture
def machine(manager, vast, tmp_path):
    m = Machine(manager, vast, tmp_path / "machine")
    yield m
    m.stop()


def kill_events(machine: Machine) -> list[dict]:
    return [e for e in machine.manager.events(machine.uuid) if e["to_state"] == "killed"]


def assert_killed_and_blocklisted(machine: Machine, *, from_state: str, says: str) -> dict:
    """Killed by the machine's own report with its reason, one event, host blocklisted, destroyed at vast."""
    row = machine.current()
    assert (row["state"], row["kill_code"]) == ("killed", "bench_failed")
    assert says in row["kill_reason"] and SANE.match(row["kill_reason"]), row["kill_reason"]
    (event,) = kill_events(machine)
    assert (event["source"], event["from_state"], event["code"]) == ("instance", from_state, "bench_failed")
    offers = run_vastctl("offers", "--json", env=machine.operator)
    assert offers.returncode == 0 and json.loads(offers.stdout) == [], offers.stdout  # its only host: blocklisted
    reconciled = run_vastctl("reconcile", "--json", env=machine.operator)
    assert reconciled.returncode == 0, reconciled.stderr
    assert machine.vast.instances == {} and machine.current()["destroyed_at"]
    assert not machine.daemon_answers()  # the script stopped the prover it started
    return row


# --- the boot, for real ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_good_machine_benches_warm_runs_and_heartbeats_the_daemons_count(machine):
    assert machine.create["env"]["VASTCTL_BENCH_COUNT"] == "4" and machine.create["env"]["VASTCTL_BENCH_CONCURRENCY"] == "2"
    assert machine.script() == onstart.default_script()
    machine.boot()
    row = machine.wait_for(lambda r: r["state"] == "running" and r["proofs_done"] == 5,
                           "running with the daemon's count (1 warm-up + 4 benched)")
    assert row["bench_rate"] >= GATE and row["last_heartbeat_at"]
    config = (machine.zk / "cuzk.toml").read_text()
    assert f'listen = "127.0.0.1:{machine.grpc}"' in config and f'status_listen = "127.0.0.1:{machine.status}"' in config
    assert f'param_cache = "{machine.zk / "params"}"' in config and 'total_budget = "auto"' in config
    bench = machine.text("data/zk/bench.log")
    assert "count:       4\nconcurrency: 2\n" in bench and "throughput:" in bench
    assert [e["to_state"] for e in machine.manager.events(machine.uuid)] == [
        "launching", "registered", "params_done", "bench_done", "running"]

    run_vastctl("kill", machine.label, "--reason", "rotating the fleet", "--force", env=machine.operator)
    assert (machine.current()["state"], machine.current()["kill_code"]) == ("killed", "operator")
    assert machine.wait_exit() == 0  # its next heartbeat is refused: it stops proving
    assert "the manager refused the heartbeat (exit 3): stopping" in machine.text("onstart.log")
    assert not machine.daemon_answers()


@pytest.mark.slow
def test_a_failed_parameter_fetch_is_reported_at_once_with_its_cleaned_reason(machine):
    machine.boot(FAKE_CURIO_FETCH_ERROR="dial tcp 104.18.2.1:443: i/o timeout \x1b[2J\u202e token=abcdef123456"
                                        " <img src=x onerror=alert(1)>")
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    row = assert_killed_and_blocklisted(machine, from_state="registered", says="parameter fetch failed (exit 1):")
    assert "i/o timeout" in row["kill_reason"] and "token=***" in row["kill_reason"]
    assert "abcdef123456" not in row["kill_reason"] and "\x1b" not in row["kill_reason"]
    # the script pushed its logs before reporting: the fetch log's tail arrived, escaped and masked
    shown = run_vastctl("logs", machine.label, "--json", env=machine.operator)
    assert shown.returncode == 0, shown.stderr
    logs = {log["name"]: log for log in json.loads(shown.stdout)["logs"]}
    assert {"onstart", "fetch"} <= set(logs)
    fetch = logs["fetch"]["text"]
    assert "i/o timeout \\x1b[2J\\u202e token=***" in fetch and "<img src=x onerror=alert(1)>" in fetch
    assert "\x1b" not in fetch and "\u202e" not in fetch and "abcdef123456" not in fetch
    assert "parameter fetch failed" in logs["onstart"]["text"]


@pytest.mark.slow
def test_a_daemon_left_on_its_defaults_never_answers_and_is_reported(machine):
    # started without the config the script wrote: the Unix socket, no status API (the old script's bug)
    machine.boot(VASTCTL_CUZK_CMD="cuzk", VASTCTL_CUZK_WAIT_S="2")  # launch.env's 60 s is for daemons that do start
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    row = assert_killed_and_blocklisted(machine, from_state="params_done", says="did not answer in 2s")
    assert "serving on unix://" in row["kill_reason"]  # the end of cuzk.log: it went to its default socket


@pytest.mark.slow
def test_a_daemon_that_does_not_listen_where_the_bench_dials_is_reported(machine):
    machine.boot(VASTCTL_CUZK_CMD='cuzk --config "$VASTCTL_ZK_DIR/cuzk.toml" --listen "unix://$VASTCTL_ZK_DIR/c.sock"')
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    assert_killed_and_blocklisted(machine, from_state="params_done",
                                  says=f"warm-up proof failed: Error: failed to connect to daemon at"
                                       f" http://127.0.0.1:{machine.grpc}")


@pytest.mark.slow
def test_a_bench_that_completes_no_proof_is_reported(machine):
    machine.boot(FAKE_CUZK_GOOD_PROOFS="1")  # the warm-up completes, every benched proof fails
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    row = assert_killed_and_blocklisted(machine, from_state="params_done", says="benchmark completed no proof:")
    assert "completed: 0 failed: 4" in row["kill_reason"]
    assert "throughput" not in machine.text("data/zk/bench.log")


@pytest.mark.slow
def test_a_slow_machine_is_killed_at_the_gate(machine):
    machine.boot(FAKE_CUZK_PROOF_S="0.5")
    assert machine.wait_exit() == 0, machine.text("onstart.log")
    row = machine.current()
    assert (row["state"], row["kill_code"]) == ("killed", "bench_failed") and 0 < row["bench_rate"] < GATE
    assert f"below gate {GATE}" in row["kill_reason"]
    assert "is below the gate: not proving" in machine.text("onstart.log")
    assert len(kill_events(machine)) == 1 and not machine.daemon_answers()
    # stopped with SIGINT, the signal cuzk drains on (SIGTERM would end it at once)
    assert "received SIGINT, shutting down gracefully" in (machine.zk / "cuzk.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["256G", "Auto", "1.5GiB", "0GiB"])
def test_a_memory_budget_cuzk_would_read_as_50_gib_is_refused_before_the_fetch(machine, memory):
    machine.boot(VASTCTL_CUZK_MEMORY=memory)
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    row = machine.current()
    assert (row["state"], row["kill_code"]) == ("killed", "bench_failed")
    assert f"VASTCTL_CUZK_MEMORY '{memory}' is not a size cuzk reads" in row["kill_reason"]
    assert "fetching parameters" not in machine.text("onstart.log")


# --- the fakes refuse what the real tools do not have -----------------------------------------------------


def run_fake(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FAKES / args[0]), *args[1:]], capture_output=True, text=True, timeout=30, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{VENV_BIN}:/usr/bin:/bin", "FAKES_ROOT": str(tmp_path), **env})


@pytest.mark.slow
@pytest.mark.parametrize("toml,says", [
    ('[daemon]\nlisten = "127.0.0.1:1"\nstatus_port = 9821\n', "unknown field `status_port`"),
    ('[srs]\nparams = "/data/zk/params"\n', "unknown field `params`"),
    ('[memory]\nbudget = "auto"\n', "unknown field `budget`"),
    ('[status]\nlisten = "127.0.0.1:1"\n', "unknown field `status`"),
    ('[daemon]\nlisten = 9820\n', "invalid type for `daemon.listen`"),
])
def test_the_fake_daemon_refuses_config_keys_cuzk_does_not_have(tmp_path, toml, says):
    (tmp_path / "cuzk.toml").write_text(toml)
    done = run_fake(tmp_path, "cuzk", "--config", "cuzk.toml")
    assert done.returncode == 1 and says in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ("cuzk-bench", "batch", "-a", "http://127.0.0.1:1", "-t", "porep", "--c1", "c1.json"),  # -a goes first
    ("cuzk-bench", "batch", "-t", "porep", "--c1", "c1.json", "--count", "-1"),
    ("cuzk-bench", "batch", "-t", "porep", "--c1", "c1.json", "--conc", "5"),  # clap takes no abbreviations
    ("cuzk-bench", "batch", "--type", "porep", "--c1", "c1.json", "-n", "5"),
    ("cuzk-bench", "single", "-t", "porep", "--c1", "c1.json", "-c", "5"),
    ("cuzk", "--status-listen", "127.0.0.1:1"),
])
def test_the_fake_tools_refuse_flags_the_real_ones_do_not_have(tmp_path, args):
    done = run_fake(tmp_path, *args)
    assert done.returncode == 2 and "usage:" in done.stderr


@pytest.mark.slow
def test_the_fake_tools_keep_upstream_defaults(tmp_path):
    dialled = run_fake(tmp_path, "cuzk-bench", "status")  # nothing listens on the default address
    assert dialled.returncode == 1 and "failed to connect to daemon at http://127.0.0.1:9820" in dialled.stderr
    wrong = run_fake(tmp_path, "curio", "fetch-params")
    assert wrong.returncode == 1 and wrong.stderr.startswith("ERROR: incorrect number of arguments")
    fetched = run_fake(tmp_path, "curio", "fetch-params", "32GiB")
    assert fetched.returncode == 0 and any((tmp_path / "var/tmp/filecoin-proof-parameters").glob("*.params"))
    daemon = subprocess.Popen([str(FAKES / "cuzk")], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PATH": f"{VENV_BIN}:/usr/bin:/bin", "FAKES_ROOT": str(tmp_path)})
    try:
        lines = [daemon.stdout.readline() for _ in range(4)]
        assert "using defaults" in lines[0] and "serving on unix://" in lines[-1]
        assert (tmp_path / "run/curio/cuzk.sock").is_socket()
        counted = run_fake(tmp_path, "cuzk-bench", "-a", f"unix://{tmp_path}/run/curio/cuzk.sock", "status")
        assert counted.returncode == 0 and "proofs completed: 0" in counted.stdout
    finally:
        daemon.kill()
        daemon.wait(timeout=10)


# --- the failed-bench report: lifecycle, CLI, HTTP -----------------------------------------------------------


def booting(conn, state="params_done", machine_id=42):
    now = SYSTEM.now()
    lifecycle.create(conn, uuid="u1", label="vastctl-u1", state=lifecycle.State.LAUNCHING, reason="t",
                     source="operator", now=now, fields={"machine_id": machine_id, "vast_id": 420})
    lifecycle.register(conn, "u1", now=now)
    if state == "params_done":
        lifecycle.params_done(conn, "u1", now=now)
    return now


def test_a_failed_bench_kills_once_with_the_reason_and_blocklists_like_a_below_gate_one(conn):
    now = booting(conn)
    with pytest.raises(BenchFailed) as caught:
        lifecycle.bench_failed(conn, "u1", "benchmark completed no proof: completed: 0 failed: 5", now=now)
    assert caught.value.exit_code == 5 and "do not prove" in str(caught.value)
    row = lifecycle.get(conn, "u1")
    assert (row["state"], row["kill_code"], row["bench_rate"]) == ("killed", "bench_failed", None)
    assert row["kill_reason"] == "bench failed: benchmark completed no proof: completed: 0 failed: 5"
    assert blocklist.reason_for(row) is not None
    with pytest.raises(BenchFailed):  # the same report again: the same answer, no second event
        lifecycle.bench_failed(conn, "u1", "a retry", now=now)
    assert len([e for e in conn.execute("SELECT * FROM events WHERE to_state = 'killed'")]) == 1


@pytest.mark.parametrize("reason", ["bad \x1b[2J", "x" * 501, "", "rtl \u202e"])
def test_a_failed_bench_with_an_unprintable_reason_changes_nothing(ready, cli, db_path, reason):
    """Refused where it enters (the command line here; an HTTP body in test_server): bench_failed takes it checked."""
    cli("register", "--uuid", "u1", "--label", "vastctl-u1")
    cli("params-done", "--uuid", "u1")
    result = cli("bench-report", "--uuid", "u1", "--failed", "--reason", reason)
    assert result.code == 2 and result.err.startswith("error: --reason must be 1 to 500 printable characters")
    with pytest.raises(BadInput):
        lifecycle.validate_reason(reason)
    assert sqlite3.connect(db_path).execute("SELECT state FROM instances").fetchone()[0] == "params_done"


def test_a_failed_bench_is_refused_once_the_bench_passed(conn):
    now = booting(conn)
    rates.bench_report(conn, "u1", 60, gate=40, now=now)
    with pytest.raises(Refused, match="is bench_done: a failed bench is reported while it boots"):
        lifecycle.bench_failed(conn, "u1", "late", now=now)
    assert lifecycle.get(conn, "u1")["state"] == "bench_done"


def test_a_failed_bench_from_registered_masks_secrets(conn):
    now = booting(conn, state="registered")
    with pytest.raises(BenchFailed):
        lifecycle.bench_failed(conn, "u1", "parameter fetch failed: Authorization: Bearer sekrit-token-123", now=now)
    row = lifecycle.get(conn, "u1")
    assert "sekrit" not in row["kill_reason"] and "Bearer ***" in row["kill_reason"]


def test_bench_report_failed_on_the_command_line(cli, ready, db_path):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-u1").code == 0
    both = cli("bench-report", "--uuid", "u1", "--rate", "50", "--failed")
    stray = cli("bench-report", "--uuid", "u1", "--rate", "50", "--reason", "why")
    neither = cli("bench-report", "--uuid", "u1")
    assert [r.code for r in (both, stray, neither)] == [2, 2, 2]
    assert all(r.err.startswith("error: ") and r.err.count("\n") == 1 for r in (both, stray, neither))
    failed = cli("bench-report", "--uuid", "u1", "--failed", "--reason", "cuzk exited at start: CUDA error")
    assert failed.code == 5 and "bench failed: cuzk exited at start: CUDA error" in failed.err
    fleet = json.loads(cli("fleet", "--all", "--json").out)
    assert fleet["instances"][0]["kill_reason"] == "bench failed: cuzk exited at start: CUDA error"


def test_launch_hands_the_bench_settings_to_the_machine():
    defaults = onstart.boot_env(config_module.from_mapping({}).launch)
    assert (defaults["VASTCTL_BENCH_COUNT"], defaults["VASTCTL_BENCH_CONCURRENCY"]) == ("5", "5")
    for key in ("bench_count", "bench_concurrency"):
        with pytest.raises(BadInput, match=f"launch.{key}' must be a whole number from 1 to 1000, got 0"):
            config_module.from_mapping({"launch": {key: 0}})


@responses.activate
def test_a_failed_bench_in_remote_mode_sends_the_reason_and_stops_the_machine():
    remote = RemoteReports("https://manager.example.test", "a" * 64, clock=SYSTEM, retry_for=0)
    url = "https://manager.example.test/v1/instances/u1/bench-report"
    said = "instance vastctl-u1: bench failed: cuzk exited at start: CUDA error; it is being killed, do not prove"
    responses.post(url, json={"state": "killed", "passed": False, "reason": said})
    with pytest.raises(BenchFailed) as caught:
        remote.bench_failed("u1", "cuzk exited at start: CUDA error")
    assert caught.value.exit_code == 5 and str(caught.value) == said  # the manager's reason, as it gave it
    assert json.loads(responses.calls[0].request.body) == {"failed": True, "reason": "cuzk exited at start: CUDA error"}
    # a reason of two lines is refused at the command line, before any request (test_remote)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("served"), gate=40).start(0)
    yield m
    m.stop()


def post(manager, uuid, report, body):
    return requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {manager.token(uuid)}"})


@pytest.mark.slow
@pytest.mark.parametrize("body,says", [
    ({"failed": True, "rate": 50}, 'takes "rate" or "failed": true, not both'),
    ({"rate": 50, "reason": "why"}, 'the "reason" field goes with "failed": true'),
    ({"failed": "yes"}, 'the "failed" field must be true or false'),
    ({"failed": True, "reason": "a\nb"}, 'the "reason" field must be 1 to 500 printable characters'),
    ({"failed": True, "reason": "x" * 501}, 'the "reason" field must be 1 to 500 printable characters'),
])
def test_a_bad_failed_bench_body_is_a_400_that_changes_nothing(served, body, says):
    uuid = f"u-{abs(hash(json.dumps(body)))}"
    assert post(served, uuid, "register", {"label": f"vastctl-{uuid[:20]}"}).status_code == 200
    answer = post(served, uuid, "bench-report", body)
    assert answer.status_code == 400 and says in answer.json()["error"], answer.text
    assert served.rows()[uuid]["state"] == "registered"


@pytest.mark.slow
def test_a_failed_bench_over_http_is_answered_and_repeated_alike(served):
    assert post(served, "u-http", "register", {"label": "vastctl-http"}).status_code == 200
    first = post(served, "u-http", "bench-report", {"failed": True, "reason": "warm-up proof failed: CUDA error"})
    again = post(served, "u-http", "bench-report", {"failed": True, "reason": "warm-up proof failed: CUDA error"})
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert first.json()["passed"] is False and first.json()["state"] == "killed"
    assert "bench failed: warm-up proof failed: CUDA error" in first.json()["reason"]
    assert len([e for e in served.events("u-http") if e["to_state"] == "killed"]) == 1
    assert post(served, "u-http", "heartbeat", {}).status_code == 409


# --- the boot script stops with a reason when a launched machine lacks what it needs ------------------


def _boot(tmp_path, path_dirs, **env):
    log = tmp_path / "onstart.log"
    base = {"PATH": ":".join([*map(str, path_dirs), "/usr/bin", "/bin"]), "HOME": str(tmp_path),
            "VASTCTL_LOG": str(log), "VASTCTL_ZK_DIR": str(tmp_path / "zk"), "VASTCTL_SERVER": "http://127.0.0.1:9",
            "VASTCTL_TOKEN": "t", "VASTCTL_UUID": "u1", "VASTCTL_LABEL": "vastctl-u1"}
    # its own session: the dead-man switch it starts outlives a script that stops, as on a machine, and is ended here
    script = subprocess.Popen(["bash", str(ROOT / "vastctl" / "machine" / "templates" / "onstart.sh")],
                              env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        script.communicate(timeout=30)
    finally:
        try:
            os.killpg(script.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return script.returncode, log.read_text()


@pytest.mark.slow
def test_the_boot_script_stops_with_a_reason_when_vastctl_has_no_source(tmp_path):
    code, log = _boot(tmp_path, [])
    assert code == 1 and "no vastctl in the image and launch.vastctl_source is empty" in log


@pytest.mark.slow
def test_the_boot_script_stops_with_a_reason_when_the_provers_are_missing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vastctl"
    fake.write_text("#!/bin/sh\necho \"$@\" >> \"$HOME/reports\"\n")
    fake.chmod(0o755)
    code, log = _boot(tmp_path, [bin_dir], VASTCTL_INSTALL="true")
    assert code == 1 and "curio missing: set launch.install or launch.image" in log
    assert (tmp_path / "reports").read_text().startswith("register")


def test_jobs_onstart_is_the_shipped_template():
    assert (ROOT / "jobs" / "onstart.sh").read_text() == (ROOT / "vastctl" / "machine" / "templates" / "onstart.sh").read_text()
