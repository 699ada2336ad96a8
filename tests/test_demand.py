"""Demand: reports, the command (real processes), staleness, the rows kept, the CLI, and jobs/curio-demand.sh."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.facts import demand

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "curio-demand.sh"


def cfg(command="", stale="15m"):
    return config_module.from_mapping({"demand": {"command": command, "stale_after": stale}})


def samples(conn):
    return [dict(r) for r in conn.execute("SELECT at, queued, in_flight, lookahead, proofs_per_hour, source, ok, error"
                                          " FROM demand_samples ORDER BY id")]


def test_no_sample_is_unknown(conn):
    current = demand.current(conn, cfg(), now=NOW)
    assert not current.known and current.queued is None and "no demand sample yet" in current.error


def test_a_report_is_known_until_stale(conn):
    demand.report(conn, 59, 310.0, now=NOW)
    fresh = demand.current(conn, cfg(), now=NOW + timedelta(minutes=15))
    assert (fresh.known, fresh.queued, fresh.proofs_per_hour, fresh.source, fresh.age_s) == (
        True, 59, 310.0, "report", 900)
    stale = demand.current(conn, cfg(), now=NOW + timedelta(minutes=15, seconds=1))
    assert not stale.known and stale.queued == 59 and "15m old" in stale.error


@pytest.mark.parametrize("queued, rate", [(-1, None), (1.5, None), (True, None), ("3", None), (3, -2.0),
                                          (3, float("nan")), (3, float("inf")), (10**400, None), (3, 10**400),
                                          (2**63, None), (1_000_000_001, None), (3, 1e308)])
def test_bad_reports_change_nothing(conn, queued, rate):
    with pytest.raises(BadInput):
        demand.report(conn, queued, rate, now=NOW)
    assert samples(conn) == []


@pytest.mark.parametrize("field, value", [("in_flight", -1), ("in_flight", 2.5), ("lookahead", True),
                                          ("lookahead", 10**400), ("in_flight", "7")])
def test_bad_optional_counts_change_nothing(conn, field, value):
    with pytest.raises(BadInput, match=field):
        demand.report(conn, 3, None, now=NOW, **{field: value})
    assert samples(conn) == []


def test_in_flight_and_lookahead_are_kept_and_shown(conn):
    demand.report(conn, 2, 40.0, now=NOW, in_flight=10, lookahead=24)
    current = demand.current(conn, cfg(), now=NOW)
    assert (current.queued, current.in_flight, current.lookahead, current.work) == (2, 10, 24, 36)
    assert {k: current.view()[k] for k in ("queued", "in_flight", "lookahead")} == {
        "queued": 2, "in_flight": 10, "lookahead": 24}


def test_a_report_with_only_queued_stays_whole(conn):
    demand.report(conn, 5, None, now=NOW)
    current = demand.current(conn, cfg(), now=NOW)
    assert current.known and (current.queued, current.in_flight, current.lookahead, current.work) == (5, None, None, 5)
    assert current.view()["in_flight"] is None and current.view()["lookahead"] is None


@pytest.mark.slow
def test_the_command_reports_in_flight_and_lookahead(conn):
    command = cfg("""echo '{"queued": 0, "in_flight": 7, "lookahead": 3, "proofs_per_hour": 12}'""")
    current = demand.refresh(conn, command, now=NOW)
    assert (current.known, current.queued, current.in_flight, current.lookahead, current.proofs_per_hour) == (
        True, 0, 7, 3, 12.0)
    assert [(r["queued"], r["in_flight"], r["lookahead"]) for r in samples(conn)] == [(0, 7, 3)]


@pytest.mark.slow
def test_the_command_is_sampled_and_every_sample_kept(conn):
    good = cfg("""echo '{"queued": 12, "proofs_per_hour": 40.5}'""")
    current = demand.refresh(conn, good, now=NOW)
    assert (current.known, current.queued, current.proofs_per_hour, current.source) == (True, 12, 40.5, "command")
    demand.refresh(conn, cfg("echo 'psql: connection refused' >&2; exit 2"), now=NOW + timedelta(minutes=1))
    rows = samples(conn)
    assert [(r["source"], r["ok"], r["queued"]) for r in rows] == [("command", 1, 12), ("command", 0, None)]
    assert rows[1]["error"] == "demand.command exited 2: psql: connection refused"
    assert rows[0]["at"] == "2026-11-30T12:00:00.000000Z"
    after_failure = demand.current(conn, good, now=NOW + timedelta(minutes=1))
    assert not after_failure.known and "exited 2" in after_failure.error  # the last good one is not used


UNDECODABLE = [  # output no decoder takes: unknown demand with the cause, never an unexpected error
    (r"""printf 'psql: FEHLER:  Relation \253sectors\273 existiert nicht\n' >&2; exit 2""",
     "demand.command exited 2: psql: FEHLER: Relation \ufffdsectors\ufffd existiert nicht"),
    (r"""printf '{"queued": 3, "note": "\377\376"}'""", "printed output that is not UTF-8 (byte 0xff at offset 23)"),
    ("""python3 -c 'print("[" * 200000 + "]" * 200000)'""", "nested too deeply"),
    ("""python3 -c 'print("{\\"queued\\": " + "[" * 200000 + "]" * 200000 + "}")'""", "nested too deeply"),
]


@pytest.mark.slow
@pytest.mark.parametrize("command, why", [
    ("echo hello", "printed no JSON"),
    ("echo '[1, 2]'", "printed '[1, 2]'"),
    ("""echo '{"active": true}'""", "printed"),
    ("""echo '{"queued": -3}'""", "queued must be a whole number"),
    ("""echo '{"queued": 3, "proofs_per_hour": "many"}'""", "proofs_per_hour must be"),
    ("true", "printed no JSON"),
    ("""echo '{"queued": 3, "in_flight": -1}'""", "in_flight must be a whole number"),
    ("""echo '{"queued": 3, "lookahead": "soon"}'""", "lookahead must be a whole number"),
    # numbers past range: unknown demand with the cause, never an unexpected error
    ("""printf '{"queued": %s}' $(printf '9%.0s' $(seq 400))""", "a number of 400 digits (out of range)"),
    ("""printf '{"queued": 1, "proofs_per_hour": %s}' $(printf '9%.0s' $(seq 400))""", "a number of 400 digits"),
    ("""printf '{"queued": %s}' $(printf '9%.0s' $(seq 6000))""", "a number of 6000 digits"),
    ("""echo '{"queued": 9223372036854775808}'""", "queued must be at most 1,000,000,000"),
    ("""echo '{"queued": 12345678901234567890}'""", "a number of 20 digits"),
    ("""echo '{"queued": 1000000001}'""", "queued must be at most 1,000,000,000"),
    ("""echo '{"queued": 1, "proofs_per_hour": 1e400}'""", "proofs_per_hour must be a finite number"),
    ("""echo '{"queued": 1, "proofs_per_hour": 1e300}'""", "proofs_per_hour must be at most"),
    ("""echo '{"queued": 1, "lookahead": 99999999999}'""", "lookahead must be at most"),
    *UNDECODABLE,
])
def test_garbage_is_unknown(conn, command, why):
    current = demand.refresh(conn, cfg(command), now=NOW)
    assert not current.known and why in current.error
    assert samples(conn)[0]["ok"] == 0


@pytest.mark.slow
def test_a_hung_command_is_killed_at_the_timeout(conn, monkeypatch):
    monkeypatch.setattr(demand, "COMMAND_TIMEOUT_S", 0.5)
    current = demand.refresh(conn, cfg("sleep 30 | cat"), now=NOW)
    assert not current.known and current.error == "demand.command timed out after 0.5s"


def test_empty_since_is_the_start_of_the_current_empty_run(conn):
    for minutes, queued in [(0, 4), (10, 0), (20, 0), (30, 0)]:
        demand.report(conn, queued, None, now=NOW + timedelta(minutes=minutes))
    assert demand.current(conn, cfg(), now=NOW + timedelta(minutes=30)).empty_since == NOW + timedelta(minutes=10)
    demand.record(conn, source="command", now=NOW + timedelta(minutes=31), error="timed out")
    demand.report(conn, 0, None, now=NOW + timedelta(minutes=32))
    assert demand.current(conn, cfg(), now=NOW + timedelta(minutes=32)).empty_since == NOW + timedelta(minutes=32)
    demand.report(conn, 1, None, now=NOW + timedelta(minutes=33))
    assert demand.current(conn, cfg(), now=NOW + timedelta(minutes=33)).empty_since is None


def test_work_in_flight_or_coming_breaks_the_empty_run(conn):
    """Claimed tasks and PoRep tasks about to come are work: the fleet's cooldown starts when they are gone too."""
    at = [NOW + timedelta(minutes=m) for m in range(6)]
    demand.report(conn, 0, None, now=at[0])  # an old-style report: in flight and coming unsaid, counted as 0
    demand.report(conn, 0, None, now=at[1], in_flight=4, lookahead=0)
    assert demand.current(conn, cfg(), now=at[1]).empty_since is None
    demand.report(conn, 0, None, now=at[2], in_flight=0, lookahead=9)
    assert demand.current(conn, cfg(), now=at[2]).empty_since is None
    demand.report(conn, 0, None, now=at[3], in_flight=0, lookahead=0)
    demand.report(conn, 0, None, now=at[4])
    assert demand.current(conn, cfg(), now=at[4]).empty_since == at[3]


