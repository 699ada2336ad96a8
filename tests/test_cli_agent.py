"""agent-step and the guard at the command line, against a stand-in market: exit codes, output, rows, calls made."""

from __future__ import annotations

import json
import re

import pytest
from helpers.agent_cli import running
from helpers.serving import query
from helpers.stand_in_llm import fake_llm

from vastctl import clock
from vastctl.agent import step
from vastctl.state import db, locks


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


def test_rules_step_launches_to_the_target(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    result = cli("agent-step", "--policy", "rules", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert (data["policy"], data["skipped"], data["refused"], data["errors"]) == ("rules", False, [], [])
    assert data["tokens"] == {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    # 70 running, sized to 115: one more machine at the default rate 60, the cheapest offer
    assert [(a["kind"], a["offer_id"]) for a in data["actions"]] == [("launch", 1)]
    assert data["actions"][0]["result"].startswith("launched vastctl-")
    assert ("create", 1) in market.calls
    launched = query(db_path, "SELECT state, offer_id FROM instances WHERE label != 'vastctl-a'")
    assert launched == [{"state": "launching", "offer_id": 1}]
    assert query(db_path, "SELECT source FROM events ORDER BY id DESC LIMIT 1") == [{"source": "agent"}]
    (row,) = query(db_path, "SELECT * FROM agent_steps")
    assert (row["policy"], row["outcome"], row["input_tokens"], row["cost"]) == ("rules", "ok", 0, 0.0)
    assert json.loads(row["actions"])[0]["kind"] == "launch" and row["finished_at"]
    assert json.loads(row["observation"])["demand"]["queued"] == 500


def test_dry_run_buys_nothing(ready, cli, market, db_path):
    assert cli("demand", "report", "--queued", "59").code == 0
    result = cli("agent-step", "--policy", "rules", "--dry-run", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["dry_run"] and [a["result"] for a in data["actions"]] == ["planned (dry run)"] * 2
    assert [c[0] for c in market.calls] == ["search"]
    assert query(db_path, "SELECT count(*) AS n FROM instances") == [{"n": 0}]
    assert query(db_path, "SELECT outcome FROM agent_steps") == [{"outcome": "dry_run"}]
    assert "dry run: policy rules: 2 action(s), 0 refused" in cli("agent-step", "--policy", "rules", "--dry-run").err


def test_without_json_one_line_per_action_and_a_quiet_tick_prints_nothing(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    result = cli("agent-step", "--policy", "rules", "--if-events")
    assert result.code == 0, result.err
    (line,) = result.out.splitlines()  # the format reconcile's lines have: time kind label result: reason
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ launch - launched vastctl-\S+ \(instance \d+\): .+", line)
    assert "policy rules: 1 action(s), 0 refused" in result.err
    quiet = cli("agent-step", "--policy", "rules", "--if-events")  # nothing new: cron gets no output, so no mail
    assert (quiet.code, quiet.out, quiet.err) == (0, "", "")


def test_if_events_skips_until_something_happens(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    running(cli, "vastctl-b", vast_id=501)
    assert cli("demand", "report", "--queued", "3").code == 0
    assert json.loads(cli("agent-step", "--policy", "rules", "--if-events", "--json").out)["skipped"] is False  # the first step runs
    again = cli("agent-step", "--policy", "rules", "--if-events", "--json")
    assert again.code == 0 and json.loads(again.out)["skipped"] is True
    assert "nothing new since step 1" in json.loads(again.out)["reason"]
    assert cli("notify", "maintenance at 02:00").code == 0  # an operator's note is an event
    woke = json.loads(cli("agent-step", "--policy", "rules", "--if-events", "--json").out)
    assert woke["skipped"] is False and "1 new event" in woke["reason"]
    assert json.loads(cli("agent-step", "--policy", "rules", "--if-events", "--json").out)["skipped"] is True
    assert cli("demand", "report", "--queued", "0").code == 0  # the queue emptied: demand changed
    assert json.loads(cli("agent-step", "--policy", "rules", "--if-events", "--json").out)["skipped"] is False
    outcomes = [r["outcome"] for r in query(db_path, "SELECT outcome FROM agent_steps ORDER BY id")]
    assert outcomes == ["ok", "skipped", "ok", "skipped", "ok"]


def test_the_agents_own_actions_do_not_wake_it_and_the_interval_does(ready, cli, market, db_path, config):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    assert json.loads(cli("agent-step", "--policy", "rules", "--json").out)["actions"][0]["kind"] == "launch"  # an agent event
    conn = db.connect(db_path, now=clock.SYSTEM.now())
    from vastctl import config as config_module

    cfg = config_module.load()
    start = clock.VirtualClock(clock.SYSTEM.now())
    assert step.run_step(conn, market, cfg, clock=start, if_events=True).skipped
    start.advance(5 * 60)
    conn.execute("UPDATE demand_samples SET at = ?", (clock.to_iso(start.now()),))
    ran = step.run_step(conn, market, cfg, clock=start, if_events=True)
    assert not ran.skipped and "agent.interval (5m) passed" in ran.reason


def test_the_incident_never_scales_down(ready, cli, market, db_path):
    """59 proofs queued and no "active" flag anywhere: the fleet is over target, yet nothing is released."""
    for i, label in enumerate(["vastctl-a", "vastctl-b", "vastctl-c"]):
        running(cli, label, vast_id=600 + i)
    assert cli("settings", "set", "target_proofs_per_hour", "20").code == 0
    assert cli("demand", "report", "--queued", "59").code == 0
    data = json.loads(cli("agent-step", "--policy", "rules", "--json").out)
    assert data["actions"] == [] and data["refused"] == []
    assert market.calls == []
    assert {r["state"] for r in query(db_path, "SELECT state FROM instances")} == {"running"}


def test_operator_stop_and_kill_of_the_last_machine_need_force(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "59").code == 0
    for args in (["stop", "vastctl-a"], ["kill", "vastctl-a", "--reason", "slow"]):
        result = cli(*args)
        assert result.code == 4 and result.err.startswith("error: ") and "never scale to zero" in result.err
        assert "--force" in result.err
    assert market.calls == [] and query(db_path, "SELECT state FROM instances") == [{"state": "running"}]
    refusals = query(db_path, "SELECT actor, kind, ok, result FROM actions ORDER BY id")
    assert [(r["actor"], r["kind"], r["ok"]) for r in refusals] == [("operator", "stop", 0), ("operator", "kill", 0)]
    assert all(r["result"].startswith("refused by the guard (never_scale_to_zero)") for r in refusals)
    result = cli("stop", "vastctl-a", "--force")
    assert result.code == 0 and market.calls == [("stop", 500)]
    (event,) = query(db_path, "SELECT reason FROM events WHERE to_state = 'stopped'")
    assert event["reason"] == "stopped by operator (forced)"
    forced = query(db_path, "SELECT result FROM actions WHERE ok = 1 AND kind = 'stop' ORDER BY id")
    assert forced[0]["result"].startswith("forced past the guard (never_scale_to_zero)")


def test_operator_launch_outside_the_allowed_models_is_refused(ready, cli, market, db_path):
    result = cli("launch", "--gpu", "RTX 3090")
    assert result.code == 4 and "fleet.gpus" in result.err
    assert market.calls == [] and query(db_path, "SELECT count(*) AS n FROM instances") == [{"n": 0}]


def test_bad_policy_and_a_held_lease(ready, cli, market, db_path):
    result = cli("agent-step", "--policy", "magic")
    assert result.code == 2 and "--policy must be one of rules, llm" in result.err
    conn = db.connect(db_path, now=clock.SYSTEM.now())
    assert locks.acquire(conn, "agent-step", ttl_s=600, holder="elsewhere:1", now=clock.SYSTEM.now())
    result = cli("agent-step", "--policy", "rules")
    assert result.code == 1 and "another agent-step is running" in result.err
    assert query(db_path, "SELECT count(*) AS n FROM agent_steps") == [{"n": 0}]


# --- the llm policy's tool calls come back through the guard ------------------------------------------


def test_llm_tool_calls_pass_the_guard_and_refusals_are_errors(ready, cli, market, db_path, monkeypatch):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    seen = fake_llm(monkeypatch, [("stop", {"label": "vastctl-a"}), ("launch", {"count": 1, "gpu_name": "RTX 4090"}),
                                  ("search_offers", {"limit": 2}), ("destroy", {"label": "vastctl-nobody", "reason": "x"}),
                                  ("reboot", {"label": "vastctl-a"})])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")  # policy auto → llm
    result = cli("agent-step", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["policy"] == "llm" and data["tokens"]["input"] == 1200 and data["cost"] == 0.0004
    stop, launch, search, destroy, unknown = seen["outcomes"]
    assert not stop.ok and "never_scale_to_zero" in stop.text
    assert launch.ok and launch.text.startswith("launched vastctl-")
    assert search.ok and [o["id"] for o in json.loads(search.text)] == [1, 2]
    assert not destroy.ok and "no instance labelled" in destroy.text
    assert not unknown.ok and "unknown tool 'reboot'" in unknown.text
    assert [r["limit"] for r in data["refused"]] == ["never_scale_to_zero"]
    assert seen["observation"]["demand"]["queued"] == 500 and seen["suggestion"][0]["kind"] == "launch"
    (row,) = query(db_path, "SELECT * FROM agent_steps")
    assert (row["policy"], row["outcome"], row["input_tokens"], row["cache_read_tokens"]) == ("llm", "ok", 1200, 900)
    assert seen["step_id"] == row["id"]
    assert query(db_path, "SELECT state FROM instances WHERE label = 'vastctl-a'") == [{"state": "running"}]


def test_an_llm_failure_buys_nothing_and_exits_1(ready, cli, market, db_path, monkeypatch):
    assert cli("demand", "report", "--queued", "59").code == 0
    fake_llm(monkeypatch, [], error="API error 529: overloaded")
    result = cli("agent-step", "--policy", "llm")
    assert result.code == 1 and "overloaded" in result.err and result.err.strip().splitlines()[-1].startswith("error:")
    assert [c for c in market.calls if c[0] != "search"] == []
    (row,) = query(db_path, "SELECT outcome, errors FROM agent_steps")
    assert row["outcome"] == "error" and "overloaded" in row["errors"]
