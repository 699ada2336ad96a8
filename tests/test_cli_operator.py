"""Operator commands on the state file: init, fleet, events, kill, notify, settings."""

from __future__ import annotations

import json
import os
import re
import sqlite3

import pytest
from helpers.refusals import contents, one_error_line


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
    assert lines[-2].startswith("work: no demand sample yet")


def test_fleet_of_an_empty_file(ready, cli):
    result = cli("fleet")
    assert (result.code, result.out) == (0, "work: no demand sample yet (demand.command, or `vastctl demand report`)"
                                            " · no proofs done in the last day\nno machines · capacity 0/0 proofs/h · $0.00/h\n")


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
                       "max_hourly_spend": 10.0, "max_daily_spend": 240.0, "max_dph": 1.0}
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


# --- everyday commands: settings, help, notify ------------------------------------------------------


def test_a_negative_setting_is_an_invalid_value_not_an_option(ready, cli):
    result = cli("settings", "set", "target_proofs_per_hour", "-5")
    assert result.code == 2
    assert result.err == "error: target_proofs_per_hour must be a number from 0 to 10000000, got '-5'\n"


@pytest.mark.parametrize("key", ["max_dph", "max_hourly_spend"])
def test_a_zero_price_limit_is_refused(ready, cli, key):
    result = cli("settings", "set", key, "0")
    assert result.code == 2 and "would refuse every launch" in result.err
    assert cli("events", "--json").out.strip() == "[]"  # nothing changed


def test_max_instances_zero_pauses_launches_out_loud(ready, cli):
    result = cli("settings", "set", "max_instances", "0")
    assert result.code == 0
    assert "warning: max_instances 0 pauses every launch" in result.err
    assert cli("settings", "get", "max_instances").out == "0\n"


def test_get_and_list_print_the_same_format(ready, cli):
    cli("settings", "set", "max_dph", "0.6")
    listed = {line.split()[0]: line.split()[1] for line in cli("settings", "list").out.splitlines()[1:]}
    for key in ("max_dph", "max_instances", "target_proofs_per_hour", "max_hourly_spend"):
        assert cli("settings", "get", key).out == listed[key] + "\n"
    assert listed["max_dph"] == "0.6" and listed["target_proofs_per_hour"] == "0"


def test_settings_json_before_or_after_the_subcommand(ready, cli):
    before = cli("settings", "--json", "list")
    after = cli("settings", "list", "--json")
    assert before.code == 0 and json.loads(before.out) == json.loads(after.out)
    assert json.loads(before.out)["max_instances"] == 10
    assert json.loads(cli("settings", "--json", "get", "max_dph").out) == {"max_dph": 1.0}


def test_settings_help_lists_the_keys(cli):
    for args in (["settings", "--help"], ["settings", "set", "--help"], ["settings", "get", "--help"]):
        out = cli(*args).out
        assert all(key in out for key in ("target_proofs_per_hour", "min_bench_rate", "max_instances",
                                          "max_hourly_spend", "max_dph")), args


def test_fleet_all_help_states_the_rule(cli):
    out = " ".join(cli("fleet", "--help").out.split())
    assert "killed machine with a vast id whose destroy vast has not confirmed" in out


def test_kill_help_does_not_suggest_prefixes(cli):
    out = cli("kill", "--help").out
    assert "vastctl kill vastctl-3f2a91c0" in out and "no prefixes" in out


def test_notify_says_what_it_did(ready, cli):
    result = cli("notify", "maintenance at 02:00")
    assert result.code == 0
    assert re.fullmatch(r"note recorded \(event \d+\); the agent reads it at its next step\n", result.out)


# --- refused input leaves every row as it was; upstream text is escaped in tables, kept in JSON ------------


@pytest.fixture
def machine(ready, cli):
    for args in (["register", "--uuid", "u1", "--label", "vastctl-a"], ["params-done", "--uuid", "u1"],
                 ["bench-report", "--uuid", "u1", "--rate", "60"], ["running", "--uuid", "u1"],
                 ["demand", "report", "--queued", "0"]):  # an empty queue: the last machine may be killed
        assert cli(*args).code == 0


