"""The day's figures: the lower bounds it is measured against, detection latencies, and the summary it prints.

The summary is what `vastctl demo --json` prints (docs/interface.md): the simulator's truth (its billing,
the proofs taken off the queue, the capacity really proving) beside the bounds and vastctl's handling of
failures; the proof waits come in from calls.proof_waits.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal, TypedDict

from vastctl import clock as clocks
from vastctl.config import Config
from vastctl.demo.setting import START, DemandCurve, DemoOptions
from vastctl.state import instances

if TYPE_CHECKING:  # the simulator is imported where it is used
    from vastctl.bound import Bound, Rentable
    from vastctl.demo.calls import DayWaits
    from vastctl.providers.sim import SimProvider, SimTotals
    from vastctl.providers.sim_store import InstanceRecord


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def detection_latencies(conn: sqlite3.Connection, records: list[InstanceRecord]) -> tuple[list[float], int]:
    """Seconds from each machine's death (the market's died_at) to our kill of it; and deaths not yet killed."""
    killed = {vast_id: clocks.from_iso(killed_at) for vast_id, killed_at in instances.kill_times(conn)}
    latencies, undetected = [], 0
    for record in records:
        died = record["died_at"]
        if died is None:
            continue
        at = killed.get(record["vast_id"])
        if at is None:
            undetected += 1
        elif at >= died:
            latencies.append((at - died).total_seconds())
    return latencies, undetected


def lower_bound_cost(market: SimProvider, config: Config, curve: DemandCurve, minutes: int, *, whole: bool = False,
                     sized_to: list[float] | None = None, honest: bool = True, interruptible: bool = False) -> float:
    """$ of the cheapest offers sized exactly to the arrivals, minute by minute, knowing every host's true rate.

    Not a lower bound (least_costs() is): renting minute by minute at each minute's
    price, it forbids what the market allows (keeping a host through an hour another
    renter takes, keeping the price rented at, letting proofs wait up to max_wait),
    and a fleet may pay less. Kept as the figure the benchmarks first compared with,
    and for its whole-machine and target-sized variants. Fractions of a machine are allowed; with `whole`, only
    whole machines (the cheapest per proof, the last one the cheapest that
    covers the rest): how much renting by the machine alone costs. `sized_to`
    replaces the arrivals with a proofs/hour per minute (the target the fleet was asked for).
    `honest` (the default) rents only what the fleet may rent: hosts that pass its own filters
    (fleet.min_cpu_ram_gb, fleet.min_inet_down_mbps) and that no other renter holds that hour; without
    it, any host of the allowed models. `interruptible` prices every host at its min_bid (never outbid: not the
    bid-aware bound, least_costs' is).
    """
    from vastctl.providers import sim_market

    hosts = [host for host in market.hosts() if host.gpu_name in config.fleet.gpus
             and host.true_rate >= config.fleet.min_bench_rate]
    if honest:
        hosts = [host for host in hosts if host.cpu_ram_gb >= config.fleet.min_cpu_ram_gb
                 and host.inet_down_mbps >= config.fleet.min_inet_down_mbps]
    everyone = market.hosts()
    taken: tuple[int, frozenset[int]] = (-1, frozenset())
    cost = 0.0
    for minute in range(minutes):
        at = (START + timedelta(minutes=minute)).timestamp()
        if honest and taken[0] != int(at // 3600):
            taken = (int(at // 3600), sim_market.taken_by_others(market.seed, everyone, int(at // 3600)))
        priced = [(dph, host.true_rate) for host in hosts if host.machine_id not in taken[1]
                  and (dph := (sim_market.min_bid(market.seed, host, at, config.launch.disk_gb) if interruptible
                               else sim_market.gpu_price(host, at)
                               + sim_market.storage_price(host, config.launch.disk_gb))) <= config.fleet.max_dph]
        priced.sort(key=lambda item: (item[0] / item[1], item[0]))
        need = curve.rate(minute) if sized_to is None else sized_to[minute]
        for index, (dph, rate) in enumerate(priced):
            if need <= 1e-9:
                break
            if whole:
                if rate >= need:  # the last machine: the cheapest one that covers what is left
                    cost += min(d for d, r in priced[index:] if r >= need) / 60
                    break
                share = 1.0
            else:
                share = min(1.0, need / rate)
            cost += dph * share / 60
            need -= rate * share
    return cost


def least_costs(market: SimProvider, config: Config, curve: DemandCurve, minutes: int) -> dict[LowerBound, Bound]:
    """The day's true lower bounds (vastctl.bound's program over bound_inputs()), in $."""
    from vastctl import bound

    inputs = bound_inputs(market, config, curve, minutes)
    return {name: bound.least_cost(hosts, inputs.arrivals, inputs.max_wait_s) for name, hosts in inputs.hosts.items()}


@dataclass(frozen=True)
class BoundInputs:
    """What each of the day's lower bounds is solved over: its hosts, the arrivals and agent.max_wait."""

    hosts: dict[LowerBound, list[Rentable]]
    arrivals: list[float]  # proofs arriving at each minute's start
    max_wait_s: float


