"""Operator commands on the state file: init, fleet, events, kill, notify, settings."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest


def lifecycle_to(cli, uuid, label, rate=68.0, running=True, vast_id=None):
    cli("register", "--uuid", uuid, "--label", label, "--gpu", "RTX 4090", *(["--vast-id", vast_id] if vast_id else []))
    cli("params-done", "--uuid", uuid)
    cli("bench-report", "--uuid", uuid, "--rate", str(rate))
    if running:
        cli("running", "--uuid", uuid)


def test_init_makes_the_file_and_a_private_secret(cli, db_path):
    result = cli("init")
    assert result.code == 0 and "ready" in result.err
    secret = db_path.with_name(db_path.name + ".secret")
    assert db_path.exists() and secret.exists()
    assert oct(os.stat(secret).st_mode & 0o777) == "0o600"
    content = secret.read_text()
    assert cli("init").code == 0 and secret.read_text() == content  # idempotent, secret kept


def test_fleet_json_shape(ready, cli):
    lifecycle_to(cli, "u1", "vastctl-a", rate=68)
    lifecycle_to(cli, "u2", "vastctl-b", rate=30, vast_id=7002)  # killed by the gate
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:  # the id a launch records (a machine's claim is not)
        raw.execute("UPDATE instances SET vast_id = 7002 WHERE uuid = 'u2'")
    cli("settings", "set", "target_proofs_per_hour", "100")
    data = json.loads(cli("fleet", "--json").out)
    # the killed machine is still listed while vast has not confirmed its destruction
    assert [i["label"] for i in data["instances"]] == ["vastctl-a", "vastctl-b"]
    first = data["instances"][0]
    for key in ("uuid", "label", "state", "vast_id", "vast_status", "gpu_name", "num_gpus", "bench_rate", "dph",
                "proofs_per_hour", "state_since", "last_heartbeat_at", "kill_reason", "kill_code", "destroyed_at"):
        assert key in first
    assert first["state_since"].endswith("Z")
    assert data["summary"]["by_state"] == {"running": 1, "killed": 1}
    assert data["summary"]["capacity_proofs_per_hour"] == 68.0
    assert data["summary"]["target_proofs_per_hour"] == 100.0
    assert data["instances"][1]["kill_code"] == "bench_failed"


def test_fleet_hides_killed_and_destroyed_unless_all(ready, cli, db_path):
    lifecycle_to(cli, "u1", "vastctl-a")
    lifecycle_to(cli, "u2", "vastctl-b", rate=1)
    sqlite3.connect(db_path, isolation_level=None).execute(
        "UPDATE instances SET destroyed_at = '2026-11-30T00:00:00Z' WHERE uuid = 'u2'")
    assert [i["label"] for i in json.loads(cli("fleet", "--json").out)["instances"]] == ["vastctl-a"]
    assert len(json.loads(cli("fleet", "--json", "--all").out)["instances"]) == 2


def test_fleet_table_and_summary_line(ready, cli, db_path):
    lifecycle_to(cli, "u1", "vastctl-a")
    sqlite3.connect(db_path, isolation_level=None).execute("UPDATE instances SET dph = 0.42")
    result = cli("fleet")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split()[:3] == ["label", "state", "vast"]
    assert lines[1].startswith("vastctl-a") and "running" in lines[1]
    assert lines[-1] == "1 running · capacity 68/0 proofs/h · $0.42/h"


def test_fleet_of_an_empty_file(ready, cli):
    result = cli("fleet")
    assert (result.code, result.out) == (0, "no machines · capacity 0/0 proofs/h · $0.00/h\n")


def test_events_since_limit_and_json(ready, cli):
    lifecycle_to(cli, "u1", "vastctl-a")
    events = json.loads(cli("events", "--json").out)
    assert [e["to_state"] for e in events] == ["registered", "params_done", "bench_done", "running"]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    assert all(e["label"] == "vastctl-a" and e["source"] == "instance" and e["at"].endswith("Z") for e in events)
    assert [e["to_state"] for e in json.loads(cli("events", "--json", "--limit", "2").out)] == ["bench_done", "running"]
    since = events[1]["id"]
    assert [e["id"] for e in json.loads(cli("events", "--json", "--since", since).out)] == [e["id"] for e in events[2:]]
    table = cli("events").out.splitlines()
    assert table[0].split() == ["id", "at", "label", "change", "source", "reason"]
    assert "bench_done → running" in table[-1]


def test_events_bad_limit(ready, cli):
    assert cli("events", "--limit", "0").code == 2


def test_kill_by_label_records_the_operator_reason(ready, cli, db_path):
    lifecycle_to(cli, "u1", "vastctl-a")
    assert cli("demand", "report", "--queued", "0").code == 0  # an empty queue: the last machine may go
    result = cli("kill", "vastctl-a", "--reason", "GPU errors in dmesg")
    assert result.code == 0
    event = json.loads(cli("events", "--json", "--limit", "1").out)[0]
    assert (event["to_state"], event["source"], event["code"]) == ("killed", "operator", "operator")
    assert event["reason"] == "operator: GPU errors in dmesg"
    assert cli("kill", "vastctl-a", "--reason", "again").code == 3
    assert cli("kill", "nobody", "--reason", "x").code == 2
    assert cli("kill", "vastctl-a", "--reason", "  ").code == 2


def test_notify_is_an_event_without_instance(ready, cli):
    result = cli("notify", "Curio maintenance at 02:00")
    assert result.code == 0
    (event,) = json.loads(cli("events", "--json").out)
    assert (event["uuid"], event["kind"], event["reason"], event["source"]) == (
        None, "note", "Curio maintenance at 02:00", "operator")
    assert cli("notify", "   ").code == 2


def test_settings_list_get_set(ready, cli):
    listing = json.loads(cli("settings", "--json").out)
    assert listing == {"target_proofs_per_hour": 0.0, "min_bench_rate": 40.0, "max_instances": 10,
                       "max_hourly_spend": 10.0, "max_dph": 1.0}
    assert cli("settings", "set", "max_instances", "12").code == 0
    assert cli("settings", "get", "max_instances").out == "12\n"
    assert json.loads(cli("settings", "list", "--json").out)["max_instances"] == 12
    (event,) = json.loads(cli("events", "--json").out)
    assert (event["kind"], event["uuid"], event["reason"]) == ("setting", None, "max_instances 10 → 12")
    assert cli("settings", "set", "max_instances", "12").code == 0  # unchanged: no second event
    assert len(json.loads(cli("events", "--json").out)) == 1


@pytest.mark.parametrize("args", [("set", "max_instances", "2.5"), ("set", "max_dph", "-1"), ("set", "max_dph", "nan"),
                                  ("set", "nope", "1"), ("get", "nope"), ("set", "max_dph", "cheap")])
def test_settings_bad_input(ready, cli, args):
    result = cli("settings", *args)
    assert result.code == 2 and result.err.startswith("error: ")
    assert json.loads(cli("events", "--json").out) == []


def test_config_sets_initial_settings(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("fleet:\n  max_instances: 4\n")
    cli("--config", str(path), "init")
    assert cli("--config", str(path), "settings", "get", "max_instances").out == "4\n"


def test_unknown_command_is_one_error_line(cli):
    result = cli("frobnicate")
    assert result.code == 2 and result.err.startswith("error: No such command") and result.err.count("\n") == 1


def test_help_lists_the_commands(cli):
    result = cli("--help")
    assert result.code == 0
    for name in ("register", "params-done", "bench-report", "running", "heartbeat", "init", "fleet", "events",
                 "kill", "notify", "settings"):
        assert name in result.out