@pytest.mark.parametrize("reason", ["r" * 501, "line one\nline two", "GPU \x1b[31merrors"])
def test_a_kill_reason_is_one_line_of_at_most_500_characters(machine, cli, db_path, reason):
    before = contents(db_path)
    one_error_line(cli("kill", "vastctl-a", "--reason", reason), 2, "--reason must be 1 to 500 printable characters")
    assert contents(db_path) == before
    assert cli("kill", "vastctl-a", "--reason", "r" * 500).code == 0


def test_a_note_keeps_its_4000_cap(ready, cli, db_path):
    before = contents(db_path)
    one_error_line(cli("notify", "n" * 4001), 2, "4000")
    assert contents(db_path) == before


ESC = "\x1b]0;pwned\x07\x1b[2J"


T = "2026-01-01T00:00:00Z"


@pytest.fixture
def upstream_text(machine, db_path):
    """Rows as vast and machines filled them before this rule existed, or as reconcile copies them from vast."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, kill_reason, vast_status,"
                " destroy_attempts, destroy_error) VALUES ('u9', ?, 'killed', ?, ?, ?, ?, 1, ?)",
                ("vastctl-\u202eevil", T, T, f"exited: {ESC}", f"exited{ESC}", f"HTTP 500 {ESC}"))
    raw.execute("UPDATE instances SET vast_status = ?, vast_status_msg = ? WHERE uuid = 'u1'",
                (f"loading{ESC}", f"pulling\n{ESC}"))
    raw.execute("INSERT INTO events (at, kind, uuid, label, to_state, reason, source) VALUES"
                " ('2026-01-01T00:00:00Z', 'transition', 'u9', ?, 'killed', ?, 'reconcile')",
                ("vastctl-\u202eevil", f"vast says exited: {ESC}\u2028fake line"))
    raw.execute("INSERT INTO vast_listings (at, ok, error) VALUES ('2026-01-01T00:00:00Z', 0, ?)", (f"bad {ESC}",))


def no_raw_controls(text: str) -> None:
    for ch in ("\x1b", "\x07", "\u202e", "\u2028"):
        assert ch not in text, repr(text)


def test_fleet_and_events_escape_what_vast_and_machines_wrote(upstream_text, cli):
    fleet = cli("fleet", "--all")
    assert fleet.code == 0
    no_raw_controls(fleet.out + fleet.err)
    assert "vastctl-\\u202eevil" in fleet.out and "\\x1b[2J" in fleet.out
    assert "warning: the last vast listing failed: bad \\x1b]0;pwned\\x07\\x1b[2J" in fleet.err
    events = cli("events")
    no_raw_controls(events.out)
    assert len(events.out.splitlines()) == 1 + 5  # every event on its own line, the separator escaped
    assert "exited: \\x1b]0;pwned\\x07\\x1b[2J\\u2028fake line" in events.out


def test_json_keeps_the_data_as_it_is(upstream_text, cli):
    instances = {i["uuid"]: i for i in json.loads(cli("fleet", "--json", "--all").out)["instances"]}
    assert instances["u9"]["label"] == "vastctl-\u202eevil"
    assert instances["u1"]["vast_status_msg"] == f"pulling\n{ESC}"
    events = json.loads(cli("events", "--json").out)
    assert events[-1]["reason"] == f"vast says exited: {ESC}\u2028fake line"


def test_kill_prints_an_adopted_label_escaped(ready, cli, db_path):
    sqlite3.connect(db_path, isolation_level=None).execute(
        "INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES ('u7', ?, 'running', ?, ?)",
        ("vastctl-\x1b[8mhidden", T, T))
    assert cli("demand", "report", "--queued", "0").code == 0  # an empty queue: the last machine may be killed
    result = cli("kill", "u7", "--reason", "odd label")
    assert result.code == 0 and result.out == "vastctl-\\x1b[8mhidden killed\n"
