"""offers, launch, stop, start and kill from the command line: exit codes, output, rows, and the requests sent."""

from __future__ import annotations

import json
import os
import sqlite3
from urllib.parse import urlparse

import pytest
import responses
from helpers.vast_market import configure, offer, rows

API = "https://vast.test"
KEY = "cli-test-key-987"


@pytest.fixture
def ready(cli, tmp_path, monkeypatch):
    configure(cli, tmp_path, monkeypatch, api=API, key=KEY, max_instances=3, max_hourly_spend=5)


@pytest.fixture
def vast():
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mocked:
        yield mocked


def offers_json(*specs):
    return {"offers": [offer(oid, mid, dph) for oid, mid, dph in specs]}


def sent(vast):
    return [(c.request.method, urlparse(c.request.url).path) for c in vast.calls]


def assert_one_error_line(result):
    lines = result.err.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in result.err


def test_offers_json(ready, cli, vast):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((5, 50, 0.31), (6, 60, 0.42)))
    result = cli("offers", "--gpu", "RTX 4090", "--max-dph", "0.5", "--limit", "2", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert [o["id"] for o in data] == [5, 6] and data[0]["machine_id"] == 50 and data[0]["cpu_ram_gb"] == 515.0
    body = json.loads(vast.calls[0].request.body)
    assert body["gpu_name"] == {"eq": "RTX 4090"} and body["dph_total"] == {"lte": 0.5}
    assert body["cpu_ram"] == {"gte": 256000} and body["inet_down"] == {"gte": 500.0}
    assert vast.calls[0].request.headers["Authorization"] == f"Bearer {KEY}"


def test_offers_table_and_reliability(ready, cli, vast):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((5, 50, 0.31)))
    result = cli("offers", "--min-reliability", "0.9")
    assert result.code == 0 and "RTX 4090" in result.out and "0.310" in result.out
    body = json.loads(vast.calls[0].request.body)
    assert body["reliability"] == {"gte": 0.9} and body["gpu_name"] == {"in": ["RTX 4090", "RTX 5090"]}


def test_offers_without_a_key(ready, cli, monkeypatch):
    monkeypatch.delenv("VAST_API_KEY")
    result = cli("offers")
    assert result.code == 2 and "VAST_API_KEY" in result.err
    assert_one_error_line(result)


def test_offers_when_vast_fails(ready, cli, vast):
    vast.post(f"{API}/api/v0/bundles/", status=500, json={"error": "oops"})
    result = cli("offers", "--json")
    assert result.code == 1 and result.out == ""
    assert_one_error_line(result)


def test_launch_by_gpu(ready, cli, vast, db_path):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((5, 50, 0.31), (6, 60, 0.42)))
    vast.put(f"{API}/api/v0/asks/5/", json={"success": True, "new_contract": 9001})
    vast.put(f"{API}/api/v0/asks/6/", json={"success": True, "new_contract": 9002})
    result = cli("launch", "--gpu", "RTX 4090", "--count", "2")
    assert result.code == 0, result.err
    assert sent(vast) == [("POST", "/api/v0/bundles/"), ("PUT", "/api/v0/asks/5/"), ("PUT", "/api/v0/asks/6/")]
    launched = rows(db_path)
    assert [(r["state"], r["vast_id"], r["offer_id"]) for r in launched] == [("launching", 9001, 5),
                                                                            ("launching", 9002, 6)]
    for row in launched:
        assert row["label"] in result.out
    body = json.loads(vast.calls[1].request.body)
    assert body["image"] == "ghcr.io/x/cuzk:1" and body["env"]["VASTCTL_SERVER"] == "https://manager.example"
    assert all(KEY not in c.request.url for c in vast.calls)


def test_launch_by_offer_json(ready, cli, vast, db_path):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((7, 70, 0.5)))
    vast.put(f"{API}/api/v0/asks/7/", json={"success": True, "new_contract": 77})
    result = cli("launch", "--offer", "7", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["launched"][0]["vast_id"] == 77 and data["error"] is None
    assert json.loads(vast.calls[0].request.body)["id"] == {"eq": 7}


def test_launch_over_max_dph_is_refused(ready, cli, vast, db_path):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((7, 70, 1.5)))
    result = cli("launch", "--offer", "7")
    assert result.code == 4 and "max_dph" in result.err
    assert_one_error_line(result)
    assert rows(db_path) == [] and sent(vast) == [("POST", "/api/v0/bundles/")]


def test_launch_over_max_instances_is_refused(ready, cli, vast, db_path):
    result = cli("launch", "--gpu", "RTX 4090", "--count", "4")
    assert result.code == 4 and "max_instances" in result.err
    assert rows(db_path) == [] and len(vast.calls) == 0


@pytest.mark.parametrize("args", [[], ["--offer", "1", "--gpu", "RTX 4090"], ["--gpu", "X", "--count", "0"],
                                  ["--offer", "1", "--count", "2"]])
def test_launch_bad_input(ready, cli, vast, db_path, args):
    result = cli("launch", *args)
    assert result.code == 2
    assert_one_error_line(result)
    assert rows(db_path) == [] and len(vast.calls) == 0


def test_launch_refused_by_vast(ready, cli, vast, db_path):
    vast.post(f"{API}/api/v0/bundles/", json=offers_json((7, 70, 0.5)))
    vast.put(f"{API}/api/v0/asks/7/", status=400, json={"success": False, "error": "invalid_args", "msg": "bad image"})
    result = cli("launch", "--offer", "7")
    assert result.code == 1 and "bad image" in result.err
    assert_one_error_line(result)
    (row,) = rows(db_path)
    assert (row["state"], row["kill_code"], row["vast_id"]) == ("killed", "start_failed", None)
    assert row["destroyed_at"]


