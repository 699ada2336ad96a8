"""The rules policy: a deterministic autoscaler, pure (Observation, config, offers → actions).

It is the default policy without an Anthropic key, and the suggestion the llm
policy is shown. In the order `plan()` applies them:

  work = queued + in_flight + lookahead (demand.Demand.work): tasks unclaimed, tasks a Curio node has claimed
  (with cuzk they wait at a daemon: a machine stopped under them loses them), and PoRep tasks Curio is about
  to create (sectors precommitted on chain; a machine launched now is booted when they arrive). A source that
  reports only `queued` counts the other two as 0.

  wanted = what drains queued + in_flight within agent.plan_horizon (never past agent.max_wait) and keeps up
  with the arrivals (lookahead over demand.lookahead_window; a source silent on it: its proofs_per_hour),
  capped by target × (1 + agent.headroom) (the ceiling). While demand is unknown: what the newest good sample
  needed (observation.last_known_demand), so the fleet holds; the ceiling if no sample was ever good.
  held = the most wanted over the last agent.scale_down_after (observation.demand_history); none (release
  nothing) unless every sample of the window is good, one was in force at its start, and no gap between
  samples (or since the newest) is longer than demand.stale_after or half the window.

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

Expected rate: measured, else bench, else the median bench rate seen for the GPU
model, else fleet.default_rate (observe.py). An offer's expected rate is what a
machine of ours last benchmarked on the same host (observation.host_rates: a
slow host of a fast model is not rented again at its model's rate), else its
model's (before any benchmark of it, the published figure, GPU_RATES), capped by what its host RAM allows (RAM_RATES, the cuzk measurements of
docs/workload.md "Host RAM bounds the rate"): a 256 GiB host proves ~68/h whatever its GPU, so offers are ranked
by proofs per dollar with the RAM counted. Plans stay inside the limits the
guard checks (max_instances, max_dph, max_hourly_spend and max_daily_spend through
guard.spend_verdict, min_machines, max_actions_per_step), so a healthy plan is never
refused; the guard checks them again anyway.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Sequence

from vastctl import clock, guard
from vastctl.bids import bid_for_offer, wants_bid
from vastctl.config import Config
from vastctl.guard import Action, Kind
from vastctl.observe import PENDING_STATES, Observation, rate_of_model
from vastctl.providers.base import Offer
from vastctl.state.lifecycle import VAST_DEAD_CODES, State

ACTOR = "agent"
BOOT_HOURS = 0.5  # a fresh machine bills ~30 min (image, parameters, benchmark) before its first proof
ROUND_DOWN = 0.5  # a shortfall under this share of the smallest machine to hand is not worth renting one
LATE_BENCH_S = 25 * 60  # a benchmark (SRS load, PCE extraction, five proofs) takes ~10-16 min; past this it is late
# proofs/hour host RAM allows (GiB → proofs/h, 32 GiB PoRep with cuzk; docs/workload.md), interpolated between
RAM_RATES = ((128, 24.0), (256, 68.0), (384, 84.0), (512, 95.0))
# proofs/hour a model proves on a host with RAM to spare, before any machine of it has benchmarked (docs/workload.md)
GPU_RATES = {"RTX 3090": 50.0, "RTX 4090": 80.0, "RTX 5070 Ti": 95.0, "RTX 5090": 100.0, "A100 SXM4": 70.0,
             "A100 80GB": 70.0, "H100 SXM": 100.0, "H100 PCIe": 100.0}


def _vast_dead(machine: Mapping[str, Any]) -> bool:
    """Not proving whatever the file says: vast lists it dead or not at all, or stopped under a running row
    (an interruptible machine outbid: reconcile waits for it, capacity does not count it)."""
    return (bool(machine.get("vast_missing")) or machine.get("vast_status") in VAST_DEAD_CODES
            or (machine.get("state") == State.RUNNING and machine.get("vast_status") == "stopped"))


def _per_dollar(machine: Mapping[str, Any]) -> float:
    dph = float(machine.get("dph") or 0.0)
    return machine["expected_rate"] / dph if dph > 0 else float("inf")


def ceiling(obs: Observation, config: Config) -> float:
    """The most the fleet is sized to: the operator's target × (1 + agent.headroom)."""
    return float(obs.settings["target_proofs_per_hour"]) * (1 + config.agent.headroom)


