"""Why the agent did what it did: `agent history` reads the steps run_step wrote; a step that holds says why."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.agent_cli import running
from helpers.rules_observations import CONFIG, NOW, m, observation, queued
from helpers.serving import query

from vastctl.agent import history, rules
from vastctl.state import db


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


# --- the hold reason ---------------------------------------------------------------------------------


def test_a_covered_target_holds_naming_running_booting_and_wanted():
    obs = observation([m("a", rate=60.0), m("b", state="params_done", rate=60.0)], queued(500))
    assert rules.plan(obs, CONFIG) == []
    assert rules.hold_reason(obs, CONFIG) == (
        "queued work: capacity 60 + 60 booting covers 115 wanted (target 100 × (1 + headroom 0.15))")


def test_a_small_queue_holds_naming_what_draining_it_needs():
    obs = observation([m("a", rate=60.0)], queued(5))
    assert rules.plan(obs, CONFIG) == []
    why = rules.hold_reason(obs, CONFIG)
    assert why.startswith("queued work: capacity 60 + 0 booting covers ") and "under the target's 115" in why
    assert "agent.plan_horizon" in why


def test_a_shortfall_with_nothing_allowed_says_what_limits_it():
    obs = observation([m("a", rate=60.0)], queued(500), max_instances=1)
    assert rules.plan(obs, CONFIG) == []
    why = rules.hold_reason(obs, CONFIG)
    assert why.startswith("queued work: capacity 60 + 0 booting is short of 115 wanted") and "max_instances" in why


def test_no_work_before_the_cooldown_holds_until_scale_down_after():
    obs = observation([m("a")], queued(0, empty_for_min=20))
    assert rules.plan(obs, CONFIG) == []
    assert rules.hold_reason(obs, CONFIG) == (
        "no work queued, in flight or coming for 20m: machines are released after agent.scale_down_after (60m)")


def test_unknown_demand_never_known_holds_as_if_work_were_queued():
    from helpers.rules_observations import UNKNOWN

    obs = observation([m("a", rate=120.0)], UNKNOWN)
    assert rules.hold_reason(obs, CONFIG).startswith(
        "demand unknown, never known (sized as if work were queued): capacity 120")


def test_a_dry_run_with_nothing_to_do_says_why_it_holds(ready, cli, market, db_path):
    running(cli, "vastctl-a", vast_id=501, rate=70)
    running(cli, "vastctl-b", uuid="u-b", vast_id=502, rate=70)
    assert cli("demand", "report", "--queued", "500").code == 0
    result = cli("agent-step", "--policy", "rules", "--dry-run")
    assert result.code == 0 and result.out == ""
    assert ("holding: queued work: capacity 140 + 0 booting covers 115 wanted (target 100 × (1 + headroom 0.15))"
            in result.err), result.err
    shown = json.loads(cli("agent-step", "--policy", "rules", "--dry-run", "--json").out)
    assert shown["hold"].startswith("queued work: capacity 140 + 0 booting covers 115") and shown["actions"] == []
    assert [c for c in market.calls if c[0] != "search"] == []  # nothing bought


def test_a_step_that_rounds_a_shortfall_down_says_so_and_rents_nothing(ready, cli, market, db_path):
    running(cli, "vastctl-a", vast_id=501, rate=100)  # its model's rate; the offers' 512 GiB hosts cap it at 95
    assert cli("demand", "report", "--queued", "10", "--lookahead", "130").code == 0  # 15 + 104 wanted, capped
    shown = json.loads(cli("agent-step", "--policy", "rules", "--json").out)
    assert shown["actions"] == [] and shown["hold"] == (
        "work for the fleet (10 queued, 130 PoRep coming): capacity 100 + 0 booting is 15 short of 115 wanted"
        " (target 100 × (1 + headroom 0.15)), under"
        " 50% of the smallest machine to hand (95/h): rounded down, not up to a whole machine (a growing queue"
        " raises what is wanted)"), shown["hold"]
    assert [c[0] for c in market.calls] == ["search"]  # the offers were looked at; nothing was bought
    assert len(query(db_path, "SELECT uuid FROM instances")) == 1
    assert cli("demand", "report", "--queued", "500").code == 0  # 5 h of work waits: the shortfall is rented
    assert [a["kind"] for a in json.loads(cli("agent-step", "--policy", "rules", "--json").out)["actions"]] == ["launch"]


# --- the history -------------------------------------------------------------------------------------


def test_history_folds_skipped_steps_and_shows_what_each_step_saw_and_did(ready, cli, market, db_path):
    assert cli("demand", "report", "--queued", "400").code == 0
    assert cli("agent-step", "--policy", "rules").code == 0  # launches toward the target
    for _ in range(14):  # nothing new since (the agent's own actions never wake it)
        assert cli("agent-step", "--policy", "rules", "--if-events").code == 0
    steps = query(db_path, "SELECT outcome, count(*) AS n FROM agent_steps GROUP BY 1 ORDER BY 1")
    assert steps == [{"outcome": "ok", "n": 1}, {"outcome": "skipped", "n": 14}]
    conn = sqlite3.connect(db_path)
    conn.execute(  # an llm step as run_step writes one: a refusal, a note, tokens and cost
        "INSERT INTO agent_steps (started_at, finished_at, policy, outcome, event_cursor, observation, actions,"
        " refused, errors, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost)"
        " VALUES ('2031-01-01T00:00:00.000000Z', '2031-01-01T00:00:05.000000Z', 'llm', 'ok', 0, ?, '[]', ?, '[]',"
        " 1200, 300, 800, 0, 0.0123)",
        (json.dumps({"capacity": 140.0, "pending_capacity": 0.0, "spend_per_hour": 1.2,
                     "settings": {"target_proofs_per_hour": 100.0}, "demand": {"known": True, "queued": 3}}),
         json.dumps([{"kind": "stop", "label": "vastctl-a", "reason": "quiet", "limit": "never_scale_to_zero",
                      "why": "work is queued: a stop would leave nothing running"}])))
    llm_id = conn.execute("SELECT max(id) FROM agent_steps").fetchone()[0]
    conn.execute("INSERT INTO agent_notes (step_id, at, text) VALUES (?, '2031-01-01T00:00:04.000000Z',"
                 " 'the queue drains by 14:00; keep two')", (llm_id,))
    conn.commit()

    view = history.history(db.connect(db_path, now=NOW))
    assert [entry["type"] for entry in view["entries"]] == ["step", "skipped", "step"]
    first, folded, llm = view["entries"]
    assert folded["count"] == 14 and folded["first_id"] == first["id"] + 1
    assert first["saw"]["demand"]["queued"] == 400 and first["saw"]["target"] == 100.0
    assert first["saw"]["capacity"] == 0 and [a["kind"] for a in first["did"]] == ["launch", "launch"]
    assert all(a["result"].startswith("launched vastctl-") for a in first["did"]) and first["hold"] is None
    assert llm["refused"] == [{"kind": "stop", "label": "vastctl-a", "limit": "never_scale_to_zero",
                               "why": "work is queued: a stop would leave nothing running"}]
    assert llm["notes"] == [{"at": "2031-01-01T00:00:04Z", "text": "the queue drains by 14:00; keep two"}]
    assert llm["tokens"] == {"input": 1200, "output": 300, "cache_read": 800, "cache_write": 0}
    assert llm["cost"] == 0.0123

    result = cli("agent", "history")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].startswith(f"#{first['id']} ") and "saw capacity 0 + 0 booting, target 100; 400 queued" in lines[0]
    assert lines[1].startswith("  did launch RTX 4090: launched vastctl-")
    assert any(line.startswith("… 14 skipped steps (") for line in lines)
    assert "  refused stop vastctl-a (never_scale_to_zero): work is queued: a stop would leave nothing running" in lines
    assert "  note: the queue drains by 14:00; keep two" in lines
    assert "  model: 1200 in, 300 out, 800 cached, $0.0123" in lines
    assert json.loads(cli("agent", "history", "--json").out) == view
    only = json.loads(cli("agent", "history", "--limit", "1", "--json").out)
    assert [entry["type"] for entry in only["entries"]] == ["skipped", "step"]  # the skipped run just before it
    assert only["entries"][1]["policy"] == "llm" and only["steps_shown"] == 1


def test_a_hold_is_kept_with_the_step_and_agent_step_keeps_its_name(ready, cli, market, db_path):
    running(cli, "vastctl-a", vast_id=501, rate=140)
    assert cli("demand", "report", "--queued", "500").code == 0
    assert cli("agent-step", "--policy", "rules").code == 0
    (step,) = history.history(db.connect(db_path, now=NOW))["entries"]
    assert step["hold"].startswith("queued work: capacity 140 + 0 booting covers 115") and step["did"] == []
    assert "  held: queued work: capacity 140" in cli("agent", "history").out
    bad = cli("agent", "history", "--limit", "0")
    assert bad.code == 2 and bad.err.startswith("error: ") and "--limit" in bad.err
    assert cli("agent", "history").code == 0 and cli("agent-step", "--policy", "rules", "--dry-run").code == 0
