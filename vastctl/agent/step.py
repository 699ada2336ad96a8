"""One agent step: observe, plan (rules, plan or llm), guard, apply, and one row in `agent_steps`.

  1. take the `agent-step` lease (not for --dry-run: it changes nothing)
  2. sample demand.command, when one is set
  3. observe once, with the events after the cursor of the last step that ran
  4. --if-events: skip (a row with outcome `skipped`) when no event from anyone but the agent itself
     arrived, demand did not change (known ↔ unknown, empty ↔ not), and agent.interval has not passed
  5. plan: rules.plan(), plan.decide(), or the llm (shown plan.decide()'s actions as a suggestion, applied to
     nothing: agent/plan_suggestion.py), whose tool calls come back here
  6. every action passes guard.check() (with the actions allowed before it in this step), refusals are
     recorded and listed; --dry-run stops there
  7. apply: one explicit branch per action kind (apply()), through operations

The cursor only moves on steps that ran (ok): a failed or dry step leaves the
events for the next one.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

from vastctl import clock as clock_module
from vastctl import guard, launches, operations
from vastctl.agent import rules
from vastctl.config import Config
from vastctl.errors import BadInput, GuardRefused, Unavailable, VastctlError
from vastctl.facts import demand as demand_module
from vastctl.facts.demand import DemandView
from vastctl.guard import Action, Kind
from vastctl.observe import Observation, observe, stored_json
from vastctl.state import locks
from vastctl.state.db import inserted_id, transaction
from vastctl.state.lifecycle import Cause, KillCode
from vastctl.state.rows import AgentStepRow, typed

if TYPE_CHECKING:
    from vastctl.agent import llm, plan, tools
    from vastctl.providers.base import Offer, Provider

LEASE = "agent-step"
LEASE_TTL_S = 10 * 60
LEASE_SLACK_S = 5 * 60  # beyond agent.deadline: the demand command, the state file, the record of the step
OFFERS_SEARCHED = 30
POLICIES = ("rules", "llm", "plan")
ZERO_TOKENS = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
LLM_CUT_SHORT = {  # the llm's stop reasons that end a step early: listed under errors, the step still ran (exit 0)
    "max_rounds": "stopped at agent.max_rounds (or the context budget)",
    "deadline": "stopped at agent.deadline",
    "refusal": "the model declined to answer",
    "max_tokens": "the reply was cut at its token limit (its tool calls were not run)",
}


@dataclass
class StepResult:
    policy: str
    outcome: str = "ok"  # ok | skipped | dry_run | error
    reason: str | None = None
    step_id: int | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: dict(ZERO_TOKENS))
    cost: float = 0.0
    demand: DemandView | None = None
    hold: str | None = None  # the rules' reason for doing nothing (rules.hold_reason)

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"

    def to_json(self) -> dict[str, Any]:
        """The contract's `agent-step --json` object."""
        return {"policy": self.policy, "skipped": self.skipped, "reason": self.reason, "outcome": self.outcome,
                "dry_run": self.outcome == "dry_run", "step_id": self.step_id, "actions": self.actions,
                "refused": self.refused, "errors": self.errors, "tokens": dict(self.tokens),
                "cost": round(self.cost, 6), "demand": self.demand, "hold": self.hold}


def resolve_policy(policy: str | None, config: Config, env: Mapping[str, str]) -> str:
    """`auto` (the config's default) is llm when ANTHROPIC_API_KEY is set, else plan: the planning policy is
    cheaper than the rules for the same service on the days measured (bench/README.md, "The same faults for
    both fleets")."""
    chosen = policy or config.agent.policy
    if chosen == "auto":
        return "llm" if env.get("ANTHROPIC_API_KEY") else "plan"
    if chosen not in POLICIES:
        raise BadInput(f"--policy must be one of rules, llm, plan (or auto in the config), got {chosen!r}")
    return chosen


