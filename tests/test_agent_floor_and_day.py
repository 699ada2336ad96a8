"""The model trying to go below agent.min_machines or past max_daily_spend: `agent-step --policy llm` end to end
(the real guard, the fake Messages API, a stand-in market); both calls are refused and the model is told why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.agent_cli import opening, running, step_json
from helpers.fake_anthropic import message, text, tool_use


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


@pytest.mark.slow  # the fake Messages API is a loopback server
def test_the_model_trying_to_go_below_the_floor_or_past_the_day_is_refused(ready, cli, market, llm_api):
    config = Path(os.environ["VASTCTL_CONFIG"])
    config.write_text(config.read_text().replace("agent:\n", "agent:\n  min_machines: 2\n"))
    running(cli, "vastctl-a", vast_id=501)
    running(cli, "vastctl-b", uuid="u-b", vast_id=502)
    assert cli("demand", "report", "--queued", "0").code == 0  # no work: only the floor keeps them
    assert cli("settings", "set", "max_daily_spend", "0.05").code == 0
    destroy = tool_use("destroy", {"label": "vastctl-b", "reason": "no work queued"})
    launch = tool_use("launch", {"count": 1, "gpu_name": "RTX 4090"})
    llm_api.answer(message(text("Trim and reshape."), destroy, launch), message(text("Both refused: holding.")))

    data = step_json(cli)

    assert data["actions"] == []
    refused = {item["kind"]: item for item in data["refused"]}
    assert refused["destroy"]["limit"] == "min_machines"
    assert "would leave 1 warm machine(s)" in refused["destroy"]["why"]
    assert refused["launch"]["limit"] == "max_daily_spend"
    assert "max_daily_spend is $0.05" in refused["launch"]["why"]
    seen = opening(llm_api.bodies[0])["observation"]
    assert seen["min_machines"] == 2 and seen["spent_today"] == 0 and seen["settings"]["max_daily_spend"] == 0.05
    results = [block for block in llm_api.bodies[1]["messages"][2]["content"] if block["type"] == "tool_result"]
    assert all(block["is_error"] for block in results)
    assert "min_machines" in results[0]["content"] and "max_daily_spend" in results[1]["content"]
    assert [call for call in market.calls if call[0] in ("create", "destroy", "stop")] == []  # nothing reached vast
