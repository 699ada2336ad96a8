"""The boot-script commands on the manager host: exit codes, output, rows in the file."""

from __future__ import annotations

import sqlite3

import pytest
from helpers.refusals import contents, one_error_line


def row(db_path, uuid="u1"):
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    return dict(conn.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone())


def event_count(db_path):
    return sqlite3.connect(db_path).execute("SELECT count(*) FROM events").fetchone()[0]


def test_full_lifecycle(ready, cli, db_path):
    steps = [
        (["register", "--uuid", "u1", "--label", "vastctl-a", "--vast-id", "77", "--gpu", "RTX 4090", "--num-gpus", "1"], "registered"),
        (["params-done", "--uuid", "u1"], "params_done"),
        (["bench-report", "--uuid", "u1", "--rate", "68.5"], "bench_done"),
        (["running", "--uuid", "u1"], "running"),
        (["heartbeat", "--uuid", "u1", "--proofs-done", "4"], "running"),
    ]
    for args, state in steps:
        result = cli(*args)
        assert (result.code, result.out, result.err) == (0, f"{state}\n", "")
    r = row(db_path)
    assert (r["state"], r["claimed_vast_id"], r["gpu_name"], r["num_gpus"], r["bench_rate"], r["proofs_done"]) == (
        "running", 77, "RTX 4090", 1, 68.5, 4)
    assert r["last_heartbeat_at"] is not None
    assert event_count(db_path) == 4


def test_uuid_and_label_come_from_the_environment(ready, cli, db_path, monkeypatch):
    monkeypatch.setenv("VASTCTL_UUID", "u-env")
    monkeypatch.setenv("VASTCTL_LABEL", "vastctl-env")
    assert cli("register").code == 0
    assert cli("params-done").code == 0
    assert row(db_path, "u-env")["label"] == "vastctl-env"
    assert cli("params-done", "--uuid", "other").code == 2  # the flag beats the environment


def test_bench_below_the_gate_exits_5_and_kills(ready, cli, db_path):
    cli("register", "--uuid", "u1", "--label", "a")
    cli("params-done", "--uuid", "u1")
    result = cli("bench-report", "--uuid", "u1", "--rate", "24")
    assert result.code == 5
    assert result.err == "error: instance a: bench rate 24 below gate 40; it is being killed, do not prove\n"
    r = row(db_path)
    assert (r["state"], r["kill_code"], r["kill_reason"]) == ("killed", "bench_failed", "bench rate 24 below gate 40")


def test_the_gate_is_the_runtime_setting(ready, cli, db_path):
    assert cli("settings", "set", "min_bench_rate", "20").code == 0
    cli("register", "--uuid", "u1", "--label", "a")
    cli("params-done", "--uuid", "u1")
    assert cli("bench-report", "--uuid", "u1", "--rate", "24").code == 0


@pytest.mark.parametrize("rate", ["-1", "nan", "NaN", "inf", "-inf", "fast", "", "1e999"])
def test_bad_rates_exit_2_and_change_nothing(ready, cli, db_path, rate):
    cli("register", "--uuid", "u1", "--label", "a")
    cli("params-done", "--uuid", "u1")
    before = event_count(db_path)
    result = cli("bench-report", "--uuid", "u1", "--rate", rate)
    assert result.code == 2
    assert result.err.startswith("error: --rate must be") and result.err.count("\n") == 1
    assert row(db_path)["state"] == "params_done" and event_count(db_path) == before


def test_refused_moves_exit_3(ready, cli, db_path):
    cli("register", "--uuid", "u1", "--label", "a")
    result = cli("running", "--uuid", "u1")
    assert result.code == 3
    assert result.err == "error: instance a is registered; it cannot go to running (only from bench_done)\n"
    assert row(db_path)["state"] == "registered"


def test_killed_machine_is_told_to_stop(ready, cli):
    cli("register", "--uuid", "u1", "--label", "a")
    cli("params-done", "--uuid", "u1")
    cli("bench-report", "--uuid", "u1", "--rate", "1")
    assert cli("heartbeat", "--uuid", "u1").code == 3
    assert cli("register", "--uuid", "u1").code == 3