def run_step(conn: sqlite3.Connection, provider: "Provider", config: Config, *, clock: clock_module.Clock,
             policy: str | None = None, dry_run: bool = False, if_events: bool = False,
             env: Mapping[str, str] | None = None) -> StepResult:
    """One step. Raises Unavailable (exit 1) when another step holds the lease."""
    env = os.environ if env is None else env
    chosen = resolve_policy(policy, config, env)
    if chosen == "llm":
        from vastctl.agent import llm  # the Anthropic SDK itself loads inside llm.run() only

        llm.require(config, env)  # a missing key or price is bad input: nothing asked, nothing written
    now = clock.now()
    previous = getattr(provider, "deadline", None)
    if provider is not None:  # the step's vast calls end by agent.deadline too, however slowly vast answers
        provider.deadline = clock.monotonic() + config.agent.deadline
    try:
        if dry_run:
            return _step(conn, provider, config, clock, chosen, now, dry_run=True, if_events=if_events, env=env)
        with locks.held(conn, LEASE, ttl_s=lease_ttl(config), now=now):
            return _step(conn, provider, config, clock, chosen, now, dry_run=False, if_events=if_events, env=env)
    finally:
        if provider is not None:
            provider.deadline = previous


def lease_ttl(config: Config) -> float:
    """How long the lease outlives a step's start: past its deadline with room to spare, so a second step is
    turned away while the first runs (it ends by agent.deadline), and a crashed one frees the lease soon after."""
    return max(LEASE_TTL_S, config.agent.deadline + LEASE_SLACK_S)


def _step(conn: sqlite3.Connection, provider: Provider, config: Config, clock: clock_module.Clock, policy: str,
          now: datetime, *, dry_run: bool, if_events: bool, env: Mapping[str, str]) -> StepResult:
    demand_module.refresh(conn, config, now=now)
    last = _last_ran(conn)
    cursor = int(last["event_cursor"] or 0) if last else 0
    obs = observe(conn, config, now=now, events_since=cursor)
    new_cursor = max([cursor] + [event["id"] for event in obs.events])
    summary = observation_summary(obs)
    result = StepResult(policy=policy, demand=obs.demand.view())
    if if_events:
        why = wake_reason(obs, last, config)
        if why is None:
            assert last is not None  # wake_reason() wakes the first step always
            result.outcome = "skipped"
            result.reason = (f"nothing new since step {last['id']} and agent.interval"
                             f" ({clock_module.human_duration(config.agent.interval)}) has not passed")
            result.step_id = _insert_step(conn, policy, "skipped", now, cursor, summary, finished=True)
            return result
        result.reason = why
    result.step_id = _insert_step(conn, policy, "error", now, new_cursor, summary, finished=False)
    executor = Executor(conn, provider, config, obs, now, dry_run=dry_run, step_id=result.step_id)
    try:
        if policy == "rules":
            _run_rules(executor)
        elif policy == "plan":
            _run_plan(executor)
        else:
            _run_llm(executor, result, clock, env)
    except BaseException as exc:
        result.outcome = "error"
        result.errors.append(str(exc) or type(exc).__name__)
        raise
    finally:
        result.actions, result.refused, result.hold = executor.actions, executor.refused, executor.hold
        result.errors = executor.errors + result.errors
        if result.outcome != "error":
            result.outcome = "dry_run" if dry_run else "ok"
        _finish_step(conn, result, clock.now())
    return result


# --- waking up ---------------------------------------------------------------------------------------


def _last_ran(conn: sqlite3.Connection) -> AgentStepRow | None:
    row = conn.execute("SELECT * FROM agent_steps WHERE outcome = 'ok' ORDER BY id DESC LIMIT 1").fetchone()
    return None if row is None else typed(row, AgentStepRow)