def test_the_observation_carries_in_flight_and_lookahead(conn):
    from vastctl.observe import observe

    demand.report(conn, 1, 20.0, now=NOW, in_flight=6, lookahead=12)
    obs = observe(conn, cfg(), now=NOW)
    assert (obs.demand.in_flight, obs.demand.lookahead, obs.demand.work) == (6, 12, 19)
    prompt = obs.to_prompt()["demand"]
    assert (prompt["queued"], prompt["in_flight"], prompt["lookahead"]) == (1, 6, 12)


def test_samples_kept_before_the_new_columns_read_as_queued_only(db_path):
    """A state file from before in_flight/lookahead: its samples survive the migration and stay whole."""
    import sqlite3

    from vastctl.state import db, migrations

    number = next(m.number for m in migrations.MIGRATIONS if m.name == "demand samples: in flight and look-ahead")
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for version, name, sql in ((m.number, m.name, m.sql) for m in migrations.MIGRATIONS[: number - 1]):
        for statement in db._statements(sql):
            raw.execute(statement)
        raw.execute("INSERT INTO migrations VALUES (?, ?, '2026-11-30T00:00:00.000000Z')", (version, name))
    raw.execute(f"PRAGMA user_version = {number - 1}")
    raw.execute("INSERT INTO demand_samples (at, queued, proofs_per_hour, source, ok) VALUES"
                " ('2026-11-30T12:00:00.000000Z', 59, 310.0, 'report', 1)")
    raw.close()
    conn = db.connect(db_path, now=NOW)
    current = demand.current(conn, cfg(), now=NOW)
    assert (current.known, current.queued, current.in_flight, current.lookahead, current.work) == (True, 59, None, None, 59)
    conn.close()


