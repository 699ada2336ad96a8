"""vast's webhooks against a real `vastctl serve` on loopback, with a loopback fake of vast behind it.

A signed `offline` delivery gets the machine vast lists offline killed within seconds (cron would take a
minute or more); refused deliveries record and wake nothing; one event delivered three times is one event
and one wake. Each wake writes one log line naming the deliveries it serves, which is how the tests count.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests
from helpers.deployment_sandbox import GUIDE, Sandbox, commands
from helpers.fake_vast import KEY, FakeVast, FakeVastHandler
from helpers.serving import Manager, free_port, on_a_thread, query, run_vastctl, wait_for

from vastctl.clock import SYSTEM
from vastctl.serving import webhooks

pytestmark = pytest.mark.slow  # real processes and servers on loopback

SECRET = "whsec_serve_test_0123456789abcdef"
WAKE = re.compile(r"webhook wake for (\d+) delivery\(ies\) \(([^)]*)\): (\d+) reconcile pass\(es\), (\d+) agent step")


class CountingHandler(FakeVastHandler):
    def do_GET(self):
        if self.path.startswith("/api/v1/instances/"):
            with self.server.lock:
                self.server.listings += 1
                self.server.flap_step()
        super().do_GET()


class CountingVast(FakeVast):
    def __init__(self):
        super().__init__()
        self.RequestHandlerClass = CountingHandler
        self.listings = 0
        self.flap: dict[int, float] = {}  # vast_id → seconds it is listed offline from the next listing on
        self.flap_ends: dict[int, float] = {}

    def flap_step(self):
        """vast's own short `offline`: from the first listing after it was asked for, for that many seconds."""
        for vast_id, seconds in list(self.flap.items()):
            ends = self.flap_ends.setdefault(vast_id, time.monotonic() + seconds)
            self.instances[vast_id]["actual_status"] = "offline" if time.monotonic() < ends else "running"


@pytest.fixture
def vast():
    with on_a_thread(CountingVast()) as server:
        yield server


def start_manager(home, vast, *, min_interval="10s", confirm="", confirm_after="3s") -> Manager:
    m = Manager(home)
    port = free_port()
    m.config_path.write_text(
        f"server:\n  url: http://127.0.0.1:{port}\n  admin_token: admin-token-for-tests-0123456789\n"
        f"  webhook_min_interval: {min_interval}\n" + (f"  webhook_confirm_after: {confirm}\n" if confirm else "")
        + f"reconcile:\n  confirm_after: {confirm_after}\n"
        "fleet:\n  min_bench_rate: 40\n  max_dph: 1.0\n"
        "launch:\n  vastctl_source: vastctl==0.1.0\n  install: /opt/provers/install.sh\n"
    )
    webhooks.add_secret(m.db_path.with_name(m.db_path.name + ".webhook-secret"), SECRET, now=SYSTEM.now())
    m.env.update(VAST_API_KEY=KEY, VAST_API_URL=vast.url)
    return m.start(port)


@pytest.fixture
def manager(tmp_path, vast):
    m = start_manager(tmp_path / "manager", vast, min_interval="1s")
    yield m
    assert m.stop() == 0


def deliver(manager, event_id, notif_type="offline", *, secret=SECRET, age=0, attempt=1, body=None, signature=None):
    timestamp = str(int(time.time()) - age)
    if body is None:
        body = json.dumps({"event_id": event_id, "user_id": 123, "notif_type": notif_type,
                           "subject": "Instance offline", "message": "An instance on machine 9001 went offline",
                           "timestamp": float(timestamp)}).encode()
    headers = {"Content-Type": "application/json", "X-Vast-Event-Id": event_id, "X-Vast-Delivery-Attempt": str(attempt),
               "X-Vast-Timestamp": timestamp,
               "X-Vast-Signature-256": signature or webhooks.signature(secret.encode(), timestamp.encode(), body)}
    return requests.post(f"{manager.url}{webhooks.PATH}", data=body, headers=headers, timeout=10)


def wakes(manager) -> list[tuple[list[str], int, int]]:
    """(event ids, reconcile passes, agent steps) of each wake the log has finished."""
    return [([one for one in found[1].split(", ") if one], int(found[2]), int(found[3]))
            for found in WAKE.findall(manager.log())]