def running_row(cli, vast_id=321):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-a").code == 0
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:  # the id a launch records (a machine's claim is not)
        raw.execute("UPDATE instances SET vast_id = ? WHERE uuid = 'u1'", (vast_id,))
    assert cli("demand", "report", "--queued", "0").code == 0  # an empty queue: the last machine may go


def test_stop_and_start(ready, cli, vast, db_path):
    running_row(cli)
    vast.put(f"{API}/api/v0/instances/321/", json={"success": True})
    result = cli("stop", "vastctl-a")
    assert result.code == 0 and "stopped" in result.out
    assert rows(db_path)[0]["state"] == "stopped"
    result = cli("start", "u1")
    assert result.code == 0 and "launching" in result.out
    row = rows(db_path)[0]
    assert row["state"] == "launching" and row["resumed_at"]
    assert [json.loads(c.request.body) for c in vast.calls] == [{"state": "stopped"}, {"state": "running"}]
    assert sent(vast) == [("PUT", "/api/v0/instances/321/")] * 2


def test_stop_start_refusals(ready, cli, vast, db_path):
    running_row(cli)
    assert cli("stop", "nobody").code == 2
    result = cli("start", "vastctl-a")  # registered, not stopped
    assert result.code == 3
    assert_one_error_line(result)
    assert len(vast.calls) == 0 and rows(db_path)[0]["state"] == "registered"


def test_stop_when_vast_fails_changes_nothing(ready, cli, vast, db_path):
    running_row(cli)
    vast.put(f"{API}/api/v0/instances/321/", json={"success": False, "msg": "missing_billing"})
    result = cli("stop", "vastctl-a")
    assert result.code == 1
    assert_one_error_line(result)
    assert rows(db_path)[0]["state"] == "registered"


def test_kill_destroys_at_vast(ready, cli, vast, db_path):
    running_row(cli)
    vast.get(f"{API}/api/v0/instances/321/", json={"instances": {"id": 321, "label": "vastctl-a"}})
    vast.delete(f"{API}/api/v0/instances/321/", json={"success": True})
    result = cli("kill", "vastctl-a", "--reason", "GPU errors")
    assert result.code == 0 and "killed" in result.out
    assert sent(vast) == [("GET", "/api/v0/instances/321/"), ("DELETE", "/api/v0/instances/321/")]
    row = rows(db_path)[0]
    assert row["state"] == "killed" and row["destroyed_at"]


def test_kill_with_a_failed_destroy(ready, cli, vast, db_path):
    running_row(cli)
    vast.get(f"{API}/api/v0/instances/321/", json={"instances": {"id": 321, "label": "vastctl-a"}})
    vast.delete(f"{API}/api/v0/instances/321/", status=500, json={"error": "oops"})
    result = cli("kill", "vastctl-a", "--reason", "GPU errors")
    assert result.code == 1 and "not yet destroyed" in result.err
    assert_one_error_line(result)
    row = rows(db_path)[0]
    assert row["state"] == "killed" and row["destroyed_at"] is None and row["destroy_attempts"] == 1


def test_kill_without_a_key_changes_nothing(ready, cli, db_path, monkeypatch):
    running_row(cli)
    monkeypatch.delenv("VAST_API_KEY")
    result = cli("kill", "vastctl-a", "--reason", "x")
    assert result.code == 2 and "VAST_API_KEY" in result.err
    assert rows(db_path)[0]["state"] == "registered"


def test_launch_arguments_are_checked_before_the_key(cli, vast, db_path, monkeypatch, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    assert cli("init").code == 0
    result = cli("launch", "--offer", "1", "--gpu", "RTX 4090")  # no VAST_API_KEY here
    assert result.code == 2 and result.err == "error: give exactly one of --offer ID or --gpu NAME\n"
    config.write_text("")
    result = cli("launch", "--gpu", "RTX 4090")
    assert result.code == 2 and "server.url is not set" in result.err
    assert rows(db_path) == [] and len(vast.calls) == 0


# --- what needs no key: a machine never rented, a launch that could not boot -----------------------------


def test_stop_and_start_of_a_machine_never_rented_need_no_key(initialised, cli):
    cli("register", "--uuid", "u1", "--label", "vastctl-u1")
    for verb in ("stop", "start"):
        result = cli(verb, "vastctl-u1")
        assert result.code == 3, result.err
        assert "vastctl-u1 was never rented" in result.err and "API key" not in result.err


def _launch_config(tmp_path, monkeypatch, launch: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n" + launch)
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))


def test_a_launch_that_could_not_boot_is_refused_before_any_key(cli, tmp_path, monkeypatch, db_path):
    _launch_config(tmp_path, monkeypatch, "")
    assert cli("init").code == 0
    result = cli("launch", "--gpu", "RTX 4090")  # no vast key in the environment: refused before it is needed
    assert result.code == 2
    assert "launch.vastctl_source" in result.err and "launch.install" in result.err
    assert result.err.count("\n") == 1
    assert sqlite3.connect(db_path).execute("SELECT count(*) FROM instances").fetchone()[0] == 0


def test_a_launch_that_says_where_the_programs_come_from_gets_past_the_boot_check(cli, tmp_path, monkeypatch):
    _launch_config(tmp_path, monkeypatch, "launch:\n  vastctl_source: vastctl==0.1.0\n  install: make provers\n")
    assert cli("init").code == 0
    result = cli("launch", "--gpu", "RTX 4090")
    assert result.code == 2 and "no vast.ai API key" in result.err  # the next thing a launch needs
