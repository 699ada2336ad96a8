"""The llm policy is shown the planning policy's decision for the same step (agent/plan_suggestion.py): the
request the fake Messages API receives carries it, nothing suggested is applied unless the model calls it, and
what the model calls still passes the guard."""

from __future__ import annotations

import json

import pytest
from helpers.agent_cli import opening, running, step_json
from helpers.fake_anthropic import message, text, tool_use
from helpers.serving import query

from vastctl.cli.app import Globals
from vastctl.clock import SYSTEM, StillClock

pytestmark = pytest.mark.slow  # every test here starts the fake Messages API (a loopback server)


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py): target 100 proofs/h, at most 6 machines."""


@pytest.fixture
def still(monkeypatch):
    """One moment for the commands that follow: the plan's figures (ages in minutes) are the same in each."""
    monkeypatch.setattr(Globals, "system_clock", StillClock(SYSTEM, SYSTEM.now()))


def suggestion_of(body: dict) -> list[dict]:
    return opening(body)["plan_suggestion"]


def test_the_model_is_shown_what_the_plan_would_rent_and_nothing_is_rented_for_it(ready, cli, market, llm_api,
                                                                                   db_path, still):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    planned = json.loads(cli("agent-step", "--policy", "plan", "--dry-run", "--json").out)["actions"]
    assert [a["kind"] for a in planned] and {a["kind"] for a in planned} == {"launch"}
    llm_api.answer(message(text("Not renting: a maintenance window is due.")))

    data = step_json(cli)

    # the request carries the plan policy's own actions for this observation, each with its reason in figures
    shown = suggestion_of(llm_api.bodies[0])
    assert [(s["kind"], s["offer_id"], s["gpu_name"], s.get("count", 1), s["reason"]) for s in shown] == [
        (a["kind"], a["offer_id"], a["gpu_name"], a.get("count", 1), a["reason"]) for a in planned]
    assert "proofs/h expected" in shown[0]["reason"] and "per 1000 proofs" in shown[0]["reason"]
    system = llm_api.bodies[0]["system"][-1]["text"]
    assert "\"plan_suggestion\"" in system and "the guard, suggested or not" in system
    # the model did not call it: nothing rented, the step ran, and its record says what it was shown
    assert [call for call in market.calls if call[0] == "create"] == []
    assert (data["outcome"], data["actions"], data["refused"]) == ("ok", [], [])
    (row,) = query(db_path, "SELECT observation FROM agent_steps WHERE policy = 'llm'")
    line = json.loads(row["observation"])["plan_suggestion"]
    assert line == "plan: " + ", ".join(f"launch 1× {a['gpu_name']} (offer {a['offer_id']})" for a in planned)
    history = cli("agent", "history")
    assert f"  suggested: {line}" in history.out.splitlines()
    (entry,) = [e for e in json.loads(cli("agent", "history", "--json").out)["entries"] if e["policy"] == "llm"]
    assert entry["suggested"] == line


def test_the_model_is_shown_why_the_plan_holds(ready, cli, market, llm_api, db_path, still):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "5").code == 0
    held = json.loads(cli("agent-step", "--policy", "plan", "--dry-run", "--json").out)
    assert held["actions"] == [] and held["hold"]
    llm_api.answer(message(text("Holding.")))

    step_json(cli)

    assert suggestion_of(llm_api.bodies[0]) == [{"kind": "hold", "reason": held["hold"]}]
    assert "covers the plan now" in held["hold"]
    (row,) = query(db_path, "SELECT observation FROM agent_steps WHERE policy = 'llm'")
    assert json.loads(row["observation"])["plan_suggestion"] == "plan: hold"


def test_demand_never_known_says_the_plan_cannot_run_and_shows_the_rules(ready, cli, market, llm_api, db_path):
    running(cli, "vastctl-a")  # no sample ever: the plan defers to the rules, sized to the ceiling
    llm_api.answer(message(text("Holding until demand is known.")))

    step_json(cli)

    first, *rest = suggestion_of(llm_api.bodies[0])
    assert first["kind"] == "plan_unavailable" and "demand was never known" in first["reason"]
    assert rest and all(item["reason"].startswith("demand unknown, the rules'") for item in rest)
    (row,) = query(db_path, "SELECT observation FROM agent_steps")
    assert json.loads(row["observation"])["plan_suggestion"].startswith(
        "plan unavailable (demand never known), the rules': ")


def test_a_suggested_launch_the_guard_refuses_is_not_applied(ready, cli, market, llm_api, db_path, still):
    running(cli, "vastctl-a")
    assert cli("settings", "set", "max_instances", "2").code == 0
    assert cli("demand", "report", "--queued", "500").code == 0

    def rent_then_follow(body: dict) -> dict:
        """The model rents a machine of its own choosing first, then calls the plan's suggested launch too."""
        (suggested,) = suggestion_of(body)
        return message(tool_use("launch", {"count": 1, "gpu_name": "RTX 4090"}),
                       tool_use("launch", {"count": 1, "offer_id": suggested["offer_id"]}))

    llm_api.answer(rent_then_follow, message(text("One rented; the suggested one was refused.")))

    data = step_json(cli)

    suggested = suggestion_of(llm_api.bodies[0])[0]
    assert suggested["kind"] == "launch"
    assert [call for call in market.calls if call[0] == "create"] == [("create", 1)]  # the model's own, only
    assert [(r["kind"], r.get("offer_id"), r["limit"]) for r in data["refused"]] == [
        ("launch", suggested["offer_id"], "max_instances")]
    results = [block for block in llm_api.bodies[1]["messages"][2]["content"]]
    assert [block["is_error"] for block in results] == [False, True]
    assert "refused by the guard (max_instances)" in results[1]["content"]
    assert query(db_path, "SELECT count(*) AS n FROM instances") == [{"n": 2}]