# --- the CLI ----------------------------------------------------------------------------------------


def test_cli_report_then_show_json(ready, cli, db_path):
    assert cli("demand", "report", "--queued", "59", "--proofs-per-hour", "310").code == 0
    result = cli("demand", "show", "--json")
    assert result.code == 0
    view = json.loads(result.out)
    assert {k: view[k] for k in ("queued", "proofs_per_hour", "source", "known")} == {
        "queued": 59, "proofs_per_hour": 310.0, "source": "report", "known": True}
    assert view["at"].endswith("Z") and view["age_s"] >= 0
    assert "59 queued" in cli("demand", "show").out


@pytest.mark.parametrize("args", [
    ["--queued", "-1"], ["--queued", "x"], [], ["--queued", "3", "--proofs-per-hour", "-1"],
    ["--queued", "9" * 400], ["--queued", str(2**63)], ["--queued", "3", "--proofs-per-hour", "9" * 400],
    ["--queued", "3", "--proofs-per-hour", "1e308"], ["--queued", "3", "--in-flight", "-1"],
    ["--queued", "3", "--in-flight", "9" * 400], ["--queued", "3", "--lookahead", "1.5"],
    ["--queued", "3", "--lookahead", "1000000001"],
])
def test_cli_bad_report_changes_nothing(ready, cli, db_path, args):
    result = cli("demand", "report", *args)
    assert result.code == 2 and result.err.startswith("error: ") and "Traceback" not in result.err
    assert result.err.count("\n") == 1 and "unexpected" not in result.err
    from vastctl.state import db

    assert db.connect(db_path, now=NOW).execute("SELECT count(*) FROM demand_samples").fetchone()[0] == 0


