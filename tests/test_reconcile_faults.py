"""reconcile through the real vast client against a misbehaving API (`responses`).

In every case: nothing alive is killed, nothing killed is left billing once
vast answers again, and the exit code is the contract's.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import requests
import responses
from test_provider_vast import RecordingClock, hang

from vastctl import clock
from vastctl.cli.app import Globals
from vastctl.state import lifecycle

API = "http://vast.test"
LIST = f"{API}/api/v1/instances/"
KEY = "test-key-123"


@pytest.fixture
def api(monkeypatch):
    """vast mocked on the wire; every pass runs on one virtual clock (`api.clock`), so backoff never really sleeps."""
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("VAST_API_URL", API)
    virtual = RecordingClock(clock.SYSTEM.now())  # the rows below are written at wall-clock times
    monkeypatch.setattr(Globals, "clock", virtual)  # the command's one clock
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        mock.clock, mock.sleeps = virtual, virtual.sleeps
        yield mock


def instance(vast_id, label, status="running", **extra):
    return {"id": vast_id, "label": label, "actual_status": status, "intended_status": "running",
            "cur_state": "running", "status_msg": "success", "machine_id": 1000 + vast_id, "gpu_name": "RTX 4090",
            "num_gpus": 1, "dph_total": 0.4, **extra}


def page(items, next_token=None, total=None):
    body = {"success": True, "instances": items, "next_token": next_token}
    if total is not None:
        body["total_instances"] = total
    return body


def fleet(store, n=4, stale=()):
    """n running rows vastctl-0…; those in `stale` have not sent a heartbeat for 30 minutes."""
    now = clock.SYSTEM.now()
    items = []
    for i in range(n):
        label = f"vastctl-{i}"
        lifecycle.create(store, uuid=f"u{i}", label=label, state=lifecycle.State.LAUNCHING, reason="launched",
                         source="operator", now=now - timedelta(hours=1), fields={"vast_id": 100 + i})
        beat = now - timedelta(minutes=30 if i in stale else 1)
        store.execute("UPDATE instances SET state = 'running', last_heartbeat_at = ? WHERE uuid = ?",
                      (clock.to_iso(beat), f"u{i}"))
        items.append(instance(100 + i, label))
    return items


def states(store):
    return {r["label"]: (r["state"], r["destroyed_at"] is not None)
            for r in store.execute("SELECT label, state, destroyed_at FROM instances")}


def all_alive(store, n=4):
    fleet_rows = {label: seen for label, seen in states(store).items() if label != "vastctl-evil"}
    return fleet_rows == {f"vastctl-{i}": ("running", False) for i in range(n)}


def test_listing_goes_through_every_page_with_the_key_in_the_header(store, cli, api):
    items = fleet(store, 30)
    api.get(LIST, json=page(items[:25], next_token="t1", total=30))
    api.get(LIST, json=page(items[25:], total=30))
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["actions"] == [] and all_alive(store, 30)
    first, second = api.calls
    assert first.request.method == "GET" and first.request.url.startswith(LIST)
    assert first.request.headers["Authorization"] == f"Bearer {KEY}" and KEY not in first.request.url
    assert "after_token=t1" in second.request.url


@pytest.mark.parametrize("failure", [
    pytest.param({"status": 500, "json": {"error": "server_error"}}, id="500"),
    pytest.param({"status": 503, "body": "upstream down"}, id="503"),
    pytest.param({"body": requests.exceptions.ReadTimeout("read timed out")}, id="read-timeout"),
    pytest.param({"body": requests.exceptions.ConnectTimeout("connect timed out")}, id="connect-timeout"),
    pytest.param({"body": requests.exceptions.ConnectionError("connection refused")}, id="connection-error"),
    pytest.param({"status": 429, "json": {"detail": "API requests too frequent endpoint threshold=1.0"}}, id="429"),
    pytest.param({"status": 200, "body": '{"success": true, "instances": [{"id": 100, "label": "vas'},
                 id="truncated-json"),
    pytest.param({"status": 200, "json": {"success": True}}, id="no-instances-key"),
    pytest.param({"status": 200, "json": ["not", "an", "object"]}, id="not-an-object"),
    pytest.param({"status": 200, "json": {"success": False, "msg": "Invalid user key"}}, id="success-false"),
    pytest.param({"status": 401, "json": {"error": "auth_error", "msg": "Invalid user key"}}, id="401"),
])
def test_a_broken_listing_kills_nothing_then_vast_recovers(store, cli, api, failure):
    items = fleet(store, 4, stale={0})  # vastctl-0 really is dead: killed only once vast answers
    api.get(LIST, **failure)
    for _ in range(3):
        result = cli("reconcile", "--json")
        assert result.code == 1, result.err
        assert result.out == "" and result.err.startswith("error: vast ") and len(result.err.splitlines()) == 1
        assert KEY not in result.err
    assert all_alive(store)
    assert store.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 0
    assert [r[0] for r in store.execute("SELECT ok FROM vast_listings")] == [0, 0, 0]
    api.replace(responses.GET, LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/100/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-0"] == ("killed", True)
    assert all(states(store)[f"vastctl-{i}"] == ("running", False) for i in (1, 2, 3))


def test_two_different_entries_under_one_id_kill_nothing(store, cli, api):
    items = fleet(store, 4)
    broken = instance(101, "vastctl-1", status="exited", status_msg="OCI runtime create failed")
    api.get(LIST, json=page(items[:2], next_token="t1", total=4))
    api.get(LIST, json=page([broken, *items[2:]], total=4))
    result = cli("reconcile", "--json")
    assert result.code == 1 and "instance 101 twice with different contents" in result.err
    assert result.out == "" and all_alive(store)
    assert [r[0] for r in store.execute("SELECT ok FROM vast_listings")] == [0]


def test_a_page_repeated_verbatim_is_one_listing(store, cli, api):
    items = fleet(store, 4, stale={3})
    api.get(LIST, json=page(items[:2], next_token="t1"))
    api.get(LIST, json=page(items, total=4))
    api.delete(f"{API}/api/v0/instances/103/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-3"] == ("killed", True)
    assert all(states(store)[f"vastctl-{i}"] == ("running", False) for i in (0, 1, 2))


def test_an_error_echoing_the_key_leaves_no_part_of_it_in_stderr_or_the_file(store, cli, api):
    items = fleet(store, 2, stale={1})
    echo = "z" * 194 + KEY + " (request echoed)"  # a cut at 200 characters would keep the key's start
    api.get(LIST, status=400, body=echo)
    result = cli("reconcile")
    assert result.code == 1 and KEY[:6] not in result.err and "***" in result.err
    (error,) = [r[0] for r in store.execute("SELECT error FROM vast_listings")]
    assert KEY[:6] not in error and "***" in error
    api.replace(responses.GET, LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/101/", status=400, body=echo)
    api.get(f"{API}/api/v0/instances/101/", json={"instances": instance(101, "vastctl-1")})  # still there
    result = cli("reconcile", "--json")
    assert result.code == 0 and KEY[:6] not in result.out
    stored = store.execute("SELECT destroy_error FROM instances WHERE label = 'vastctl-1'").fetchone()[0]
    audit = [r[0] for r in store.execute("SELECT result FROM actions")]
    assert all(KEY[:6] not in text for text in [stored, *audit]) and "***" in stored


def test_a_429_storm_is_retried_with_backoff(store, cli, api):
    items = fleet(store, 2)
    for _ in range(3):
        api.get(LIST, status=429, json={"detail": "API requests too frequent"})
    api.get(LIST, json=page(items))
    assert cli("reconcile").code == 0
    assert len(api.sleeps) == 3 and api.sleeps == sorted(api.sleeps)
    assert all_alive(store, 2)


def test_a_listing_that_stops_half_way_is_not_trusted(store, cli, api):
    items = fleet(store, 30)
    api.get(LIST, json=page(items[:25], total=30))  # no cursor, yet 30 promised
    result = cli("reconcile")
    assert result.code == 1 and "partial" in result.err
    assert all_alive(store, 30)


def test_a_page_that_fails_after_the_first_is_not_a_shorter_fleet(store, cli, api):
    items = fleet(store, 30)
    api.get(LIST, json=page(items[:25], next_token="t1", total=30))
    api.get(LIST, status=502, body="bad gateway")
    assert cli("reconcile").code == 1
    assert all_alive(store, 30)


def test_an_empty_listing_against_a_live_fleet_is_distrusted(store, cli, api):
    fleet(store, 4)
    api.get(LIST, json=page([], total=0))
    for _ in range(3):
        result = cli("reconcile", "--json")
        assert result.code == 1 and "distrusted: 4 of 4 live machines vanished at once" in result.err
    assert all_alive(store)
    assert [r[0] for r in store.execute("SELECT vast_missing FROM instances")] == [0, 0, 0, 0]


def test_a_destroy_that_keeps_failing_is_retried_until_it_works(store, cli, api):
    items = fleet(store, 4, stale={2})
    api.get(LIST, json=page(items))
    delete = f"{API}/api/v0/instances/102/"
    api.delete(delete, status=500, json={"error": "server_error"})
    for attempt in (1, 2, 3):
        result = cli("reconcile", "--json")
        assert result.code == 0
        data = json.loads(result.out)
        assert len(data["errors"]) == 1 and "HTTP 500" in data["errors"][0]
        assert states(store)["vastctl-2"] == ("killed", False)
        row = store.execute("SELECT destroy_attempts FROM instances WHERE label = 'vastctl-2'").fetchone()
        assert row[0] == attempt
    deletes = [c for c in api.calls if c.request.method == "DELETE"]
    assert deletes and all(c.request.url == delete for c in deletes)
    assert json.loads(deletes[0].request.body) == {}
    api.replace(responses.DELETE, delete, json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0 and json.loads(result.out)["errors"] == []
    assert states(store)["vastctl-2"] == ("killed", True)
    assert store.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 1
    assert {k: v for k, v in states(store).items() if k != "vastctl-2"} == {
        f"vastctl-{i}": ("running", False) for i in (0, 1, 3)}


def test_a_destroy_of_an_instance_vast_already_lost_counts_as_done(store, cli, api):
    items = fleet(store, 4, stale={1})
    api.get(LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/101/", status=404, json={"error": "no_such_instance", "msg": "gone"})
    api.get(f"{API}/api/v0/instances/101/", json={"instances": None})
    assert cli("reconcile").code == 0
    assert states(store)["vastctl-1"] == ("killed", True)


# --- what a machine may claim ----------------------------------------------------------------------


def deletes(api):
    return [c.request.url.removeprefix(API) for c in api.calls if c.request.method == "DELETE"]


def test_an_adopted_machine_claiming_a_victims_vast_id_cannot_get_it_destroyed(store, cli, api):
    items = fleet(store, 2)  # vastctl-0 (vast 100) is the victim
    evil = instance(200, "vastctl-evil")
    assert cli("register", "--uuid", "evil", "--label", "vastctl-evil", "--vast-id", "100").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    api.get(LIST, json=page([*items, evil]))
    api.delete(f"{API}/api/v0/instances/200/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert deletes(api) == ["/api/v0/instances/200/"]  # its own machine, found by its label; never the victim
    assert all_alive(store, 2)
    evil_row = store.execute("SELECT vast_id, claimed_vast_id, destroyed_at FROM instances WHERE uuid = 'evil'").fetchone()
    assert (evil_row["vast_id"], evil_row["claimed_vast_id"]) == (200, 100) and evil_row["destroyed_at"]
    # the fleet is still watched: later passes trust the listing and still kill what is really dead
    store.execute("UPDATE instances SET last_heartbeat_at = ? WHERE label = 'vastctl-1'",
                  (clock.to_iso(clock.SYSTEM.now() - timedelta(minutes=30)),))
    api.replace(responses.GET, LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/101/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-0"] == ("running", False) and states(store)["vastctl-1"] == ("killed", True)
    assert "/api/v0/instances/100/" not in deletes(api)


def test_an_adopted_claim_without_its_label_at_vast_is_never_believed(store, cli, api):
    items = fleet(store, 2)
    assert cli("register", "--uuid", "evil", "--label", "vastctl-evil", "--vast-id", "100").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    api.get(LIST, json=page(items))  # the attacker's own machine is not listed under its label
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert deletes(api) == [] and all_alive(store, 2)
    (action,) = json.loads(result.out)["actions"]
    assert action["label"] == "vastctl-evil" and "100" in action["result"] and "not touched" in action["result"]
    assert store.execute("SELECT vast_id FROM instances WHERE uuid = 'evil'").fetchone()[0] is None


def test_a_launched_machine_cannot_change_the_vast_id_recorded_at_launch(store, cli, api):
    items = fleet(store, 3)  # vastctl-2 (vast 102) turns on vastctl-0 (vast 100)
    store.execute("UPDATE instances SET state = 'launching', offer_id = 7 WHERE label = 'vastctl-2'")
    assert cli("register", "--uuid", "u2", "--vast-id", "100").code == 0
    assert store.execute("SELECT vast_id FROM instances WHERE uuid = 'u2'").fetchone()[0] == 102
    assert cli("params-done", "--uuid", "u2").code == 0
    assert cli("bench-report", "--uuid", "u2", "--rate", "1").code == 5
    api.get(LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/102/", json={"success": True})
    assert cli("reconcile").code == 0
    assert deletes(api) == ["/api/v0/instances/102/"]
    assert states(store)["vastctl-0"] == ("running", False)


def test_an_adopted_machine_cannot_adopt_an_instance_outside_our_prefix(store, cli, api):
    items = fleet(store, 1)
    stranger = instance(300, "train-job")  # launched by hand, not ours to touch
    assert cli("register", "--uuid", "evil", "--label", "train-job", "--vast-id", "300").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    api.get(LIST, json=page([*items, stranger]))
    assert cli("reconcile").code == 0
    assert deletes(api) == []


def test_a_destroy_by_vast_id_needs_the_rows_label_at_vast(store, cli, api):
    items = fleet(store, 2, stale={0})
    items[0]["label"] = "someone-else"  # vast lists instance 100 under another label
    api.get(LIST, json=page(items))
    result = cli("reconcile", "--json")
    assert result.code == 0
    assert deletes(api) == []
    assert states(store)["vastctl-0"] == ("killed", False)  # retried every pass, never destroyed blind
    (error,) = json.loads(result.out)["errors"]
    assert "someone-else" in error and "not destroyed" in error


# --- the pass's deadline (reconcile.deadline, 50s by default; cron starts the next pass a minute later) ---------


def skipped_in_the_file(store):
    return [dict(r) for r in store.execute("SELECT kind, label, ok, result FROM actions WHERE result LIKE 'skipped:%'")]


def test_a_listing_that_keeps_timing_out_ends_the_pass_by_its_deadline(store, cli, api):
    fleet(store, 4, stale={0})
    api.add_callback(responses.GET, LIST, callback=hang(api.clock))
    result = cli("reconcile", "--json")
    assert result.code == 1 and "deadline" in result.err and len(result.err.splitlines()) == 1
    assert api.clock.monotonic() <= 50.0  # not 4 attempts × 60 s read timeouts
    assert all_alive(store)
    (error,) = [r[0] for r in store.execute("SELECT error FROM vast_listings WHERE ok = 0")]
    assert "deadline" in error and "nothing was planned or killed" in error


def test_a_429_asking_for_60s_is_not_waited_for(store, cli, api):
    fleet(store, 4, stale={0})
    api.get(LIST, status=429, headers={"Retry-After": "60"}, json={"detail": "API requests too frequent"})
    result = cli("reconcile")
    assert result.code == 1 and "waiting 60s more would pass the deadline" in result.err
    assert api.sleeps == [] and api.clock.monotonic() < 50.0
    assert all_alive(store)


def test_destroys_that_hang_stop_at_the_deadline_and_the_rest_is_recorded_as_skipped(store, cli, api):
    items = fleet(store, 4, stale={0, 1, 2})
    api.get(LIST, json=page(items))
    for vast_id in (100, 101, 102):
        api.add_callback(responses.DELETE, f"{API}/api/v0/instances/{vast_id}/", callback=hang(api.clock))
    result = cli("reconcile", "--json")
    assert result.code == 1
    assert api.clock.monotonic() <= 50.0
    data = json.loads(result.out)
    assert data["deadline_passed"] is True
    assert [a["result"].split(":")[0] for a in data["actions"] if a["kind"] == "destroy"] == [
        "not done", "skipped", "skipped"]
    assert "3 action(s) left for the next pass: destroy vastctl-0, destroy vastctl-1, destroy vastctl-2" in (
        data["errors"][-1])
    assert result.err.splitlines()[-1].startswith("error: stopped calling vast: reconcile.deadline 50s reached")
    # every kill still happened (no call to vast); the destroys are left for the next pass and said so in the file
    assert {label: s for label, s in states(store).items()} == {
        "vastctl-0": ("killed", False), "vastctl-1": ("killed", False), "vastctl-2": ("killed", False),
        "vastctl-3": ("running", False)}
    assert [(r["label"], r["ok"]) for r in skipped_in_the_file(store)] == [("vastctl-1", 0), ("vastctl-2", 0)]
    # vast answers again: the next pass destroys all three
    for vast_id in (100, 101, 102):
        api.replace(responses.DELETE, f"{API}/api/v0/instances/{vast_id}/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert [label for label, (_state, gone) in states(store).items() if gone] == ["vastctl-0", "vastctl-1", "vastctl-2"]


def test_destroys_rate_limited_with_a_long_retry_after_end_the_pass_at_once(store, cli, api):
    items = fleet(store, 3, stale={0, 1})
    api.get(LIST, json=page(items))
    api.delete(f"{API}/api/v0/instances/100/", status=429, headers={"Retry-After": "60"},
               json={"detail": "API requests too frequent endpoint threshold=3.0"})  # 101 must not even be tried
    result = cli("reconcile", "--json")
    assert result.code == 1 and api.sleeps == []
    assert len([c for c in api.calls if c.request.method == "DELETE"]) == 1  # the second is not even tried
    assert json.loads(result.out)["deadline_passed"] is True
    assert [r["label"] for r in skipped_in_the_file(store)] == ["vastctl-1"]


def test_the_deadline_comes_from_the_config(store, cli, api, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("reconcile:\n  deadline: 5s\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    fleet(store, 2)
    api.add_callback(responses.GET, LIST, callback=hang(api.clock))
    result = cli("reconcile")
    assert result.code == 1 and "reconcile.deadline 5s" in result.err
    assert api.clock.monotonic() <= 5.0
