"""Every launch, stop, resume and kill keeps why its actor acted (the event's data: the reason, and the agent step
that did it); `agent history --label/--since` finds the steps; empty listings say so in words."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.agent_cli import running
from helpers.serving import query
from helpers.stand_in_llm import fake_llm


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


def cause_of(db_path, where: str) -> dict | None:
    """The data of the one event matching `where`, parsed."""
    (event,) = query(db_path, f"SELECT data FROM events WHERE {where}")
    return event["data"] and json.loads(event["data"])


# --- the reason in the event --------------------------------------------------------------------------


def test_a_rules_launch_keeps_the_policys_reason_and_the_step_in_its_event(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    done = json.loads(cli("agent-step", "--policy", "rules", "--json").out)
    (action,) = done["actions"]
    assert action["kind"] == "launch" and action["reason"].startswith("queued work: capacity 70")
    (launched,) = query(db_path, "SELECT uuid, label FROM instances WHERE label != 'vastctl-a'")
    assert cause_of(db_path, f"uuid = '{launched['uuid']}'") == {"reason": action["reason"], "step": done["step_id"]}

    (shown,) = json.loads(cli("events", "--label", launched["label"], "--json").out)
    assert shown["cause"] == {"reason": action["reason"], "step": done["step_id"]}
    table = cli("events", "--label", launched["label"]).out
    assert f"; why: {action['reason']} (agent step {done['step_id']})" in table
    assert "launching on offer 1 " in table
    # the machine's own reports carry no cause
    assert all(e["cause"] is None for e in json.loads(cli("events", "--label", "vastctl-a", "--json").out))


def test_an_agents_destroy_and_stop_name_the_step_and_the_models_reason(ready, cli, market, db_path, monkeypatch):
    running(cli, "vastctl-a")
    running(cli, "vastctl-b", vast_id=501)
    running(cli, "vastctl-c", vast_id=502)
    market.show_instance = lambda vast_id: None  # the destroy's look-up: vast lists nothing else under the id
    assert cli("demand", "report", "--queued", "500").code == 0
    fake_llm(monkeypatch, [("destroy", {"label": "vastctl-b", "reason": "ECC errors in its heartbeats"}),
                           ("stop", {"label": "vastctl-c"})])  # the stop tool takes no reason
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    done = json.loads(cli("agent-step", "--json").out)
    assert [a["result"] for a in done["actions"]] == ["killed and destroyed", "stopped"], (done["refused"], done["errors"])
    step = done["step_id"]
    assert cause_of(db_path, "label = 'vastctl-b' AND to_state = 'killed'") == {
        "reason": "ECC errors in its heartbeats", "step": step}
    assert cause_of(db_path, "label = 'vastctl-c' AND to_state = 'stopped'") == {"reason": "no reason given", "step": step}
    line = [row for row in cli("events").out.splitlines() if "vastctl-b" in row and "killed" in row]
    assert len(line) == 1 and line[0].endswith(f"agent: ECC errors in its heartbeats (agent step {step}) [agent]")


def test_an_operators_launch_kill_stop_and_start_say_the_operator_did_it(ready, cli, market, db_path):
    assert cli("launch", "--gpu", "RTX 4090").code == 0
    (launched,) = query(db_path, "SELECT uuid, label FROM instances")
    assert cause_of(db_path, f"uuid = '{launched['uuid']}'") == {"reason": "the operator ran `vastctl launch`"}
    assert "; why: the operator ran `vastctl launch`" in cli("events").out

    running(cli, "vastctl-a")
    running(cli, "vastctl-b", vast_id=501)
    assert cli("stop", "vastctl-b").code == 0
    assert cause_of(db_path, "label = 'vastctl-b' AND to_state = 'stopped'") == {
        "reason": "the operator ran `vastctl stop`"}
    assert cli("start", "vastctl-b").code == 0
    assert cause_of(db_path, "label = 'vastctl-b' AND to_state = 'launching'") == {
        "reason": "the operator ran `vastctl start`"}
    assert cli("register", "--uuid", "u-x", "--label", "vastctl-x").code == 0  # never rented: no vast call to kill it
    assert cli("kill", "vastctl-x", "--reason", "GPU errors in dmesg").code == 0
    assert cause_of(db_path, "label = 'vastctl-x' AND to_state = 'killed'") == {"reason": "operator: GPU errors in dmesg"}
    shown = [e for e in json.loads(cli("events", "--json").out) if e["label"] == "vastctl-x"][-1]
    assert shown["cause"] == {"reason": "operator: GPU errors in dmesg", "step": None}
    # the reason already says it: the line does not say it twice
    assert cli("events").out.count("GPU errors in dmesg") == 1


# --- agent history --label / --since --------------------------------------------------------------------


def test_history_by_label_finds_the_step_that_launched_a_machine_and_the_one_that_stopped_another(
        ready, cli, market, db_path, monkeypatch):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    launch_step = json.loads(cli("agent-step", "--policy", "rules", "--json").out)
    (launched,) = query(db_path, "SELECT label FROM instances WHERE label != 'vastctl-a'")
    running(cli, "vastctl-b", vast_id=501)
    fake_llm(monkeypatch, [("stop", {"label": "vastctl-b"})])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    stop_step = json.loads(cli("agent-step", "--json").out)
    assert [a["result"] for a in stop_step["actions"]] == ["stopped"]

    def ids(*args: str) -> list[int]:
        view = json.loads(cli("agent", "history", *args, "--json").out)
        return [entry["id"] for entry in view["entries"]]

    assert ids() == [launch_step["step_id"], stop_step["step_id"]]
    assert ids("--label", launched["label"]) == [launch_step["step_id"]]  # found through its events
    assert ids("--label", "u-vastctl-b") == [stop_step["step_id"]]  # a uuid names the machine too
    assert ids("--label", "vastctl-a") == []
    assert cli("agent", "history", "--label", "vastctl-a").out == "no agent step matches: none acted on vastctl-a\n"
    shown = cli("agent", "history", "--label", "vastctl-b").out
    assert shown.startswith(f"#{stop_step['step_id']} ") and "did stop vastctl-b: stopped (no reason)" in shown

    with sqlite3.connect(db_path) as raw:  # the launch step ran two days ago
        raw.execute("UPDATE agent_steps SET started_at = '2020-01-01T00:00:00.000000Z' WHERE id = ?",
                    (launch_step["step_id"],))
    assert ids("--since", "1d") == [stop_step["step_id"]]
    assert ids("--since", "2019-12-31T00:00:00Z") == [launch_step["step_id"], stop_step["step_id"]]
    assert ids("--since", "2019-12-31T00:00:00Z", "--label", launched["label"]) == [launch_step["step_id"]]
    assert ids("--since", "1d", "--label", launched["label"]) == []
    view = json.loads(cli("agent", "history", "--since", "2020-06-01T00:00:00Z", "--label", "vastctl-b", "--json").out)
    assert (view["since"], view["label"], view["steps_shown"]) == ("2020-06-01T00:00:00Z", "vastctl-b", 1)


def test_bad_label_or_since_is_one_error_line_exit_2_and_nothing_changes(ready, cli, market, db_path):
    assert cli("demand", "report", "--queued", "500").code == 0
    assert cli("agent-step", "--policy", "rules").code == 0
    before = query(db_path, "SELECT * FROM agent_steps"), query(db_path, "SELECT * FROM events")
    for args, says in ((["--since", "yesterday"], "--since must be a duration like 6h"),
                       (["--since", "99999999999999d"], "--since 99999999999999d reaches before the year 1"),
                       (["--since", "2999-01-01T00:00:00Z"], "is in the future"),
                       (["--label", "vastctl-nobody"], "no instance labelled or with uuid 'vastctl-nobody'")):
        bad = cli("agent", "history", *args)
        assert bad.code == 2 and bad.out == "", args
        assert bad.err.startswith("error: ") and bad.err.count("\n") == 1 and says in bad.err, bad.err
    assert (query(db_path, "SELECT * FROM agent_steps"), query(db_path, "SELECT * FROM events")) == before


def test_one_skipped_step_shows_one_time_not_a_range(ready, cli, market, db_path):
    assert cli("agent-step", "--policy", "rules", "--if-events").code == 0  # the first step always runs
    assert cli("agent-step", "--policy", "rules", "--if-events").code == 0  # nothing new: skipped
    (skipped,) = query(db_path, "SELECT started_at FROM agent_steps WHERE outcome = 'skipped'")
    at = skipped["started_at"][:19] + "Z"
    lines = cli("agent", "history").out.splitlines()
    assert lines[-1] == f"… 1 skipped step ({at}: nothing new)", lines
    assert cli("agent-step", "--policy", "rules", "--if-events").code == 0
    assert cli("agent", "history").out.splitlines()[-1].startswith(f"… 2 skipped steps ({at} to ")


# --- empty listings ------------------------------------------------------------------------------------


def test_empty_events_and_provers_say_so(ready, cli, db_path):
    shown = cli("events", "--limit", "5")
    assert (shown.code, shown.out) == (0, "no events yet\n")
    assert cli("events", "--json").out == "[]\n"
    assert cli("notify", "maintenance at 02:00").code == 0
    assert cli("events", "--since", "1").out == "no events match: none after id 1\n"
    assert "maintenance at 02:00" in cli("events").out
    provers = cli("provers")
    assert provers.code == 0 and provers.out == "no joined provers: no running machine's tunnel end answers\n"
    assert provers.err == "provers.upstream_file is not set: no upstream file is written\n"


def test_provers_says_in_words_that_the_upstream_file_was_written_then_left_unchanged(ready, cli, tmp_path, monkeypatch):
    upstream = tmp_path / "upstream.conf"
    config = tmp_path / "config.yaml"
    config.write_text(config.read_text() + f"provers:\n  upstream_file: {upstream}\n")
    first = cli("provers")
    assert first.code == 0 and first.err == f"{upstream} rewritten: 0 prover(s); no reload_command set\n"
    again = cli("provers")
    assert again.code == 0 and again.err == f"{upstream} unchanged: it already lists these 0 prover(s); nothing reloaded\n"
    assert again.out == "no joined provers: no running machine's tunnel end answers\n"
