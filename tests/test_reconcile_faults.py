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

from vastctl import clock, lifecycle
from vastctl.providers import get_provider

API = "http://vast.test"
LIST = f"{API}/api/v1/instances/"
KEY = "test-key-123"


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("VAST_API_URL", API)
    sleeps: list[float] = []
    monkeypatch.setattr("vastctl.cli.reconcile.make_provider", lambda config: get_provider(config, sleep=sleeps.append))
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        mock.sleeps = sleeps
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
    now = clock.utcnow()
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
    return states(store) == {f"vastctl-{i}": ("running", False) for i in range(n)}


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
