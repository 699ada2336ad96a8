"""The machines' dead-man switch: a machine the manager no longer answers, or that the manager killed, destroys
its own instance with its per-instance key, so a dead manager host does not leave the fleet billing.

The real boot script runs under bash against the fakes of tests/fakes (the harness of helpers/boot.py) and reports to
a real `vastctl serve`; vast's instance API, as an instance calls it from inside, is a loopback fake that records
every request. Durations are short and set the way launch.env would set them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import responses
from helpers.boot import Machine
from helpers.serving import free_port, run_vastctl, wait_for

from vastctl import config as config_module
from vastctl.clock import VirtualClock
from vastctl.errors import BadInput, Refused, Unavailable
from vastctl.machine import onstart
from vastctl.machine.remote import RemoteReports

INSTANCE_KEY = "per-instance-key-0123456789abcdef"
ORPHAN_S = 4
FAST = {"VASTCTL_ORPHAN_AFTER_S": str(ORPHAN_S), "VASTCTL_WATCHDOG_S": "0.2", "VASTCTL_LAST_TRY_FOR": "1s",
        "CONTAINER_API_KEY": INSTANCE_KEY}


class Recorder(ThreadingHTTPServer):
    """A loopback HTTP server answering every request with one status, and recording each."""

    daemon_threads = True

    def __init__(self, status: int, body: dict, port: int = 0):
        self.status, self.body, self.requests = status, body, []
        self.arrived: list[float] = []  # time.monotonic() of each request, in order


        class Handler(BaseHTTPRequestHandler):
            def _any(handler):
                length = int(handler.headers.get("Content-Length") or 0)
                self.requests.append({"method": handler.command, "path": handler.path,
                                      "auth": handler.headers.get("Authorization"),
                                      "body": handler.rfile.read(length).decode()})
                self.arrived.append(time.monotonic())
                data = json.dumps(self.body).encode()
                handler.send_response(self.status)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                handler.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", port), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def instance_api():
    """vast's API as the instance's own key reaches it: a destroy answers {"success": true}."""
    server = Recorder(200, {"success": True})
    yield server
    server.close()


@pytest.fixture
def machine(manager, vast, tmp_path):
    m = Machine(manager, vast, tmp_path / "machine")
    yield m
    m.stop()


def boot(machine: Machine, instance_api: Recorder, **knobs: str) -> Machine:
    return machine.boot(**{**FAST, "VASTCTL_VAST_URL": instance_api.url, **knobs})


def wait_until(predicate, what: str, machine: Machine, timeout: float = 240) -> None:
    """Wait for what the boot script does; the bound only stops a hung test (a loaded machine took ~50 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}:\n{machine.text('onstart.log')}")


