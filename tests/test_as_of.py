"""`--as-of TIME`: every view shows the state file as it stood then (docs/interface.md, "--as-of").

A kept simulated day is read at a moment inside it and compared with the same day's file as it really stood at
that moment (as_of_day: copied while the day ran). What the file keeps only as its latest value (a machine's
heartbeats, vast's message) is unknown at an earlier moment and must read as unknown, never as a later value.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta

import pytest
from helpers.as_of_day import HOURS, make

from vastctl import clock
from vastctl import config as config_module
from vastctl.demo import setting
from vastctl.errors import BadInput
from vastctl.serving import dashboard
from vastctl.state import as_of, db
from vastctl.state.rows import TABLES

# What the file keeps only as its latest value, and what an earlier moment shows of it once the latest came later.
UNKNOWN_THEN = {"proofs_done": 0, "proofs_per_hour": None, "vast_status_msg": None}
FROM_UNKNOWN = ("rate_source",)  # whether the heartbeats' rate or the benchmark's was clamped to the router's
HEARD_BY_THEN = ("last_heartbeat_at", "last_contact_at")  # a machine heard from after it: at the moment at the latest
RATE_FROM_HEARTBEATS = {"expected_rate", "counted_rate"}  # what a machine's heartbeats' rate sets, when it has one
RATE_WITHOUT_HEARTBEATS = ("bench", "router", "gpu_model", "default")  # the rate sources that stand in without it


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    return make(tmp_path_factory.mktemp("as-of"))


def read(cli, path, moment, *command) -> dict:
    result = cli("--db", path, "--as-of", clock.display_moment(moment), *command, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def without_unknowns(shown: dict, then: dict, moment: str) -> tuple[dict, dict]:
    """The two with what is unknown at the moment left out, once `shown` shows it as unknown (or as it was)."""
    for name, unknown in UNKNOWN_THEN.items():
        if name in shown and shown[name] != then.get(name):
            assert shown[name] == unknown, (shown.get("label"), name, shown[name], then.get(name))
    for name in HEARD_BY_THEN:
        if name in shown and shown[name] != then.get(name):
            assert then[name] is not None and then[name] < shown[name] <= moment, (name, shown[name], then[name])
    left_out = {*UNKNOWN_THEN, *HEARD_BY_THEN, *FROM_UNKNOWN, "contact_age_s"}
    if "proofs_per_hour" in shown and shown["proofs_per_hour"] is None and then.get("proofs_per_hour") is not None:
        # its heartbeats' rate then is unknown: the rate it is counted at is its benchmark's (or the router's)
        assert shown["rate_source"] in RATE_WITHOUT_HEARTBEATS, (shown.get("label"), shown["rate_source"])
        left_out |= RATE_FROM_HEARTBEATS
    return ({name: value for name, value in shown.items() if name not in left_out},
            {name: value for name, value in then.items() if name not in left_out})


def summaries_agree(shown: dict, then: dict, machines: list, truths: list, moment: str) -> None:
    """The summaries match, but for the capacity: it sums the machines' counted rates, so it moves by as much as
    the rates whose heartbeats' figure was unknown then."""
    shift = sum((machine.get("counted_rate") or 0.0) - (truth.get("counted_rate") or 0.0)
                for machine, truth in zip(machines, truths))
    assert shown["capacity_proofs_per_hour"] == pytest.approx(then["capacity_proofs_per_hour"] + shift, abs=0.1)
    mine, theirs = without_unknowns(shown, then, moment)
    mine.pop("capacity_proofs_per_hour"), theirs.pop("capacity_proofs_per_hour")
    assert mine == theirs


