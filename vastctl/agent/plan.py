"""The planning policy: each step, the cheapest capacity over the next hours, and what to do now to follow it.

Where the rules size the fleet to the coming hour's work (agent/rules.py), this policy plans a horizon of
HORIZON_SLOTS slots of SLOT_S (2.5 h) with a linear program (agent/plan_lp.py) over the forecast arrivals
(agent/plan_forecast.py: the look-ahead count, then a day-old profile or the level held) and every source of
capacity at its own price: the machines running (at the price they were rented at), booting, stopped
(a resume's boot) and the offers (a fresh boot, BOOT_HOURS of its price), each boot counted at the share of
recent boots that came up (agent/plan_odds.py: where boots fail, more are started, and sooner; one on its way at
the share of those that got as far as it has; a benchmark past HEALTHY_BENCH_S or a parameter fetch past
sizing.healthy_fetch_s counts for nothing: it is likely stuck, and the plan rents around it before it is killed).
A proof is planned done within agent.max_wait less PLAN_MARGIN_S; into that margin it costs MARGIN_LATE_COST a
slot (a few proofs a few minutes into it buy no boot: a boot bought for minutes of catching up was released as
soon as it came up); past agent.max_wait less HARD_MARGIN_S, LATE_COST more. The plan stays within the operator's
ceiling (target × (1 + agent.headroom)) but where proofs would go late past that line: there it plans above the
ceiling at OVER_CEILING_COST, so a fleet that lost its machines catches up rather than leaving its queue late for
hours (the guard's max_instances and max_hourly_spend still hold).
Its freedoms, the lower bound's (vastctl/bound.py):

  hold      a running machine stays through a lull when work returns before a new rental would pay off
  wait      a peak of minutes is worked off by the queue, not by a machine rented for it
  rent late a machine is rented or resumed only when the plan needs it in the first slot it could prove in
            (a fresh boot: FRESH_FIRST_SLOT, a resume: RESUME_FIRST_SLOT): later needs are planned again next step

What it does now, rounded to whole machines: a stopped machine or an offer the plan has proving in its first
slot is resumed or rented, the largest planned share first, then the cheapest per proof, for at least
ROUND_UP of its rate; a running machine the plan releases in the first slot goes when at least RELEASE_SHARE of
it is released and what stays running covers the plan's first MAKE_BEFORE_BREAK_SLOTS slots without the
machines booting (a boot may fail or run late: make before break), never in a step that rents or resumes,
least planned and dearest per proof first, at most agent.max_releases_per_step: destroyed, not stopped
(the program never takes a released machine back, and a stopped disk bills while it waits for a resume that
saves ~15 min of boot and finds its GPU taken more often than a fresh boot fails: a stop pays only when resumed
within about two hours, and of the plan's stops most were not; bench/README.md "Released is destroyed").
Machines stopped otherwise (by an operator, by the rules) are still resumed first when the plan wants them.

What holds, whatever the program says: demand unknown or stale is planned on the newest good sample (and the
calls the proof router holds), its queue brought to now (grown by what it had coming, less what the machines
running prove since), releasing nothing; never known at all, it is the rules' (sized to the ceiling);
no release takes the last running machine while work is queued, in flight or held at the proof router;
agent.min_machines is kept (the rules' floor); housekeeping is the rules' (a stopped machine resumed once is
destroyed, one whose storage billed a fresh boot is retired, outbid machines are waited for, rebid or released),
but a benchmark past LATE_BENCH_S is released whatever else the step does (the rules keep one while the fleet is short).
Every action goes through the guard like the rules'; each carries its reason in the plan's figures.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Sequence

from vastctl import guard
from vastctl.agent import plan_lp, rules
from vastctl.agent.plan_forecast import DemandPast, Forecast, coming_rate, forecast
from vastctl.agent.plan_odds import BootOdds
from vastctl.agent.sizing import (
    HEALTHY_BENCH_S,
    LATE_BENCH_S,
    benchmarking_past,
    ceiling,
    fetching_past,
    has_work,
    healthy_fetch_s,
    in_state_for,
    late_benchmarks,
    on_its_way,
    resumable,
    vast_dead,
)
from vastctl.agent.valuation import BOOT_HOURS, launch_price, launch_terms, per_proof, rank_offers
from vastctl.config import Config
from vastctl.guard import Action, Kind
from vastctl.observe import Machine, Observation
from vastctl.providers.base import Offer
from vastctl.state.lifecycle import State

ACTOR = rules.ACTOR
SLOT_S = 600.0  # one slot of the plan: 10 min
HORIZON_SLOTS = 15  # 2.5 h: past max_wait, a boot and a lull worth holding through
FRESH_FIRST_SLOT = 3  # a fresh rental proves ~25 min after its launch (image, parameters, benchmark)
RESUME_FIRST_SLOT = 2  # a resume ~17 min (its image and parameters kept: digest check and benchmark)
RESUME_BILLED_H = 0.25  # a resume bills its GPU ~15 min before its first proof
BOOTING_FIRST_SLOT = {State.LAUNCHING: 3, State.REGISTERED: 2, State.PARAMS_DONE: 1, State.BENCH_DONE: 1}
PLAN_MARGIN_S = 15 * 60  # proofs are planned done this long within agent.max_wait: forecasts err, machines fail
MARGIN_LATE_COST = 0.02  # $ per proof per slot into the margin: a few proofs' price, so minutes of it buy no boot
HARD_MARGIN_S = 5 * 60  # past agent.max_wait less this, a proof is late
LATE_COST = 1.0  # $ per proof per slot late: far above any machine's price per proof, so lateness is a last resort
OFFERS_PLANNED = 20  # the offers cheapest per expected proof the program may rent from
ROUND_UP = 0.5  # a machine is started for at least this share of its rate planned in its first slot
ROUND_UP_LATE = 0.1  # ... when proofs are late (past the hard line) from the first slot a start proves in: any share helps
RELEASE_SHARE = 0.9  # a running machine goes when the plan releases at least this share of it now
MAKE_BEFORE_BREAK_SLOTS = 3  # what stays running covers the plan's capacity of this many slots without boots
# $ per proof/h per slot planned above the ceiling. A proof/h for a slot proves SLOT_S/3600 (1/6) proofs: kept within
# the margin for the whole horizon they save MARGIN_LATE_COST × HORIZON_SLOTS / 6 = $0.05, kept a slot from going late
# (LATE_COST + MARGIN_LATE_COST) / 6 = $0.17; between the two, only lateness buys capacity above the ceiling
OVER_CEILING_COST = 0.1
FRESH_START_H = BOOT_HOURS  # hours of its price a fresh rental costs before its first proof, as the plan counts it


@dataclass(frozen=True)
class Decision:
    actions: list[Action]
    hold: str | None  # why nothing is done, in the plan's figures (None when there are actions)


def needs_offers(obs: Observation, config: Config) -> bool:
    """Whether the plan looks at offers (the caller searches the market only then): whenever work is known,
    as holding, waiting and renting are weighed against them, or when the rules would."""
    return (obs.demand.known and obs.demand.work > 0) or rules.needs_offers(obs, config)


def plan(obs: Observation, config: Config, offers: Sequence[Offer] = (), past: DemandPast = DemandPast(),
         odds: BootOdds = BootOdds()) -> list[Action]:
    """What the planning policy does now. Pure: same observation, offers, past and odds, same actions."""
    return decide(obs, config, offers, past, odds).actions


def decide(obs: Observation, config: Config, offers: Sequence[Offer] = (), past: DemandPast = DemandPast(),
           odds: BootOdds = BootOdds()) -> Decision:
    """The actions of this step, and why it holds when there are none."""
    known = obs.demand.known
    if not known:  # never shrink on no evidence: planned on the newest good sample, releasing nothing
        held = _held_to_last(obs, config)
        if held is None:  # no sample was ever good: the rules size to the ceiling
            actions = [replace(a, reason=f"demand unknown, the rules' hold: {a.reason}")
                       for a in rules.plan(obs, config, offers)]
            return Decision(actions, None if actions else "demand unknown, the rules' hold: "
                            + rules.hold_reason(obs, config, offers))
        obs = held
    budget = config.agent.max_actions_per_step
    actions = _housekeeping(obs, config, budget)
    touched = {a.uuid for a in actions}
    setup = _setup(obs, config, offers, past, touched, odds)
    solution = plan_lp.solve(setup.problem)
    summary = _summary(setup, solution, config)
    if not known:
        old = (obs.demand.age_s or 0.0) / 60
        summary = f"demand unknown, held to its newest good sample ({old:.0f}m old), nothing released; {summary}"
    if known:
        actions.extend(_release_late_benchmarks(obs, budget - len(actions), touched))
    started = _starts(obs, config, setup, solution, summary, budget - len(actions))
    actions.extend(started)
    if not started and known:  # never release and rent in one step, nor on no evidence
        actions.extend(_releases(obs, config, setup, solution, summary, budget - len(actions), touched))
    actions = rules._keep_floor(obs, config, offers, actions, budget)
    return Decision(actions, None if actions else _hold(setup, solution, summary))


def _release_late_benchmarks(obs: Observation, budget: int, touched: set[str | None]) -> list[Action]:
    """Destroy every benchmark past LATE_BENCH_S, whatever else the step does: the plan does not count it (it
    plans around it), and five cold proofs that take that long come from a host the gate would refuse, so it would
    only bill until reconcile's timeouts.params_done (90 min). The rules keep one while the fleet needs it."""
    late_ones = [m for m in late_benchmarks(obs) if m["uuid"] not in touched]
    return [Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                   reason=(f"benchmarking for {in_state_for(machine, obs.now) / 60:.0f}m (a healthy benchmark takes"
                           f" 10-16m; past {LATE_BENCH_S // 60}m it is likely stuck, and a benchmark that slow"
                           " would not pass the gate): released, the plan does not count it"))
            for machine in late_ones[:max(0, budget)]]


