"""The guard: the limits every action passes, whoever asks (agent, operator, reconcile), before the provider is called.

`check()` is pure: an Observation, one Action, the config, and the actions
already allowed earlier in the same step → a Verdict. Callers record every
refusal and every override with `record()` (a row in `actions`) and apply
nothing that was refused. Rules, in the order they are checked (first refusal wins):

  limit                 applies to                refuses
  kind                  every actor               a kind other than launch, stop, start, kill, destroy, note
  max_actions_per_step  agent                     more than agent.max_actions_per_step actions in one step
                                                  (a launch of N counts N; notes do not count)
  label_prefix          agent, operator; reconcile  a machine whose label lacks vast.label_prefix (reconcile:
                        only when it acts by vast id  its kills and destroys of rows are the safety net). A kill
                                                  of a row with no vast instance (no vast id, not launching)
                                                  touches nothing at vast and is not refused; an operator's
                                                  --force passes it for a kill (recorded as forced).
  gpus                  launch                    a GPU model not in fleet.gpus
  max_instances         launch                    more live machines than the max_instances setting
  max_dph               launch, start             a machine dearer than the max_dph setting
  max_hourly_spend      launch, start             spend above the max_hourly_spend setting: what vast bills
                                                  (observe.billing) plus the action's price (a start: its
                                                  price less the disk it already bills)
  max_daily_spend       launch, start             a day's spend above the max_daily_spend setting: what was
                                                  spent since 00:00 UTC (`vastctl cost`'s account,
                                                  observation.spent_today) plus the next hour of the spend
                                                  with the action (max_hourly_spend's sum)
  never_scale_to_zero   stop, kill, destroy       removing the last machine really proving (see proving():
                        (agent, operator)         running here, running at vast, heartbeat fresh) while
                                                  demand shows work (queued, in flight or look-ahead,
                                                  or calls the proof router holds: demand.held)
                                                  or is unknown. Retiring a machine
                                                  that proves nothing (booting, stopped, dead at vast, silent)
                                                  is not refused. An operator's --force passes it (recorded
                                                  as forced); reconcile's kills of dead machines are never
                                                  refused by it.
  min_machines          stop, kill, destroy       leaving fewer warm machines (warm(): proving, or booting and
                        (agent, operator)         not dead at vast) than agent.min_machines, whatever demand
                                                  says. Retiring a machine that is not warm is not refused; an
                                                  operator's --force passes it (recorded as forced); reconcile
                                                  is never refused by it.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from vastctl import clock, validate
from vastctl.config import Config
from vastctl.observe import PENDING_STATES, Machine
from vastctl.state.audit import record_action
from vastctl.state.lifecycle import VAST_DEAD_CODES, KillCode, State, StrEnum
from vastctl.validate import MIN_DPH

if TYPE_CHECKING:
    from vastctl.observe import Observation


class Kind(StrEnum):
    LAUNCH = "launch"
    STOP = "stop"
    START = "start"
    KILL = "kill"
    DESTROY = "destroy"
    NOTE = "note"
    REBID = "rebid"  # an interruptible machine's bid changed (dph: the new bid)


ACTORS = ("agent", "operator", "reconcile")
REMOVING = frozenset({Kind.STOP, Kind.KILL, Kind.DESTROY})
RETIRING = frozenset({Kind.KILL, Kind.DESTROY})
SCALE_TO_ZERO = "never_scale_to_zero"
LABEL_PREFIX = "label_prefix"
FLOOR = "min_machines"
FORCEABLE = frozenset({SCALE_TO_ZERO, LABEL_PREFIX, FLOOR})  # the rules an operator's --force passes (for a kill)


@dataclass(frozen=True)
class Action:
    """One thing an actor asks for, whoever it is: the agent's policies, an operator's command, a reconcile pass.

    `expect` is a precondition, not a request: the target row's (state, state_since, last_heartbeat_at) the
    decision was made on (reconcile's plan), so that a row that moved on since is left alone. It is neither
    shown nor audited.
    """

    kind: Kind
    actor: str                # agent | operator | reconcile
    label: str | None = None
    uuid: str | None = None
    vast_id: int | None = None
    reason: str = ""
    code: KillCode | None = None
    count: int = 1
    gpu_name: str | None = None
    offer_id: int | None = None
    dph: float | None = None
    text: str | None = None
    force: bool = False
    expect: tuple[Any, ...] | None = field(default=None, compare=False)

    def details(self) -> dict[str, Any]:
        """The request's fields as they are shown and audited (the precondition `expect` left out)."""
        return {name: value for name, value in asdict(self).items() if name != "expect"}

    def view(self, result: str | None = None) -> dict[str, Any]:
        """The contract's action object (kind, label, reason, result) and whichever details it has."""
        view = {"kind": str(self.kind), "label": self.label, "reason": self.reason, "result": result}
        for name, value in self.details().items():
            if name not in view and value not in (None, False) and not (name == "count" and value == 1):
                view[name] = value
        return view


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str = ""
    limit: str | None = None

    @property
    def forced(self) -> bool:
        """Allowed only because an operator passed --force."""
        return self.allowed and self.limit is not None

    def refusal(self, action: Action) -> dict[str, Any]:
        """How a refused action is listed under `refused`."""
        return {**action.view(None), "why": self.why, "limit": self.limit}


ALLOWED = Verdict(True)


def _refuse(limit: str, why: str) -> Verdict:
    return Verdict(False, why, limit)


def weight(action: Action) -> int:
    """How many of agent.max_actions_per_step an action uses."""
    if action.kind == Kind.NOTE:
        return 0
    return max(1, int(action.count)) if action.kind == Kind.LAUNCH else 1


def check(obs: "Observation", action: Action, config: Config, *, earlier: Sequence[Action] = ()) -> Verdict:
    """May this action be applied now? `earlier`: actions allowed before it in the same step, not yet observed."""
    try:
        kind = Kind(action.kind)
    except ValueError:
        return _refuse("kind", f"unknown action kind {action.kind!r}: one of {', '.join(k.value for k in Kind)}")
    if action.actor not in ACTORS:
        return _refuse("actor", f"unknown actor {action.actor!r}: one of {', '.join(ACTORS)}")
    if kind is Kind.NOTE:
        return ALLOWED
    if action.actor == "agent":
        used = sum(weight(a) for a in earlier)
        most = config.agent.max_actions_per_step
        if used + weight(action) > most:
            return _refuse("max_actions_per_step", f"this step already took {used} action(s); agent.max_actions_per_step"
                           f" is {most}: the rest waits for the next step")
    if kind is Kind.LAUNCH:
        return _check_launch(obs, action, config, earlier)
    prefix = _check_prefix(obs, kind, action, config)
    if not prefix.allowed:
        return prefix
    if kind is Kind.START:
        return _check_start(obs, action, earlier)
    if kind is Kind.REBID:
        return _check_rebid(obs, action, earlier)
    passed = _both(prefix, _check_scale_to_zero(obs, action, config, earlier))
    if not passed.allowed:
        return passed
    return _both(passed, _check_floor(obs, action, config, earlier))


def _both(first: Verdict, second: Verdict) -> Verdict:
    """Two rules passed in turn: a refusal of the second stands; overrides of both are recorded together."""
    if not second.allowed or not first.forced:
        return second
    if not second.forced:
        return first
    return Verdict(True, f"{first.why}; {second.why}", f"{first.limit}+{second.limit}")


def _check_prefix(obs: "Observation", kind: Kind, action: Action, config: Config) -> Verdict:
    prefix = config.vast.label_prefix
    if action.actor == "reconcile" and action.uuid is not None:
        return ALLOWED
    if not prefix or (action.label or "").startswith(prefix):
        return ALLOWED
    if kind in RETIRING and action.vast_id is None and (action.uuid or action.label):
        target = find(obs, action)
        if target is not None and target.get("vast_id") is None and target["state"] != State.LAUNCHING:
            return ALLOWED  # only our row is retired: nothing at vast is touched
    text = (f"{action.label or f'vast instance {action.vast_id}'} does not carry our label prefix {prefix!r}:"
            " vastctl never touches machines that are not its own")
    if action.actor == "operator" and kind in RETIRING:
        if action.force:
            return Verdict(True, f"forced: {text}", LABEL_PREFIX)
        text += " (pass --force to retire it anyway)"
    return _refuse(LABEL_PREFIX, text)


def _spend_added(earlier: Iterable[Action], obs: "Observation") -> float:
    added = 0.0
    for item in earlier:
        if item.kind == Kind.LAUNCH:
            added += max(1, item.count) * (item.dph or 0.0)
        elif item.kind == Kind.START:
            target = find(obs, item)
            added += _resume_adds(float((target.get("dph") if target is not None else None) or item.dph or 0.0), target)
    return added


def _resume_adds(dph: float, target: Machine | None) -> float:
    """What resuming a machine adds to the spend: its price, less what it bills already (a stopped disk)."""
    return max(0.0, dph - float((target.get("billed_per_hour") if target is not None else None) or 0.0))


def _check_spend(obs: "Observation", earlier: Sequence[Action], extra: float, what: str) -> Verdict:
    before = obs.spend_per_hour + _spend_added(earlier, obs)
    return spend_verdict(obs, before + extra, what, before=before)


DAY_AHEAD_H = 1.0  # max_daily_spend: what was spent today plus this many hours of the spend an action leads to


def spend_verdict(obs: "Observation", per_hour: float, what: str, *, before: float | None = None) -> Verdict:
    """May the fleet bill `per_hour` $/h? Within max_hourly_spend, and today's spend (observation.spent_today)
    plus DAY_AHEAD_H of it within max_daily_spend. The rules ask it too, so a plan stays inside the limits."""
    before = obs.spend_per_hour if before is None else before
    most = float(obs.settings["max_hourly_spend"])
    if not per_hour <= most + 1e-9:  # a NaN anywhere in the sum is refused, not let through
        return _refuse("max_hourly_spend", f"{what} would bring spend to ${per_hour:.2f}/h (now ${before:.2f}/h);"
                       f" max_hourly_spend is ${most:g}/h (vastctl settings set max_hourly_spend X)")
    day_most = float(obs.settings.get("max_daily_spend", math.inf))
    spent = obs.spent()
    day = spent + per_hour * DAY_AHEAD_H
    if not day <= day_most + 1e-9:
        return _refuse("max_daily_spend", f"{what} would bring today's spend to ${day:.2f} (${spent:.2f} spent since"
                       f" 00:00 UTC, plus the next hour at ${per_hour:.2f}/h); max_daily_spend is ${day_most:g}"
                       " (vastctl settings set max_daily_spend X)")
    return ALLOWED


def _check_dph(dph: float, what: str, obs: "Observation") -> Verdict:
    most = float(obs.settings["max_dph"])
    if validate.price(dph) is None:  # NaN passes every comparison; a negative or tiny one lowers the spend
        return _refuse("max_dph", f"{what} is priced ${dph:g}/h, which is not a price: vastctl rents only at a finite"
                       f" price of at least ${MIN_DPH:g}/h (check the offer at vast)")
    if dph > most + 1e-9:
        return _refuse("max_dph", f"{what} costs ${dph:g}/h; max_dph is ${most:g}/h (vastctl settings set max_dph X)")
    return ALLOWED


def _check_launch(obs: "Observation", action: Action, config: Config, earlier: Sequence[Action]) -> Verdict:
    count = int(action.count)
    if count < 1:
        return _refuse("count", f"a launch rents at least 1 machine, got count {count}")
    if action.gpu_name is not None and config.fleet.gpus and action.gpu_name not in config.fleet.gpus:
        return _refuse("gpus", f"{action.gpu_name} is not an allowed GPU model (fleet.gpus:"
                       f" {', '.join(config.fleet.gpus)}); add it to fleet.gpus in the config to rent it")
    live = len(obs.live()) + sum(max(1, a.count) for a in earlier if a.kind == Kind.LAUNCH)
    most = int(obs.settings["max_instances"])
    if live + count > most:
        return _refuse("max_instances", f"launching {count} would make {live + count} machines; max_instances is"
                       f" {most} (vastctl settings set max_instances N)")
    if action.dph is None:  # the price is checked again once the offer is known
        return ALLOWED
    what = f"offer {action.offer_id}" if action.offer_id is not None else f"a {action.gpu_name or 'machine'}"
    verdict = _check_dph(action.dph, what, obs)
    if not verdict.allowed:
        return verdict
    return _check_spend(obs, earlier, count * action.dph, f"launching {count}")


def _check_start(obs: "Observation", action: Action, earlier: Sequence[Action]) -> Verdict:
    target = find(obs, action)
    dph = target.get("dph") if target is not None else None
    if dph is None:
        dph = action.dph
    if dph is None:
        return ALLOWED
    verdict = _check_dph(float(dph), action.label or "the machine", obs)
    if not verdict.allowed:
        return verdict
    return _check_spend(obs, earlier, _resume_adds(float(dph), target), f"starting {action.label}")


def _check_rebid(obs: "Observation", action: Action, earlier: Sequence[Action]) -> Verdict:
    """A new bid: for an interruptible machine of ours, a real price within max_dph and max_hourly_spend."""
    target = find(obs, action)
    if target is None or target.get("bid") is None:
        return _refuse("rebid", f"{action.label or 'the machine'} is not an interruptible machine of the fleet:"
                       " only a bid can be changed")
    if action.dph is None:
        return _refuse("rebid", "a rebid names the new bid in $/h")
    verdict = _check_dph(float(action.dph), f"the bid for {action.label}", obs)
    if not verdict.allowed:
        return verdict
    adds = max(0.0, float(action.dph) - float(target.get("dph") or 0.0))
    return _check_spend(obs, earlier, adds, f"raising the bid of {action.label}")


def heartbeat_fresh(machine: Mapping[str, Any], limit_s: float, now: datetime) -> bool:
    """The liveness rule reconcile's heartbeat_timeout and never_scale_to_zero both judge by: a heartbeat since
    the machine entered its state
    within `limit_s` (timeouts.heartbeat), or, without one yet, in that state for no longer than that."""
    since = clock.from_iso(machine.get("state_since"))
    beat = clock.from_iso(machine.get("last_heartbeat_at"))
    last = since if beat is None or (since is not None and beat < since) else beat
    return last is None or (now - last).total_seconds() <= limit_s


def proving(machine: Machine, config: Config, now: datetime) -> bool:
    """Really proving: running in our file, running at vast (when vast has listed it at all: missing or any
    other status is not running), and its heartbeat fresh. What never_scale_to_zero protects."""
    if machine.get("state") != State.RUNNING or machine.get("vast_missing"):
        return False
    if machine.get("vast_status") not in (None, "running"):
        return False
    return heartbeat_fresh(machine, config.timeouts.heartbeat, now)


def _left_after(obs: "Observation", action: Action, earlier: Sequence[Action],
                counted: Callable[[Machine], bool]) -> list[Machine] | None:
    """The machines `counted` still counts once this removal and the step's earlier ones are done; None when the
    target is not one of them (removing it takes nothing away)."""
    target = find(obs, action)
    if target is None or not counted(target):
        return None
    gone = {_key(m) for m in (find(obs, a) for a in earlier if a.kind in REMOVING) if m is not None}
    gone.add(_key(target))
    return [m for m in obs.machines if counted(m) and _key(m) not in gone]


def _held_back(action: Action, text: str, limit: str, agent_hint: str = "") -> Verdict:
    """A removal a rule holds back: refused, or for an operator's --force allowed and recorded as forced."""
    if action.actor == "operator" and action.force:
        return Verdict(True, f"forced: {text}", limit)
    hint = " (pass --force to do it anyway)" if action.actor == "operator" else agent_hint
    return _refuse(limit, text + hint)


def _check_scale_to_zero(obs: "Observation", action: Action, config: Config, earlier: Sequence[Action]) -> Verdict:
    if action.actor == "reconcile":  # a dead machine is no capacity: the safety net is never held back
        return ALLOWED
    left = _left_after(obs, action, earlier, lambda m: proving(m, config, obs.now))
    if left is None or left:
        return ALLOWED  # it proves nothing (retiring it takes no capacity away), or another one still proves
    demand = obs.demand
    if demand.known and demand.work == 0:
        return ALLOWED
    if demand.known:
        why = f"{demand.work} proofs are queued, in flight or about to be queued"
    else:
        why = f"demand is unknown ({demand.error or 'no sample'})"
    if demand.held:
        why += f", {demand.held} of them held at the proof router for a free prover"
    text = (f"{action.kind} {action.label or action.uuid} would leave no machine running: it is the last one"
            f" proving (running here and at vast, heartbeat fresh) while {why}; never scale to zero")
    return _held_back(action, text, SCALE_TO_ZERO)


def warm(machine: Machine, config: Config, now: datetime) -> bool:
    """Counted in the floor of agent.min_machines: proving (proving()), or booting and not dead or missing at vast
    (a boot counts, so the floor is not rented twice while it comes up)."""
    if machine.get("state") == State.RUNNING:
        return proving(machine, config, now)
    if machine.get("state") not in PENDING_STATES or machine.get("vast_missing"):
        return False
    return machine.get("vast_status") not in VAST_DEAD_CODES


def _check_floor(obs: "Observation", action: Action, config: Config, earlier: Sequence[Action]) -> Verdict:
    floor = config.agent.min_machines
    if action.actor == "reconcile" or floor <= 0:
        return ALLOWED
    left = _left_after(obs, action, earlier, lambda m: warm(m, config, obs.now))
    if left is None or len(left) >= floor:
        return ALLOWED  # not warm (retiring it takes nothing from the floor), or the floor still holds
    text = (f"{action.kind} {action.label or action.uuid} would leave {len(left)} warm machine(s) (proving, or"
            f" booting); agent.min_machines keeps {floor} whatever the queue says")
    return _held_back(action, text, FLOOR, " (lower agent.min_machines in the config)")


def _key(machine: Machine) -> str | None:
    return machine.get("uuid") or machine.get("label")


def find(obs: "Observation", action: Action) -> Machine | None:
    """The machine an action names: by uuid, else by label, else by vast id."""
    for machine in obs.machines:
        if action.uuid is not None:
            if machine.get("uuid") == action.uuid:
                return machine
        elif action.label is not None:
            if machine.get("label") == action.label:
                return machine
        elif action.vast_id is not None and machine.get("vast_id") == action.vast_id:
            return machine
    return None


def record(conn: sqlite3.Connection, action: Action, verdict: Verdict, *, now: datetime) -> None:
    """Keep a refusal or an override in the `actions` audit; an ordinary allowed action leaves no trace here."""
    if verdict.allowed and not verdict.forced:
        return
    if verdict.allowed:
        result = f"forced past the guard ({verdict.limit}): {verdict.why}"
    else:
        result = f"refused by the guard ({verdict.limit}): {verdict.why}"
    request = {k: v for k, v in action.details().items() if v not in (None, "") and k not in ("kind", "actor")}
    record_action(conn, actor=action.actor, kind=str(action.kind), ok=verdict.allowed, result=result,
                  uuid=action.uuid, label=action.label, vast_id=action.vast_id, request=request, now=now)
