"""The rules policy: a deterministic autoscaler, pure (Observation, config, offers → actions).

It is the default policy without an Anthropic key, and the suggestion the llm
policy is shown. In the order `plan()` applies them:

  work = queued + in_flight + lookahead (demand.Demand.work): tasks unclaimed, tasks a Curio node has claimed
  (with cuzk they wait at a daemon: a machine stopped under them loses them), and PoRep tasks Curio is about
  to create (sectors precommitted on chain; a machine launched now is booted when they arrive). A source that
  reports only `queued` counts the other two as 0.

  demand                     what it does
  work > 0, or unknown       size capacity + pending capacity to target × (1 + agent.headroom), because a
                             replacement takes 15-90 minutes to boot: first resume stopped machines never
                             resumed before (they keep their parameters), best proofs per dollar first; then
                             launch the cheapest offers per expected proof among fleet.gpus. Capacity still on
                             its way counts: no second launch for it. A machine vast lists as exited, offline or
                             missing is not counted (reconcile is about to kill it).
  any                        a stopped machine that was resumed once already is destroyed (replaced): it bills
                             storage and is not resumed twice
  work == 0 for              first stop the running machines the fleet can spare above target × (1 + headroom),
  agent.scale_down_after     least proofs per dollar first, as many as the step allows (not while a machine boots:
                             its rate is still a guess); with none to spare, stop one machine a step, least proofs
                             per dollar first (stopped, it keeps its disk and is resumed first when work returns)
  work == 0, cooling down    hold
  work > 0, over target      hold: the fleet never shrinks while work is queued, in flight or coming (the
                             incident: 59 queued, no "active" flag, every machine stopped)
  unknown                    never shrink the fleet (hold), whatever the last known queue said

Expected rate: measured, else bench, else the median bench rate seen for the GPU
model, else fleet.default_rate (observe.py). An offer's expected rate is its
model's (before any benchmark of it, the published figure, GPU_RATES), capped by what its host RAM allows (RAM_RATES, the cuzk measurements of
domain.md): a 256 GiB host proves ~68/h whatever its GPU, so offers are ranked
by proofs per dollar with the RAM counted. Plans stay inside the limits the
guard checks (max_instances, max_dph, max_hourly_spend, max_actions_per_step), so
a healthy plan is never refused; the guard checks them again anyway.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..config import Config
from ..fleet import VAST_DEAD
from ..guard import Action, Kind
from ..lifecycle import State
from ..observe import PENDING_STATES, Observation, rate_of_model
from ..providers.base import Offer

ACTOR = "agent"
# proofs/hour host RAM allows (GiB → proofs/h, 32 GiB PoRep with cuzk; domain.md), interpolated between
RAM_RATES = ((128, 24.0), (256, 68.0), (384, 84.0), (512, 95.0))
# proofs/hour a model proves on a host with RAM to spare, before any machine of it has benchmarked (domain.md)
GPU_RATES = {"RTX 3090": 50.0, "RTX 4090": 80.0, "RTX 5070 Ti": 95.0, "RTX 5090": 100.0, "A100 SXM4": 70.0,
             "A100 80GB": 70.0, "H100 SXM": 100.0, "H100 PCIe": 100.0}


def _vast_dead(machine: Mapping[str, Any]) -> bool:
    return bool(machine.get("vast_missing")) or machine.get("vast_status") in VAST_DEAD


def _per_dollar(machine: Mapping[str, Any]) -> float:
    dph = float(machine.get("dph") or 0.0)
    return machine["expected_rate"] / dph if dph > 0 else float("inf")


def wanted_capacity(obs: Observation, config: Config) -> float:
    """Proofs/hour the fleet is sized to while work is queued (or demand is unknown)."""
    return float(obs.settings["target_proofs_per_hour"]) * (1 + config.agent.headroom)


def has_work(obs: Observation) -> bool:
    """Work queued, in flight or coming, or no trustworthy word that there is none."""
    return not obs.demand.known or obs.demand.work > 0


def work_reason(obs: Observation) -> str:
    """Why the fleet is sized to the target: the work the demand names, or that it is unknown."""
    demand = obs.demand
    if not demand.known:
        return "demand unknown (sized as if work were queued)"
    if not demand.in_flight and not demand.lookahead:
        return "queued work"
    counts = [f"{demand.queued or 0} queued"]
    if demand.in_flight is not None:
        counts.append(f"{demand.in_flight} in flight")
    if demand.lookahead is not None:
        counts.append(f"{demand.lookahead} PoRep coming")
    return f"work for the fleet ({', '.join(counts)})"


def counted_capacity(obs: Observation) -> float:
    """Running plus on-its-way capacity, without machines vast says are dead."""
    return sum(m["expected_rate"] for m in obs.machines
               if (m["state"] == State.RUNNING or m["state"] in PENDING_STATES) and not _vast_dead(m))


def shortfall(obs: Observation, config: Config) -> float:
    """Proofs/hour still missing; > 0 means the plan wants to resume or launch."""
    if not has_work(obs):
        return 0.0
    return wanted_capacity(obs, config) - counted_capacity(obs)


def needs_offers(obs: Observation, config: Config) -> bool:
    """Whether plan() would look at offers (the caller searches the market only then)."""
    missing = shortfall(obs, config)
    for machine in _resumable(obs):
        missing -= machine["expected_rate"]
    return missing > 0


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
    """What an offer is expected to prove per hour: its model's rate (benchmarked, else the published figure,
    else fleet.default_rate), capped by what its host RAM allows."""
    default = GPU_RATES.get(offer.gpu_name, config.fleet.default_rate)
    return min(rate_of_model(offer.gpu_name, obs.model_rates, default), ram_rate(offer.cpu_ram_gb))


def rank_offers(offers: Iterable[Offer], obs: Observation, config: Config) -> list[tuple[Offer, float]]:
    """Allowed offers with their expected rate, cheapest per expected proof first, one per host machine."""
    allowed = set(config.fleet.gpus)
    max_dph = float(obs.settings["max_dph"])
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
    return sorted(ranked, key=lambda item: (item[0].dph_total / item[1], item[0].dph_total, item[0].id))


def plan(obs: Observation, config: Config, offers: Sequence[Offer] = ()) -> list[Action]:
    """What the rules would do now. Pure: same observation, same offers → same actions."""
    budget = config.agent.max_actions_per_step
    actions: list[Action] = []
    for machine in obs.machines:
        if machine["state"] == State.STOPPED and machine.get("resumes") and len(actions) < budget:
            actions.append(Action(kind=Kind.DESTROY, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                                  reason="stopped again after its one resume: replaced, not resumed twice"))
    if has_work(obs):
        actions.extend(_grow(obs, config, offers, budget - len(actions)))
    elif _cooled_down(obs, config):
        actions.extend(_trim(obs, config, budget - len(actions)) or _shrink(obs, config, budget - len(actions)))
    return actions


def _cooled_down(obs: Observation, config: Config) -> bool:
    """The work is known to have run out agent.scale_down_after ago: machines may be released."""
    since = obs.demand.empty_since
    return since is not None and (obs.now - since).total_seconds() >= config.agent.scale_down_after


def _grow(obs: Observation, config: Config, offers: Sequence[Offer], budget: int) -> list[Action]:
    want = wanted_capacity(obs, config)
    have = counted_capacity(obs)
    missing = want - have
    sizing = f"{work_reason(obs)}: capacity {have:g} of {want:g} proofs/h (target × (1 + {config.agent.headroom:g}))"
    actions: list[Action] = []
    spend = obs.spend_per_hour
    live = len(obs.live())
    max_spend = float(obs.settings["max_hourly_spend"])
    for machine in _resumable(obs):
        dph = float(machine.get("dph") or 0.0)
        if missing <= 0 or len(actions) >= budget:
            break
        adds = max(0.0, dph - float(machine.get("billed_per_hour") or 0.0))  # its disk bills already
        if spend + adds > max_spend + 1e-9 or dph > float(obs.settings["max_dph"]) + 1e-9:
            continue
        actions.append(Action(kind=Kind.START, actor=ACTOR, label=machine["label"], uuid=machine["uuid"],
                              dph=machine.get("dph"), reason=f"{sizing}; resume before renting anew"))
        missing -= machine["expected_rate"]
        spend += adds
    for offer, rate in rank_offers(offers, obs, config):
        if missing <= 0 or len(actions) >= budget or live >= int(obs.settings["max_instances"]):
            break
        if spend + offer.dph_total > max_spend + 1e-9:
            continue
        actions.append(Action(
            kind=Kind.LAUNCH, actor=ACTOR, offer_id=offer.id, gpu_name=offer.gpu_name, dph=offer.dph_total,
            reason=(f"{sizing}; {offer.gpu_name} at ${offer.dph_total:g}/h, {rate:g} proofs/h expected"
                    f" (${offer.dph_total / rate * 1000:.2f} per 1000 proofs)"),
        ))
        missing -= rate
        spend += offer.dph_total
        live += 1
    return actions


def _trim(obs: Observation, config: Config, budget: int) -> list[Action]:
    """Stop what the fleet can spare above target × (1 + headroom), least proofs per dollar first (demand known)."""
    if not obs.demand.known or budget < 1 or any(m["state"] in PENDING_STATES for m in obs.machines):
        return []  # unknown demand holds; a booting machine's rate is a guess: trim once the fleet has settled
    want = wanted_capacity(obs, config)
    have = counted_capacity(obs)
    candidates = sorted((m for m in obs.machines if m["state"] == State.RUNNING
                         and m.get("vast_id") is not None and not _vast_dead(m)),
                        key=lambda m: (_per_dollar(m), m["label"]))
    actions = []
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
    empty_for = (obs.now - obs.demand.empty_since).total_seconds()
    candidates = [m for m in obs.machines if m["state"] in PENDING_STATES | {State.RUNNING}
                  and m.get("vast_id") is not None]
    if not candidates:
        return []
    worst = min(candidates, key=lambda m: (_per_dollar(m), m["label"]))
    return [Action(kind=Kind.STOP, actor=ACTOR, label=worst["label"], uuid=worst["uuid"],
                   reason=(f"no work queued, in flight or coming for {int(empty_for // 60)}m (agent.scale_down_after"
                           f" {int(config.agent.scale_down_after // 60)}m); least proofs per dollar"
                           f" ({_per_dollar(worst):.1f}/$)"))]


def hold_reason(obs: Observation, config: Config) -> str:
    """Why plan() has nothing to do: the figures it held on, in one line (what `agent-step --dry-run` says)."""
    want = wanted_capacity(obs, config)
    running = sum(m["expected_rate"] for m in obs.machines if m["state"] == State.RUNNING and not _vast_dead(m))
    booting = sum(m["expected_rate"] for m in obs.machines if m["state"] in PENDING_STATES and not _vast_dead(m))
    target = float(obs.settings["target_proofs_per_hour"])
    sized = f"{round(want, 1):g} wanted (target {target:g} × (1 + headroom {config.agent.headroom:g}))"
    if has_work(obs):
        have = f"capacity {round(running, 1):g} + {round(booting, 1):g} booting"
        if running + booting >= want - 1e-9:
            return f"{work_reason(obs)}: {have} covers {sized}"
        return (f"{work_reason(obs)}: {have} is short of {sized}, but no stopped machine to resume and no offer"
                f" of fleet.gpus within max_dph, max_hourly_spend (${obs.spend_per_hour:.2f}/h of"
                f" ${float(obs.settings['max_hourly_spend']):g}/h) and max_instances")
    since = obs.demand.empty_since
    empty_for = int((obs.now - since).total_seconds() // 60) if since is not None else 0
    wait = int(config.agent.scale_down_after // 60)
    if not _cooled_down(obs, config):
        return (f"no work queued, in flight or coming for {empty_for}m: machines are released after"
                f" agent.scale_down_after ({wait}m)")
    if any(m["state"] in PENDING_STATES for m in obs.machines):
        return f"no work for {empty_for}m, but a machine is still booting (its rate is a guess): releasing after it settles"
    return f"no work for {empty_for}m and no machine left to release"