def test_unknown_uuid_exits_2(ready, cli):
    result = cli("params-done", "--uuid", "ghost")
    assert result.code == 2 and "no instance with uuid 'ghost'" in result.err


def test_missing_uuid_is_a_usage_error(ready, cli):
    result = cli("params-done")
    assert result.code == 2 and result.err.startswith("error: Missing option '--uuid'")


def test_register_without_label_for_a_new_machine(ready, cli, db_path):
    result = cli("register", "--uuid", "u1")
    assert result.code == 2 and "--label" in result.err
    assert sqlite3.connect(db_path).execute("SELECT count(*) FROM instances").fetchone()[0] == 0


@pytest.mark.parametrize("count", ["-3", str(2**63)])
def test_a_bad_proof_count_is_exit_2_and_changes_nothing(ready, cli, db_path, count):
    cli("register", "--uuid", "u1", "--label", "a")
    result = cli("heartbeat", "--uuid", "u1", "--proofs-done", count)
    assert result.code == 2
    assert result.err.startswith("error: --proofs-done must be a whole number from 0 to") and result.err.count("\n") == 1
    row = sqlite3.connect(db_path).execute("SELECT last_heartbeat_at, proofs_done FROM instances").fetchone()
    assert row == (None, 0)


def test_commands_need_an_initialised_file(cli, db_path):
    result = cli("register", "--uuid", "u1", "--label", "a")
    assert result.code == 2 and "vastctl init" in result.err
    assert not db_path.exists()


# --- identifiers: one rule (lifecycle.validate_text) for the command line and HTTP ---------------------


HIDING = {
    "DEL": "\x7f", "C1 NEL": "\x85", "C1 CSI": "\x9b", "ESC sequence": "\x1b[2J", "newline": "\n", "tab": "\t",
    "RLO": "\u202e", "LRI": "\u2066", "RLM": "\u200f", "ALM": "\u061c", "zero width space": "\u200b",
    "line separator": "\u2028", "paragraph separator": "\u2029", "BOM": "\ufeff",
}


@pytest.mark.parametrize("flag", ["--uuid", "--label", "--gpu"])
@pytest.mark.parametrize("name", HIDING)
def test_control_and_bidi_characters_are_refused_in_identifiers(ready, cli, db_path, flag, name):
    values = {"--uuid": "u1", "--label": "vastctl-a", "--gpu": "RTX 4090"}
    values[flag] = f"vastctl{HIDING[name]}x"
    before = contents(db_path)
    result = cli("register", *[item for pair in values.items() for item in pair])
    one_error_line(result, 2, f"{flag} must be 1 to 256 printable characters")
    assert contents(db_path) == before


def test_a_repeated_register_cannot_smuggle_a_gpu_name_in(ready, cli, db_path):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-a").code == 0
    before = contents(db_path)
    one_error_line(cli("register", "--uuid", "u1", "--gpu", "RTX\u202e4090"), 2, "--gpu")
    assert contents(db_path) == before


@pytest.mark.parametrize("length,code", [(256, 0), (257, 2), (10_000, 2)])
def test_gpu_name_has_the_same_cap_as_http(ready, cli, db_path, length, code):
    before = contents(db_path)
    result = cli("register", "--uuid", "u1", "--label", "vastctl-a", "--gpu", "G" * length)
    assert result.code == code
    if code:
        one_error_line(result, 2, "--gpu must be 1 to 256 printable characters", f"got {length} characters")
        assert contents(db_path) == before


@pytest.mark.parametrize("args,flag", [
    (["heartbeat", "--uuid", "u1", "--proofs-done", str(2**63)], "--proofs-done"),
    (["register", "--uuid", "u2", "--label", "vastctl-b", "--vast-id", str(2**63)], "--vast-id"),
    (["register", "--uuid", "u2", "--label", "vastctl-b", "--num-gpus", str(2**63)], "--num-gpus"),
])
def test_a_number_too_large_for_the_file_names_its_flag(ready, cli, db_path, args, flag):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-a").code == 0
    before = contents(db_path)
    one_error_line(cli(*args), 2, f"{flag} must be a whole number from", "too large")
    assert contents(db_path) == before
    assert cli("heartbeat", "--uuid", "u1", "--proofs-done", str(2**63 - 1)).code == 0