def wake_reason(obs: Observation, last: AgentStepRow | None, config: Config) -> str | None:
    """Why a step should run now, or None: the agent's own actions (events with source agent) never wake it."""
    if last is None:
        return "no step has run yet"
    since = clock_module.from_iso(last["started_at"])
    assert since is not None  # agent_steps.started_at is NOT NULL
    if (obs.now - since).total_seconds() >= config.agent.interval:
        return f"agent.interval ({clock_module.human_duration(config.agent.interval)}) passed"
    news = [event for event in obs.events if event.get("source") != "agent"]
    if news:
        return f"{len(news)} new event(s), the newest #{news[-1]['id']}"
    before = stored_json(last["observation"], dict).get("demand") or {}
    now_known, was_known = obs.demand.known, bool(before.get("known"))
    if now_known != was_known:
        return "demand became " + ("known" if now_known else "unknown")
    if now_known and ((obs.demand.queued or 0) > 0) != ((before.get("queued") or 0) > 0):
        return f"the queue went from {before.get('queued')} to {obs.demand.queued}"
    return None


# --- the agent_steps row -----------------------------------------------------------------------------


def observation_summary(obs: Observation) -> dict[str, Any]:
    """What a step saw, small enough to keep for every step (the full fleet is in `instances` anyway)."""
    return {
        "demand": obs.demand.view(), "capacity": round(obs.capacity, 3),
        "pending_capacity": round(obs.pending_capacity, 3), "spend_per_hour": round(obs.spend_per_hour, 4),
        "settings": dict(obs.settings), "by_state": dict(Counter(m["state"] for m in obs.machines)),
        "events": [event["id"] for event in obs.events],
    }


def _insert_step(conn: sqlite3.Connection, policy: str, outcome: str, now: datetime, cursor: int,
                 summary: dict[str, Any], *, finished: bool) -> int:
    with transaction(conn):
        return inserted_id(conn.execute(
            "INSERT INTO agent_steps (started_at, finished_at, policy, outcome, event_cursor, observation)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (clock_module.to_iso(now), clock_module.to_iso(now) if finished else None, policy, outcome, cursor,
             json.dumps(summary, sort_keys=True, default=str)),
        ))


def _finish_step(conn: sqlite3.Connection, result: StepResult, now: datetime) -> None:
    tokens = {**ZERO_TOKENS, **(result.tokens or {})}
    with transaction(conn):
        conn.execute(
            "UPDATE agent_steps SET finished_at = ?, outcome = ?, actions = ?, refused = ?, errors = ?,"
            " input_tokens = ?, output_tokens = ?, cache_read_tokens = ?, cache_write_tokens = ?, cost = ?, hold = ?"
            " WHERE id = ?",
            (clock_module.to_iso(now), result.outcome, json.dumps(result.actions, default=str),
             json.dumps(result.refused, default=str), json.dumps(result.errors), int(tokens["input"]),
             int(tokens["output"]), int(tokens["cache_read"]), int(tokens["cache_write"]), float(result.cost),
             result.hold, result.step_id),
        )


# --- guard, then apply -------------------------------------------------------------------------------


class Executor:
    """Passes each action of one step through the guard (with the ones allowed before it), then applies it."""

    def __init__(self, conn: sqlite3.Connection, provider: Provider, config: Config, obs: Observation, now: datetime, *,
                 dry_run: bool, step_id: int | None = None) -> None:
        self.conn, self.provider, self.config, self.obs, self.now = conn, provider, config, obs, now
        self.dry_run = dry_run
        self.step_id = step_id  # the agent_steps row: every event this step's actions write names it
        self.accepted: list[Action] = []
        self.actions: list[dict[str, Any]] = []
        self.refused: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.hold: str | None = None

    def submit(self, action: Action) -> tuple[bool, str]:
        """Guard and apply one action; (ok, what happened) — the text the llm is told."""
        verdict = guard.check(self.obs, action, self.config, earlier=self.accepted)
        if not self.dry_run:
            guard.record(self.conn, action, verdict, now=self.now)
        if not verdict.allowed:
            self.refused.append(verdict.refusal(action))
            return False, f"refused by the guard ({verdict.limit}): {verdict.why}"
        self.accepted.append(action)
        if self.dry_run:
            self.actions.append(action.view("planned (dry run)"))
            return True, "planned (dry run): nothing was applied"
        try:
            outcome = apply(self.conn, self.provider, self.config, action, step=self.step_id, now=self.now)
        except GuardRefused as exc:  # the fleet changed under the step; operations recorded the refusal
            self.accepted.remove(action)
            self.refused.append({**action.view(None), "why": str(exc), "limit": exc.limit})
            return False, f"refused by the guard: {exc}"
        except VastctlError as exc:
            outcome = f"error: {exc}"
            self.errors.append(f"{action.kind} {action.label or action.gpu_name or ''}: {exc}".replace("  ", " "))
            self.actions.append(action.view(outcome))
            return False, outcome
        self.actions.append(action.view(outcome))
        return True, outcome

    def offers(self, *, gpu_names: list[str] | None = None, max_dph: float | None = None, limit: int = OFFERS_SEARCHED) -> list[Offer]:
        return launches.find_offers(self.conn, self.provider, self.config, gpu_names=gpu_names or None,
                                      max_dph=max_dph, limit=limit, now=self.now)


