"""The rules policy: a deterministic autoscaler, pure (Observation, config, offers → actions).

It is the default policy without an Anthropic key (the llm policy is shown the
planning policy's decision instead: agent/plan_suggestion.py). In the order `plan()` applies them:

  work, wanted and held: what the fleet is sized to (agent/sizing.py).

  demand                     what it does
  any                        a stopped machine resumed once already is destroyed (replaced, not resumed
                             twice); a stopped one whose storage has billed what a fresh boot costs
                             (BOOT_HOURS of its price) is destroyed (kept longer it costs more than renting anew);
                             an interruptible machine vast stopped for a higher bid (outbid) is waited for
                             agent.outbid_wait, then rebid 25% higher (capped by max_dph and its offer's on-demand
                             price), and destroyed once still outbid at that cap (outbid_choice)
  work > 0, or unknown,      grow fast: capacity + pending capacity to wanted; first resume stopped machines never
  below wanted               resumed before (they keep their parameters), best proofs per dollar first, unless an
                             offer is agent.replace_factor × cheaper per proof (running, it would be replaced:
                             rent the offer instead); then launch the cheapest offers per expected proof among
                             fleet.gpus, the last one the cheapest per hour that covers what is left
                             (next_offer). Capacity still on its way counts: no second launch for it, unless its
                             benchmark is late (LATE_BENCH_S: likely stuck, reconcile kills it at
                             timeouts.params_done; the rules destroy it themselves once what runs and boots covers
                             wanted without it). A machine vast lists as exited, offline, missing, or stopped
                             under a running row (outbid) is not counted. A shortfall under ROUND_DOWN of the
                             smallest machine to hand is rounded down (rounded_down: the queue it leaves raises
                             wanted until it is worth a machine), only while what waits drains within half of
                             agent.plan_horizon, never from no capacity at all.
  work > 0, at or over       release slowly: running capacity alone (booting machines are not counted: make before
  wanted                     break) must still cover held with agent.scale_down_margin to spare; at most
                             agent.max_releases_per_step, dearest per proof first, stopped (disk kept). A machine a
                             cheaper host came up to replace (agent.replace_factor, within agent.replace_after)
                             goes once the rest covers held, destroyed. With nothing to release: when nothing
                             boots, a machine run past agent.replace_after that costs replace_factor × more per
                             proof than the best offer gets its replacement launched (one at a time)
  work == 0 for              first stop the running machines the fleet can spare above the ceiling, least proofs
  agent.scale_down_after     per dollar first, as many as the step allows (not while a machine boots: its rate is
                             still a guess); with none to spare, stop one machine a step, least proofs per dollar
                             first (stopped, it keeps its disk and is resumed first when work returns)
  work == 0, cooling down    hold
  unknown                    never shrink the fleet (hold), whatever the last known queue said (and grow only to
                             what that sample needed: a replacement for a machine lost meanwhile); the incident
                             (59 queued, no "active" flag, every machine stopped) cannot recur: a queue is work,
                             one fresh report is no evidence over the window, and the guard never scales to zero
  any (agent.min_machines)   the floor, last: no release takes the warm machines (guard.warm: proving, or
                             booting and not dead at vast) below agent.min_machines, and a fleet under it resumes
                             stopped machines, then rents the cheapest offers per expected proof up to it

Expected rate: agent/valuation.py. Plans stay inside the limits the
guard checks (max_instances, max_dph, max_hourly_spend and max_daily_spend through
guard.spend_verdict, min_machines, max_actions_per_step), so a healthy plan is never
refused; the guard checks them again anyway.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Sequence

from vastctl import guard
from vastctl.agent.outbid import outbid_choice, outbid_since
from vastctl.agent.sizing import (
    LATE_BENCH_S,
    ROUND_DOWN,
    ceiling,
    cooled_down,
    counted_capacity,
    has_work,
    held_capacity,
    horizon_hours,
    in_state_for,
    late_benchmarks,
    on_its_way,
    resumable,
    rounded_down,
    shortfall,
    sized_to,
    vast_dead,
    wanted_capacity,
    work_reason,
)
from vastctl.agent.valuation import BOOT_HOURS, launch_price, launch_terms, next_offer, per_dollar, per_proof, rank_offers
from vastctl.config import Config
from vastctl.guard import Action, Kind
from vastctl.observe import PENDING_STATES, Machine, Observation
from vastctl.providers.base import Offer
from vastctl.state.lifecycle import State

ACTOR = "agent"


def needs_offers(obs: Observation, config: Config) -> bool:
    """Whether plan() would look at offers (the caller searches the market only then): to grow (a stopped
    machine is resumed only when no offer is clearly cheaper per proof), or to replace a running machine by a
    cheaper host."""
    return (shortfall(obs, config) > 0 or bool(replacement_candidates(obs, config))
            or warm_count(obs, config) < config.agent.min_machines)


def plan(obs: Observation, config: Config, offers: Sequence[Offer] = ()) -> list[Action]:
    """What the rules would do now. Pure: same observation, same offers → same actions."""
    budget = config.agent.max_actions_per_step
    actions: list[Action] = []
    for machine in obs.machines:
        if machine["state"] == State.STOPPED and machine.get("resumes") and len(actions) < budget:
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason="stopped again after its one resume: replaced, not resumed twice"))
    actions.extend(_retire_stopped(obs, budget - len(actions)))
    actions.extend(_outbid_actions(obs, config, budget - len(actions)))
    if has_work(obs):
        grown = _grow(obs, config, offers, budget - len(actions))
        actions.extend(grown)
        if not grown and obs.demand.known:
            actions.extend(_release_late_benchmarks(obs, config, budget - len(actions)))
            actions.extend(_release_while_queued(obs, config, budget - len(actions))
                           or _replace(obs, config, offers, budget - len(actions)))
    elif cooled_down(obs, config):
        actions.extend(_trim(obs, config, budget - len(actions)) or _shrink(obs, config, budget - len(actions)))
    return _keep_floor(obs, config, offers, actions, budget)


def warm_count(obs: Observation, config: Config) -> int:
    """Machines in the floor of agent.min_machines, as the guard counts them (guard.warm)."""
    return sum(1 for m in obs.machines if guard.warm(m, config, obs.now))


def _keep_floor(obs: Observation, config: Config, offers: Sequence[Offer], actions: list[Action],
                budget: int) -> list[Action]:
    """agent.min_machines, whatever the queue says: no release takes the warm machines below it, and a fleet
    under it resumes stopped machines, then rents the cheapest offers per expected proof, to reach it (within
    max_instances, max_dph and the spend limits, as every launch)."""
    floor = config.agent.min_machines
    if floor <= 0:
        return actions
    warm = {m["uuid"] for m in obs.machines if guard.warm(m, config, obs.now)}
    count = len(warm)
    kept: list[Action] = []
    for action in actions:
        if action.kind in guard.REMOVING and action.uuid in warm:
            if count - 1 < floor:
                continue  # the floor holds it
            count -= 1
        kept.append(action)
    coming = sum(max(1, a.count) if a.kind == Kind.LAUNCH else 1 for a in kept if a.kind in (Kind.LAUNCH, Kind.START))
    missing = floor - count - coming
    if missing <= 0:
        return kept
    why = f"agent.min_machines {floor}: {count} warm (proving or booting), whatever the queue says"
    spend = obs.spend_per_hour + sum(max(1, a.count) * (a.dph or 0.0) for a in kept if a.kind == Kind.LAUNCH)
    started = {a.uuid for a in kept if a.kind == Kind.START}
    for machine in resumable(obs):
        if missing <= 0 or len(kept) >= budget:
            return kept
        adds = max(0.0, float(machine.get("dph") or 0.0) - float(machine.get("billed_per_hour") or 0.0))
        if machine["uuid"] in started or not guard.spend_verdict(obs, spend + adds, "").allowed:
            continue
        kept.append(Action(kind=Kind.START, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                           dph=machine.get("dph"), reason=f"{why}; resume before renting anew"))
        missing -= 1
        spend += adds
    live = len(obs.live()) + sum(max(1, a.count) for a in kept if a.kind == Kind.LAUNCH)
    taken = {a.offer_id for a in kept if a.kind == Kind.LAUNCH}
    for offer, rate in rank_offers(offers, obs, config):
        if missing <= 0 or len(kept) >= budget or live >= int(obs.settings["max_instances"]):
            break
        if offer.id in taken or not guard.spend_verdict(obs, spend + offer.dph_total, "").allowed:
            continue
        kept.append(Action(kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name,
                           dph=offer.dph_total, reason=(f"{why}; {offer.gpu_name} at {launch_terms(offer, obs, config)},"
                                                        f" {rate:g} proofs/h expected")))
        missing -= 1
        spend += offer.dph_total
        live += 1
    return kept


def _retire_stopped(obs: Observation, budget: int) -> list[Action]:
    """Destroy a stopped machine whose storage has billed what a fresh boot costs (BOOT_HOURS of its price):
    kept longer, it costs more than renting anew would (the ski-rental rule: at most twice the best choice)."""
    actions: list[Action] = []
    for machine in obs.machines:
        if len(actions) >= budget or machine["state"] != State.STOPPED or machine.get("resumes"):
            continue
        storage = float(machine.get("billed_per_hour") or 0.0)
        boot_cost = float(machine.get("dph") or 0.0) * BOOT_HOURS
        stopped_h = in_state_for(machine, obs.now) / 3600
        if storage > 0 and boot_cost > 0 and storage * stopped_h >= boot_cost:
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason=(f"stopped {stopped_h:.1f}h: its storage (${storage:.3f}/h) has billed"
                                          f" ${storage * stopped_h:.2f}, what a fresh boot costs"
                                          f" ({BOOT_HOURS:g}h at ${float(machine['dph'] or 0.0):g}/h)")))
    return actions


def _outbid_actions(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Rebid or release outbid machines as outbid_choice says (waiting is no action)."""
    actions: list[Action] = []
    max_dph = float(obs.settings["max_dph"])
    for machine in obs.machines:
        if len(actions) >= budget or outbid_since(machine) is None or machine.get("vast_id") is None:
            continue
        choice, bid, why = outbid_choice(machine, obs.now, max_dph, config)
        if choice == "rebid":
            actions.append(Action(kind=Kind.REBID, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  dph=bid, reason=why))
        elif choice == "release":
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason=why))
    return actions