def horizon_hours(config: Config) -> float:
    """agent.plan_horizon in hours, never past agent.max_wait (at least a minute)."""
    return max(60.0, min(config.agent.plan_horizon, config.agent.max_wait or config.agent.plan_horizon)) / 3600


def needed(sample: Mapping[str, Any], config: Config) -> float:
    """Proofs/hour that drain what is queued and in flight within agent.plan_horizon while keeping up with the
    arrivals: the look-ahead spread over demand.lookahead_window, else (a source silent on it) the rate the
    source says was proved lately."""
    backlog = (sample.get("queued") or 0) + (sample.get("in_flight") or 0)
    window = config.demand.lookahead_window
    if sample.get("lookahead") is not None and window > 0:
        arrivals = sample["lookahead"] / (window / 3600)
    else:
        arrivals = float(sample.get("proofs_per_hour") or 0.0)
    return backlog / horizon_hours(config) + arrivals


def sized_to(obs: Observation) -> Mapping[str, Any] | None:
    """The demand sample the fleet is sized to: the current one while demand is known, else the newest good one
    (observation.last_known_demand: the fleet holds, neither shrinking on no evidence nor buying the whole ceiling
    on none); None if no sample was ever good. Its in_flight is at least the calls the proof router holds
    (demand.held): Curio counts them in flight, and the router's word is the manager's own."""
    demand = obs.demand
    if not demand.known:
        last = obs.last_known_demand
        if not demand.held or last is None:
            return last
        # the router's held calls are work measured here: the fleet holds to the last sample, or to them
        return {**last, "in_flight": max(last.get("in_flight") or 0, demand.held)}
    return {"queued": demand.queued, "in_flight": max(demand.in_flight or 0, demand.held) if demand.held else demand.in_flight,
            "lookahead": demand.lookahead, "proofs_per_hour": demand.proofs_per_hour}


def wanted_capacity(obs: Observation, config: Config) -> float:
    """Proofs/hour the fleet is sized to now: what the work of sized_to() needs (needed()), capped by ceiling();
    the ceiling itself if no demand sample was ever good."""
    sample = sized_to(obs)
    return ceiling(obs, config) if sample is None else min(ceiling(obs, config), needed(sample, config))


def held_capacity(obs: Observation, config: Config) -> float | None:
    """The most wanted over the last agent.scale_down_after (the scale-down side of the hysteresis): releases
    while work is queued keep at least this. None (release nothing) when a sample in the window failed, or the
    window is not covered by samples (none in force at its start, or a gap longer than demand.stale_after or
    half the window, so the window is sampled twice at least): one fresh report of a queue is no evidence of
    how long the fleet has been over it, nor is one old report (a source gone quiet) of what it is now."""
    if not obs.demand.known:
        return None
    history = obs.demand_history
    since = obs.now - timedelta(seconds=config.agent.scale_down_after)
    if not history or history[0]["at"] > since:
        return None
    times = [sample["at"] for sample in history] + [obs.now]
    longest = min(config.demand.stale_after, config.agent.scale_down_after / 2)
    if any((later - earlier).total_seconds() > longest for earlier, later in zip(times, times[1:])):
        return None
    if not all(sample["ok"] for sample in history):
        return None
    return min(ceiling(obs, config), max([wanted_capacity(obs, config)] + [needed(s, config) for s in history]))


def has_work(obs: Observation) -> bool:
    """Work queued, in flight or coming, or no trustworthy word that there is none."""
    return not obs.demand.known or obs.demand.work > 0