@pytest.mark.slow  # a simulated day
def test_the_day_has_what_a_moment_must_take_back(day):
    """Machines launched after the moment and machines whose state changed after it: the checks below are not
    of a file that stood still."""
    kept, then = (sqlite3.connect(path) for path in (day.kept, day.then))
    moment = clock.to_iso(day.moment)
    assert kept.execute("SELECT count(*) FROM instances WHERE created_at > ?", (moment,)).fetchone()[0] > 0
    assert then.execute("SELECT count(*) FROM instances WHERE created_at > ?", (moment,)).fetchone()[0] == 0
    changed = kept.execute("SELECT count(DISTINCT uuid) FROM events WHERE kind = 'transition' AND at > ? AND uuid IN"
                           " (SELECT uuid FROM instances WHERE created_at <= ?)", (moment, moment)).fetchone()[0]
    assert changed > 0
    assert kept.execute("SELECT count(*) FROM proof_calls WHERE at > ?", (moment,)).fetchone()[0] > 0
    kept.close()
    then.close()


@pytest.mark.slow
def test_fleet_at_a_moment_is_the_fleet_the_file_had_then(cli, day):
    shown, then = read(cli, day.kept, day.moment, "fleet", "--all"), read(cli, day.then, day.moment, "fleet", "--all")
    assert [m["label"] for m in shown["instances"]] == [m["label"] for m in then["instances"]]
    moment = clock.display_moment(day.moment)
    for machine, truth in zip(shown["instances"], then["instances"]):
        mine, theirs = without_unknowns(machine, truth, moment)
        assert mine == theirs, machine["label"]
    summaries_agree(shown["summary"], then["summary"], shown["instances"], then["instances"], moment)
    assert shown["summary"]["contact_age_s"] <= then["summary"]["contact_age_s"]
    at_end = {m["label"]: m for m in read(cli, day.kept, setting.START + timedelta(hours=HOURS), "fleet", "--all")["instances"]}
    assert len(at_end) > len(shown["instances"]) and any(at_end[m["label"]]["state"] != m["state"] for m in shown["instances"])


@pytest.mark.slow
def test_cost_by_machine_and_demand_at_a_moment_are_the_files_then(cli, day):
    for command in (("cost", "--by", "machine"), ("cost",), ("cost", "--since", "1h"), ("demand", "show"),
                    ("settings", "list"), ("agent", "history"), ("events", "--limit", "1000")):
        assert read(cli, day.kept, day.moment, *command) == read(cli, day.then, day.moment, *command), command


@pytest.mark.slow
def test_the_dashboards_figures_at_a_moment_are_the_files_then(day, tmp_path):
    copy = as_of.copy_as_of(day.kept, day.moment, tmp_path)  # what `serve --as-of` serves
    config = config_module.from_mapping({})
    pages = []
    for path in (copy, day.then):
        config.db = str(path)
        conn = db.connect(path, now=day.moment)
        try:
            pages.append(dashboard.page_data(conn, config, day.moment))
        finally:
            conn.close()
    shown, then = pages
    assert shown.keys() == then.keys()
    moment = clock.display_moment(day.moment)
    assert [m["label"] for m in shown["instances"]] == [m["label"] for m in then["instances"]]
    for machine, truth in zip(shown["instances"], then["instances"]):
        mine, theirs = without_unknowns(dict(machine), dict(truth), moment)
        assert mine == theirs, machine["label"]
    summaries_agree(dict(shown["summary"]), dict(then["summary"]), shown["instances"], then["instances"], moment)
    seen, truth = shown["observation"], then["observation"]
    assert (seen.spend_per_hour, seen.demand) == (truth.spend_per_hour, truth.demand)
    # a machine's heartbeats' rate is unknown then: its benchmark's, clamped to what the router saw, stands in
    shift = sum(m["expected_rate"] - t["expected_rate"] for m, t in zip(seen.machines, truth.machines)
                if t["state"] == "running")
    assert seen.capacity == pytest.approx(truth.capacity + shift, abs=0.1)
    chart, chart_then = shown["history"], then["history"]
    assert {**chart, "capacity": None} == {**chart_then, "capacity": None}
    assert [at for at, _ in chart["capacity"]] == [at for at, _ in chart_then["capacity"]]
    # the chart walks capacity back from the moment's, each machine at its rate then (its heartbeats' rate unknown:
    # its benchmark's stands in), so the moment's own is the file's then, moved as the observation's is
    assert chart["capacity"][-1][1] == pytest.approx(chart_then["capacity"][-1][1] + shift, abs=0.1)
    for name in shown.keys() - {"instances", "summary", "observation", "history"}:
        assert shown[name] == then[name], name