def _sizing(obs: Observation, config: Config, have: float, want: float) -> str:
    cap = ceiling(obs, config)
    at_ceiling = want >= cap - 1e-9 or sized_to(obs) is None
    why = (f"target × (1 + {config.agent.headroom:g})" if at_ceiling
           else f"drains the work within {config.agent.plan_horizon / 60:g}m and keeps up with arrivals")
    return f"{work_reason(obs)}: capacity {have:g} of {want:g} proofs/h wanted ({why})"


def _grow(obs: Observation, config: Config, offers: Sequence[Offer], budget: int) -> list[Action]:
    ranked = rank_offers(offers, obs, config)
    if rounded_down(obs, config, ranked) is not None:
        return []
    want = wanted_capacity(obs, config)
    have = counted_capacity(obs)
    missing = want - have
    sizing = _sizing(obs, config, have, want)
    actions: list[Action] = []
    spend = obs.spend_per_hour
    live = len(obs.live())
    best = launch_price(ranked[0][0], obs, config) / ranked[0][1] if ranked else float("inf")
    for machine in resumable(obs):
        dph = float(machine.get("dph") or 0.0)
        if missing <= 0 or len(actions) >= budget:
            break
        if per_proof(machine) > config.agent.replace_factor * best:
            continue  # running, it would be replaced by that offer: rent the offer instead
        adds = max(0.0, dph - float(machine.get("billed_per_hour") or 0.0))  # its disk bills already
        if not guard.spend_verdict(obs, spend + adds, "").allowed or dph > float(obs.settings["max_dph"]) + 1e-9:
            continue
        actions.append(Action(kind=Kind.START, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                              dph=machine.get("dph"), reason=f"{sizing}; resume before renting anew"))
        missing -= machine["expected_rate"]
        spend += adds
    left = list(ranked)
    while left and missing > 0 and len(actions) < budget and live < int(obs.settings["max_instances"]):
        offer, rate, covers_the_rest = next_offer(left, missing, obs, config)
        left.remove((offer, rate))
        if not guard.spend_verdict(obs, spend + offer.dph_total, "").allowed:
            continue
        last = "; the cheapest per hour that covers the rest" if covers_the_rest else ""
        actions.append(Action(
            kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name, dph=offer.dph_total,
            reason=(f"{sizing}; {offer.gpu_name} at {launch_terms(offer, obs, config)}, {rate:g} proofs/h expected"
                    f" (${launch_price(offer, obs, config) / rate * 1000:.2f} per 1000 proofs){last}"),
        ))
        missing -= rate
        spend += offer.dph_total
        live += 1
    return actions