def _held_to_last(obs: Observation, config: Config) -> Observation | None:
    """The observation with its demand the newest good sample's, brought to now (and at least the calls the router
    holds now), None when no sample was ever good. Blind, work does not stop: its queue has grown by what its
    look-ahead had coming (at the look-ahead's rate, else its proofs/h) and shrunk by what the machines running now
    prove, over the sample's age; the look-ahead is held as it was."""
    last = obs.last_known_demand
    if last is None:
        return None
    age_s = max(0.0, (obs.now - last["at"]).total_seconds())
    lookahead = last.get("lookahead")
    coming = coming_rate(lookahead, last.get("proofs_per_hour"), config.demand.lookahead_window)
    queued = last.get("queued")
    if queued is not None:
        queued = max(0, round(queued + (coming - obs.capacity) * age_s / 3600))
    in_flight = max(last.get("in_flight") or 0, obs.demand.held)
    demand = dataclasses.replace(obs.demand, known=True, queued=queued, in_flight=in_flight,
                                 lookahead=lookahead, proofs_per_hour=last.get("proofs_per_hour"), age_s=age_s)
    return dataclasses.replace(obs, demand=demand)


@dataclass(frozen=True)
class _Setup:
    problem: plan_lp.Problem
    forecast: Forecast
    machines: dict[str, Machine]  # by uuid: the running, booting and stopped sources
    offers: dict[str, tuple[Offer, float]]  # by source key: the offer and its expected rate
    best_per_proof: float  # $ per proof of the cheapest offer (inf without one)
    wait_s: float  # a proof is planned done within this of arriving
    odds: BootOdds  # how much of a boot's rate is counted on (agent/plan_odds.py)