def sandbox_empty(machine: Machine) -> bool:
    """Nothing of the boot is left: the script, its watchdog and the prover have all exited."""
    if machine.proc.poll() is None:
        return False
    try:
        os.killpg(machine.proc.pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_destroyed_itself_once(machine: Machine, instance_api: Recorder) -> None:
    wait_until(lambda: instance_api.requests, "the machine never called vast's destroy", machine)
    wait_until(lambda: sandbox_empty(machine), "the boot's processes are still running after the destroy", machine)
    assert instance_api.requests == [{"method": "DELETE", "path": "/api/v0/instances/5001/",
                                      "auth": f"Bearer {INSTANCE_KEY}", "body": "{}"}]
    assert not machine.daemon_answers()  # it stopped proving


def running(machine: Machine) -> None:
    machine.wait_for(lambda r: r["state"] == "running" and r["last_heartbeat_at"], "running with heartbeats")


# --- the switch, in the real boot script -----------------------------------------------------------------


@pytest.mark.slow
def test_a_machine_whose_manager_is_gone_destroys_itself_once_after_orphan_after(machine, instance_api):
    boot(machine, instance_api)
    running(machine)
    assert instance_api.requests == []  # heartbeats answered: nothing happens however long it runs
    machine.manager.stop()
    stopped = time.monotonic()
    assert_destroyed_itself_once(machine, instance_api)
    assert time.monotonic() - stopped >= ORPHAN_S - 1  # not before orphan_after (whole seconds on the machine)
    log = machine.text("onstart.log")
    assert f"no answer from the manager for {ORPHAN_S}s: one last heartbeat" in log
    assert "destroying this instance: orphaned" in log and "vastctl-onstart: destroyed" in log


@pytest.mark.slow
def test_a_manager_answering_5xx_is_alive_and_the_machine_keeps_proving(machine, instance_api):
    # orphan_after longer here: between two 5xx answers a report backs off for seconds (a log push retries
    # for 9 s), which a 4 h orphan_after never notices and a 4 s one would
    orphan_s = 10
    boot(machine, instance_api, VASTCTL_RETRY_FOR="2s", VASTCTL_ORPHAN_AFTER_S=str(orphan_s))
    running(machine)
    port = machine.manager.port
    machine.manager.stop()
    failing = Recorder(503, {"error": "upgrading"}, port=port)  # the TLS proxy's answer while serve restarts
    try:
        contact = machine.zk / "manager-contact"
        ages = []
        started = time.monotonic()

        def watched() -> bool:  # twice orphan_after of nothing but 5xx, and three heartbeats answered 5xx
            seen = time.monotonic() - started
            beats = sum(r["path"].endswith("/heartbeat") for r in failing.requests)
            return seen >= 2 * orphan_s and (beats >= 3 or seen >= 6 * orphan_s)

        while not watched():  # a loaded machine reports less often: the window grows until it has seen three
            ages.append(time.time() - int(contact.read_text()))
            time.sleep(0.2)
        # each 5xx answer was noted as contact (the file holds whole seconds, and on a loaded machine a report's
        # process takes a second to start): never as old as orphan_after
        assert max(ages) < orphan_s, ages
        # the heartbeat loop kept reporting (heartbeats, and the log tails it pushes beside them)
        paths = [r["path"] for r in failing.requests]
        assert all(path.endswith(("/heartbeat", "/log")) for path in paths), paths
        assert sum(path.endswith("/heartbeat") for path in paths) >= 3, paths
        assert instance_api.requests == [] and machine.proc.poll() is None and machine.daemon_answers()
        assert "one last heartbeat" not in machine.text("onstart.log")
    finally:
        failing.close()
    assert_destroyed_itself_once(machine, instance_api)  # once nothing answers at all, the switch still works


@pytest.mark.slow
def test_a_contact_file_that_cannot_be_written_is_not_silence_while_the_manager_answers(machine, instance_api):
    # a full disk: the heartbeat is answered but its contact note cannot land (here the file's place is taken by a
    # directory, so the note's rename fails and the switch cannot read the file either, even as root)
    boot(machine, instance_api)
    running(machine)
    contact = machine.zk / "manager-contact"
    contact.unlink()
    contact.mkdir()
    (contact / "taken").write_text("full")
    wait_until(lambda: machine.text("onstart.log").count("the manager answered (exit 0): carrying on") >= 2,
               "the switch never heard the manager answer its last heartbeat", machine)
    assert instance_api.requests == [] and machine.proc.poll() is None and machine.daemon_answers()
    assert "destroying this instance" not in machine.text("onstart.log")
    machine.manager.stop()  # and once nothing answers at all, the switch still works
    assert_destroyed_itself_once(machine, instance_api)


@pytest.mark.slow
def test_a_killed_machine_destroys_itself_at_once(machine, instance_api):
    boot(machine, instance_api, VASTCTL_ORPHAN_AFTER_S="3600")
    running(machine)
    run_vastctl("kill", machine.label, "--reason", "rotating the fleet", "--force", env=machine.operator)
    assert machine.current()["state"] == "killed"  # (the manager's own destroy goes to the fake of its listing)
    assert machine.wait_exit() == 0, machine.text("onstart.log")
    assert_destroyed_itself_once(machine, instance_api)
    log = machine.text("onstart.log")
    assert "the manager refused the heartbeat (exit 3): stopping" in log
    assert "destroying this instance: killed by the manager" in log


@pytest.mark.slow
def test_a_machine_that_never_reaches_the_manager_gives_up_after_orphan_after(machine, instance_api):
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: every report is refused at connect
    boot(machine, instance_api, VASTCTL_SERVER=nobody, VASTCTL_RETRY_FOR="1s")
    assert machine.wait_exit() == 1  # register gave up; the watchdog outlives the script
    assert "register failed" in machine.text("onstart.log")
    assert_destroyed_itself_once(machine, instance_api)


@pytest.mark.slow
def test_the_switch_can_be_turned_off(machine, instance_api):
    nobody = f"http://127.0.0.1:{free_port()}"
    boot(machine, instance_api, VASTCTL_SERVER=nobody, VASTCTL_RETRY_FOR="1s", VASTCTL_ORPHAN_AFTER_S="0")
    assert machine.wait_exit() == 1, machine.text("onstart.log")
    wait_until(lambda: sandbox_empty(machine), "a watchdog runs although launch.orphan_after is 0", machine, timeout=10)
    assert instance_api.requests == []


# --- what the switch reads: the manager's answers, any status, noted by the instance commands ----------------


def remote(tmp_path: Path, clock: VirtualClock) -> RemoteReports:
    return RemoteReports.from_env({"VASTCTL_SERVER": "https://manager.example", "VASTCTL_TOKEN": "t0ken",
                                   "VASTCTL_RETRY_FOR": "2s", "VASTCTL_CONTACT_FILE": str(tmp_path / "contact")},
                                  clock=clock)


@responses.activate
def test_every_answer_is_noted_as_contact_and_an_unreachable_manager_is_not(tmp_path):
    from datetime import datetime, timezone

    clock = VirtualClock(datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc))
    url = "https://manager.example/v1/instances/u1/heartbeat"
    contact = tmp_path / "contact"
    responses.post(url, body=requests.ConnectionError("Connection refused"))
    with pytest.raises(Unavailable):
        remote(tmp_path, clock).heartbeat("u1")
    assert not contact.exists()  # nobody answered

    responses.replace(responses.POST, url, status=503, json={"error": "upgrading"})
    with pytest.raises(Unavailable):
        remote(tmp_path, clock).heartbeat("u1")
    assert int(contact.read_text()) == int(clock.now().timestamp())  # a 5xx, the last retry's, is an answer

    clock.advance(60)
    responses.replace(responses.POST, url, status=409, json={"error": "instance x was killed: stop proving"})
    with pytest.raises(Refused):
        remote(tmp_path, clock).heartbeat("u1")
    assert int(contact.read_text()) == int(clock.now().timestamp())

    clock.advance(60)
    responses.replace(responses.POST, url, status=200, json={"state": "running"})
    assert remote(tmp_path, clock).heartbeat("u1")["state"] == "running"
    assert int(contact.read_text()) == int(clock.now().timestamp())
    assert not list(tmp_path.glob("contact.*"))  # written whole, no part left behind


