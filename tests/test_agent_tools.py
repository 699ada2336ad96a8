"""agent.tools: each tool defined once — its schema derived, a call's input parsed once into what it asks for."""

from __future__ import annotations

import json

import pytest

from vastctl.agent import llm, tools
from vastctl.errors import BadInput
from vastctl.guard import Action, Kind
from vastctl.validate import Invalid


def test_the_schema_sent_is_derived_from_the_tools_in_their_order():
    assert [tool["name"] for tool in llm.TOOLS] == [tool.name for tool in tools.TOOLS]
    assert json.dumps(llm.TOOLS) == json.dumps(tools.schemas())  # the cached prefix: the same bytes every request
    (launch,) = [tool for tool in llm.TOOLS if tool["name"] == "launch"]
    assert launch["input_schema"] == {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 1, "maximum": 100, "description": "machines to rent"},
            "gpu_name": {"type": "string", "minLength": 1, "maxLength": 100,
                         "description": "only this GPU model (one of fleet.gpus)"},
            "offer_id": {"type": "integer", "minimum": 1, "description": "rent exactly this offer"},
        },
        "required": ["count"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize("name,tool_input,expected", [
    ("launch", {"count": 2, "gpu_name": "RTX 4090"}, Action(kind=Kind.LAUNCH, actor="agent", count=2,
                                                           gpu_name="RTX 4090")),
    ("launch", {"count": 1, "offer_id": 7}, Action(kind=Kind.LAUNCH, actor="agent", offer_id=7)),
    ("destroy", {"label": "vastctl-a", "reason": "idle"}, Action(kind=Kind.DESTROY, actor="agent", label="vastctl-a",
                                                                reason="idle")),
    ("stop", {"label": "vastctl-a"}, Action(kind=Kind.STOP, actor="agent", label="vastctl-a")),
    ("start", {"label": "vastctl-a"}, Action(kind=Kind.START, actor="agent", label="vastctl-a")),
    ("rebid", {"label": "vastctl-a", "bid": 0.25}, Action(kind=Kind.REBID, actor="agent", label="vastctl-a",
                                                         dph=0.25)),
    ("search_offers", {}, tools.OfferSearch()),
    ("search_offers", {"gpu_name": "RTX 5090", "max_dph": 0.5, "limit": 3}, tools.OfferSearch("RTX 5090", 0.5, 3)),
    ("note", {"text": "  5090s are cheap at night "}, tools.Note("5090s are cheap at night")),
])
def test_a_call_parses_into_what_it_asks_for(name, tool_input, expected):
    assert tools.parse(name, tool_input) == expected


@pytest.mark.parametrize("name,tool_input,says", [
    ("launch", {"count": 1}, "launch needs exactly one of gpu_name and offer_id"),
    ("launch", {"count": 1, "gpu_name": "RTX 4090", "offer_id": 3}, "launch needs exactly one of gpu_name and offer_id"),
    ("launch", {"count": 0, "gpu_name": "RTX 4090"}, "launch.count must be between 1 and 100, got 0"),
    ("launch", {"count": 1.5, "gpu_name": "RTX 4090"}, "launch.count must be an integer, got 1.5"),
    ("destroy", {"label": "  ", "reason": "x"}, "destroy.label must be 1–200 characters"),
    ("search_offers", {"max_dph": -1}, "search_offers.max_dph must be at least 0, got -1"),
    ("search_offers", {"limit": 51}, "search_offers.limit must be between 1 and 50, got 51"),
    ("note", "text", "note takes an object of arguments"),
])
def test_a_call_that_is_not_one_names_the_tool_and_parameter(name, tool_input, says):
    with pytest.raises(Invalid) as caught:
        tools.parse(name, tool_input)
    assert str(caught.value) == says


def test_an_unknown_tool_names_the_tools():
    with pytest.raises(BadInput, match="unknown tool 'reboot': the tools are launch, destroy, stop, start, rebid"):
        tools.parse("reboot", {})