def _housekeeping(obs: Observation, config: Config, budget: int) -> list[Action]:
    """The rules' own: a machine stopped again after its one resume is destroyed, one whose storage billed a
    fresh boot is retired, outbid machines are waited for, rebid or released."""
    actions = [Action(kind=Kind.DESTROY, actor=ACTOR, label=m["label"], uuid=m["uuid"],
                      reason="stopped again after its one resume: replaced, not resumed twice")
               for m in obs.machines if m["state"] == State.STOPPED and m.get("resumes")][:budget]
    actions.extend(rules._retire_stopped(obs, budget - len(actions)))
    actions.extend(rules._outbid_actions(obs, config, budget - len(actions)))
    return actions


def _price(machine: Machine) -> float:
    """$/h the machine bills while it proves: its bid when it was rented interruptible, else its price."""
    bid = machine.get("bid")
    return float(bid) if bid is not None else float(machine.get("dph") or 0.0)


def _setup(obs: Observation, config: Config, offers: Sequence[Offer], past: DemandPast, touched: set[str | None],
           odds: BootOdds) -> _Setup:
    ahead = forecast(obs, config, past, HORIZON_SLOTS, SLOT_S)
    wait_s = max(SLOT_S, config.agent.max_wait - PLAN_MARGIN_S)
    ranked = rank_offers(offers, obs, config)[:OFFERS_PLANNED]
    best = min((launch_price(o, obs, config) / rate for o, rate in ranked), default=math.inf)
    sources: list[plan_lp.Source] = []
    machines: dict[str, Machine] = {}
    fetch_limit = healthy_fetch_s(config)
    for m in obs.machines:
        if m["uuid"] in touched or m["expected_rate"] <= 0:
            continue
        if m["state"] == State.RUNNING and m.get("vast_id") is not None and not vast_dead(m):
            sources.append(plan_lp.Source(key=m["uuid"], kind="running", rate=m["expected_rate"], price=_price(m),
                                          first_slot=0))
        elif on_its_way(m, obs.now):
            # a benchmark or a parameter fetch past a healthy one's time is likely stuck (released at LATE_BENCH_S,
            # killed at timeouts.registered): counted for nothing, so the plan rents around it now, not minutes later
            stuck = benchmarking_past(m, obs.now, HEALTHY_BENCH_S) or fetching_past(m, obs.now, fetch_limit)
            share = 0.0 if stuck else odds.on_its_way(bool(m.get("resumes")), m["state"])
            sources.append(plan_lp.Source(key=m["uuid"], kind="booting", rate=m["expected_rate"] * share, price=_price(m),
                                          first_slot=BOOTING_FIRST_SLOT.get(State(m["state"]), FRESH_FIRST_SLOT)))
        else:
            continue
        machines[m["uuid"]] = m
    max_dph = float(obs.settings["max_dph"])
    for m in resumable(obs):
        if m["uuid"] in touched or m["expected_rate"] <= 0 or _price(m) > max_dph + 1e-9:
            continue
        if per_proof(m) > config.agent.replace_factor * best:
            continue  # running, it would be replaced by that offer: the rules pass it over too
        machines[m["uuid"]] = m
        sources.append(plan_lp.Source(key=m["uuid"], kind="stopped", rate=m["expected_rate"] * odds.resume, price=_price(m),
                                      first_slot=RESUME_FIRST_SLOT, start_cost=_price(m) * RESUME_BILLED_H))
    by_key: dict[str, tuple[Offer, float]] = {}
    for offer, rate in ranked:
        key = f"offer:{offer.id}"
        price = launch_price(offer, obs, config)
        by_key[key] = (offer, rate)
        sources.append(plan_lp.Source(key=key, kind="offer", rate=rate * odds.fresh, price=price, first_slot=FRESH_FIRST_SLOT,
                                      start_cost=price * FRESH_START_H))
    problem = plan_lp.Problem(slot_s=SLOT_S, arrivals=ahead.arrivals, backlog=ahead.backlog,
                              due=_due(ahead, wait_s), sources=sources, ceiling=ceiling(obs, config),
                              late_cost=MARGIN_LATE_COST,
                              due_hard=_due(ahead, max(wait_s, config.agent.max_wait - HARD_MARGIN_S)),
                              hard_late_cost=LATE_COST, over_ceiling_cost=OVER_CEILING_COST)
    return _Setup(problem=problem, forecast=ahead, machines=machines, offers=by_key, best_per_proof=best, wait_s=wait_s,
                  odds=odds)


