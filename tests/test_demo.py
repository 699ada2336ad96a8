"""`vastctl demo`: a simulated day of the control loop, through the CLI and through vastctl.demo."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from datetime import timedelta

import pytest
from helpers.serving import query

from vastctl import clock as clocks
from vastctl.demo import chart as day_chart
from vastctl.demo import day as demo_day
from vastctl.demo import setting
from vastctl.providers.sim import FAULT_KINDS
from vastctl.state import db

CONTRACT_KEYS = {"hours", "seed", "target_attainment", "cost", "proofs", "cost_per_1000_proofs", "kills_by_reason",
                 "leaked_instance_hours", "detection_latency_p95_s"}
# columns that hold a moment to come (computed from simulated time): a blocklist entry's end, the market's next step
SCHEDULED = {("blocklist", "until"), ("sim_instances", "step_at"), ("sim_instances", "fault_at"),
             ("sim_meta", "busy_until"), ("locks", "expires_at"),
             ("proof_calls", "at")}  # a call a machine took before the end is answered after it
ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


def demo_json(cli, *args):
    result = cli("demo", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.slow
def test_a_short_demo_through_the_cli_prints_the_contracts_figures_and_leaves_the_operators_file_alone(cli, db_path):
    figures = demo_json(cli, "--hours", "3")
    assert CONTRACT_KEYS <= set(figures)
    assert figures["hours"] == 3 and figures["seed"] == setting.DEFAULT_SEED
    assert 0 <= figures["target_attainment"] <= 1 and figures["attainment_minutes"] == 120  # 3 h minus the warm-up
    assert figures["proofs"] > 0 and figures["cost"] > 0
    assert figures["cost_per_1000_proofs"] == pytest.approx(figures["cost"] / figures["proofs"] * 1000, rel=0.01)
    assert figures["machines_launched"] > 0 and figures["agent_steps"] > 0
    assert set(figures["faults"]) == set(FAULT_KINDS)
    assert not db_path.exists()  # VASTCTL_DB names the operator's file: the demo never opens it


@pytest.mark.slow
def test_the_summary_table_names_the_figures_and_no_progress_bar_goes_to_a_pipe(cli):
    result = cli("demo", "--hours", "2")
    assert result.code == 0, result.err
    assert result.out.startswith(f"vastctl demo: 2 simulated hours, seed {setting.DEFAULT_SEED}, policy plan,"
                                 " failures default")
    for label in ("target met", "cost per 1000 proofs", "leaked instance-hours", "dead machines detected"):
        assert label in result.out
    assert "kills by reason:" in result.out and "market faults:" in result.out
    assert result.err == ""  # stderr is not a terminal here: no progress bar


def labels(path):
    return [row["label"] for row in query(path, "SELECT label FROM instances ORDER BY rowid")]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_figures_to_the_digit_and_another_seed_another(cli, tmp_path):
    """Labels too: a decision breaks a tie between two machines alike by label, so random labels would make the
    same seed's day differ wherever such a tie fell the other way."""
    first = demo_json(cli, "--hours", "3", "--seed", "4", "--failures", "high", "--keep", tmp_path / "first.db")
    again = demo_json(cli, "--hours", "3", "--seed", "4", "--failures", "high", "--keep", tmp_path / "again.db")
    other = demo_json(cli, "--hours", "3", "--seed", "5", "--failures", "high", "--keep", tmp_path / "other.db")
    assert first == again
    launched = labels(tmp_path / "first.db")
    assert len(launched) > 3 and launched == labels(tmp_path / "again.db")
    assert set(launched).isdisjoint(labels(tmp_path / "other.db"))
    assert other["seed"] == 5
    assert (other["cost"], other["proofs"], other["faults"]) != (first["cost"], first["proofs"], first["faults"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["day.svg", "day.png"])
def test_the_chart_is_written_as_svg_or_png_by_its_extension(cli, tmp_path, name):
    chart = tmp_path / name
    result = cli("demo", "--hours", "1", "--chart", chart)
    assert result.code == 0, result.err
    assert f"chart written to {chart}" in result.err
    data = chart.read_bytes()
    if name.endswith(".png"):
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    else:
        root = ElementTree.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert b"proofs / hour" in data and b"queued" in data and b"spend $/h" in data


@pytest.mark.parametrize("args, words", [
    (["--policy", "llm"], "ANTHROPIC_API_KEY"),
    (["--policy", "magic"], "--policy must be one of rules, llm"),
    (["--hours", "0"], "--hours must be more than 0"),
    (["--failures", "often"], "--failures must be one of low, default, high"),
    (["--seed", "-1"], "--seed must be a whole number"),
    (["--chart", "day.txt"], "must end in .svg or .png"),
    (["--chart", "/no/such/dir/day.svg"], "does not exist"),
    (["--rental", "cheap"], "--rental must be one of on-demand, interruptible, mixed"),
])
def test_bad_input_is_one_error_line_and_exit_2(cli, tmp_path, monkeypatch, args, words):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = cli("demo", *args)
    assert result.code == 2
    assert result.out == "" and result.err.count("\n") == 1 and result.err.startswith("error: ") and words in result.err
    assert list(work.iterdir()) == []  # no chart, nothing written


# --- a simulated day, through vastctl.demo ----------------------------------------------------------


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    directory = tmp_path_factory.mktemp("demo-day")
    result = demo_day.run(setting.DemoOptions(hours=24), directory)
    return result, directory / "demo.db"


@pytest.mark.slow
def test_a_simulated_day_writes_no_wall_clock_time_anywhere_in_the_file(day):
    result, path = day
    conn = db.connect(path, now=setting.START)
    start, end = setting.START, setting.START + timedelta(hours=24)
    low, high = clocks.to_iso(start)[:19], clocks.to_iso(end)[:19]
    until = "9999"  # a moment to come may lie past the day, never before it (the wall clock is years before START)
    seen = {}
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                         " AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        text_columns = [c[1] for c in conn.execute(f"PRAGMA table_info({table})") if c[2].upper() == "TEXT"]
        for column in text_columns:
            for (value,) in conn.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"):
                for moment in ISO_TIME.findall(str(value)):  # JSON columns too (observation, actions, …)
                    assert low <= moment <= (until if (table, column) in SCHEDULED else high), (table, column, moment)
                    seen[(table, column)] = seen.get((table, column), 0) + 1
    for table, column in (("migrations", "applied_at"), ("agent_steps", "started_at"), ("agent_steps", "observation"), ("demand_samples", "at"),
                          ("events", "at"), ("actions", "at"), ("instances", "killed_at"), ("settings", "updated_at"),
                          ("sim_instances", "died_at"), ("vast_listings", "at"), ("proof_calls", "at")):
        assert seen.get((table, column)), (table, column)  # the scan saw each of them: it cannot pass on an empty file
    conn.close()


@pytest.mark.slow
def test_every_failure_kind_happens_and_is_handled_over_two_days_at_the_default_level(day, tmp_path):
    """The default seed's day and seed 9's: a fleet sized honestly runs ~14 machines a day, too few for every
    rare fault (a vanished instance, an offline host, a stalled fetch) to strike in one day. Seed 9's runs the
    rules, which stop machines in a lull and resume them (the plan destroys what it releases): a resume whose
    GPU was taken needs a resume."""
    other = demo_day.run(setting.DemoOptions(hours=24, seed=9, policy="rules"), tmp_path)
    days = [day, (other, tmp_path / "demo.db")]
    happened = {kind for result, _path in days for kind, n in result.figures["faults"].items() if n > 0}
    assert happened >= set(FAULT_KINDS), [result.figures["faults"] for result, _path in days]
    codes: set[str] = set()
    stuck = 0
    for result, path in days:
        figures = result.figures
        conn = db.connect(path, now=setting.START)
        codes |= {row[0] for row in conn.execute("SELECT kill_code FROM instances WHERE state = 'killed'")}
        # a stuck benchmark goes at reconcile's timeout, or before it once the fleet launched around it and covers
        # the work
        stuck += conn.execute("SELECT count(*) FROM instances WHERE kill_code = 'timeout_params_done' OR (kill_code ="
                              " 'agent' AND kill_reason LIKE '%benchmarking for %likely stuck%')").fetchone()[0]
        # every machine that died was killed, and every killed one is destroyed but the last minutes' refusals
        assert figures["deaths"] > 0 and figures["deaths_undetected_at_end"] == 0
        left = conn.execute("SELECT count(*) FROM instances WHERE state = 'killed' AND destroyed_at IS NULL"
                            " AND killed_at < ?", (clocks.to_iso(setting.START + timedelta(hours=23)),)).fetchone()[0]
        assert left == 0
        assert figures["detection_latency_p95_s"] <= 180
        assert sum(figures["kills_by_reason"].values()) == conn.execute(
            "SELECT count(*) FROM instances WHERE state = 'killed'").fetchone()[0]
        conn.close()
    assert {"start_failed", "timeout_registered", "scheduling_timeout"} <= codes, codes
    assert stuck > 0
    assert {"exited", "disappeared", "offline"} <= codes, codes


@pytest.mark.slow
def test_the_demand_source_outage_makes_demand_unknown_and_the_agent_holds(day):
    result, path = day
    conn = db.connect(path, now=setting.START)
    outage_from = clocks.to_iso(setting.START + timedelta(hours=setting.OUTAGE[0]))
    outage_to = clocks.to_iso(setting.START + timedelta(hours=setting.OUTAGE[1]))
    assert conn.execute("SELECT count(*) FROM demand_samples WHERE at >= ? AND at < ?",
                        (outage_from, outage_to)).fetchone()[0] == 0
    unknown = [json.loads(row[0])["demand"] for row in conn.execute(
        "SELECT observation FROM agent_steps WHERE outcome = 'ok' AND started_at >= ? AND started_at < ?",
        (outage_from, outage_to))]
    assert any(not d["known"] for d in unknown)
    stops = conn.execute("SELECT count(*) FROM events WHERE source = 'agent' AND to_state = 'stopped'"
                         " AND at >= ? AND at < ?", (outage_from, outage_to)).fetchone()[0]
    assert stops == 0  # unknown demand never shrinks the fleet
    conn.close()


# --- the demo explains itself; --keep --------------------------------------------------------------


@pytest.mark.slow
def test_the_summary_says_what_the_lower_bound_is_and_what_the_ratio_means(cli):
    result = cli("demo", "--hours", "1")
    assert result.code == 0, result.err
    bound = next(line for line in result.out.splitlines() if line.startswith("lower bound:"))
    assert "least any fleet could pay" in bound and "linear program" in bound and "no fleet pays less" in bound
    for freedom in ("keep a host through an hour another renter takes", "keep the price it rented at",
                    "let proofs wait up to agent.max_wait"):
        assert freedom in bound
    assert any(line.startswith("any-host bound:") and "bid-aware bound" in line for line in result.out.splitlines())
    ratio = next(line for line in result.out.splitlines() if line.startswith("cost / lower bound:"))
    assert "how many times that bound the run paid" in ratio


@pytest.mark.slow
def test_the_chart_marks_launches_kills_by_reason_the_outage_and_shows_spend_so_far_and_proof_waits(day, tmp_path):
    result, _ = day
    svg = tmp_path / "day.svg"
    day_chart.write_chart(result, svg)
    text = svg.read_text()
    assert f"launch ({len(result.launches)})" in text and len(result.launches) == result.figures["machines_launched"]
    for code, n in result.figures["kills_by_reason"].items():
        assert f"kill: {code} ({n})" in text
    assert "demand source down (nothing reported)" in text
    assert "$ so far" in text and "minutes a proof waited" in text
    # the histogram is the run's own record of the waits: its lines are the summary's percentiles
    assert sum(result.waits.values()) == pytest.approx(result.figures["proofs_judged_for_wait"], abs=1)
    for name in ("p50", "p95"):
        assert f"{name} {result.figures[f'proof_wait_{name}_s'] / 60:.0f} min" in text


@pytest.mark.slow
def test_keep_leaves_the_days_state_file_for_serve(cli, tmp_path):
    kept = tmp_path / "day.db"
    result = cli("demo", "--hours", "2", "--keep", kept)
    assert result.code == 0, result.err
    assert f"state file kept at {kept}; every command reads it at the day's end (`--as-of 2031-03-03T02:00:00Z`)" in result.err
    token = (tmp_path / "day.db.admin-token").read_text().strip()
    assert len(token) >= 32 and f"`vastctl --db {kept} serve`" in result.err
    assert result.err.count(token) == 1 and token not in result.out  # shown once, on stderr
    for name in ("day.db.secret", "day.db.admin-token"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    conn = db.connect(kept, now=setting.START + timedelta(hours=2))  # a whole file: no -wal beside it needed
    assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] > 0
    conn.close()
    assert not (tmp_path / "day.db-wal").exists() or (tmp_path / "day.db-wal").stat().st_size == 0


KEPT_HOURS = 8


@pytest.fixture(scope="module")
def kept_day(tmp_path_factory):
    """An 8-hour day of the rules kept by `demo --keep`, through the CLI as an operator runs it: long enough for a
    machine to boot, prove, be killed and destroyed (test_events_label_shows_one_machines_whole_path; the plan
    holds its fleet through these hours)."""
    from helpers.serving import run_vastctl

    kept = tmp_path_factory.mktemp("kept") / "day.db"
    done = run_vastctl("demo", "--hours", str(KEPT_HOURS), "--policy", "rules", "--keep", str(kept), env={})
    assert done.returncode == 0, done.stderr
    return kept


@pytest.mark.slow
def test_the_read_commands_read_a_kept_day_at_its_own_end(cli, kept_day):
    """Without --as-of: the day lies years ahead of the wall clock, and its "last hour" is its own."""
    cost = json.loads(cli("--db", kept_day, "cost", "--json").out)
    assert cost["as_of"].startswith(f"2031-03-03T{KEPT_HOURS:02d}:00:0") and cost["cost"] > 0 and cost["machines"] > 0, cost
    fleet = json.loads(cli("--db", kept_day, "fleet", "--all", "--json").out)
    assert fleet["summary"]["listing_age_s"] < 120  # the day's last listing, a minute before its end
    destroyed = [m for m in fleet["instances"] if m["destroyed_at"] and m["vast_id"] is not None]
    assert destroyed and {m["vast_status"] for m in destroyed} == {"destroyed"}
    table = cli("--db", kept_day, "fleet", "--all").out
    assert " destroyed " in table
    history = cli("--db", kept_day, "agent", "history", "--json")
    assert history.code == 0 and json.loads(history.out), history.err
    earlier = json.loads(cli("--db", kept_day, "--as-of", "2031-03-03T01:00:00Z", "cost", "--json").out)
    assert earlier["as_of"].startswith("2031-03-03T01:00:0") and earlier["cost"] < cost["cost"]


@pytest.mark.slow
def test_events_label_shows_one_machines_whole_path(cli, kept_day):
    conn = db.connect(kept_day, now=setting.START + timedelta(hours=KEPT_HOURS))
    label, uuid = conn.execute(  # one that booted, proved, was killed and destroyed: every kind of step
        "SELECT label, uuid FROM instances i WHERE destroyed_at IS NOT NULL AND vast_id IS NOT NULL AND EXISTS"
        " (SELECT 1 FROM events e WHERE e.uuid = i.uuid AND e.to_state = 'bench_done') ORDER BY created_at LIMIT 1"
    ).fetchone()
    mine = [r[0] for r in conn.execute("SELECT id FROM events WHERE uuid = ? ORDER BY id", (uuid,))]
    calls = [r[0] for r in conn.execute("SELECT kind FROM actions WHERE uuid = ? ORDER BY id", (uuid,))]
    conn.close()
    listed = json.loads(cli("--db", kept_day, "events", "--label", label, "--json").out)
    assert [e["id"] for e in listed] == mine and {e["label"] for e in listed} == {label}
    table = cli("--db", kept_day, "events", "--label", label).out.splitlines()
    changes = " ".join(table)
    for state in ("∅ → launching", "launching → registered", "→ params_done", "→ bench_done", "→ killed"):
        assert state in changes, (state, table)
    assert sum(line.split()[2] == "vast" for line in table[1:-1]) == len(calls) and "launch" in calls
    assert "vast destroy: " in changes and table[-1].split()[2] == "now" and "destroyed at vast" in table[-1]
    times = [line.split()[1] for line in table[1:-1]]
    assert times == sorted(times)
    unknown = cli("--db", kept_day, "events", "--label", "vastctl-nothere")
    assert unknown.code == 2 and unknown.err.count("\n") == 1 and "no instance labelled" in unknown.err


def test_as_of_refuses_a_time_it_cannot_read(cli):
    result = cli("--as-of", "yesterday", "fleet")
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith("error: --as-of must be a UTC time like 2031-03-04T00:00:00Z")


@pytest.mark.slow
def test_in_a_simulated_day_event_ids_follow_their_times(day):
    """The order consumers follow (--since ID) is the order things happened: a minute's machine reports are written
    before that minute's settings and passes."""
    result, path = day
    conn = db.connect(path, now=setting.START)
    times = [row[0] for row in conn.execute("SELECT at FROM events ORDER BY id")]
    conn.close()
    assert len(times) > 100 and times == sorted(times)


def test_keep_never_overwrites_a_file(cli, tmp_path):
    kept = tmp_path / "day.db"
    kept.write_text("the operator's")
    result = cli("demo", "--hours", "1", "--keep", kept)
    assert result.code == 2 and result.err.startswith("error: --keep") and "already exists" in result.err
    assert kept.read_text() == "the operator's" and not (tmp_path / "day.db.secret").exists()


def test_serve_as_of_rejects_a_time_it_cannot_read(cli):
    result = cli("serve", "--port", "0", "--as-of", "yesterday")
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith("error: --as-of must be a UTC time like 2031-03-04T00:00:00Z")


@pytest.mark.slow
def test_serve_as_of_shows_the_kept_day_on_its_own_clock(cli, tmp_path):
    import requests
    from helpers.serving import ADMIN_TOKEN, Manager

    kept = tmp_path / "m" / "day.db"
    kept.parent.mkdir()
    assert cli("demo", "--hours", "2", "--keep", kept).code == 0
    manager = Manager(tmp_path / "m2")
    manager.env["VASTCTL_DB"] = str(kept)
    manager.start(0, "--as-of", "2031-03-03T02:00:00Z")
    try:
        session = requests.Session()
        session.post(f"{manager.url}/login", data={"token": ADMIN_TOKEN}, timeout=10)
        page = session.get(f"{manager.url}/", timeout=10).text
    finally:
        assert manager.stop() == 0
    assert "Since the fleet began (2h" in page  # the simulated day, not the wall clock's empty last day
    assert '<time datetime="2031-03-03T01:' in page


@pytest.mark.slow
def test_a_kept_day_opens_its_dashboard_with_no_config_written(cli, tmp_path):
    """`demo --keep`, then `vastctl --db FILE serve` alone: the token printed once signs in, at the day's end."""
    import requests
    from helpers.serving import Manager

    kept = tmp_path / "m" / "day.db"
    kept.parent.mkdir()
    made = cli("demo", "--hours", "2", "--keep", kept)
    token = re.search(r"sign in with (\S+) ", made.err).group(1)
    manager = Manager(tmp_path / "m2")
    manager.config_path.write_text("fleet:\n  min_bench_rate: 40\n")  # no admin token anywhere in it
    manager.env["VASTCTL_DB"] = str(kept)
    manager.start(0)
    try:
        session = requests.Session()
        assert session.post(f"{manager.url}/login", data={"token": "wrong" * 8}, timeout=10).status_code == 401
        session.post(f"{manager.url}/login", data={"token": token}, timeout=10)
        page = session.get(f"{manager.url}/", timeout=10).text
    finally:
        assert manager.stop() == 0
    assert "Since the fleet began (2h" in page and '<time datetime="2031-03-03T01:' in page


@pytest.mark.slow
def test_a_day_reports_how_long_proofs_waited_and_the_bound_rents_only_what_the_fleet_may(day):
    result, path = day
    figures = result.figures
    assert figures["max_wait_s"] == 45 * 60
    assert figures["proofs_within_max_wait"] >= 0.99
    assert 0 <= figures["proof_wait_p50_s"] <= figures["proof_wait_p95_s"] <= figures["proof_wait_p99_s"] <= 45 * 60
    assert figures["proofs_judged_for_wait"] >= figures["proofs"] - figures["machines_launched"]  # whole calls
    # the fleet's filters make the honest bound at least the any-host one (every host of the market)
    assert figures["lower_bound_cost_per_1000_proofs"] >= figures["lower_bound_any_host_cost_per_1000_proofs"]
    conn = db.connect(path, now=setting.START)
    coming = conn.execute("SELECT count(*) FROM demand_samples WHERE lookahead > 0").fetchone()[0]
    assert coming > 600  # the script reports the coming hour as look-ahead, beside the queue
    conn.close()


@pytest.mark.slow
def test_a_days_calls_add_up_to_the_markets_proofs_and_its_wait_figures_are_the_routers(day):
    """The day's proof_calls rows: every proof the market did, as whole calls (within one a machine), and the
    demo's proof-wait figures are deliveries.proof_wait over the file, as `fleet --json` reads it."""
    from vastctl.facts import deliveries

    result, path = day
    figures = result.figures
    conn = db.connect(path, now=setting.START)
    completed = dict(conn.execute("SELECT uuid, count(*) FROM proof_calls WHERE result = 'completed'"
                                  " GROUP BY uuid").fetchall())
    assert None not in completed and set(completed) <= {r[0] for r in conn.execute("SELECT uuid FROM instances")}
    assert 0 <= figures["proofs"] - sum(completed.values()) <= len(completed), (figures["proofs"], completed)
    kinds = conn.execute("SELECT DISTINCT kind, attempt FROM proof_calls WHERE result = 'completed'").fetchall()
    assert [tuple(k) for k in kinds] == [("porep", 1)]
    late = conn.execute("SELECT count(*) FROM proof_calls WHERE result = 'expired'").fetchone()[0]
    measured = deliveries.proof_wait(conn, since=setting.START, until=setting.START + timedelta(days=2),
                                     max_wait_s=figures["max_wait_s"])
    assert measured["calls"] == sum(completed.values()) and figures["proofs_judged_for_wait"] == measured["calls"] + late
    assert (figures["proof_wait_p50_s"], figures["proof_wait_p95_s"], figures["proof_wait_p99_s"]) == (
        measured["p50_s"], measured["p95_s"], measured["p99_s"])
    assert figures["proofs_within_max_wait"] == pytest.approx(
        measured["within_max_wait"] * measured["calls"] / (measured["calls"] + late), abs=1e-4)
    # a machine kept at its true rate is seen by the router at it: the routed ceiling is that rate
    end = setting.START + timedelta(hours=24)
    true = dict(conn.execute("SELECT uuid, h.true_rate FROM sim_instances JOIN sim_hosts h USING (machine_id)"))
    for uuid, routed in deliveries.routed_rates(conn, now=end, slots=5).items():
        assert routed.rate <= true[uuid] * 1.001 and routed.rate_max == pytest.approx(true[uuid], rel=1e-3)
    conn.close()


@pytest.mark.slow
def test_the_rules_release_machines_while_work_is_queued_in_a_day(day):
    """Two-way sizing: machines are stopped while work is queued or coming, not only after the quiet spell."""
    result, path = day
    conn = db.connect(path, now=setting.START)
    quiet_from = clocks.to_iso(setting.START + timedelta(hours=setting.QUIET[0]))
    released = conn.execute("SELECT count(*) FROM events WHERE source = 'agent' AND to_state IN ('stopped', 'killed')"
                            " AND at < ?", (quiet_from,)).fetchone()[0]
    assert released > 0
    conn.close()


def test_the_help_names_the_default_seed_and_the_rentals(cli):
    result = cli("demo", "--help")
    text = " ".join(result.out.split())
    assert f"default {setting.DEFAULT_SEED}" in text and "default 11" not in text
    assert "--rental" in text and "interruptible" in text and "mixed" in text


@pytest.mark.slow
def test_a_mixed_day_through_the_cli_rents_interruptible_and_reports_the_bid_aware_bound(cli, tmp_path):
    figures = demo_json(cli, "--hours", "3", "--rental", "mixed")
    assert figures["rental"] == "mixed" and figures["machines_interruptible"] > 0
    assert figures["cost_ratio_to_interruptible_bound"] >= figures["cost_ratio_to_lower_bound"] >= 1
    config = tmp_path / "config.yaml"
    config.write_text("launch:\n  rental: interruptible\n")
    result = cli("--config", str(config), "demo", "--json", "--hours", "2")
    assert result.code == 0, result.err
    from_config = json.loads(result.out)
    assert from_config["rental"] == "interruptible" and from_config["machines_interruptible"] > 0


@pytest.mark.slow
def test_over_a_kept_day_vastctls_proofs_equal_the_markets_within_1_percent(cli, tmp_path):
    kept = tmp_path / "day.db"
    # the rules' fleet: it stops machines in a lull and resumes them (the plan destroys what it releases)
    figures = demo_json(cli, "--hours", "24", "--seed", "5", "--policy", "rules", "--keep", str(kept))
    conn = db.connect(kept, now=setting.START)
    counted = conn.execute("SELECT sum(proofs_total) FROM instances").fetchone()[0]
    resets = conn.execute("SELECT count(*) FROM events WHERE kind = 'counter_reset'").fetchone()[0]
    conn.close()
    assert resets > 0  # resumed machines restarted their counters, and nothing was lost to it
    assert abs(counted - figures["proofs"]) <= 0.01 * figures["proofs"], (counted, figures["proofs"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_fleet_comes_in_under_the_lower_bound(tmp_path, seed):
    """The rules fleet, the static one and the mixed-rental one on three seeds (12 simulated hours each): each
    pays at least its bound per proof (the on-demand bound; the bid-aware one for a fleet that bids)."""
    from vastctl.config import Config

    def mixed(config: Config) -> None:
        config.launch.rental = "mixed"

    for number, (fleet, configure) in enumerate((("rules", None), ("static", None), ("rules", mixed))):
        directory = tmp_path / str(number)
        directory.mkdir()
        figures = demo_day.run(setting.DemoOptions(hours=12, seed=seed, fleet=fleet), directory, configure=configure).figures
        assert figures["cost_ratio_to_interruptible_bound"] >= 1.0, (fleet, figures)
        if configure is None:
            assert figures["cost_ratio_to_lower_bound"] >= 1.0, (fleet, figures)
        assert figures["lower_bound_interruptible_cost_per_1000_proofs"] <= figures["lower_bound_cost_per_1000_proofs"]
        assert figures["lower_bound_any_host_cost_per_1000_proofs"] <= figures["lower_bound_cost_per_1000_proofs"]