def _release_late_benchmarks(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Destroy benchmarks past LATE_BENCH_S once what runs and boots covers what is wanted without them.

    A late benchmark is already given up on (not counted, the fleet launched around it); once the fleet covers the
    work without it, it only bills, until reconcile's timeouts.params_done (90 min by default) would kill it. If it
    was merely slow, the fleet did not need it."""
    want = wanted_capacity(obs, config)
    if budget < 1 or counted_capacity(obs) < want - 1e-9:
        return []
    late_ones = late_benchmarks(obs)
    return [Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                   reason=(f"benchmarking for {in_state_for(machine, obs.now) / 60:.0f}m (a healthy benchmark takes 10-16m;"
                           f" past {LATE_BENCH_S // 60}m it is likely stuck), and the fleet covers the"
                           f" {want:g} proofs/h wanted without it: released"))
            for machine in late_ones[:budget]]


def _live_running(obs: Observation) -> list[Machine]:
    return [m for m in obs.machines if m["state"] == State.RUNNING and m.get("vast_id") is not None
            and not vast_dead(m)]


def _release_while_queued(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Work is queued and the fleet can spare machines: release them, worst per proof first.

    Capacity still booting is not counted (make before break), and what stays covers the most wanted over
    agent.scale_down_after (held_capacity): a machine clearly dearer per proof than the cheapest running one
    that a cheaper host came up to replace (_replaced) goes as soon as the rest covers that, and is destroyed (a cheaper one replaced it);
    any other goes only with agent.scale_down_margin to spare, and is stopped (kept for a quick resume).
    """
    held = held_capacity(obs, config)
    limit = min(budget, config.agent.max_releases_per_step)
    if held is None or limit < 1 or ceiling(obs, config) <= 0:
        return []
    running = sorted(_live_running(obs), key=lambda m: (-per_proof(m), m["label"]))
    have = sum(m["expected_rate"] for m in running)
    margin = config.agent.scale_down_margin
    actions: list[Action] = []
    for machine in running:
        if len(actions) >= limit:
            break
        left = have - machine["expected_rate"]
        dear = _replaced(machine, running, obs.now, config)
        if left < held * (1 + (0 if dear else margin)) - 1e-9 or left <= 0:
            continue
        have = left
        cost = f"${per_proof(machine) * 1000:.2f} per 1000 proofs"
        if dear:
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason=(f"{work_reason(obs)}: {cost}, replaced by a host at least"
                                          f" {config.agent.replace_factor:g}× cheaper per proof; the rest ({left:g} proofs/h) covers the {held:g} wanted over"
                                          f" the last {config.agent.scale_down_after / 60:g}m")))
        else:
            actions.append(Action(kind=Kind.STOP, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason=(f"{work_reason(obs)}: the rest ({left:g} proofs/h) covers the {held:g}"
                                          f" wanted over the last {config.agent.scale_down_after / 60:g}m with"
                                          f" {margin:.0%} to spare; {cost}")))
    return actions