def _due(ahead: Forecast, wait_s: float) -> list[float]:
    """Proofs that must be done by the end of each slot: the queue's (the newest arrivals, first come first
    proved: those older than wait_s − the slot's end) and the forecast's, each wait_s after arriving."""
    due = []
    cumulative = [0.0]
    for arriving in ahead.arrivals:
        cumulative.append(cumulative[-1] + arriving)
    for t in range(len(ahead.arrivals)):
        end = (t + 1) * SLOT_S
        queue = ahead.backlog - _arrived_since(ahead, wait_s - end)
        arrived_by = (end - wait_s) / SLOT_S  # slots of the forecast that have been waiting wait_s by then
        whole = int(math.floor(max(0.0, arrived_by)))
        part = max(0.0, arrived_by) - whole
        later = cumulative[min(whole, len(ahead.arrivals))]
        if whole < len(ahead.arrivals):
            later += ahead.arrivals[whole] * part
        due.append(max(0.0, queue) + later)
    return due


def _arrived_since(ahead: Forecast, age_s: float) -> float:
    """How many of the queued proofs arrived within the last age_s (all of them past the oldest's age)."""
    if age_s <= 0 or ahead.backlog <= 0:
        return 0.0
    if age_s >= ahead.backlog_age_s:
        return ahead.backlog
    within = ahead.arrived_within
    k = age_s / SLOT_S
    if within and k < len(within) - 1:
        low = int(math.floor(k))
        value = within[low] + (within[low + 1] - within[low]) * (k - low)
        return min(ahead.backlog, value)
    return ahead.backlog * age_s / ahead.backlog_age_s  # evenly since the oldest


