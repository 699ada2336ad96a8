"""What the llm policy is shown as its suggestion: the planning policy's decision for the same step, applied to nothing.

Each llm step runs the planning policy (agent/plan.py, plan.decide) dry on the step's one observation, its
offers and the demand samples, and shows the model what it would do: each action (kind, target or offer,
count) with its reason in the plan's figures; a `hold` item with the plan's reason when it would do nothing;
a `plan_unavailable` item first when it cannot plan (demand never known: it defers to the rules, whose actions
follow) or when it failed. The model is free to follow it or not: whatever it calls passes the guard like any
call, and nothing suggested is applied because it was suggested.

Deterministic (the plan is pure: the same observation, offers and samples give the same items in the same
order) and bounded: at most SHOWN items, each reason at most REASON_CHARS (memory.build_prompt condenses it
further when the context budget is short). The step's record keeps one short line of it (`line`), which
`agent history` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypedDict

from vastctl.guard import Action
from vastctl.observe import Observation

if TYPE_CHECKING:
    from vastctl.agent.plan import Decision

SHOWN = 12  # actions shown; a plan never does more than agent.max_actions_per_step in a step anyway
REASON_CHARS = 600  # a plan's reason (its figures, then the action's own) fits; memory clips the rest
LINE_CHARS = 200  # the record's line
HOLD = "hold"
UNAVAILABLE = "plan_unavailable"
NEVER_KNOWN = ("demand was never known (no good sample): the plan has nothing to forecast from and defers to"
               " the rules (sized to the ceiling); what they would do follows")


class Suggested(TypedDict, total=False):
    """One item of the suggestion: an action the plan would take, or `hold` / `plan_unavailable` with why."""

    kind: str
    label: str
    offer_id: int
    gpu_name: str
    count: int
    dph: float
    reason: str


@dataclass(frozen=True)
class Suggestion:
    items: list[Suggested]  # what the model is shown, in the plan's order
    line: str  # one short line for the step's record


def shown(obs: Observation, decide: Callable[[], "Decision"]) -> Suggestion:
    """The suggestion for this step; `decide` runs the plan on the step's observation (nothing is applied)."""
    try:
        decision = decide()
    except Exception as exc:  # noqa: BLE001 - a plan that fails leaves the model without a suggestion, not the step
        why = _clipped(f"the plan could not run this step ({type(exc).__name__}: {exc}); decide without it")
        return Suggestion([{"kind": UNAVAILABLE, "reason": why}], _clipped(f"plan unavailable: {why}", LINE_CHARS))
    items: list[Suggested] = []
    deferred = not obs.demand.known and obs.last_known_demand is None
    if deferred:
        items.append({"kind": UNAVAILABLE, "reason": NEVER_KNOWN})
    actions = [_item(action) for action in decision.actions[:SHOWN]]
    items.extend(actions)
    if not actions:
        items.append({"kind": HOLD, "reason": _clipped(decision.hold or "the plan does nothing this step")})
    said = ", ".join(_short(item) for item in actions) or HOLD
    if len(decision.actions) > len(actions):
        said += f" (+{len(decision.actions) - len(actions)} more)"
    line = f"plan unavailable (demand never known), the rules': {said}" if deferred else f"plan: {said}"
    return Suggestion(items, _clipped(line, LINE_CHARS))


def _item(action: Action) -> Suggested:
    item: Suggested = {"kind": str(action.kind)}
    if action.label:
        item["label"] = action.label
    if action.offer_id is not None:
        item["offer_id"] = action.offer_id
    if action.gpu_name:
        item["gpu_name"] = action.gpu_name
    if action.count != 1:
        item["count"] = action.count
    if action.dph is not None:
        item["dph"] = round(float(action.dph), 4)
    item["reason"] = _clipped(action.reason or "no reason given")
    return item


def _short(item: Suggested) -> str:
    """`launch 2× RTX 4090 (offer 7)`, `stop vastctl-a`."""
    count = item.get("count", 1)
    target = item.get("label") or f"{count}× {item.get('gpu_name') or 'any GPU'}"
    offer = f" (offer {item['offer_id']})" if "offer_id" in item else ""
    return f"{item['kind']} {target}{offer}"


def _clipped(text: str, limit: int = REASON_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
