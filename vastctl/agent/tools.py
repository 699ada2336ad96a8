"""The llm policy's tools, each defined once: its typed parameters, the JSON schema the model is sent (derived,
in a fixed order, so the cached prefix never changes between requests), and the one parse of a call's input
into what it asks for — a guard Action (launch, destroy, stop, start, rebid), an OfferSearch or a Note.

A call that does not match its tool is refused by parse() with an Invalid naming `tool.parameter`, before
anything is guarded or run; the model reads the refusal as the call's error result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vastctl import validate
from vastctl.agent import memory
from vastctl.errors import BadInput
from vastctl.guard import Action, Kind
from vastctl.validate import Invalid

ACTOR = "agent"
JSON_TYPES: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "string": str}


@dataclass(frozen=True)
class Param:
    """One parameter of a tool: its JSON type, its bounds (length for text), whether the call must give it."""

    name: str
    type: str  # integer | number | string
    description: str = ""
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # a number strictly greater than this (JSON schema's exclusiveMinimum)
    min_length: int | None = None
    max_length: int | None = None
    required: bool = False

    def schema(self) -> dict[str, Any]:
        """The JSON schema of this parameter, its keys in the order the model has always been sent them."""
        spec: dict[str, Any] = {"type": self.type}
        for key, value in (("minimum", self.minimum), ("exclusiveMinimum", self.above), ("maximum", self.maximum),
                           ("minLength", self.min_length), ("maxLength", self.max_length),
                           ("description", self.description or None)):
            if value is not None:
                spec[key] = value
        return spec

    def check(self, tool: str, value: Any) -> Any:
        """The value as the schema allows it, else Invalid naming `tool.name`."""
        field = f"{tool}.{self.name}"
        if isinstance(value, bool) or not isinstance(value, JSON_TYPES[self.type]):
            article = "an" if self.type[0] in "aeiou" else "a"
            raise Invalid(field, f"must be {article} {self.type}, got {json.dumps(value)[:60]}")
        if isinstance(value, str):
            shortest, longest = self.min_length or 0, self.max_length
            if not shortest <= len(value.strip()) <= len(value) <= (longest or len(value)):
                raise Invalid(field, f"must be {shortest}–{longest} characters")
            return value
        number = validate.real(value)
        if number is None:  # a JSON integer of 400 digits
            raise Invalid(field, f"must be a finite {self.type}, got {json.dumps(value)[:60]}")
        if self.above is not None and not number > self.above:
            raise Invalid(field, f"must be above {self.above:g}, got {value}")
        low = self.minimum if self.minimum is not None else float("-inf")
        high = self.maximum if self.maximum is not None else float("inf")
        if not low <= number <= high:
            bounds = f"between {self.minimum} and {self.maximum}" if self.maximum is not None else f"at least {low}"
            raise Invalid(field, f"must be {bounds}, got {value}")
        return value


@dataclass(frozen=True)
class OfferSearch:
    """search_offers: the offers to list (the search itself is the step's: launches.find_offers)."""

    gpu_name: str | None = None
    max_dph: float | None = None
    limit: int = 10


@dataclass(frozen=True)
class Note:
    """note: kept by the llm policy's memory for the following steps."""

    text: str


Call = Action | OfferSearch | Note


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]
    build: Callable[[Mapping[str, Any]], Call]  # the checked input → what the call asks for

    def schema(self) -> dict[str, Any]:
        """What the Messages API is sent for this tool."""
        input_schema: dict[str, Any] = {"type": "object", "properties": {p.name: p.schema() for p in self.params}}
        required = [p.name for p in self.params if p.required]
        if required:
            input_schema["required"] = required
        input_schema["additionalProperties"] = False
        return {"name": self.name, "description": self.description, "input_schema": input_schema}

    def parse(self, tool_input: Any) -> Call:
        """The call's input checked against the parameters (all of them, once), then what it asks for."""
        if not isinstance(tool_input, Mapping):
            raise Invalid(self.name, "takes an object of arguments")
        known = {p.name: p for p in self.params}
        for param in self.params:
            if param.required and param.name not in tool_input:
                raise Invalid(self.name, f"needs {param.name!r}")
        for key in tool_input:
            if key not in known:
                raise Invalid(self.name, f"takes no argument {key!r} (it takes {', '.join(known) or 'none'})")
        values = {key: known[key].check(self.name, value) for key, value in tool_input.items()}
        return self.build(values)