def _summary(setup: _Setup, solution: plan_lp.Solution, config: Config) -> str:
    ahead = setup.forecast
    window = config.demand.lookahead_window / 60
    past = "" if ahead.past_rate is None else f" (was {ahead.past_rate:.0f}/h)"
    late = f", {solution.late:.0f} proof-slots late" if solution.late > 0.5 else ""
    most_above = max(solution.above, default=0.0)
    if most_above > 0.5:
        late += f", {most_above:.0f}/h over the ceiling ({solution.ceiling:.0f}/h) where proofs would go late"
    timed = " as the source times it" if ahead.timed else ""
    return (f"plan {HORIZON_SLOTS * SLOT_S / 3600:g}h: {ahead.backlog:.0f} waiting (oldest ~{ahead.backlog_age_s / 60:.0f}m),"
            f" {ahead.coming_rate:.0f}/h coming over {window:g}m{past}{timed}, beyond it {ahead.beyond};"
            f" each proof done within {setup.wait_s / 60:.0f}m of arriving at ${solution.cost:.2f}{late}"
            f" ({setup.odds.words()})")


def _first_share(setup: _Setup, solution: plan_lp.Solution, key: str) -> float:
    source = next(s for s in setup.problem.sources if s.key == key)
    return solution.shares[key][source.first_slot] if source.first_slot < len(solution.shares[key]) else 0.0


def _starts(obs: Observation, config: Config, setup: _Setup, solution: plan_lp.Solution, summary: str,
            budget: int) -> list[Action]:
    """Resume or rent what the plan has proving in the first slot it could prove in, largest share first."""
    fresh = [s for s in setup.problem.sources if s.kind in ("stopped", "offer")]
    shares = {s.key: _first_share(setup, solution, s.key) for s in fresh}
    planned = sum(shares[s.key] * s.rate for s in fresh)
    order = sorted((s for s in fresh if shares[s.key] > 1e-6),
                   key=lambda s: (-round(shares[s.key], 6), s.price / s.rate, s.key))
    actions: list[Action] = []
    left = planned
    first = min((s.first_slot for s in fresh), default=len(solution.overdue))
    least = ROUND_UP_LATE if sum(solution.overdue[first:]) > 0.5 else ROUND_UP  # late where a start could help
    spend = obs.spend_per_hour
    live = len(obs.live())
    for source in order:
        if len(actions) >= budget or left < least * source.rate - 1e-9:
            continue
        need = (f"{summary}: the plan has {planned:.0f} proofs/h more proving {source.first_slot * SLOT_S / 60:.0f}m"
                f" from now")
        if source.kind == "stopped":
            machine = setup.machines[source.key]
            adds = max(0.0, source.price - float(machine.get("billed_per_hour") or 0.0))
            if not guard.spend_verdict(obs, spend + adds, "").allowed:
                continue
            actions.append(Action(kind=Kind.START, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  dph=machine.get("dph"),
                                  reason=(f"{need}; resume {machine['label']} ({machine['expected_rate']:g} proofs/h at"
                                          f" ${source.price:g}/h, {shares[source.key]:.2f} of it planned): a resume"
                                          f" bills ~{RESUME_BILLED_H * 60:.0f}m before proving, a fresh boot"
                                          f" ~{BOOT_HOURS * 60:.0f}m")))
            spend += adds
        else:
            offer, rate = setup.offers[source.key]
            if live >= int(obs.settings["max_instances"]) or not guard.spend_verdict(obs, spend + offer.dph_total, "").allowed:
                continue
            actions.append(Action(
                kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name, dph=offer.dph_total,
                reason=(f"{need}; {offer.gpu_name} at {launch_terms(offer, obs, config)}, {rate:g} proofs/h expected"
                        f" (${source.price / rate * 1000:.2f} per 1000 proofs, {shares[source.key]:.2f} of it planned)")))
            spend += offer.dph_total
            live += 1
        left -= source.rate
    return actions