def work_reason(obs: Observation) -> str:
    """Why the fleet is sized to the target: the work the demand names, or that it is unknown."""
    demand = obs.demand
    held = f"; {demand.held} calls held at the proof router" if demand.held else ""
    if not demand.known:
        last = obs.last_known_demand
        if last is None:
            return f"demand unknown, never known (sized as if work were queued{held})"
        return (f"demand unknown (held to its newest good sample, {clock.human_age(last['at'], obs.now)} old:"
                f" {last.get('queued') or 0} queued, {last.get('in_flight') or 0} in flight,"
                f" {last.get('lookahead') or 0} coming{held})")
    if not demand.in_flight and not demand.lookahead and not demand.held:
        return "queued work"
    counts = [f"{demand.queued or 0} queued"]
    if demand.in_flight is not None:
        counts.append(f"{demand.in_flight} in flight")
    if demand.held:
        counts.append(f"{demand.held} held at the proof router")
    if demand.lookahead is not None:
        counts.append(f"{demand.lookahead} PoRep coming")
    return f"work for the fleet ({', '.join(counts)})"


def late(machine: Mapping[str, Any], now: datetime) -> bool:
    """Benchmarking for longer than LATE_BENCH_S: a healthy benchmark takes minutes, so this one is likely stuck
    (reconcile kills it at timeouts.params_done). It is not counted as capacity on its way, so the fleet launches
    around it instead of waiting for its timeout; if it does come up, it counts again."""
    return machine["state"] == State.PARAMS_DONE and _since(machine, now) > LATE_BENCH_S


def on_its_way(machine: Mapping[str, Any], now: datetime) -> bool:
    """Booting (or resuming) and expected to come up: not late, not dead at vast."""
    return machine["state"] in PENDING_STATES and not late(machine, now) and not _vast_dead(machine)


def counted_capacity(obs: Observation) -> float:
    """Running plus on-its-way capacity, without machines vast says are dead or boots that are late."""
    return sum(m["expected_rate"] for m in obs.machines
               if (m["state"] == State.RUNNING and not _vast_dead(m)) or on_its_way(m, obs.now))


def shortfall(obs: Observation, config: Config) -> float:
    """Proofs/hour still missing; > 0 means the plan wants to resume or launch."""
    if not has_work(obs):
        return 0.0
    return wanted_capacity(obs, config) - counted_capacity(obs)


def needs_offers(obs: Observation, config: Config) -> bool:
    """Whether plan() would look at offers (the caller searches the market only then): to grow (a stopped
    machine is resumed only when no offer is clearly cheaper per proof), or to replace a running machine by a
    cheaper host."""
    return (shortfall(obs, config) > 0 or bool(replacement_candidates(obs, config))
            or warm_count(obs, config) < config.agent.min_machines)


def _resumable(obs: Observation) -> list[dict]:
    stopped = [m for m in obs.machines if m["state"] == State.STOPPED and not m.get("resumes")
               and m.get("vast_id") is not None and not m.get("vast_missing")]
    return sorted(stopped, key=_per_dollar, reverse=True)


def ram_rate(ram_gb: float | None) -> float:
    """Proofs/hour a host with this much RAM allows (inf when the offer does not say)."""
    if not ram_gb or ram_gb <= 0:
        return float("inf")
    points = RAM_RATES
    if ram_gb <= points[0][0]:
        return points[0][1] * ram_gb / points[0][0]
    for (low, low_rate), (high, high_rate) in zip(points, points[1:]):
        if ram_gb <= high:
            return low_rate + (high_rate - low_rate) * (ram_gb - low) / (high - low)
    return points[-1][1]