def _replaced(machine: Machine, running: Sequence[Machine], now: datetime, config: Config) -> bool:
    """A cheaper host came up after this machine, within agent.replace_after, at agent.replace_factor × less per
    proof: the replacement _replace() launched for it (a fleet that merely mixes hosts replaces nothing)."""
    age = in_state_for(machine, now)
    return any(other is not machine and in_state_for(other, now) < age and in_state_for(other, now) <= config.agent.replace_after
               and per_proof(machine) >= config.agent.replace_factor * per_proof(other) for other in running)


def replacement_candidates(obs: Observation, config: Config) -> list[Machine]:
    """Running machines old enough to be replaced by a cheaper host (agent.replace_after), dearest per proof first;
    none while any machine boots (one replacement at a time) or while demand is not known to have work."""
    if not obs.demand.known or obs.demand.work <= 0 or any(on_its_way(m, obs.now) for m in obs.machines):
        return []
    old = [m for m in _live_running(obs) if in_state_for(m, obs.now) >= config.agent.replace_after]
    return sorted(old, key=lambda m: (-per_proof(m), m["label"]))


def _replace(obs: Observation, config: Config, offers: Sequence[Offer], budget: int) -> list[Action]:
    """Launch a cheaper host for the dearest machine (make before break: _release_while_queued destroys the dear
    one once the replacement is running and the rest covers what is wanted)."""
    candidates = replacement_candidates(obs, config)
    if not candidates or budget < 1 or len(obs.live()) >= int(obs.settings["max_instances"]):
        return []
    ranked = rank_offers(offers, obs, config)
    if not ranked:
        return []
    offer, rate = ranked[0]
    best = offer.dph_total / rate
    worst = candidates[0]
    if per_proof(worst) < config.agent.replace_factor * best:
        return []
    if not guard.spend_verdict(obs, obs.spend_per_hour + offer.dph_total, "").allowed:
        return []
    return [Action(kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name, dph=offer.dph_total,
                   reason=(f"replacing {worst['label']} (${per_proof(worst) * 1000:.2f} per 1000 proofs) with"
                           f" {offer.gpu_name} at ${offer.dph_total:g}/h, {rate:g} proofs/h expected"
                           f" (${best * 1000:.2f} per 1000 proofs): released once this one is running"))]