def test_every_table_of_the_file_has_a_rule_for_an_earlier_moment():
    """A table added later is taken back, kept or cut by its stamp: never read at a moment with rows from after it."""
    ruled = [*as_of.STAMPED, *as_of.REWOUND, *as_of.KEPT]
    assert len(ruled) == len(set(ruled)) and set(TABLES) <= set(ruled), set(TABLES) - set(ruled)


def test_a_table_with_no_rule_is_refused_not_shown_as_it_is_now(conn):
    conn.execute("CREATE TABLE unruled_extra (at TEXT)")
    with pytest.raises(BadInput, match=r"--as-of cannot rewind the table\(s\) unruled_extra of this file"):
        as_of.cut(conn, "2031-03-03T12:00:00Z")


@pytest.mark.slow
def test_the_days_own_end_shows_what_reading_it_without_as_of_shows(cli, day):
    end = clock.display_moment(setting.START + timedelta(hours=HOURS))
    for command in (("fleet", "--all"), ("cost", "--by", "machine"), ("demand", "show"), ("events",)):
        plain = cli("--db", day.kept, *command, "--json")
        held = cli("--db", day.kept, "--as-of", end, *command, "--json")
        assert plain.code == held.code == 0 and plain.out == held.out, command


@pytest.mark.slow
@pytest.mark.parametrize("command", [("kill", "vastctl-any", "--reason", "looked at a moment"), ("reconcile",),
                                     ("settings", "set", "target_proofs_per_hour", "300"), ("agent-step",),
                                     ("demand", "report", "--queued", "3"), ("provers",), ("demo", "--hours", "1")])
def test_a_command_that_writes_is_refused_at_a_moment_and_changes_nothing(cli, day, command):
    before = day.kept.read_bytes()
    result = cli("--db", day.kept, "--as-of", clock.display_moment(day.moment), *command)
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1, result
    assert result.err.startswith("error: --as-of shows the state file as it stood then, to the commands that only"
                                 " read it (agent history, cost, demand show, events, fleet, logs, serve,")
    named = " ".join(command[:2] if command[0] in ("settings", "demand") else command[:1])
    assert result.err.endswith(f"`vastctl {named}` is not one: run it without --as-of\n")
    assert day.kept.read_bytes() == before


@pytest.mark.slow  # a server in a process of its own
def test_serve_as_of_serves_the_file_as_it_stood_then(cli, day, tmp_path):
    import requests
    from helpers.serving import Manager

    truth = read(cli, day.then, day.moment, "fleet", "--all")
    manager = Manager(tmp_path / "m", admin_token=day.admin_token)
    manager.env["VASTCTL_DB"] = str(day.kept)
    manager.start(0, "--as-of", clock.display_moment(day.moment))
    try:
        answer = requests.get(f"{manager.url}/v1/fleet", params={"all": "1"}, timeout=10,
                              headers={"Authorization": f"Bearer {day.admin_token}"})
    finally:
        assert manager.stop() == 0
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert [m["label"] for m in shown["instances"]] == [m["label"] for m in truth["instances"]]
    moment = clock.display_moment(day.moment)
    for machine, then in zip(shown["instances"], truth["instances"]):
        mine, theirs = without_unknowns(machine, then, moment)
        assert mine == theirs, machine["label"]


@pytest.mark.slow
def test_demand_at_a_moment_is_its_last_sample_then_and_todays_source_is_not_asked(cli, day, tmp_path):
    asked = tmp_path / "asked"
    config = tmp_path / "config.yaml"
    config.write_text(f"demand:\n  command: \"touch {asked}; echo '{{\\\"queued\\\": 999}}'\"\n")
    truth = read(cli, day.then, day.moment, "demand", "show")
    result = cli("--config", config, "--db", day.kept, "--as-of", clock.display_moment(day.moment), "demand", "show",
                 "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out) == truth and truth["queued"] != 999
    assert not asked.exists()