def apply(conn: sqlite3.Connection, provider: "Provider", config: Config, action: Action, *, now: datetime,
          step: int | None = None) -> str:
    """Apply one allowed action: one explicit branch per kind, an unknown kind is an error. The events it writes
    keep its cause: the action's reason and the step's id (`step`)."""
    cause = Cause(action.reason or "no reason given", step)
    try:
        kind = Kind(action.kind)
    except ValueError:
        raise BadInput(f"unknown action kind {action.kind!r}: one of {', '.join(k.value for k in Kind)}") from None
    target = action.uuid or action.label
    if kind is Kind.LAUNCH:
        launched = launches.launch(conn, provider, config, offer_id=action.offer_id,
                                     gpu=None if action.offer_id is not None else action.gpu_name,
                                     count=action.count, actor=action.actor, cause=cause, now=now)
        names = ", ".join(f"{row['label']} (instance {row['vast_id']})" for row in launched.launched)
        if not launched.launched:
            raise Unavailable(launched.error or "nothing was launched")
        return f"launched {names}" + (f"; {launched.error}" if launched.error else "")
    if kind is Kind.START:
        target = _need_target(action, target)
        row = operations.start(conn, provider, config, target, actor=action.actor, cause=cause, now=now)
        return f"resumed ({row['state']})"
    if kind is Kind.STOP:
        target = _need_target(action, target)
        operations.stop(conn, provider, target, config=config, actor=action.actor, reason=action.reason,
                        force=action.force, cause=cause, now=now)
        return "stopped"
    if kind is Kind.KILL or kind is Kind.DESTROY:
        target = _need_target(action, target)
        row, error = operations.kill(conn, provider, target, f"{action.actor}: {action.reason or 'no reason given'}",
                                     config=config, actor=action.actor, code=KillCode.AGENT, kind=kind,
                                     force=action.force, cause=cause, now=now)
        return f"killed; destroy failed ({error}), reconcile retries" if error else "killed and destroyed"
    if kind is Kind.REBID:
        target = _need_target(action, target)
        row = operations.rebid(conn, provider, config, target, float(action.dph or 0.0), actor=action.actor,
                               reason=action.reason, now=now)
        return f"bid ${row['bid']:g}/h"
    if kind is Kind.NOTE:
        return "noted"  # notes are kept by the llm policy's memory; nothing reaches the market
    raise BadInput(f"no branch for action kind {kind!r}")  # pragma: no cover - every Kind has a branch above


def _need_target(action: Action, target: str | None) -> str:
    if not target:
        raise BadInput(f"a {action.kind} needs the machine's label")
    return target


# --- policies ----------------------------------------------------------------------------------------


def _offers_if_needed(executor: Executor, needed: bool | None = None) -> list[Offer]:
    if not (rules.needs_offers(executor.obs, executor.config) if needed is None else needed):
        return []
    try:
        return executor.offers(gpu_names=list(executor.config.fleet.gpus))
    except VastctlError as exc:
        executor.errors.append(f"offer search failed: {exc}")
        return []