def _trim(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Stop what the fleet can spare above target × (1 + headroom), least proofs per dollar first (demand known)."""
    if not obs.demand.known or budget < 1 or any(on_its_way(m, obs.now) for m in obs.machines):
        return []  # unknown demand holds; a booting machine's rate is a guess: trim once the fleet has settled
    want = ceiling(obs, config)
    have = counted_capacity(obs)
    candidates = sorted((m for m in obs.machines if m["state"] == State.RUNNING
                         and m.get("vast_id") is not None and not vast_dead(m)),
                        key=lambda m: (per_dollar(m), m["label"]))
    actions: list[Action] = []
    for machine in candidates:
        if len(actions) >= budget:
            break
        if have - machine["expected_rate"] < want - 1e-9:
            continue
        have -= machine["expected_rate"]
        actions.append(Action(kind=Kind.STOP, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                              reason=(f"capacity {have + machine['expected_rate']:g} of {want:g} proofs/h wanted"
                                      f" (target × (1 + {config.agent.headroom:g})): {have:g} without it;"
                                      f" least proofs per dollar ({per_dollar(machine):.1f}/$)")))
    return actions


def _shrink(obs: Observation, config: Config, budget: int) -> list[Action]:
    """One machine a step, once the work has run out past the cooldown (plan() checks it)."""
    if budget < 1:
        return []
    since = obs.demand.empty_since  # set: plan() shrinks only once the cooldown since it has passed
    empty_for = (obs.now - since).total_seconds() if since is not None else 0.0
    candidates = [m for m in obs.machines if m["state"] in PENDING_STATES | {State.RUNNING}
                  and m.get("vast_id") is not None]
    if not candidates:
        return []
    worst = min(candidates, key=lambda m: (per_dollar(m), m["label"]))
    return [Action(kind=Kind.STOP, actor=ACTOR, label=worst["label"], uuid=worst["uuid"],
                   reason=(f"no work queued, in flight or coming for {int(empty_for // 60)}m (agent.scale_down_after"
                           f" {int(config.agent.scale_down_after // 60)}m); least proofs per dollar"
                           f" ({per_dollar(worst):.1f}/$)"))]


def hold_reason(obs: Observation, config: Config, offers: Sequence[Offer] = ()) -> str:
    """Why plan() has nothing to do: the figures it held on, in one line (what `agent-step --dry-run` says).
    `offers`: the ones plan() was given (a shortfall under half the smallest of them is rounded down)."""
    want = wanted_capacity(obs, config)
    running = sum(m["expected_rate"] for m in obs.machines if m["state"] == State.RUNNING and not vast_dead(m))
    booting = sum(m["expected_rate"] for m in obs.machines if on_its_way(m, obs.now))
    target = float(obs.settings["target_proofs_per_hour"])
    cap = ceiling(obs, config)
    if want >= cap - 1e-9:
        sized = f"{round(want, 1):g} wanted (target {target:g} × (1 + headroom {config.agent.headroom:g}))"
    else:  # the work needs less than the target: what drains it within the plan horizon
        sized = (f"{round(want, 1):g} wanted (the work drained within agent.plan_horizon"
                 f" {round(horizon_hours(config) * 60):g}m, under the target's {round(cap, 1):g})")
    if has_work(obs):
        have = f"capacity {round(running, 1):g} + {round(booting, 1):g} booting"
        if running + booting >= want - 1e-9:
            return f"{work_reason(obs)}: {have} covers {sized}"
        smallest = rounded_down(obs, config, rank_offers(offers, obs, config))
        if smallest is not None:
            return (f"{work_reason(obs)}: {have} is {round(want - running - booting, 1):g} short of {sized}, under"
                    f" {ROUND_DOWN:.0%} of the smallest machine to hand ({round(smallest, 1):g}/h): rounded down,"
                    f" not up to a whole machine (a growing queue raises what is wanted)")
        return (f"{work_reason(obs)}: {have} is short of {sized}, but no stopped machine to resume and no offer"
                f" of fleet.gpus within max_dph, max_hourly_spend (${obs.spend_per_hour:.2f}/h of"
                f" ${float(obs.settings['max_hourly_spend']):g}/h), max_daily_spend (${obs.spent():.2f} spent"
                f" today of ${float(obs.settings.get('max_daily_spend', math.inf)):g}) and max_instances")
    since = obs.demand.empty_since
    empty_for = int((obs.now - since).total_seconds() // 60) if since is not None else 0
    wait = int(config.agent.scale_down_after // 60)
    if not cooled_down(obs, config):
        return (f"no work queued, in flight or coming for {empty_for}m: machines are released after"
                f" agent.scale_down_after ({wait}m)")
    if any(m["state"] in PENDING_STATES for m in obs.machines):
        return f"no work for {empty_for}m, but a machine is still booting (its rate is a guess): releasing after it settles"
    warm = warm_count(obs, config)
    if 0 < warm <= config.agent.min_machines:
        return (f"no work for {empty_for}m: agent.min_machines keeps {config.agent.min_machines} warm"
                f" ({warm} proving or booting)")
    return f"no work for {empty_for}m and no machine left to release"