def offer_rate(offer: Offer, obs: Observation, config: Config) -> float:
    """What an offer is expected to prove per hour: what a machine of ours last benchmarked on the same host
    (hosts of one model differ: a slow CPU, shared RAM), else its model's rate (benchmarked, else the published
    figure, else fleet.default_rate) capped by what its host RAM allows."""
    if offer.machine_id is not None and offer.machine_id in obs.host_rates:
        return float(obs.host_rates[offer.machine_id])
    default = GPU_RATES.get(offer.gpu_name, config.fleet.default_rate)
    return min(rate_of_model(offer.gpu_name, obs.model_rates, default), ram_rate(offer.cpu_ram_gb))


def _price(offer: Offer, obs: Observation, config: Config) -> float:
    """$/h a launch on the offer now pays: its bid when launch.rental has it bid, else the on-demand price."""
    bid = (bid_for_offer(offer, float(obs.settings["max_dph"]), config.launch.bid_margin)
           if wants_bid(config, obs.live()) else None)
    return float(offer.dph_total) if bid is None else bid


def _terms(offer: Offer, obs: Observation, config: Config) -> str:
    price = _price(offer, obs, config)
    return f"${offer.dph_total:g}/h" if price == offer.dph_total else f"a bid of ${price:g}/h (${offer.dph_total:g}/h on demand)"


def rank_offers(offers: Iterable[Offer], obs: Observation, config: Config) -> list[tuple[Offer, float]]:
    """Allowed offers with their expected rate, cheapest per expected proof first (at the price the next launch
    pays: launch_price), one per host machine."""
    allowed = set(config.fleet.gpus)
    max_dph = float(obs.settings["max_dph"])
    bidding = wants_bid(config, obs.live())
    ranked = []
    seen: set[int] = set()
    for offer in offers:
        if (allowed and offer.gpu_name not in allowed) or offer.dph_total > max_dph:
            continue
        if offer.machine_id is not None:
            if offer.machine_id in seen:
                continue
            seen.add(offer.machine_id)
        rate = offer_rate(offer, obs, config)
        if rate > 0:
            ranked.append((offer, rate))
    def price(offer: Offer) -> float:
        bid = bid_for_offer(offer, max_dph, config.launch.bid_margin) if bidding else None
        return float(offer.dph_total) if bid is None else bid

    return sorted(ranked, key=lambda item: (price(item[0]) / item[1], price(item[0]), item[0].id))


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
    elif _cooled_down(obs, config):
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
    for machine in _resumable(obs):
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
                           dph=offer.dph_total, reason=(f"{why}; {offer.gpu_name} at {_terms(offer, obs, config)},"
                                                        f" {rate:g} proofs/h expected")))
        missing -= 1
        spend += offer.dph_total
        live += 1
    return kept


def _since(machine: Mapping[str, Any], now: datetime) -> float:
    """Seconds the machine has been in its state (0 when the file does not say)."""
    at = clock.from_iso(machine.get("state_since"))
    return max(0.0, (now - at).total_seconds()) if at is not None else 0.0


def _retire_stopped(obs: Observation, budget: int) -> list[Action]:
    """Destroy a stopped machine whose storage has billed what a fresh boot costs (BOOT_HOURS of its price):
    kept longer, it costs more than renting anew would (the ski-rental rule: at most twice the best choice)."""
    actions: list[Action] = []
    for machine in obs.machines:
        if len(actions) >= budget or machine["state"] != State.STOPPED or machine.get("resumes"):
            continue
        storage = float(machine.get("billed_per_hour") or 0.0)
        boot_cost = float(machine.get("dph") or 0.0) * BOOT_HOURS
        stopped_h = _since(machine, obs.now) / 3600
        if storage > 0 and boot_cost > 0 and storage * stopped_h >= boot_cost:
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason=(f"stopped {stopped_h:.1f}h: its storage (${storage:.3f}/h) has billed"
                                          f" ${storage * stopped_h:.2f}, what a fresh boot costs"
                                          f" ({BOOT_HOURS:g}h at ${float(machine['dph']):g}/h)")))
    return actions