def bound_inputs(market: SimProvider, config: Config, curve: DemandCurve, minutes: int) -> BoundInputs:
    """The hosts of the day's three lower bounds (every freedom the market gives):

      honest         the hosts the fleet may rent (its models, RAM, bandwidth, reliability, price cap, a host
                     that can pass the benchmark gate), on demand
      any_host       every host of the market, no filter of the fleet's, on demand
      interruptible  the honest hosts, each by bid (from its min_bid) or on demand: a share rented by bid
                     proves only at a bid over every rival's that holds the host then (the market's rival bids,
                     sim_market.rivals, known in hindsight as the arrivals are), else on demand

    The work is the demand curve's arrivals, each proof done within agent.max_wait.
    """
    from vastctl import bound
    from vastctl.launches import DEFAULT_MIN_RELIABILITY
    from vastctl.providers import sim_market

    arrivals = [curve.rate(minute) / 60 for minute in range(minutes)]
    horizon = bound.minutes(minutes, config.agent.max_wait)
    disk = config.launch.disk_gb
    everyone = market.hosts()
    hours = [START.timestamp() + 3600 * hour for hour in range(horizon // 60 + 1)]
    taken = [sim_market.taken_by_others(market.seed, everyone, int(at // 3600)) for at in hours]
    moments = [START.timestamp() + 60 * minute for minute in range(horizon)]

    def passes(host: sim_market.Host) -> bool:
        return (host.gpu_name in config.fleet.gpus and host.cpu_ram_gb >= config.fleet.min_cpu_ram_gb
                and host.inet_down_mbps >= config.fleet.min_inet_down_mbps
                and host.reliability >= DEFAULT_MIN_RELIABILITY
                and host.true_rate * 1.03 >= config.fleet.min_bench_rate)  # a bench reports 0.96-1.03 × true

    asked: dict[tuple[int, bool], list[float]] = {}  # each host's $/h in each minute, by bid or on demand

    def rentable(host: sim_market.Host, *, bid: bool, cap: float | None) -> bound.Rentable:
        storage = sim_market.storage_price(host, disk)
        if (host.machine_id, bid) not in asked:
            asked[host.machine_id, bid] = [sim_market.min_bid(market.seed, host, at, disk) for at in moments] if bid else [
                sim_market.gpu_price(host, at) + storage for at in moments]
        every = asked[host.machine_id, bid]
        prices: list[float | None] = []
        for hour in range(0, horizon, 60):  # not offered in an hour another renter holds it, nor over the cap
            if host.machine_id in taken[hour // 60]:
                prices += [None] * len(every[hour:hour + 60])
            else:
                prices += [price if cap is None or price <= cap else None for price in every[hour:hour + 60]]
        if not bid:
            return bound.Rentable(key=host.machine_id, rate=host.true_rate, storage_dph=storage, prices=prices)
        rivals = sim_market.rival_floors(market.seed, host, START.timestamp(), bound.BLOCK_MIN * 60,
                                         horizon // bound.BLOCK_MIN, market.rates)
        return bound.Rentable(key=-host.machine_id, rate=host.true_rate, storage_dph=storage, prices=prices,
                              rival=[floor + storage if floor > 0 else 0.0 for floor in rivals], machine=host.machine_id)

    honest = [host for host in everyone if passes(host)]
    cap = config.fleet.max_dph
    return BoundInputs(hosts={
        "honest": [rentable(h, bid=False, cap=cap) for h in honest],
        "any_host": [rentable(h, bid=False, cap=None) for h in everyone],
        "interruptible": [rentable(h, bid=True, cap=cap) for h in honest] + [rentable(h, bid=False, cap=cap) for h in honest],
    }, arrivals=arrivals, max_wait_s=config.agent.max_wait)


LowerBound = Literal["honest", "any_host", "interruptible"]  # least_costs' three lower bounds


class DaySummary(TypedDict):
    """The day's figures, as `demo --json` prints them (docs/interface.md), in this order."""

    hours: float
    seed: int
    policy: str
    failures: str
    fleet: str
    proofs_within_max_wait: float | None
    max_wait_s: float
    proof_wait_p50_s: float | None
    proof_wait_p95_s: float | None
    proof_wait_p99_s: float | None
    proofs_judged_for_wait: int
    target_attainment: float | None
    attainment_minutes: int
    capacity_measured_as: str
    cost: float | None
    proofs: int
    proofs_arrived: int
    queued_at_end: int
    cost_per_1000_proofs: float | None
    lower_bound_cost_per_1000_proofs: float | None
    lower_bound_any_host_cost_per_1000_proofs: float | None
    lower_bound_whole_machines_cost_per_1000_proofs: float | None
    lower_bound_target_sized_cost_per_1000_proofs: float | None
    cost_ratio_to_lower_bound: float | None
    lower_bound_interruptible_cost_per_1000_proofs: float | None
    cost_ratio_to_any_host_bound: float | None
    cost_ratio_to_interruptible_bound: float | None
    lower_bound_minute_by_minute_cost_per_1000_proofs: float | None
    rental: str
    machines_interruptible: int
    outbids: int
    rebids: int
    kills_by_reason: dict[str, int]
    billed_instance_hours: float | None
    leaked_instance_hours: float | None
    leaked_fraction: float | None
    detection_latency_p50_s: float | None
    detection_latency_p95_s: float | None
    deaths: int
    deaths_undetected_at_end: int
    faults: dict[str, int]
    machines_launched: int
    agent_steps: int
    failed_passes: dict[str, int]


def summary(conn: sqlite3.Connection, config: Config, options: DemoOptions, totals: SimTotals, market: SimProvider,
            curve: DemandCurve, *, arrived: float, done: float, backlog: float, counted: int, met: int,
            billed_at_kill: dict[int, float], errors: dict[str, int], latencies: list[float], undetected: int,
            asked: list[float], waits: DayWaits) -> DaySummary:
    kills: dict[str, int] = {}
    for code, n in instances.kill_counts(conn).items():
        kills[code or "none"] = n
    billed = {record["vast_id"]: record["billed_hours"] for record in totals.instances}
    leaked = sum(max(0.0, billed[vast_id] - at_kill) for vast_id, at_kill in billed_at_kill.items())
    least = least_costs(market, config, curve, options.minutes)
    bound, any_host, bids_bound = (least[name].cost for name in ("honest", "any_host", "interruptible"))
    minute_by_minute = lower_bound_cost(market, config, curve, options.minutes)
    whole = lower_bound_cost(market, config, curve, options.minutes, whole=True)
    sized = lower_bound_cost(market, config, curve, options.minutes, whole=True, sized_to=asked)
    interruptible = sum(1 for record in totals.instances if record.get("bid") is not None)
    rebids = conn.execute("SELECT count(*) FROM actions WHERE kind = 'rebid' AND ok = 1").fetchone()[0]
    per_1000 = totals.cost / done * 1000 if done > 0 else None
    bound_per_1000 = bound / arrived * 1000 if arrived > 0 else None

    def ratio(to: float) -> float | None:
        return round(per_1000 / (to / arrived * 1000), 3) if per_1000 and arrived > 0 and to > 0 else None
    launched = instances.count(conn)
    steps = conn.execute("SELECT count(*) FROM agent_steps WHERE outcome = 'ok'").fetchone()[0]

    def r(value: float | None, digits: int = 4) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "hours": options.hours, "seed": options.seed, "policy": options.policy, "failures": options.failures,
        "fleet": options.fleet,
        "proofs_within_max_wait": r(waits["within"]),
        "max_wait_s": config.agent.max_wait,
        "proof_wait_p50_s": waits["p50"],  # deliveries.proof_wait's, as they come (to the millisecond)
        "proof_wait_p95_s": waits["p95"],
        "proof_wait_p99_s": waits["p99"],
        "proofs_judged_for_wait": int(waits["judged"]),
        "target_attainment": r(met / counted if counted else None),
        "attainment_minutes": counted,
        "capacity_measured_as": "simulator",
        "cost": r(totals.cost, 2),
        "proofs": int(done),
        "proofs_arrived": int(arrived),
        "queued_at_end": math.ceil(backlog - 1e-9),
        "cost_per_1000_proofs": r(per_1000, 3),
        "lower_bound_cost_per_1000_proofs": r(bound_per_1000, 3),
        "lower_bound_any_host_cost_per_1000_proofs": r(any_host / arrived * 1000 if arrived > 0 else None, 3),
        "lower_bound_whole_machines_cost_per_1000_proofs": r(whole / arrived * 1000 if arrived > 0 else None, 3),
        "lower_bound_target_sized_cost_per_1000_proofs": r(sized / arrived * 1000 if arrived > 0 else None, 3),
        "cost_ratio_to_lower_bound": ratio(bound),
        "lower_bound_interruptible_cost_per_1000_proofs": r(bids_bound / arrived * 1000 if arrived > 0 else None, 3),
        "cost_ratio_to_any_host_bound": ratio(any_host),
        "cost_ratio_to_interruptible_bound": ratio(bids_bound),
        "lower_bound_minute_by_minute_cost_per_1000_proofs": r(minute_by_minute / arrived * 1000
                                                               if arrived > 0 else None, 3),
        "rental": config.launch.rental,
        "machines_interruptible": interruptible,
        "outbids": totals.outbids,
        "rebids": rebids,
        "kills_by_reason": kills,
        "billed_instance_hours": r(totals.billed_hours, 3),
        "leaked_instance_hours": r(leaked, 3),
        "leaked_fraction": r(leaked / totals.billed_hours if totals.billed_hours else None),
        "detection_latency_p50_s": r(percentile(latencies, 0.5), 1),
        "detection_latency_p95_s": r(percentile(latencies, 0.95), 1),
        "deaths": len(latencies) + undetected,
        "deaths_undetected_at_end": undetected,
        "faults": dict(sorted(totals.faults.items())),
        "machines_launched": launched,
        "agent_steps": steps,
        "failed_passes": dict(errors),
    }