@responses.activate
def test_a_contact_file_that_cannot_be_written_does_not_fail_the_report(tmp_path):
    from datetime import datetime, timezone

    clock = VirtualClock(datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc))
    responses.post("https://manager.example/v1/instances/u1/heartbeat", status=200, json={"state": "running"})
    reports = RemoteReports("https://manager.example", "t0ken", clock=clock,
                            contact_file=str(tmp_path / "no-such-dir" / "contact"))
    assert reports.heartbeat("u1")["state"] == "running"


# --- launch.orphan_after ---------------------------------------------------------------------------------


def test_orphan_after_reaches_the_machine_and_defaults_to_four_hours():
    assert onstart.boot_env(config_module.from_mapping({}).launch)["VASTCTL_ORPHAN_AFTER_S"] == "14400"
    configured = config_module.from_mapping({"launch": {"orphan_after": "6h"}})
    assert onstart.boot_env(configured.launch)["VASTCTL_ORPHAN_AFTER_S"] == "21600"
    assert onstart.boot_env(config_module.from_mapping({"launch": {"orphan_after": 0}}).launch)[
        "VASTCTL_ORPHAN_AFTER_S"] == "0"


@pytest.mark.parametrize("raw, says", [
    ({"launch": {"orphan_after": "90m"}}, "timeouts.params_done is 5400s"),
    ({"launch": {"orphan_after": "5h"}, "timeouts": {"registered": "5h"}}, "timeouts.registered is 18000s"),
    ({"launch": {"orphan_after": "soon"}}, "launch.orphan_after: expected a duration"),
])
def test_an_orphan_after_a_healthy_boot_could_outlast_is_refused(raw, says):
    with pytest.raises(BadInput, match=says):
        config_module.from_mapping(raw)