REBID_STEP = 0.25  # an outbid machine's bid rises by this share a round, up to its cap


def outbid_since(machine: Mapping[str, Any]) -> datetime | None:
    """When vast paused this interruptible machine for a higher bid (reconcile's listing), None if it is not."""
    if machine.get("bid") is None or machine.get("state") != State.RUNNING or machine.get("vast_status") != "stopped":
        return None  # on demand, or running again (restarting after a pause counts as capacity on its way)
    return clock.from_iso(machine.get("outbid_since")) or clock.from_iso(machine.get("vast_seen_at")) or None


def outbid_choice(machine: Mapping[str, Any], now: datetime, max_dph: float,
                  config: Config) -> tuple[str, float | None, str]:
    """What an outbid machine gets: ("wait" | "rebid" | "release", the new bid or None, why).

    Waiting costs only its storage (capacity does not count it, so the fleet grows around it), and it resumes
    with its disk and parameters. After agent.outbid_wait its bid rises by REBID_STEP, capped by max_dph and the
    on-demand price of its offer (ask_dph: a bid over that pays more than renting on demand); each rebid is
    given agent.outbid_wait again. One already bidding its cap that is still outbid is released: a fresh
    machine costs BOOT_HOURS of boot, an unbounded wait costs the capacity it was rented for."""
    since = outbid_since(machine)
    paused = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
    bid = float(machine.get("bid") or 0.0)
    cap = float(max_dph)
    ask = machine.get("ask_dph")
    if isinstance(ask, (int, float)) and math.isfinite(ask) and ask > 0:
        cap = min(cap, float(ask))
    waited = f"outbid for {paused / 60:.0f}m at ${bid:g}/h"
    if paused < config.agent.outbid_wait:
        return "wait", None, f"{waited}: waited for (agent.outbid_wait {config.agent.outbid_wait / 60:g}m; disk kept)"
    if bid < cap - 1e-9:
        new = round(min(cap, max(bid * (1 + REBID_STEP), bid + 0.001)), 4)
        return "rebid", new, f"{waited}: bid raised to ${new:g}/h (cap ${cap:g}/h: max_dph and its on-demand price)"
    return "release", None, (f"{waited}, already bidding its cap ${cap:g}/h: released (a fresh machine costs"
                             f" {BOOT_HOURS:g}h of boot; waiting on costs the capacity)")


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


def _cooled_down(obs: Observation, config: Config) -> bool:
    """The work is known to have run out agent.scale_down_after ago: machines may be released."""
    since = obs.demand.empty_since
    return since is not None and (obs.now - since).total_seconds() >= config.agent.scale_down_after


def _sizing(obs: Observation, config: Config, have: float, want: float) -> str:
    cap = ceiling(obs, config)
    at_ceiling = want >= cap - 1e-9 or sized_to(obs) is None
    why = (f"target × (1 + {config.agent.headroom:g})" if at_ceiling
           else f"drains the work within {config.agent.plan_horizon / 60:g}m and keeps up with arrivals")
    return f"{work_reason(obs)}: capacity {have:g} of {want:g} proofs/h wanted ({why})"


