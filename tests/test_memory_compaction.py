"""Everything in the opening message is compacted to fit agent.max_context_tokens (the last actions and the
recent steps included, however many calls were refused before), and a step that cannot reach the model is an
error, not "ok"."""

from __future__ import annotations

import json

import pytest
from helpers.agent_cli import opening, running, step_json
from helpers.fake_anthropic import FakeMessagesAPI, fleet_observation, message, text, tool_use
from helpers.serving import query

from vastctl.agent import llm, memory
from vastctl.config import from_mapping

REFUSED = 400


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


def refused_storm():
    """One reply asking for REFUSED launches of a GPU model the fleet does not allow: the guard refuses each."""
    calls = [tool_use("launch", {"count": 1, "gpu_name": f"H100 SXM variant {i:03d}"}) for i in range(REFUSED)]
    return message(text("Launching everything I can find."), *calls)


@pytest.mark.slow
def test_the_step_after_400_refused_calls_still_asks_the_model_within_the_budget(ready, cli, market, llm_api, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "59").code == 0
    llm_api.answer(refused_storm(), message(text("All refused.")))
    first = step_json(cli)
    assert len(first["refused"]) + len(first["errors"]) >= REFUSED - 10, first["errors"][:3]
    asked_before = len(llm_api.requests)

    llm_api.answer(message(text("Holding: the last step's calls were refused.")))
    second = step_json(cli)

    assert len(llm_api.requests) == asked_before + 1  # the model was asked
    assert second["outcome"] == "ok" and not any("0 round" in e for e in second["errors"]), second["errors"]
    body = llm_api.bodies[-1]
    budget = from_mapping({}).agent.max_context_tokens
    opening_text = body["messages"][0]["content"][0]["text"]
    assert memory.estimate_tokens(opening_text) <= llm.opening_budget(from_mapping({}))
    sent = memory.as_data(body["system"]) + memory.as_data(body["tools"]) + memory.as_data(body["messages"])
    assert memory.estimate_tokens(sent) <= budget
    data = opening(body)
    assert data["omitted"]["last_actions"] > 0  # said, not silently dropped
    assert 0 < len(data["observation"]["last_actions"]) <= memory.LAST_ACTIONS_WHEN_SHORT
    table = data["observation"]["machines"]  # compacted to a table, the one machine still in it
    assert [row[table["columns"].index("label")] for row in table["rows"]] == ["vastctl-a"]
    (previous,) = [s for s in data["recent_steps"] if s["step"] == first["step_id"]]
    assert len(previous.get("refused", [])) <= memory.ITEMS_PER_STEP and previous.get("refused_omitted", 0) > 0


@pytest.mark.parametrize("part", ["last_actions", "events", "machines", "everything"])
def test_every_part_of_the_observation_is_compacted_to_fit(conn, part):
    observation = fleet_observation(40, events=40)
    huge = "x" * 5000
    if part in ("last_actions", "everything"):
        observation["last_actions"] = [{"kind": "launch", "gpu_name": huge, "why": huge, "limit": "fleet.gpus",
                                        "result": huge} for _ in range(REFUSED)]
    if part in ("events", "everything"):
        observation["events"] = [{"id": i, "reason": huge} for i in range(2000)]
    if part in ("machines", "everything"):
        observation["machines"] = observation["machines"] * 100
    if part == "everything":
        observation["settings"] = {f"s{i}": huge for i in range(300)}
        observation["expected_rate_by_gpu"] = {f"gpu {i} {huge}": 1.0 for i in range(300)}
    budget = llm.opening_budget(from_mapping({}))
    prompt = memory.build_prompt(conn, observation=observation, suggestion=[], step_id=1, budget_tokens=budget)
    assert prompt.tokens <= budget
    assert prompt.omitted  # what was left out is counted
    data = json.loads(prompt.text.split(memory.DATA_OPEN, 1)[1].split(memory.DATA_CLOSE, 1)[0])
    assert data["observation"]["demand"] == observation["demand"]  # the facts a decision needs first


def test_a_huge_suggestion_is_condensed_to_fit(conn):
    suggestion = [{"kind": "launch", "count": 1, "gpu_name": "RTX 4090", "reason": "y" * 239, "extra": "z" * 239}
                  for _ in range(20)]
    budget = 800
    prompt = memory.build_prompt(conn, observation=fleet_observation(3), suggestion=suggestion, step_id=1,
                                 budget_tokens=budget)
    assert prompt.tokens <= budget and prompt.omitted.get("suggestion", 0) > 0


@pytest.mark.slow
def test_a_step_whose_prompt_cannot_fit_is_an_error_and_sends_nothing(ready, cli, market, llm_api, db_path,
                                                                      tmp_path, monkeypatch):
    config = tmp_path / "tiny.yaml"
    config.write_text(f"agent:\n  max_context_tokens: {llm.prefix_tokens() + 50}\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    running(cli, "vastctl-a")
    result = cli("agent-step", "--policy", "llm", "--json")
    assert llm_api.requests == []
    assert result.code == 1, result.err
    data = json.loads(result.out)
    assert data["outcome"] == "error" and any("max_context_tokens" in e for e in data["errors"]), data["errors"]
    (outcome,) = query(db_path, "SELECT outcome FROM agent_steps ORDER BY id DESC LIMIT 1")
    assert outcome["outcome"] == "error"


@pytest.mark.slow
def test_a_step_with_no_time_for_a_request_is_an_error(conn):
    api = FakeMessagesAPI()
    try:
        from datetime import datetime, timezone

        from vastctl.clock import VirtualClock
        clock = VirtualClock(datetime(2026, 5, 1, tzinfo=timezone.utc))
        config = from_mapping({"agent": {"deadline": "3s"}})
        result = llm.run(conn, config, observation=fleet_observation(), suggestion=[], step_id=1, clock=clock,
                         env={"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url},
                         execute=lambda name, tool_input: llm.ToolOutcome(True, "done"))
    finally:
        api.close()
    assert api.requests == [] and result.stop_reason == "error" and "agent.deadline" in result.error