def vast_events(manager):
    return query(manager.db_path, "SELECT * FROM events WHERE source = 'vast' ORDER BY id")


def launched_and_listed(manager, vast):
    """The operator's environment and one machine launched at the fake vast, seen running by a reconcile pass
    (cron's last before the delivery)."""
    operator = {**manager.env, "VAST_API_KEY": KEY, "VAST_API_URL": vast.url}
    launched = run_vastctl("launch", "--gpu", "RTX 4090", "--json", env=operator)
    assert launched.returncode == 0, launched.stderr
    (machine,) = json.loads(launched.stdout)["launched"]
    assert run_vastctl("reconcile", env=operator).returncode == 0
    return operator, machine


def test_an_offline_delivery_gets_the_machine_vast_lists_offline_killed_within_seconds(tmp_path, vast):
    manager = start_manager(tmp_path / "manager", vast)  # the shipped rate limit: 10s between wakes
    try:
        operator, machine = launched_and_listed(manager, vast)
        vast.instances[machine["vast_id"]]["actual_status"] = "offline"

        started = time.monotonic()
        answer = deliver(manager, "evt-offline-1")
        assert answer.status_code == 200 and answer.json()["duplicate"] is False
        assert time.monotonic() - started < 1.0  # answered before the safety net runs

        def killed():
            return [e for e in manager.events(machine["uuid"]) if e["to_state"] == "killed"]

        (kill,) = wait_for(killed, timeout=15, what="the kill event")
        latency = time.monotonic() - started
        assert latency < 15
        assert (kill["source"], kill["code"]) == ("reconcile", "offline")
        wait_for(lambda: vast.instances == {}, timeout=15, what="the destroy")  # the pass that killed destroyed it
        print(f"delivery → kill event: {latency:.1f}s")  # shown with -s: the latency cron's minute would be
        (wake,) = wait_for(lambda: wakes(manager), what="the wake's log line")
        assert wake == (["evt-offline-1"], 2, 1)  # one listing, then the confirming one the rule needs
        (event,) = vast_events(manager)
        assert (event["kind"], event["code"], event["uuid"]) == ("webhook", "offline", None)
    finally:
        assert manager.stop() == 0


def test_a_seven_second_offline_flap_with_its_delivery_kills_nobody(tmp_path, vast):
    # vast lists the machine offline for 7 s and says so by webhook; a wake's two listings 1 s apart both see it
    manager = start_manager(tmp_path / "manager", vast, confirm="1s", confirm_after="12s")
    try:
        operator, machine = launched_and_listed(manager, vast)
        with vast.lock:
            vast.flap[machine["vast_id"]] = 7.0
        assert deliver(manager, "evt-flap-1").status_code == 200

        (wake,) = wait_for(lambda: wakes(manager), timeout=40, what="the wake's log line")
        assert wake == (["evt-flap-1"], 2, 1)  # it listed again, 12 s on: vast had it running again
        assert vast.flap_ends and vast.instances[machine["vast_id"]]["actual_status"] == "running"
        assert run_vastctl("reconcile", env=operator).returncode == 0  # and cron's next pass
        assert [e for e in manager.events(machine["uuid"]) if e["to_state"] == "killed"] == []
        (row,) = query(manager.db_path, "SELECT state, destroyed_at FROM instances")
        assert (row["state"], row["destroyed_at"]) == ("launching", None)
        assert machine["vast_id"] in vast.instances
    finally:
        assert manager.stop() == 0