def rounded_down(obs: Observation, config: Config, ranked: Sequence[tuple[Offer, float]]) -> float | None:
    """The rate of the smallest machine to hand (a ranked offer or a stopped machine to resume) when what is
    missing is under ROUND_DOWN of it, else None: the shortfall is rounded down, not up to a whole machine.

    A machine bills whole whatever it proves. Left short by less than half a machine, the queue grows, and with it
    the drain term of wanted_capacity (queued / agent.plan_horizon), until the shortfall is worth a machine: at
    most plan_horizon × ROUND_DOWN of that machine's work waits the longer, spread over the fleet proving. So only
    for a fleet keeping up: not while what waits (queued and in flight) takes longer than ROUND_DOWN × plan_horizon
    to drain at the capacity counted, and never from nothing (a fleet with no capacity grows for any shortfall)."""
    have = counted_capacity(obs)
    missing = wanted_capacity(obs, config) - have
    rates = [rate for _, rate in ranked] + [m["expected_rate"] for m in _resumable(obs) if m["expected_rate"] > 0]
    if missing <= 0 or have <= 0 or not rates:
        return None
    sample = sized_to(obs) or {}
    if ((sample.get("queued") or 0) + (sample.get("in_flight") or 0)) / have > ROUND_DOWN * horizon_hours(config):
        return None  # proofs already wait: the shortfall is rented
    smallest = min(rates)
    return smallest if missing < ROUND_DOWN * smallest else None


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
    best = _price(ranked[0][0], obs, config) / ranked[0][1] if ranked else float("inf")
    for machine in _resumable(obs):
        dph = float(machine.get("dph") or 0.0)
        if missing <= 0 or len(actions) >= budget:
            break
        if _per_proof(machine) > config.agent.replace_factor * best:
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
            reason=(f"{sizing}; {offer.gpu_name} at {_terms(offer, obs, config)}, {rate:g} proofs/h expected"
                    f" (${_price(offer, obs, config) / rate * 1000:.2f} per 1000 proofs){last}"),
        ))
        missing -= rate
        spend += offer.dph_total
        live += 1
    return actions


def next_offer(ranked: Sequence[tuple[Offer, float]], missing: float, obs: Observation,
               config: Config) -> tuple[Offer, float, bool]:
    """The next offer to rent for `missing` proofs/hour, and whether it was chosen to cover the rest: the cheapest
    per expected proof (ranked first), unless that one is more than what is missing and an offer cheaper per hour
    covers the rest. A machine bills by the hour whatever it proves, so the last one is chosen by its price (the
    lower bound's whole-machine rule); while it is the dearest per proof, it is the first released."""
    offer, rate = ranked[0]
    if missing >= rate:
        return offer, rate, False
    cheapest = min((item for item in ranked if item[1] >= missing),
                   key=lambda item: (_price(item[0], obs, config), item[0].id))
    if _price(cheapest[0], obs, config) < _price(offer, obs, config) - 1e-9:
        return cheapest[0], cheapest[1], True
    return offer, rate, False


