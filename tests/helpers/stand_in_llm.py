"""A stand-in for agent.llm that makes the tool calls it is given, through the real parser and the step's execute,
and keeps what each returned: the agent step's llm policy without a model."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

from vastctl.agent import tools
from vastctl.errors import BadInput


@dataclass
class ToolOutcome:
    ok: bool
    text: str
    action: dict | None = None


@dataclass
class LlmResult:
    tokens: dict
    cost: float
    rounds: int
    stop_reason: str
    error: str | None = None
    transcript: list = field(default_factory=list)


def fake_llm(monkeypatch, calls, *, error=None):
    """A stand-in agent.llm: makes the given tool calls and keeps what each returned."""
    seen: dict = {"outcomes": []}

    def run(conn, config, *, observation, suggestion, execute, clock, step_id=None, env=None):
        seen.update(observation=observation, suggestion=suggestion, step_id=step_id)
        for name, tool_input in calls:  # parsed as the real loop parses them, before anything is run
            try:
                call = tools.parse(name, tool_input)
            except BadInput as exc:
                seen["outcomes"].append(ToolOutcome(False, str(exc)))
                continue
            seen["outcomes"].append(execute(name, call))
        return LlmResult(tokens={"input": 1200, "output": 80, "cache_read": 900, "cache_write": 0}, cost=0.0004,
                         rounds=len(calls) + 1, stop_reason="error" if error else "end_turn", error=error)

    module = types.SimpleNamespace(run=run, ToolOutcome=ToolOutcome, LlmResult=LlmResult,
                                   require=lambda config, env: ("sk-test", [0.0] * 4))
    import vastctl.agent

    monkeypatch.setitem(__import__("sys").modules, "vastctl.agent.llm", module)
    monkeypatch.setattr(vastctl.agent, "llm", module, raising=False)
    return seen