def test_cli_report_with_arrivals_and_later(ready, cli, db_path):
    result = cli("demand", "report", "--queued", "2", "--lookahead", "9", "--arrivals", "4, 0,5", "--later", "30")
    assert result.code == 0 and "2 queued, 9 coming (per 10 min: 4 0 5), 30 later" in result.err + result.out
    view = json.loads(cli("demand", "show", "--json").out)
    assert (view["lookahead"], view["arrivals"], view["later"], view["known"]) == (9, [4, 0, 5], 30, True)
    assert "2 queued, 9 coming (per 10 min: 4 0 5), 30 later" in cli("demand", "show").out
    from vastctl.state import db

    row = db.connect(db_path, now=NOW).execute("SELECT arrivals, later FROM demand_samples").fetchone()
    assert tuple(row) == ("[4, 0, 5]", 30)


@pytest.mark.parametrize("args, why", [
    (["--arrivals", "1,x"], "--arrivals must be a list of at most 18 whole numbers from 0 to 1,000,000,000"),
    (["--arrivals", "1,-2"], "got '-2' in it"),
    (["--arrivals", ""], "got '' in it"),
    (["--arrivals", "1,,2"], "got '' in it"),
    (["--arrivals", ",".join(["1"] * 19)], "got 19 numbers"),
    (["--arrivals", "1000000001"], "got 1000000001 in it"),
    (["--arrivals", "9" * 400], "--arrivals must be"),
    (["--arrivals", "١"], "--arrivals must be"),  # an Arabic-Indic one: digits are ASCII
    (["--later", "-1"], "--later"),
    (["--later", "1000000001"], "later must be at most 1,000,000,000"),
])
def test_cli_bad_arrivals_or_later_change_nothing(ready, cli, db_path, args, why):
    result = cli("demand", "report", "--queued", "3", *args)
    assert result.code == 2 and result.err.startswith("error: ") and result.err.count("\n") == 1
    assert why in result.err and "Traceback" not in result.err
    from vastctl.state import db

    assert db.connect(db_path, now=NOW).execute("SELECT count(*) FROM demand_samples").fetchone()[0] == 0


def test_cli_report_with_in_flight_and_lookahead(ready, cli):
    result = cli("demand", "report", "--queued", "0", "--in-flight", "10", "--lookahead", "24")
    assert result.code == 0 and "0 queued, 10 in flight, 24 coming" in result.err + result.out
    view = json.loads(cli("demand", "show", "--json").out)
    assert (view["queued"], view["in_flight"], view["lookahead"], view["known"]) == (0, 10, 24, True)
    assert "0 queued, 10 in flight, 24 coming" in cli("demand", "show").out


