"""Demand: reports, the command (real processes), staleness, the rows kept, the CLI, and jobs/curio-demand.sh."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vastctl import config as config_module
from vastctl import demand
from vastctl.errors import BadInput

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "curio-demand.sh"


def cfg(command="", stale="15m"):
    return config_module.from_mapping({"demand": {"command": command, "stale_after": stale}})


def samples(conn):
    return [dict(r) for r in conn.execute("SELECT at, queued, proofs_per_hour, source, ok, error FROM demand_samples"
                                          " ORDER BY id")]


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
                                          (3, float("nan")), (3, float("inf"))])
def test_bad_reports_change_nothing(conn, queued, rate):
    with pytest.raises(BadInput):
        demand.report(conn, queued, rate, now=NOW)
    assert samples(conn) == []


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


@pytest.mark.parametrize("command, why", [
    ("echo hello", "printed no JSON"),
    ("echo '[1, 2]'", "printed '[1, 2]'"),
    ("""echo '{"active": true}'""", "printed"),
    ("""echo '{"queued": -3}'""", "queued must be a whole number"),
    ("""echo '{"queued": 3, "proofs_per_hour": "many"}'""", "proofs_per_hour must be"),
    ("true", "printed no JSON"),
])
def test_garbage_is_unknown(conn, command, why):
    current = demand.refresh(conn, cfg(command), now=NOW)
    assert not current.known and why in current.error
    assert samples(conn)[0]["ok"] == 0


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


@pytest.mark.parametrize("args", [["--queued", "-1"], ["--queued", "x"], [], ["--queued", "3", "--proofs-per-hour", "-1"]])
def test_cli_bad_report_changes_nothing(ready, cli, db_path, args):
    result = cli("demand", "report", *args)
    assert result.code == 2 and result.err.startswith("error: ") and "Traceback" not in result.err
    from vastctl import db

    assert db.connect(db_path, now=NOW).execute("SELECT count(*) FROM demand_samples").fetchone()[0] == 0


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
    """A `psql` first on PATH that answers the two counts and logs the queries it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "psql.log"
    (bin_dir / "psql").write_text(
        "#!/bin/sh\n"
        f"for arg in \"$@\"; do last=\"$arg\"; done; echo \"$1|$last\" >> {log}\n"
        "case \"$last\" in *harmony_task_history*) echo \"${FAKE_FINISHED:-0}\" ;; *) echo \"${FAKE_QUEUED:-0}\" ;; esac\n"
    )
    (bin_dir / "psql").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "log": log}


def run_script(fake_psql, **env):
    return subprocess.run([str(SCRIPT)], env={**os.environ, "PATH": fake_psql["PATH"], **env},
                          capture_output=True, text=True, timeout=30)


def test_curio_demand_prints_the_json_vastctl_reads(fake_psql):
    result = run_script(fake_psql, FAKE_QUEUED="59", FAKE_FINISHED="312", CURIO_DB_URL="postgres://u:p@yb:5433/db")
    assert result.returncode == 0, result.stderr
    assert demand.parse_output(result.stdout) == (59, 312.0)
    queries = fake_psql["log"].read_text().splitlines()
    assert all(line.startswith("postgres://u:p@yb:5433/db|") for line in queries)
    assert "FROM harmony_task WHERE name IN ('PoRep','UpdateProve','PSProve') AND owner_id IS NULL" in queries[0]
    assert "harmony_task_history" in queries[1] and "interval '1 hour'" in queries[1]


def test_curio_demand_fails_on_odd_output(fake_psql):
    result = run_script(fake_psql, FAKE_QUEUED="ERROR: relation does not exist")
    assert result.returncode != 0 and result.stdout == "" and "expected a count" in result.stderr