def test_refused_deliveries_record_nothing_and_wake_nothing(manager, vast):
    accepted = deliver(manager, "evt-1")
    assert accepted.status_code == 200
    wait_for(lambda: wakes(manager), what="the first wake")
    listings = vast.listings

    assert deliver(manager, "evt-2", secret="whsec_someone_else_0123456789ab").status_code == 401
    assert deliver(manager, "evt-3", age=301).status_code == 401
    assert deliver(manager, "evt-4", age=-301).status_code == 401
    big = json.dumps({"event_id": "evt-5", "notif_type": "offline", "message": "x" * webhooks.MAX_BODY}).encode()
    too_big = deliver(manager, "evt-5", body=big)
    assert too_big.status_code == 413 and "limit" in too_big.json()["error"]
    replay = deliver(manager, "evt-1")  # the same delivery again, freshly signed: a duplicate
    assert replay.status_code == 200 and replay.json()["duplicate"] is True
    body = json.dumps({"event_id": "evt-1", "notif_type": "offline"}).encode()
    stale = str(int(time.time()) - 400)
    captured = webhooks.signature(SECRET.encode(), stale.encode(), body)
    old = requests.post(f"{manager.url}{webhooks.PATH}", data=body, timeout=10, headers={
        "X-Vast-Event-Id": "evt-1", "X-Vast-Timestamp": stale, "X-Vast-Signature-256": captured})
    assert old.status_code == 401  # a capture replayed later is stale

    assert [e["code"] for e in vast_events(manager)] == ["offline"]
    assert [d["event_id"] for d in query(manager.db_path, "SELECT event_id FROM webhook_deliveries")] == ["evt-1"]
    assert deliver(manager, "evt-6").status_code == 200  # a barrier: its wake comes after any a refusal caused
    wait_for(lambda: any("evt-6" in ids for ids, _, _ in wakes(manager)), what="the barrier's wake")
    assert [ids for ids, _, _ in wakes(manager)] == [["evt-1"], ["evt-6"]]
    assert vast.listings == listings + 1  # the barrier's pass, nothing for the refused ones


def test_the_same_event_three_times_is_one_event_and_one_pass(manager, vast):
    answers = [deliver(manager, "evt-same", attempt=n) for n in (1, 2, 3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["duplicate"] for a in answers] == [False, True, True]
    wait_for(lambda: wakes(manager), what="the first wake")
    assert deliver(manager, "evt-barrier").status_code == 200
    wait_for(lambda: any("evt-barrier" in ids for ids, _, _ in wakes(manager)), what="the barrier's wake")
    assert wakes(manager) == [(["evt-same"], 1, 1), (["evt-barrier"], 1, 1)]
    assert [e["code"] for e in vast_events(manager)] == ["offline", "offline"]
    assert query(manager.db_path, "SELECT count(*) AS n FROM vast_listings")[0]["n"] == 2  # one pass each
    deliveries = query(manager.db_path, "SELECT event_id, attempt FROM webhook_deliveries ORDER BY event_id")
    assert deliveries == [{"event_id": "evt-barrier", "attempt": 1}, {"event_id": "evt-same", "attempt": 1}]


# --- the guide's section, as written ----------------------------------------------------------------------


def test_the_guides_webhook_commands_run_as_written(tmp_path):
    import subprocess

    (number,) = re.findall(r"^## (\d+)\. vast's webhooks", GUIDE.read_text(), flags=re.M)
    sandbox = Sandbox(tmp_path / "host")
    sandbox.set_up()
    lines = [sandbox.runnable(line) for line in commands(number)]
    assert None not in lines
    add, events, rotate, retire, backup = lines
    secret_file = sandbox.path("/var/lib/vastctl/vastctl.db.webhook-secret")

    def sh(line, stdin=""):
        done = subprocess.run(["sh", "-c", line], env=sandbox.env, input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        return done

    assert SECRET not in sh(add, SECRET + "\n").stderr
    assert webhooks.read_secrets(secret_file) == [SECRET.encode()] and secret_file.stat().st_mode & 0o777 == 0o600
    sh(events)
    sh(rotate, "whsec_rotated_0123456789abcdef01\n")
    assert len(webhooks.read_secrets(secret_file)) == 2
    assert "retired 1 old webhook secret" in sh(retire).stderr
    assert webhooks.read_secrets(secret_file) == [b"whsec_rotated_0123456789abcdef01"]
    sandbox.sh("install -d -m 700 " + str(sandbox.path("/var/lib/vastctl/backups")))
    sh(backup)
    copy = sandbox.path("/var/lib/vastctl/backups/vastctl.db.webhook-secret")
    assert copy.read_text() == secret_file.read_text() and copy.stat().st_mode & 0o777 == 0o600