@pytest.mark.slow
def test_the_cli_refuses_a_short_orphan_after_with_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("launch:\n  orphan_after: 10m\n")
    done = run_vastctl("fleet", env={"VASTCTL_CONFIG": str(config), "VASTCTL_DB": str(tmp_path / "x.db")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "launch.orphan_after" in done.stderr and not (tmp_path / "x.db").exists()


# --- what the manager shows: each machine's last contact, and a warning before the fleet gives up ---------


def test_fleet_shows_each_machines_last_contact_and_warns_before_the_fleet_gives_up(conn, config):
    from datetime import datetime, timedelta, timezone

    from vastctl.serving import dashboard_page
    from vastctl.state import lifecycle, rates
    from vastctl.views import fleet

    t0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
    for uuid, label in (("u-boot", "vastctl-boot"), ("u-run", "vastctl-run")):
        lifecycle.create(conn, uuid=uuid, label=label, state="launching", reason="launch", source="operator", now=t0,
                         fields={"vast_id": 7 if uuid == "u-boot" else 8})
    lifecycle.register(conn, "u-boot", now=t0 + timedelta(minutes=5))  # a report that changes state
    lifecycle.register(conn, "u-run", now=t0 + timedelta(minutes=2))
    rates.heartbeat(conn, "u-run", now=t0 + timedelta(minutes=30))  # a report that records no event

    def view(now):
        return fleet.fleet_view(conn, config, now=now)

    fresh = view(t0 + timedelta(minutes=31))
    contact = {i["label"]: i["last_contact_at"] for i in fresh["instances"]}
    assert contact == {"vastctl-boot": "2026-12-01T08:05:00Z", "vastctl-run": "2026-12-01T08:30:00Z"}
    assert (fresh["summary"]["last_contact_at"], fresh["summary"]["contact_age_s"]) == ("2026-12-01T08:30:00Z", 60)
    assert fresh["summary"]["orphan_after_s"] == 14400 and fresh["summary"]["orphan_warning"] is None

    def live(v, now):
        return dashboard_page.live_fragment({"now": now, "instances": v["instances"], "summary": {
            **v["summary"], "settings": {"max_hourly_spend": 10, "max_dph": 1, "max_instances": 10},
            "pending_capacity_proofs_per_hour": 0, "demand": None, "destroys_pending": {"count": 0},
            "reconcile": {"last_success": None, "last_error": None, "failures_last_day": 0}},
            "events": [], "steps": []})

    assert "orphan-warning" not in live(fresh, t0 + timedelta(minutes=31))
    late = t0 + timedelta(minutes=30, hours=2, seconds=1)  # half of orphan_after since the fleet's newest report
    warned = view(late)
    assert warned["summary"]["orphan_warning"].startswith(
        "no machine has reached the manager for 2h: they destroy themselves in 1h59m (launch.orphan_after 4h)")
    assert 'id="orphan-warning"' in live(warned, late) and "destroy themselves in 1h59m" in live(warned, late)


def test_the_fleet_table_has_a_contact_column_and_the_warning(cli, store):
    from datetime import timedelta

    from vastctl.clock import SYSTEM
    from vastctl.state import lifecycle

    lifecycle.create(store, uuid="u-1", label="vastctl-quiet", state="launching", reason="launch", source="operator",
                     now=SYSTEM.now() - timedelta(hours=3), fields={"vast_id": 9})
    done = cli("fleet")
    assert done.code == 0 and "contact" in done.out.splitlines()[0]
    assert done.err.startswith("warning: no machine has reached the manager for 3h: they destroy themselves in ")
    assert "(launch.orphan_after 4h)" in done.err.splitlines()[0]
    lifecycle.register(store, "u-1", now=SYSTEM.now())
    done = cli("fleet")
    assert done.code == 0 and "warning" not in done.err


# --- the loader a long boot script is sent as: the switch holds before the script itself is on the machine ----


def start_loader(tmp_path: Path, server: str, instance_api: Recorder, **knobs: str) -> subprocess.Popen:
    """The loader as vast runs it, in a process group of its own; its stderr piped."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "VASTCTL_SERVER": server, "VASTCTL_UUID": "u-1",
           "VASTCTL_TOKEN": "t0ken", "CONTAINER_ID": "5001", "CONTAINER_API_KEY": INSTANCE_KEY,
           "VASTCTL_VAST_URL": instance_api.url, "VASTCTL_LOADER_RETRY_S": "0.2", **knobs}
    return subprocess.Popen(["bash", "-c", onstart.loader("#!/bin/bash\necho booted\n")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_loader(tmp_path: Path, server: str, instance_api: Recorder, *, timeout: float = 60, **knobs: str):
    """The loader as vast runs it; (exit status, stderr), or (None, stderr) when it was still running at `timeout`."""
    proc = start_loader(tmp_path, server, instance_api, **knobs)
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[1]


DESTROY = {"method": "DELETE", "path": "/api/v0/instances/5001/", "auth": f"Bearer {INSTANCE_KEY}", "body": "{}"}


@pytest.mark.slow
def test_a_loader_that_never_reaches_the_manager_destroys_its_instance_after_orphan_after(tmp_path, instance_api):
    started = time.monotonic()
    code, err = run_loader(tmp_path, f"http://127.0.0.1:{free_port()}", instance_api, VASTCTL_ORPHAN_AFTER_S="2")
    assert code == 1 and "destroying this instance" in err
    assert time.monotonic() - started >= 1  # not before orphan_after (whole seconds on the machine)
    assert instance_api.requests == [DESTROY]


@pytest.mark.slow
def test_a_loader_told_409_destroys_at_once(tmp_path, instance_api):
    killed = Recorder(409, {"error": "instance x was killed: its token is no longer accepted"})
    try:
        code, err = run_loader(tmp_path, killed.url, instance_api, VASTCTL_ORPHAN_AFTER_S="3600")
    finally:
        killed.close()
    assert code == 1 and "(last answer 409)" in err
    assert len(killed.requests) == 1 and instance_api.requests == [DESTROY]


@pytest.mark.slow
def test_a_loader_whose_manager_answers_5xx_keeps_asking_and_destroys_nothing(tmp_path, instance_api):
    failing = Recorder(503, {"error": "upgrading"})
    orphan_after = 1
    proc = start_loader(tmp_path, failing.url, instance_api, VASTCTL_ORPHAN_AFTER_S=str(orphan_after))

    def answered_5xx_for_three_orphan_afters() -> bool:
        arrived = list(failing.arrived)
        return len(arrived) >= 5 and arrived[-1] - arrived[0] >= 3 * orphan_after

    try:  # however slow the host, until the loader heard 5xx for three times orphan_after, or it exited
        wait_for(lambda: answered_5xx_for_three_orphan_afters() or proc.poll() is not None,
                 "5xx answers for three times orphan_after", timeout=240)  # the timeout only stops a hung test
        still_asking = proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        err = proc.communicate()[1]
        failing.close()
    assert answered_5xx_for_three_orphan_afters(), err
    assert still_asking and instance_api.requests == [], err
