"""What the fleet is sized to: the work the demand names, the capacity it wants, holds and counts. Pure.

The plan (agent/rules.py) grows to what is wanted, releases only above what is held, and counts the capacity
running and on its way:

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

  counted = running plus on-its-way capacity, without machines vast lists as exited, offline, missing or stopped
  under a running row (outbid), nor a benchmark past LATE_BENCH_S; a shortfall under ROUND_DOWN of the smallest
  machine to hand is rounded down (rounded_down).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Sequence

from vastctl import clock
from vastctl.agent.valuation import per_dollar
from vastctl.config import Config
from vastctl.observe import PENDING_STATES, DemandSample, Machine, Observation, Work
from vastctl.providers.base import Offer
from vastctl.state.lifecycle import VAST_DEAD_CODES, State

ROUND_DOWN = 0.5  # a shortfall under this share of the smallest machine to hand is not worth renting one
LATE_BENCH_S = 25 * 60  # a benchmark (SRS load, PCE extraction, five proofs) takes ~10-16 min; past this it is late
HEALTHY_BENCH_S = 16 * 60  # the longest a healthy benchmark takes: one still running past it is likely stuck
PARAMS_GBIT = {"32GiB": 455.0}  # the parameter set `curio fetch-params` fetches, by launch.sector_size (~53 GiB)
FETCH_CHECKS_S = 5 * 60  # a healthy fetch's minutes besides the download: the boot script's start, the digest checks


def vast_dead(machine: Machine) -> bool:
    """Not proving whatever the file says: vast lists it dead or not at all, or stopped under a running row
    (an interruptible machine outbid: reconcile waits for it, capacity does not count it)."""
    return (bool(machine.get("vast_missing")) or machine.get("vast_status") in VAST_DEAD_CODES
            or (machine.get("state") == State.RUNNING and machine.get("vast_status") == "stopped"))


def ceiling(obs: Observation, config: Config) -> float:
    """The most the fleet is sized to: the operator's target × (1 + agent.headroom)."""
    return float(obs.settings["target_proofs_per_hour"]) * (1 + config.agent.headroom)


def horizon_hours(config: Config) -> float:
    """agent.plan_horizon in hours, never past agent.max_wait (at least a minute)."""
    return max(60.0, min(config.agent.plan_horizon, config.agent.max_wait or config.agent.plan_horizon)) / 3600


def needed(sample: Work, config: Config) -> float:
    """Proofs/hour that drain what is queued and in flight within agent.plan_horizon while keeping up with the
    arrivals: the look-ahead spread over demand.lookahead_window, else (a source silent on it) the rate the
    source says was proved lately."""
    backlog = (sample.get("queued") or 0) + (sample.get("in_flight") or 0)
    window = config.demand.lookahead_window
    lookahead = sample.get("lookahead")
    if lookahead is not None and window > 0:
        arrivals = lookahead / (window / 3600)
    else:
        arrivals = float(sample.get("proofs_per_hour") or 0.0)
    needed: float = backlog / horizon_hours(config) + arrivals
    return needed


def sized_to(obs: Observation) -> Work | None:
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
        held: DemandSample = {**last, "in_flight": max(last.get("in_flight") or 0, demand.held)}
        return held
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


def benchmarking_past(machine: Machine, now: datetime, seconds: float) -> bool:
    """Benchmarking (parameters fetched, no bench report yet) for longer than `seconds`."""
    return machine["state"] == State.PARAMS_DONE and in_state_for(machine, now) > seconds


def healthy_fetch_s(config: Config) -> float | None:
    """The longest a healthy parameter fetch takes: the set downloaded at the slowest link the fleet rents
    (fleet.min_inet_down_mbps) and its checks (docs/params-mirror.md); None where either is unknown (a 64GiB
    set, no floor on the link)."""
    gbit = PARAMS_GBIT.get(config.launch.sector_size)
    floor_mbps = config.fleet.min_inet_down_mbps
    if gbit is None or floor_mbps <= 0:
        return None
    return gbit * 1000 / floor_mbps + FETCH_CHECKS_S


def fetching_past(machine: Machine, now: datetime, seconds: float | None) -> bool:
    """Fetching its parameters (registered, not yet fetched) for longer than `seconds` (None: never)."""
    return seconds is not None and machine["state"] == State.REGISTERED and in_state_for(machine, now) > seconds


def late(machine: Machine, now: datetime) -> bool:
    """Benchmarking for longer than LATE_BENCH_S: a healthy benchmark takes minutes, so this one is likely stuck
    (reconcile kills it at timeouts.params_done). It is not counted as capacity on its way, so the fleet launches
    around it instead of waiting for its timeout; if it does come up, it counts again."""
    return benchmarking_past(machine, now, LATE_BENCH_S)


def late_benchmarks(obs: Observation) -> list[Machine]:
    """The late benchmarks a policy may destroy: rented (a vast id) and not already dead at vast."""
    return [m for m in obs.machines if late(m, obs.now) and m.get("vast_id") is not None and not vast_dead(m)]


def on_its_way(machine: Machine, now: datetime) -> bool:
    """Booting (or resuming) and expected to come up: not late, not dead at vast."""
    return machine["state"] in PENDING_STATES and not late(machine, now) and not vast_dead(machine)


def counted_capacity(obs: Observation) -> float:
    """Running plus on-its-way capacity, without machines vast says are dead or boots that are late."""
    total: float = sum(m["expected_rate"] for m in obs.machines
                       if (m["state"] == State.RUNNING and not vast_dead(m)) or on_its_way(m, obs.now))
    return total


def shortfall(obs: Observation, config: Config) -> float:
    """Proofs/hour still missing; > 0 means the plan wants to resume or launch."""
    if not has_work(obs):
        return 0.0
    return wanted_capacity(obs, config) - counted_capacity(obs)


def resumable(obs: Observation) -> list[Machine]:
    stopped = [m for m in obs.machines if m["state"] == State.STOPPED and not m.get("resumes")
               and m.get("vast_id") is not None and not m.get("vast_missing")]
    return sorted(stopped, key=per_dollar, reverse=True)


def in_state_for(machine: Machine, now: datetime) -> float:
    """Seconds the machine has been in its state (0 when the file does not say)."""
    at = clock.from_iso(machine.get("state_since"))
    return max(0.0, (now - at).total_seconds()) if at is not None else 0.0


def cooled_down(obs: Observation, config: Config) -> bool:
    """The work is known to have run out agent.scale_down_after ago: machines may be released."""
    since = obs.demand.empty_since
    return since is not None and (obs.now - since).total_seconds() >= config.agent.scale_down_after


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
    rates = [rate for _, rate in ranked] + [m["expected_rate"] for m in resumable(obs) if m["expected_rate"] > 0]
    if missing <= 0 or have <= 0 or not rates:
        return None
    sample = sized_to(obs)
    backlog = 0 if sample is None else (sample.get("queued") or 0) + (sample.get("in_flight") or 0)
    if backlog / have > ROUND_DOWN * horizon_hours(config):
        return None  # proofs already wait: the shortfall is rented
    smallest = min(rates)
    return smallest if missing < ROUND_DOWN * smallest else None