def _release_late_benchmarks(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Destroy benchmarks past LATE_BENCH_S once what runs and boots covers what is wanted without them.

    A late benchmark is already given up on (not counted, the fleet launched around it); once the fleet covers the
    work without it, it only bills, until reconcile's timeouts.params_done (90 min by default) would kill it. If it
    was merely slow, the fleet did not need it."""
    want = wanted_capacity(obs, config)
    if budget < 1 or counted_capacity(obs) < want - 1e-9:
        return []
    late_ones = [m for m in obs.machines if late(m, obs.now) and m.get("vast_id") is not None and not _vast_dead(m)]
    return [Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                   reason=(f"benchmarking for {_since(machine, obs.now) / 60:.0f}m (a healthy benchmark takes 10-16m;"
                           f" past {LATE_BENCH_S // 60}m it is likely stuck), and the fleet covers the"
                           f" {want:g} proofs/h wanted without it: released"))
            for machine in late_ones[:budget]]


def _live_running(obs: Observation) -> list[dict]:
    return [m for m in obs.machines if m["state"] == State.RUNNING and m.get("vast_id") is not None
            and not _vast_dead(m)]


def _per_proof(machine: Mapping[str, Any]) -> float:
    """$ per proof the machine costs (inf without a rate)."""
    rate = float(machine["expected_rate"] or 0.0)
    return float(machine.get("dph") or 0.0) / rate if rate > 0 else float("inf")


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
    running = sorted(_live_running(obs), key=lambda m: (-_per_proof(m), m["label"]))
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
        cost = f"${_per_proof(machine) * 1000:.2f} per 1000 proofs"
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


def _replaced(machine: Mapping[str, Any], running: Sequence[Mapping[str, Any]], now: datetime, config: Config) -> bool:
    """A cheaper host came up after this machine, within agent.replace_after, at agent.replace_factor × less per
    proof: the replacement _replace() launched for it (a fleet that merely mixes hosts replaces nothing)."""
    age = _since(machine, now)
    return any(other is not machine and _since(other, now) < age and _since(other, now) <= config.agent.replace_after
               and _per_proof(machine) >= config.agent.replace_factor * _per_proof(other) for other in running)


def replacement_candidates(obs: Observation, config: Config) -> list[dict]:
    """Running machines old enough to be replaced by a cheaper host (agent.replace_after), dearest per proof first;
    none while any machine boots (one replacement at a time) or while demand is not known to have work."""
    if not obs.demand.known or obs.demand.work <= 0 or any(on_its_way(m, obs.now) for m in obs.machines):
        return []
    old = [m for m in _live_running(obs) if _since(m, obs.now) >= config.agent.replace_after]
    return sorted(old, key=lambda m: (-_per_proof(m), m["label"]))


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
    if _per_proof(worst) < config.agent.replace_factor * best:
        return []
    if not guard.spend_verdict(obs, obs.spend_per_hour + offer.dph_total, "").allowed:
        return []
    return [Action(kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name, dph=offer.dph_total,
                   reason=(f"replacing {worst['label']} (${_per_proof(worst) * 1000:.2f} per 1000 proofs) with"
                           f" {offer.gpu_name} at ${offer.dph_total:g}/h, {rate:g} proofs/h expected"
                           f" (${best * 1000:.2f} per 1000 proofs): released once this one is running"))]


def _trim(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Stop what the fleet can spare above target × (1 + headroom), least proofs per dollar first (demand known)."""
    if not obs.demand.known or budget < 1 or any(on_its_way(m, obs.now) for m in obs.machines):
        return []  # unknown demand holds; a booting machine's rate is a guess: trim once the fleet has settled
    want = ceiling(obs, config)
    have = counted_capacity(obs)
    candidates = sorted((m for m in obs.machines if m["state"] == State.RUNNING
                         and m.get("vast_id") is not None and not _vast_dead(m)),
                        key=lambda m: (_per_dollar(m), m["label"]))
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
                                      f" least proofs per dollar ({_per_dollar(machine):.1f}/$)")))
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
    worst = min(candidates, key=lambda m: (_per_dollar(m), m["label"]))
    return [Action(kind=Kind.STOP, actor=ACTOR, label=worst["label"], uuid=worst["uuid"],
                   reason=(f"no work queued, in flight or coming for {int(empty_for // 60)}m (agent.scale_down_after"
                           f" {int(config.agent.scale_down_after // 60)}m); least proofs per dollar"
                           f" ({_per_dollar(worst):.1f}/$)"))]


def hold_reason(obs: Observation, config: Config, offers: Sequence[Offer] = ()) -> str:
    """Why plan() has nothing to do: the figures it held on, in one line (what `agent-step --dry-run` says).
    `offers`: the ones plan() was given (a shortfall under half the smallest of them is rounded down)."""
    want = wanted_capacity(obs, config)
    running = sum(m["expected_rate"] for m in obs.machines if m["state"] == State.RUNNING and not _vast_dead(m))
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
    if not _cooled_down(obs, config):
        return (f"no work queued, in flight or coming for {empty_for}m: machines are released after"
                f" agent.scale_down_after ({wait}m)")
    if any(m["state"] in PENDING_STATES for m in obs.machines):
        return f"no work for {empty_for}m, but a machine is still booting (its rate is a guess): releasing after it settles"
    warm = warm_count(obs, config)
    if 0 < warm <= config.agent.min_machines:
        return (f"no work for {empty_for}m: agent.min_machines keeps {config.agent.min_machines} warm"
                f" ({warm} proving or booting)")
    return f"no work for {empty_for}m and no machine left to release"