@pytest.mark.slow
def test_cli_show_runs_the_command(ready, cli, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("demand:\n  command: \"echo '{\\\"queued\\\": 7}'\"\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    view = json.loads(cli("demand", "show", "--json").out)
    assert (view["queued"], view["source"], view["known"]) == (7, "command", True)
    config.write_text("demand:\n  command: \"exit 9\"\n")
    result = cli("demand", "show")
    assert result.code == 0 and result.out.startswith("unknown: demand.command exited 9")


# --- jobs/curio-demand.sh -----------------------------------------------------------------------------


@pytest.fixture
def fake_psql(tmp_path):
    """A `psql` first on PATH that prints $FAKE_COUNTS and logs its arguments, one a line (the real
    database is in test_curio_demand.py; this one prints what a real psql never would)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "psql.log"
    (bin_dir / "psql").write_text(
        "#!/bin/sh\n"
        f"for arg in \"$@\"; do echo \"$arg\" >> {log}; done; env | grep '^PG' >> {log}\n"
        "echo \"$FAKE_COUNTS\"\n"
    )
    (bin_dir / "psql").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "log": log}


def run_script(fake_psql, **env):
    return subprocess.run([str(SCRIPT)], env={**os.environ, "PATH": fake_psql["PATH"], **env},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_curio_demand_bounds_itself_and_qualifies_every_table(fake_psql):
    result = run_script(fake_psql, FAKE_COUNTS="59 10 24 312 3,5,0,4,6,2,0,1,0 40", CURIO_DB_URL="postgres://u:p@yb:5433/db",
                        CURIO_DB_SCHEMA="curio_prod")
    assert result.returncode == 0, result.stderr
    assert demand.parse_output(result.stdout) == demand.Sample(queued=59, in_flight=10, lookahead=24,
                                                               proofs_per_hour=312.0, arrivals=(3, 5, 0, 4, 6, 2, 0, 1, 0),
                                                               later=40)
    args = fake_psql["log"].read_text()
    assert args.startswith("postgres://u:p@yb:5433/db\n")
    assert "SET statement_timeout = '10s'" in args and "SET lock_timeout = '5s'" in args
    assert "PGCONNECT_TIMEOUT=5" in args and "PGAPPNAME=curio-demand" in args
    for table in ("harmony_task", "harmony_task_history", "sectors_sdr_pipeline"):
        assert f"FROM curio_prod.{table}" in args
    assert " harmony_task " not in args.replace("curio_prod.harmony_task ", "")


@pytest.mark.slow
@pytest.mark.parametrize("counts", ["ERROR: relation does not exist", "", "1 2 3", "1 2 3 4 5", "1 2 -3 4",
                                    "1 2 3 4.5", "1 2 3 4", "1 2 3 4 0,0,0,0,0,0,0,0,0",
                                    "1 2 3 4 0,0,0,0,0,0,0,0 5", "1 2 3 4 0,0,0,0,0,0,0,0,0,0 5",
                                    "1 2 3 4 0,0,0,,0,0,0,0,0 5", "1 2 3 4 0,0,0,0,0,0,0,0,0, 5",
                                    "1 2 3 4 0,0,0,0,-1,0,0,0,0 5", "1 2 3 4 0,0,0,0,0,0,0,0,0 5 6",
                                    "1 2 3 4 0,0,0,0,0,0,0,0,0 x"])
def test_curio_demand_fails_on_odd_output(fake_psql, counts):
    result = run_script(fake_psql, FAKE_COUNTS=counts)
    assert result.returncode != 0 and result.stdout == ""
    assert "expected five counts and 9 arrivals" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("field", ["queued", "proofs_per_hour", "in_flight"])
def test_an_agent_step_reads_a_400_digit_number_as_unknown_demand(ready, cli, tmp_path, monkeypatch, field):
    """The step runs and holds (unknown demand), naming the cause; it does not fail on the number."""
    import yaml

    digits = "9" * 400
    body = {"queued": 1, field: digits} if field != "queued" else {"queued": digits}
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"demand": {"command": f"echo '{text}'"}}))
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    market = type("EmptyMarket", (), {"list_instances": lambda self: [], "search_offers": lambda self, query: []})()
    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: market)
    result = cli("agent-step", "--dry-run", "--json")
    assert result.code == 0, result.err
    step = json.loads(result.out)
    assert step["demand"]["known"] is False and "a number of 400 digits (out of range)" in step["demand"]["error"]


@pytest.mark.slow
def test_a_latin1_stderr_beside_a_good_report_is_known(conn):
    current = demand.refresh(conn, cfg(r"""printf 'Warnung: \344\n' >&2; echo '{"queued": 4}'"""), now=NOW)
    assert current.known and current.queued == 4


@pytest.mark.slow
@pytest.mark.parametrize("command, why", UNDECODABLE)
def test_demand_show_and_an_agent_step_hold_on_undecodable_output(ready, cli, tmp_path, monkeypatch, command, why):
    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"demand": {"command": command}}))
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    shown = cli("demand", "show", "--json")
    assert shown.code == 0, shown.err
    view = json.loads(shown.out)
    assert view["known"] is False and why in view["error"]
    market = type("EmptyMarket", (), {"list_instances": lambda self: [], "search_offers": lambda self, query: []})()
    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: market)
    result = cli("agent-step", "--dry-run", "--json")
    assert result.code == 0, result.err
    step = json.loads(result.out)
    assert step["demand"]["known"] is False and why in step["demand"]["error"]


# --- quick: the command's report read through an injected runner (no process) -------------------------------


def printing(stdout: str, code: int = 0, stderr: str = ""):
    """A stand-in for run_command: what the command would have printed, and the arguments it was given."""
    calls = []

    def runner(command, timeout_s, env):
        calls.append((command, timeout_s, dict(env)))
        return code, stdout, stderr
    return runner, calls


def test_the_commands_in_flight_and_lookahead_are_read_and_kept(conn):
    runner, calls = printing('{"queued": 0, "in_flight": 7, "lookahead": 3, "proofs_per_hour": 12}\n')
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert (current.known, current.queued, current.in_flight, current.lookahead, current.proofs_per_hour) == (
        True, 0, 7, 3, 12.0)
    assert current.work == 10 and current.source == "command"
    assert [(r["queued"], r["in_flight"], r["lookahead"], r["ok"]) for r in samples(conn)] == [(0, 7, 3, 1)]
    assert calls == [("curio-demand", demand.COMMAND_TIMEOUT_S, {"VASTCTL_SECTOR_SIZE": "32GiB"})]


def test_a_command_silent_on_in_flight_and_lookahead_reads_them_as_unknown(conn):
    runner, _ = printing('{"queued": 4}')
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert (current.known, current.queued, current.in_flight, current.lookahead, current.work) == (True, 4, None, None, 4)


def test_parse_output_reads_every_field_and_refuses_a_bad_optional_count():
    assert demand.parse_output('{"queued": 2, "in_flight": 5, "lookahead": 9, "proofs_per_hour": 1.5}') == demand.Sample(
        queued=2, in_flight=5, lookahead=9, proofs_per_hour=1.5)
    for field in ("in_flight", "lookahead"):
        with pytest.raises(BadInput, match=f"{field} must be a whole number"):
            demand.parse_output(f'{{"queued": 2, "{field}": -1}}')


def test_the_commands_arrivals_and_later_are_read_kept_and_shown(conn):
    runner, _ = printing('{"queued": 1, "lookahead": 12, "arrivals": [3, 0, 4, 5, 0, 0, 0, 0, 0], "later": 40}\n')
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert current.known and (current.arrivals, current.later) == ((3, 0, 4, 5, 0, 0, 0, 0, 0), 40)
    assert tuple(conn.execute("SELECT arrivals, later FROM demand_samples").fetchone()) == ("[3, 0, 4, 5, 0, 0, 0, 0, 0]", 40)
    view = current.view()
    assert (view["arrivals"], view["later"]) == ([3, 0, 4, 5, 0, 0, 0, 0, 0], 40)
    assert current.work == 13  # the buckets say when, not more: work counts the look-ahead once


def test_a_source_silent_on_arrivals_and_later_reads_them_as_none(conn):
    runner, _ = printing('{"queued": 1, "lookahead": 12}')
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert current.known and (current.arrivals, current.later) == (None, None)
    assert (current.view()["arrivals"], current.view()["later"]) == (None, None)
    assert tuple(conn.execute("SELECT arrivals, later FROM demand_samples").fetchone()) == (None, None)


@pytest.mark.parametrize("text, why", [
    ('"arrivals": [1, -2]', "arrivals must be a list of at most 18 whole numbers from 0 to 1,000,000,000"),
    ('"arrivals": [1, 2.5]', "got 2.5 in it"),
    ('"arrivals": [true]', "got True in it"),
    ('"arrivals": ["3"]', "got '3' in it"),
    ('"arrivals": [[1]]', "got [1] in it"),
    ('"arrivals": 5', "arrivals must be a list"),
    ('"arrivals": {"0": 1}', "arrivals must be a list"),
    ('"arrivals": [' + ", ".join(["0"] * 19) + "]", "got 19 numbers"),
    ('"arrivals": [1000000001]', "got 1000000001 in it"),
    ('"arrivals": [' + "9" * 400 + "]", "a number of 400 digits"),
    ('"later": -1', "later must be a whole number ≥ 0 (sectors in earlier stages)"),
    ('"later": 1.5', "later must be a whole number"),
])
def test_bad_arrivals_or_later_are_unknown_demand_in_one_line(conn, text, why):
    runner, _ = printing('{"queued": 1, ' + text + "}")
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert not current.known and why in current.error and "\n" not in current.error
    assert [(r["ok"], r["queued"]) for r in samples(conn)] == [(0, None)]
    assert tuple(conn.execute("SELECT arrivals, later FROM demand_samples").fetchone()) == (None, None)


def test_eighteen_buckets_and_empty_ones_are_whole():
    assert demand.parse_output('{"queued": 0, "arrivals": []}').arrivals == ()
    eighteen = demand.parse_output('{"queued": 0, "arrivals": [' + ", ".join(["1000000000"] * 18) + "]}")
    assert eighteen.arrivals == (1_000_000_000,) * 18


@pytest.mark.parametrize("arrivals, later", [([1, -1], None), ([0] * 19, None), ("1,2", None), ([1], -3), ([1], True)])
def test_a_bad_report_of_arrivals_or_later_changes_nothing(conn, arrivals, later):
    with pytest.raises(BadInput, match="arrivals must|later must"):
        demand.report(conn, 3, None, now=NOW, arrivals=arrivals, later=later)
    assert samples(conn) == []


def test_the_observation_carries_arrivals_and_later(conn):
    from vastctl.observe import observe

    demand.report(conn, 1, None, now=NOW, lookahead=5, arrivals=[2, 3], later=7)
    obs = observe(conn, cfg(), now=NOW)
    assert (obs.demand.arrivals, obs.demand.later, demand.ARRIVAL_BUCKET_S) == ((2, 3), 7, 600)
    prompt = obs.to_prompt()["demand"]
    assert (prompt["arrivals"], prompt["later"]) == ([2, 3], 7)


def test_a_failed_command_is_unknown_with_its_exit_and_output(conn):
    runner, _ = printing("", code=2, stderr="psql: connection refused\n")
    current = demand.refresh(conn, cfg("curio-demand"), now=NOW, runner=runner)
    assert not current.known and current.error == "demand.command exited 2: psql: connection refused"
    assert [(r["ok"], r["queued"], r["in_flight"]) for r in samples(conn)] == [(0, None, None)]