def _launch(values: Mapping[str, Any]) -> Action:
    offer_id, gpu_name = values.get("offer_id"), values.get("gpu_name")
    if (offer_id is None) == (gpu_name is None):
        raise Invalid("launch", "needs exactly one of gpu_name and offer_id")
    return Action(kind=Kind.LAUNCH, actor=ACTOR, count=values["count"], offer_id=offer_id, gpu_name=gpu_name)


def _on_a_machine(kind: Kind) -> Callable[[Mapping[str, Any]], Action]:
    def build(values: Mapping[str, Any]) -> Action:
        return Action(kind=kind, actor=ACTOR, label=values["label"], reason=values.get("reason", ""),
                      dph=values.get("bid"))
    return build


LABEL = Param("label", "string", "the machine's label, as in the observation", min_length=1, max_length=200,
              required=True)
GPU_NAME = Param("gpu_name", "string", min_length=1, max_length=100)
TOOLS: tuple[Tool, ...] = (
    Tool("launch", "Rent new machines: `count` of the cheapest offers of gpu_name, or the one offer "
                   "offer_id (from search_offers, count 1). Give exactly one of gpu_name and offer_id. The guard "
                   "refuses one past max_instances, max_dph, max_hourly_spend or max_daily_spend.",
         (Param("count", "integer", "machines to rent", minimum=1, maximum=100, required=True),
          Param("gpu_name", "string", "only this GPU model (one of fleet.gpus)", min_length=1, max_length=100),
          Param("offer_id", "integer", "rent exactly this offer", minimum=1)),
         _launch),
    Tool("destroy", "Kill a machine and destroy it at vast (it stops costing money; its disk is gone). The guard "
                    "refuses one that leaves fewer than min_machines warm.",
         (LABEL, Param("reason", "string", "why, for the event", min_length=1, max_length=500, required=True)),
         _on_a_machine(Kind.DESTROY)),
    Tool("stop", "Stop a machine at vast: no GPU billing, its disk (and fetched parameters) kept. Refused like "
                 "destroy below min_machines.",
         (LABEL,), _on_a_machine(Kind.STOP)),
    Tool("start", "Resume a stopped (or exited) machine; it boots again from its kept disk.",
         (LABEL,), _on_a_machine(Kind.START)),
    Tool("rebid", "Change an interruptible machine's bid (its `bid`, $/h): raise it to win back a machine vast "
                  "paused for a higher bid (outbid_since). The guard refuses a bid above max_dph.",
         (LABEL, Param("bid", "number", "the new bid in $ per hour", above=0, required=True),
          Param("reason", "string", "why, for the event", min_length=1, max_length=500)),
         _on_a_machine(Kind.REBID)),
    Tool("search_offers", "List current vast offers that meet the fleet's requirements, cheapest per proof first.",
         (GPU_NAME, Param("max_dph", "number", "at most this $ per hour", minimum=0),
          Param("limit", "integer", minimum=1, maximum=50)),
         lambda values: OfferSearch(**values)),
    Tool("note", "Keep a short note for later steps (shown to you in every following step).",
         (Param("text", "string", min_length=1, max_length=memory.NOTE_MAX_CHARS, required=True),),
         lambda values: Note(values["text"].strip())),
)
BY_NAME = {tool.name: tool for tool in TOOLS}


def schemas() -> list[dict[str, Any]]:
    """Every tool's schema, in TOOLS order: the `tools` of every request."""
    return [tool.schema() for tool in TOOLS]


def parse(name: Any, tool_input: Any) -> Call:
    """A model's tool call → what it asks for; Invalid (or an unknown tool's BadInput) when it is not one."""
    tool = BY_NAME.get(name) if isinstance(name, str) else None
    if tool is None:
        raise BadInput(f"unknown tool {name!r}: the tools are {', '.join(BY_NAME)}")
    return tool.parse(tool_input)