def _releases(obs: Observation, config: Config, setup: _Setup, solution: plan_lp.Solution, summary: str,
              budget: int, touched: set[str | None]) -> list[Action]:
    """Release the running machines the plan lets go now, least kept and dearest per proof first."""
    running = [s for s in setup.problem.sources if s.kind == "running" and s.key not in touched]
    limit = min(budget, config.agent.max_releases_per_step)
    if limit < 1 or not running:
        return []
    kept = {s.key: solution.shares[s.key][0] for s in running}
    have = sum(s.rate for s in running)
    released = sum((1 - kept[s.key]) * s.rate for s in running)
    if MAKE_BEFORE_BREAK_SLOTS > 0:  # what runs must cover the plan's next slots without the machines booting
        planned = max(sum(solution.shares[s.key][t] * s.rate for s in setup.problem.sources)
                      for t in range(min(MAKE_BEFORE_BREAK_SLOTS, len(setup.problem.arrivals))))
        released = min(released, max(0.0, have - planned))
    booting = any(s.kind == "booting" for s in setup.problem.sources)
    work = has_work(obs) or setup.forecast.backlog > 0
    remaining = len(running)
    actions: list[Action] = []
    left = released
    for source in sorted(running, key=lambda s: (round(kept[s.key], 6), -s.price / s.rate, s.key)):
        if len(actions) >= limit or 1 - kept[source.key] < 1e-6:
            break
        if source.rate * RELEASE_SHARE > left + 1e-9:
            continue
        if work and remaining <= 1 and not booting:
            break  # never the last machine while work waits
        machine = setup.machines[source.key]
        left -= source.rate
        remaining -= 1
        dear = per_proof(machine) > config.agent.replace_factor * setup.best_per_proof
        because = "resumed once already" if machine.get("resumes") else (
            f"{config.agent.replace_factor:g}× dearer per proof than the best offer" if dear else
            f"the plan takes no released machine back within its {HORIZON_SLOTS * SLOT_S / 3600:g}h: stopped, its disk"
            f" would bill while it waits, for a resume that saves ~{(BOOT_HOURS - RESUME_BILLED_H) * 60:.0f}m of boot"
            f" and finds its GPU taken more often than a fresh boot fails")
        actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                              reason=(f"{summary}: the plan keeps {have - released:.0f} of {have:.0f} proofs/h running"
                                      f" now; {machine['label']} ${source.price:g}/h"
                                      f" (${source.price / source.rate * 1000:.2f} per 1000 proofs): destroyed"
                                      f" ({because})")))
    return actions


def _hold(setup: _Setup, solution: plan_lp.Solution, summary: str) -> str:
    """Why the plan does nothing now: what runs and boots covers it, and what it holds through."""
    running = [s for s in setup.problem.sources if s.kind == "running"]
    booting = [s for s in setup.problem.sources if s.kind == "booting"]
    have = sum(s.rate for s in running)
    idle = [t for t in range(len(solution.done)) if solution.done[t] < 0.5 * have * SLOT_S / 3600]
    through = (f"; {have:.0f} proofs/h held through {len(idle) * SLOT_S / 60:.0f}m of little work: releasing and"
               f" booting again costs more") if idle and running and all(
        solution.shares[s.key][max(idle)] > 0.5 for s in running) else ""
    later = next((t for t in range(1, len(solution.done)) if any(
        solution.shares[s.key][t] > 0.5 for s in setup.problem.sources if s.kind in ("stopped", "offer"))), None)
    grow = f"; more capacity planned from ~{later * SLOT_S / 60:.0f}m (started when it must be)" if later else ""
    return (f"{summary}: capacity {have:g} running + {sum(s.rate for s in booting):g} booting covers the plan now"
            f"{through}{grow}")