def _run_rules(executor: Executor) -> None:
    offers = _offers_if_needed(executor)
    planned = rules.plan(executor.obs, executor.config, offers)
    if not planned:
        executor.hold = rules.hold_reason(executor.obs, executor.config, offers)
    for action in planned:
        executor.submit(action)


def _plan_decision(executor: Executor) -> "plan.Decision":
    """What the planning policy decides on this step's observation, its offers and the demand samples: pure,
    nothing applied (the plan policy submits it, the llm policy is shown it)."""
    from vastctl.agent import plan, plan_forecast, plan_odds

    offers = _offers_if_needed(executor, plan.needs_offers(executor.obs, executor.config))
    past = plan_forecast.read_past(executor.conn, executor.config, executor.now, plan.HORIZON_SLOTS, plan.SLOT_S)
    odds = plan_odds.read_boot_odds(executor.conn, executor.now)
    return plan.decide(executor.obs, executor.config, offers, past, odds)


def _run_plan(executor: Executor) -> None:
    """The planning policy (agent/plan.py): its own forecast of the demand samples, then the guard, as the rules."""
    decision = _plan_decision(executor)
    executor.hold = decision.hold
    for action in decision.actions:
        executor.submit(action)


def _run_llm(executor: Executor, result: StepResult, clock: clock_module.Clock, env: Mapping[str, str]) -> None:
    from vastctl.agent import llm, plan_suggestion, tools

    suggestion = plan_suggestion.shown(executor.obs, lambda: _plan_decision(executor))  # applied to nothing
    _record_suggestion(executor.conn, result.step_id, suggestion.line)

    def execute(name: str, call: tools.Call) -> "llm.ToolOutcome":
        """A parsed tool call (agent/tools.py): the offer search, or an action through the guard like the rules'."""
        if isinstance(call, tools.OfferSearch):
            return _search(executor, call)
        if not isinstance(call, Action):  # a note never leaves the llm's loop
            return llm.ToolOutcome(ok=False, text=f"error: {name} is not an action")
        ok, text = executor.submit(call)
        return llm.ToolOutcome(ok=ok, text=text, action=call.view(text))

    outcome = llm.run(executor.conn, executor.config, observation=executor.obs.to_prompt(), suggestion=suggestion.items,
                      execute=execute, clock=clock, step_id=result.step_id, env=env)
    result.tokens = {**ZERO_TOKENS, **(outcome.tokens or {})}
    result.cost = float(outcome.cost or 0.0)
    if outcome.stop_reason == "error" or outcome.error:
        result.outcome = "error"  # exit 1: the API failed; the cursor stays for the next step
        result.errors.append(f"llm: {outcome.error or 'the step failed'}")
    elif outcome.stop_reason in LLM_CUT_SHORT:
        result.errors.append(f"llm: {LLM_CUT_SHORT[outcome.stop_reason]} after {outcome.rounds} round(s)")


def _record_suggestion(conn: sqlite3.Connection, step_id: int | None, line: str) -> None:
    """The step's stored observation says what the model was suggested (`agent history` shows it)."""
    with transaction(conn):
        conn.execute("UPDATE agent_steps SET observation = json_set(observation, '$.plan_suggestion', ?) WHERE id = ?",
                     (line, step_id))


def _search(executor: Executor, search: "tools.OfferSearch") -> "llm.ToolOutcome":
    """search_offers: the offers the fleet may rent, as the model is shown them (launches.offer_view)."""
    from vastctl.agent import llm

    try:
        found = executor.offers(gpu_names=[search.gpu_name] if search.gpu_name else None, max_dph=search.max_dph,
                                limit=search.limit)
    except VastctlError as exc:
        return llm.ToolOutcome(ok=False, text=f"error: {exc}")
    return llm.ToolOutcome(ok=True, text=json.dumps([launches.offer_view(offer) for offer in found]))
