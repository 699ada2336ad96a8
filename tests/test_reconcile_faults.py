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
from helpers.mocked_vast import API, KEY, LIST, fleet, instance, states
from helpers.provider_vast import hang

from vastctl import clock


def page(items, next_token=None, total=None):
    body = {"success": True, "instances": items, "next_token": next_token}
    if total is not None:
        body["total_instances"] = total
    return body


def all_alive(store, n=4):
    fleet_rows = {label: seen for label, seen in states(store).items() if label != "vastctl-evil"}
    return fleet_rows == {f"vastctl-{i}": ("running", False) for i in range(n)}


def test_listing_goes_through_every_page_with_the_key_in_the_header(store, cli, vast_api):
    items = fleet(store, 30)
    vast_api.get(LIST, json=page(items[:25], next_token="t1", total=30))
    vast_api.get(LIST, json=page(items[25:], total=30))
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["actions"] == [] and all_alive(store, 30)
    first, second = vast_api.calls
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
def test_a_broken_listing_kills_nothing_then_vast_recovers(store, cli, vast_api, failure):
    items = fleet(store, 4, stale={0})  # vastctl-0 really is dead: killed only once vast answers
    vast_api.get(LIST, **failure)
    for _ in range(3):
        result = cli("reconcile", "--json")
        assert result.code == 1, result.err
        assert result.out == "" and result.err.startswith("error: vast ") and len(result.err.splitlines()) == 1
        assert KEY not in result.err
    assert all_alive(store)
    assert store.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 0
    assert [r[0] for r in store.execute("SELECT ok FROM vast_listings")] == [0, 0, 0]
    vast_api.replace(responses.GET, LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/100/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-0"] == ("killed", True)
    assert all(states(store)[f"vastctl-{i}"] == ("running", False) for i in (1, 2, 3))


def test_two_different_entries_under_one_id_kill_nothing(store, cli, vast_api):
    items = fleet(store, 4)
    broken = instance(101, "vastctl-1", status="exited", status_msg="OCI runtime create failed")
    vast_api.get(LIST, json=page(items[:2], next_token="t1", total=4))
    vast_api.get(LIST, json=page([broken, *items[2:]], total=4))
    result = cli("reconcile", "--json")
    assert result.code == 1 and "instance 101 twice with different contents" in result.err
    assert result.out == "" and all_alive(store)
    assert [r[0] for r in store.execute("SELECT ok FROM vast_listings")] == [0]


def test_a_page_repeated_verbatim_is_one_listing(store, cli, vast_api):
    items = fleet(store, 4, stale={3})
    vast_api.get(LIST, json=page(items[:2], next_token="t1"))
    vast_api.get(LIST, json=page(items, total=4))
    vast_api.delete(f"{API}/api/v0/instances/103/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-3"] == ("killed", True)
    assert all(states(store)[f"vastctl-{i}"] == ("running", False) for i in (0, 1, 2))


def test_an_error_echoing_the_key_leaves_no_part_of_it_in_stderr_or_the_file(store, cli, vast_api):
    items = fleet(store, 2, stale={1})
    echo = "z" * 194 + KEY + " (request echoed)"  # a cut at 200 characters would keep the key's start
    vast_api.get(LIST, status=400, body=echo)
    result = cli("reconcile")
    assert result.code == 1 and KEY[:6] not in result.err and "***" in result.err
    (error,) = [r[0] for r in store.execute("SELECT error FROM vast_listings")]
    assert KEY[:6] not in error and "***" in error
    vast_api.replace(responses.GET, LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/101/", status=400, body=echo)
    vast_api.get(f"{API}/api/v0/instances/101/", json={"instances": instance(101, "vastctl-1")})  # still there
    result = cli("reconcile", "--json")
    assert result.code == 0 and KEY[:6] not in result.out
    stored = store.execute("SELECT destroy_error FROM instances WHERE label = 'vastctl-1'").fetchone()[0]
    audit = [r[0] for r in store.execute("SELECT result FROM actions")]
    assert all(KEY[:6] not in text for text in [stored, *audit]) and "***" in stored


def test_a_429_storm_is_retried_with_backoff(store, cli, vast_api):
    items = fleet(store, 2)
    for _ in range(3):
        vast_api.get(LIST, status=429, json={"detail": "API requests too frequent"})
    vast_api.get(LIST, json=page(items))
    assert cli("reconcile").code == 0
    assert len(vast_api.sleeps) == 3 and vast_api.sleeps == sorted(vast_api.sleeps)
    assert all_alive(store, 2)


def test_a_listing_that_stops_half_way_is_not_trusted(store, cli, vast_api):
    items = fleet(store, 30)
    vast_api.get(LIST, json=page(items[:25], total=30))  # no cursor, yet 30 promised
    result = cli("reconcile")
    assert result.code == 1 and "partial" in result.err
    assert all_alive(store, 30)


def test_a_page_that_fails_after_the_first_is_not_a_shorter_fleet(store, cli, vast_api):
    items = fleet(store, 30)
    vast_api.get(LIST, json=page(items[:25], next_token="t1", total=30))
    vast_api.get(LIST, status=502, body="bad gateway")
    assert cli("reconcile").code == 1
    assert all_alive(store, 30)


def test_an_empty_listing_against_a_live_fleet_is_distrusted(store, cli, vast_api):
    fleet(store, 4)
    vast_api.get(LIST, json=page([], total=0))
    for _ in range(3):
        result = cli("reconcile", "--json")
        assert result.code == 1 and "distrusted: 4 of 4 live machines vanished at once" in result.err
    assert all_alive(store)
    assert [r[0] for r in store.execute("SELECT vast_missing FROM instances")] == [0, 0, 0, 0]


def test_a_destroy_that_keeps_failing_is_retried_until_it_works(store, cli, vast_api):
    items = fleet(store, 4, stale={2})
    vast_api.get(LIST, json=page(items))
    delete = f"{API}/api/v0/instances/102/"
    vast_api.delete(delete, status=500, json={"error": "server_error"})
    for attempt in (1, 2, 3):
        result = cli("reconcile", "--json")
        assert result.code == 0
        data = json.loads(result.out)
        assert len(data["errors"]) == 1 and "HTTP 500" in data["errors"][0]
        assert states(store)["vastctl-2"] == ("killed", False)
        row = store.execute("SELECT destroy_attempts FROM instances WHERE label = 'vastctl-2'").fetchone()
        assert row[0] == attempt
    deletes = [c for c in vast_api.calls if c.request.method == "DELETE"]
    assert deletes and all(c.request.url == delete for c in deletes)
    assert json.loads(deletes[0].request.body) == {}
    vast_api.replace(responses.DELETE, delete, json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0 and json.loads(result.out)["errors"] == []
    assert states(store)["vastctl-2"] == ("killed", True)
    assert store.execute("SELECT count(*) FROM events WHERE to_state = 'killed'").fetchone()[0] == 1
    assert {k: v for k, v in states(store).items() if k != "vastctl-2"} == {
        f"vastctl-{i}": ("running", False) for i in (0, 1, 3)}


def test_a_destroy_of_an_instance_vast_already_lost_counts_as_done(store, cli, vast_api):
    items = fleet(store, 4, stale={1})
    vast_api.get(LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/101/", status=404, json={"error": "no_such_instance", "msg": "gone"})
    vast_api.get(f"{API}/api/v0/instances/101/", json={"instances": None})
    assert cli("reconcile").code == 0
    assert states(store)["vastctl-1"] == ("killed", True)


# --- what a machine may claim ----------------------------------------------------------------------


def deletes(vast_api):
    return [c.request.url.removeprefix(API) for c in vast_api.calls if c.request.method == "DELETE"]


def test_an_adopted_machine_claiming_a_victims_vast_id_cannot_get_it_destroyed(store, cli, vast_api):
    items = fleet(store, 2)  # vastctl-0 (vast 100) is the victim
    evil = instance(200, "vastctl-evil")
    assert cli("register", "--uuid", "evil", "--label", "vastctl-evil", "--vast-id", "100").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    vast_api.get(LIST, json=page([*items, evil]))
    vast_api.delete(f"{API}/api/v0/instances/200/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert deletes(vast_api) == ["/api/v0/instances/200/"]  # its own machine, found by its label; never the victim
    assert all_alive(store, 2)
    evil_row = store.execute("SELECT vast_id, claimed_vast_id, destroyed_at FROM instances WHERE uuid = 'evil'").fetchone()
    assert (evil_row["vast_id"], evil_row["claimed_vast_id"]) == (200, 100) and evil_row["destroyed_at"]
    # the fleet is still watched: later passes trust the listing and still kill what is really dead
    store.execute("UPDATE instances SET last_heartbeat_at = ? WHERE label = 'vastctl-1'",
                  (clock.to_iso(clock.SYSTEM.now() - timedelta(minutes=30)),))
    vast_api.replace(responses.GET, LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/101/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert states(store)["vastctl-0"] == ("running", False) and states(store)["vastctl-1"] == ("killed", True)
    assert "/api/v0/instances/100/" not in deletes(vast_api)


def test_an_adopted_claim_without_its_label_at_vast_is_never_believed(store, cli, vast_api):
    items = fleet(store, 2)
    assert cli("register", "--uuid", "evil", "--label", "vastctl-evil", "--vast-id", "100").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    vast_api.get(LIST, json=page(items))  # the attacker's own machine is not listed under its label
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert deletes(vast_api) == [] and all_alive(store, 2)
    (action,) = json.loads(result.out)["actions"]
    assert action["label"] == "vastctl-evil" and "100" in action["result"] and "not touched" in action["result"]
    assert store.execute("SELECT vast_id FROM instances WHERE uuid = 'evil'").fetchone()[0] is None


def test_a_launched_machine_cannot_change_the_vast_id_recorded_at_launch(store, cli, vast_api):
    items = fleet(store, 3)  # vastctl-2 (vast 102) turns on vastctl-0 (vast 100)
    store.execute("UPDATE instances SET state = 'launching', offer_id = 7 WHERE label = 'vastctl-2'")
    assert cli("register", "--uuid", "u2", "--vast-id", "100").code == 0
    assert store.execute("SELECT vast_id FROM instances WHERE uuid = 'u2'").fetchone()[0] == 102
    assert cli("params-done", "--uuid", "u2").code == 0
    assert cli("bench-report", "--uuid", "u2", "--rate", "1").code == 5
    vast_api.get(LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/102/", json={"success": True})
    assert cli("reconcile").code == 0
    assert deletes(vast_api) == ["/api/v0/instances/102/"]
    assert states(store)["vastctl-0"] == ("running", False)


def test_an_adopted_machine_cannot_adopt_an_instance_outside_our_prefix(store, cli, vast_api):
    items = fleet(store, 1)
    stranger = instance(300, "train-job")  # launched by hand, not ours to touch
    assert cli("register", "--uuid", "evil", "--label", "train-job", "--vast-id", "300").code == 0
    assert cli("params-done", "--uuid", "evil").code == 0
    assert cli("bench-report", "--uuid", "evil", "--rate", "1").code == 5
    vast_api.get(LIST, json=page([*items, stranger]))
    assert cli("reconcile").code == 0
    assert deletes(vast_api) == []


def test_a_destroy_by_vast_id_needs_the_rows_label_at_vast(store, cli, vast_api):
    items = fleet(store, 2, stale={0})
    items[0]["label"] = "someone-else"  # vast lists instance 100 under another label
    vast_api.get(LIST, json=page(items))
    result = cli("reconcile", "--json")
    assert result.code == 0
    assert deletes(vast_api) == []
    assert states(store)["vastctl-0"] == ("killed", False)  # retried every pass, never destroyed blind
    (error,) = json.loads(result.out)["errors"]
    assert "someone-else" in error and "not destroyed" in error


# --- the pass's deadline (reconcile.deadline, 50s by default; cron starts the next pass a minute later) ---------


def skipped_in_the_file(store):
    return [dict(r) for r in store.execute("SELECT kind, label, ok, result FROM actions WHERE result LIKE 'skipped:%'")]


def test_a_listing_that_keeps_timing_out_ends_the_pass_by_its_deadline(store, cli, vast_api):
    fleet(store, 4, stale={0})
    vast_api.add_callback(responses.GET, LIST, callback=hang(vast_api.clock))
    result = cli("reconcile", "--json")
    assert result.code == 1 and "deadline" in result.err and len(result.err.splitlines()) == 1
    assert vast_api.clock.monotonic() <= 50.0  # not 4 attempts × 60 s read timeouts
    assert all_alive(store)
    (error,) = [r[0] for r in store.execute("SELECT error FROM vast_listings WHERE ok = 0")]
    assert "deadline" in error and "nothing was planned or killed" in error


def test_a_429_asking_for_60s_is_not_waited_for(store, cli, vast_api):
    fleet(store, 4, stale={0})
    vast_api.get(LIST, status=429, headers={"Retry-After": "60"}, json={"detail": "API requests too frequent"})
    result = cli("reconcile")
    assert result.code == 1 and "waiting 60s more would pass the deadline" in result.err
    assert vast_api.sleeps == [] and vast_api.clock.monotonic() < 50.0
    assert all_alive(store)


def test_destroys_that_hang_stop_at_the_deadline_and_the_rest_is_recorded_as_skipped(store, cli, vast_api):
    items = fleet(store, 4, stale={0, 1, 2})
    vast_api.get(LIST, json=page(items))
    for vast_id in (100, 101, 102):
        vast_api.add_callback(responses.DELETE, f"{API}/api/v0/instances/{vast_id}/", callback=hang(vast_api.clock))
    result = cli("reconcile", "--json")
    assert result.code == 1
    assert vast_api.clock.monotonic() <= 50.0
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
        vast_api.replace(responses.DELETE, f"{API}/api/v0/instances/{vast_id}/", json={"success": True})
    result = cli("reconcile", "--json")
    assert result.code == 0, result.err
    assert [label for label, (_state, gone) in states(store).items() if gone] == ["vastctl-0", "vastctl-1", "vastctl-2"]


def test_destroys_rate_limited_with_a_long_retry_after_end_the_pass_at_once(store, cli, vast_api):
    items = fleet(store, 3, stale={0, 1})
    vast_api.get(LIST, json=page(items))
    vast_api.delete(f"{API}/api/v0/instances/100/", status=429, headers={"Retry-After": "60"},
                    json={"detail": "API requests too frequent endpoint threshold=3.0"})  # 101 must not even be tried
    result = cli("reconcile", "--json")
    assert result.code == 1 and vast_api.sleeps == []
    assert len([c for c in vast_api.calls if c.request.method == "DELETE"]) == 1  # the second is not even tried
    assert json.loads(result.out)["deadline_passed"] is True
    assert [r["label"] for r in skipped_in_the_file(store)] == ["vastctl-1"]


def test_the_deadline_comes_from_the_config(store, cli, vast_api, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("reconcile:\n  deadline: 5s\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    fleet(store, 2)
    vast_api.add_callback(responses.GET, LIST, callback=hang(vast_api.clock))
    result = cli("reconcile")
    assert result.code == 1 and "reconcile.deadline 5s" in result.err
    assert vast_api.clock.monotonic() <= 5.0
