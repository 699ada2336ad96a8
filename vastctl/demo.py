"""`vastctl demo`: a day of the control loop against the simulated market, on virtual time, in seconds.

A fresh state file in a temporary directory (never the operator's), `provider:
sim`, and everything cron and an operator's scripts would do, minute by
minute on a VirtualClock:

  every minute   Curio's proving work arrives (the demand curve below); a script reports the queue
                 (`demand report`): the proofs waiting or in flight plus those arriving within the
                 hour (the look-ahead of docs/workload.md: precommitted sectors reach PoRep ~75 min
                 later), except during the outage of the demand source, when nothing is reported
                 and demand goes unknown after demand.stale_after;
                 `reconcile`, then `agent-step --if-events`, as cron runs them;
                 the machines the market says are proving take work off the queue at their true rates
  every 10 min   the operator's script sets target_proofs_per_hour to the peak arrival rate of the
                 coming hour (the look-ahead of docs/workload.md: precommitted sectors arrive ~75 min
                 later), rounded up to 10; it keeps the last target while the demand source is down

The demand curve (hours from the start of each simulated day): a daily swing of
160-400 proofs/hour (low at 03:00, high at 15:00), a burst of +250 from 10:00
to 11:30, a quiet spell with nothing arriving from 16:00 to 19:00, and an
outage of the demand source from 21:00 to 22:30; ±10% noise per 10 minutes,
drawn from the seed.

The figures are the simulator's truth, not what vastctl believes: capacity is
the sum of the true proof rates of the machines the market has proving at that
minute (a machine vastctl counts as running but that died, or proves slower
than it benchmarked, does not count in full), cost is the market's billing,
proofs are the ones actually taken off the queue. `target_attainment` is the
fraction of the minutes after the first hour (warm-up: a first machine takes
20-40 minutes to boot) with work queued during which that capacity was at
least the target.

The proofs reach vastctl as the proof router's calls would (RoutedCalls): each
machine's share of the work becomes whole calls, each a proof_calls row, so
the day runs through what the router feeds in production: a machine's proofs
in `cost`, its routed rate in the observation, the dashboard's proof waits.
The proof-wait figures are production's (deliveries.proof_wait: held + proving
time of each answered call), with the proofs still held past agent.max_wait at
the end counted as late.

The same seed gives the same figures to the digit: the market, the demand and
the clock are all functions of the seed, and no wall-clock time enters.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from vastctl import clock as clocks
from vastctl import config as config_module
from vastctl import reconcile
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.errors import BadInput, VastctlError
from vastctl.facts import deliveries, demand
from vastctl.providers.sim_engine import Share
from vastctl.state import db, settings, tokens

START = datetime(2031, 3, 3, tzinfo=timezone.utc)  # far from the wall clock: a wall-clock time in the file stands out
STEP_S = 60  # cron's minute
WARMUP_MINUTES = 60
TARGET_EVERY_MINUTES = 10
LOOKAHEAD_MINUTES = 60
FAILURE_LEVELS = ("low", "default", "high")
POLICIES = ("rules", "llm")
RENTALS = ("on-demand", "interruptible", "mixed")  # launch.rental's choices
FLEETS = ("rules", "static")  # static: sized for the day's peak once, never scaled down (the bench's baseline)
MAX_HOURS = 7 * 24
DEFAULT_SEED = 351  # the README's day: most failure kinds happen in it (with seed 9's day, every one)

# the demand curve, in hours of the simulated day
SWING_MEAN, SWING_AMPLITUDE, SWING_PEAK_HOUR = 280.0, 120.0, 15.0
BURST = (10.0, 11.5, 250.0)  # from, to, extra proofs/hour
QUIET = (16.0, 19.0)  # nothing arrives: long past agent.scale_down_after, the fleet is released and resumed
OUTAGE = (21.0, 22.5)  # the demand source is down: nothing is reported
NOISE = 0.10


@dataclass(frozen=True)
class DemoOptions:
    hours: float = 24.0
    seed: int = DEFAULT_SEED
    policy: str = "rules"
    failures: str = "default"
    fleet: str = "rules"
    rental: str | None = None  # launch.rental for the day (None: the config's, on-demand)

    def check(self) -> None:
        if not (isinstance(self.hours, (int, float)) and math.isfinite(self.hours) and 0 < self.hours <= MAX_HOURS):
            raise BadInput(f"--hours must be more than 0 and at most {MAX_HOURS}, got {self.hours!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise BadInput(f"--seed must be a whole number ≥ 0, got {self.seed!r}")
        for name, value, choices in (("--policy", self.policy, POLICIES), ("--failures", self.failures, FAILURE_LEVELS),
                                     ("fleet", self.fleet, FLEETS)):
            if value not in choices:
                raise BadInput(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if self.rental is not None and self.rental not in RENTALS:
            raise BadInput(f"--rental must be one of {', '.join(RENTALS)}, got {self.rental!r}")

    @property
    def minutes(self) -> int:
        return max(1, int(round(self.hours * 60)))


class DemandCurve:
    """Proofs/hour arriving at each minute of the run, and whether the demand source is down then."""

    def __init__(self, seed: int):
        self.seed = seed
        self._noise: dict[int, float] = {}

    def rate(self, minute: int) -> float:
        hour = (minute / 60) % 24
        if QUIET[0] <= hour < QUIET[1]:
            return 0.0
        base = SWING_MEAN + SWING_AMPLITUDE * math.sin(2 * math.pi * (hour - SWING_PEAK_HOUR + 6) / 24)
        if BURST[0] <= hour < BURST[1]:
            base += BURST[2]
        return base * self._factor(minute // 10)

    def outage(self, minute: int) -> bool:
        hour = (minute / 60) % 24
        return OUTAGE[0] <= hour < OUTAGE[1]

    def coming(self, minute: int) -> float:
        """Proofs arriving within the next hour (what the look-ahead query counts)."""
        return sum(self.rate(m) for m in range(minute + 1, minute + 1 + LOOKAHEAD_MINUTES)) / 60

    def lookahead_target(self, minute: int) -> float:
        """What the operator's script sets: the coming hour's peak arrival rate, rounded up to 10."""
        peak = max(self.rate(m) for m in range(minute, minute + LOOKAHEAD_MINUTES))
        return float(math.ceil(peak / 10) * 10)

    def _factor(self, block: int) -> float:
        if block not in self._noise:
            self._noise[block] = random.Random(f"{self.seed}/demand/{block}").uniform(1 - NOISE, 1 + NOISE)
        return self._noise[block]


@dataclass
class Sample:
    """One minute of the run, for the chart."""

    minute: int
    target: float
    capacity: float  # true proofs/hour of the machines the market has proving
    believed: float  # what vastctl counts as running capacity (expected rates)
    queued: float
    spend_per_hour: float
    arrival: float


@dataclass
class DemoResult:
    options: DemoOptions
    figures: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds from each death to its kill
    launches: list[float] = field(default_factory=list)  # minutes of the run at which vastctl launched a machine
    kills: list[tuple[float, str]] = field(default_factory=list)  # (minute, kill code) of each kill
    waits: dict[int, float] = field(default_factory=dict)  # whole minutes waited → calls judged (wait_minutes)

    def to_json(self) -> dict[str, Any]:
        return dict(self.figures)


def demo_config(directory: Path, options: DemoOptions) -> Config:
    """The config a demo runs with: the simulated market, fleet limits sized for the demand curve."""
    from vastctl.providers import sim_market

    config = Config(db=str(directory / "demo.db"), provider="sim")
    config.server.url = "https://manager.demo.invalid"
    config.fleet.max_instances = 24
    config.fleet.max_hourly_spend = 15.0
    config.fleet.max_dph = 1.2
    config.fleet.gpus = [model.name for model in sim_market.GPUS]  # every model the market offers, up to max_dph
    config.fleet.min_cpu_ram_gb = 384.0  # ≥384 GiB hosts prove 84-95/h: cheaper per proof, fewer below their promise
    config.sim.seed, config.sim.failures = options.seed, options.failures
    config.demand.lookahead_window = LOOKAHEAD_MINUTES * 60.0  # the script's look-ahead counts the coming hour
    if options.rental is not None:
        config.launch.rental = options.rental
    if options.fleet == "static":
        config.agent.scale_down_after = 10 * 365 * 86400.0  # never
        config.agent.plan_horizon = 60.0  # any queue at all sizes it to the target: the old one-way fleet
    return config


class _Market:
    """The simulator's truth, read from its own tables in the demo's file (not what vastctl believes)."""

    PROVING = ("SELECT coalesce(sum(h.true_rate), 0) FROM sim_instances m JOIN sim_hosts h USING (machine_id)"
               " WHERE m.destroyed_at IS NULL AND m.listed = 1 AND m.actual_status = 'running'"
               " AND m.proving_since IS NOT NULL AND m.paused_at IS NULL AND m.refused_at IS NULL"
               " AND m.died_at IS NULL")

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def proving_rate(self) -> float:
        return float(self.conn.execute(self.PROVING).fetchone()[0])


def run(options: DemoOptions, directory: Path, *, env: Mapping[str, str] | None = None,
        progress: Callable[[int, int], None] | None = None,
        configure: Callable[[Config], None] | None = None) -> DemoResult:
    """Run the demo in `directory` (a fresh, empty directory the caller owns) and return its figures.

    `configure` may change the demo's config before the run (the control-loop bench tries settings with it).
    """
    from vastctl import markets
    from vastctl.agent import step
    from vastctl.observe import observe
    from vastctl.providers.sim import SimProvider

    options.check()
    config = demo_config(directory, options)
    if configure is not None:
        configure(config)
    tokens.ensure_secret(config.secret_path)
    clock = VirtualClock(START)
    conn = db.connect(config.db_path, now=clock.now(), create=True)
    market = markets.get_provider(config, conn=conn, clock=clock)
    assert isinstance(market, SimProvider)  # demo_config names provider: sim
    truth = _Market(conn)
    curve = DemandCurve(options.seed)
    peak = max(curve.lookahead_target(m) for m in range(0, 24 * 60, TARGET_EVERY_MINUTES))
    env = {} if env is None else env

    backlog = arrived = done = 0.0
    calls = RoutedCalls(conn, slots=config.launch.bench_concurrency)
    done_by_minute: list[float] = []
    samples: list[Sample] = []
    target = 0.0
    counted = met = 0
    billed_at_kill: dict[int, float] = {}
    previous_cost = 0.0
    errors = {"reconcile": 0, "agent_step": 0}
    total = options.minutes
    for minute in range(total):
        now = clock.now()
        arriving = curve.rate(minute)
        backlog += arriving / 60
        arrived += arriving / 60
        calls.arrive(arriving / 60)
        down = curve.outage(minute)
        if minute % TARGET_EVERY_MINUTES == 0 and not down:
            market.totals()  # the machines' reports of the minute gone by are written first: ids follow times
            wanted = peak if options.fleet == "static" else curve.lookahead_target(minute)
            settings.set_value(conn, config, "target_proofs_per_hour", wanted, source="operator", now=now)
        target = float(settings.get(conn, config, "target_proofs_per_hour"))
        queued = math.ceil(backlog - 1e-9)
        if not down:
            demand.report(conn, queued, round(sum(done_by_minute[-60:]), 1), now=now,
                          lookahead=math.ceil(curve.coming(minute) - 1e-9))
        try:
            reconcile.run_pass(conn, market, config, clock=clock)
        except VastctlError:
            errors["reconcile"] += 1  # the listing failed or was distrusted: cron's next pass retries
        try:
            step.run_step(conn, market, config, clock=clock, policy=options.policy, if_events=True, env=env)
        except VastctlError:
            errors["agent_step"] += 1
        capacity = truth.proving_rate()
        shares = market.work(backlog, STEP_S)  # the proving machines' counters count what they take
        calls.take(minute, shares)  # and the router sees it as calls
        served = sum(share.proofs for share in shares)
        backlog -= served
        done += served
        done_by_minute.append(served)
        if minute >= WARMUP_MINUTES and queued > 0:
            counted += 1
            met += capacity >= target - 1e-9
        totals = market.totals()
        billed = {record["vast_id"]: record["billed_hours"] for record in totals.instances}
        _note_kills(conn, billed, billed_at_kill, now)
        samples.append(Sample(minute=minute, target=target, capacity=capacity,
                              believed=observe(conn, config, now=now).capacity, queued=backlog,
                              spend_per_hour=(totals.cost - previous_cost) * 60, arrival=arriving))
        previous_cost = totals.cost
        clock.advance(STEP_S)
        if progress is not None:
            progress(minute + 1, total)
    calls.finish(total, config.agent.max_wait)
    totals = market.totals()
    latencies, undetected = detection_latencies(conn, totals.instances)
    figures = _figures(conn, config, options, totals, market, curve, arrived=arrived, done=done, backlog=backlog,
                       counted=counted, met=met, billed_at_kill=billed_at_kill, errors=errors,
                       waits=proof_waits(conn, calls, config.agent.max_wait),
                       latencies=latencies, undetected=undetected,
                       asked=[sample.target * (1 + config.agent.headroom) for sample in samples])
    launches, kills = _launches_and_kills(conn)
    waits = wait_minutes(conn, calls)
    conn.close()
    return DemoResult(options=options, figures=figures, samples=samples, latencies=latencies, launches=launches,
                      kills=kills, waits=waits)


def _launches_and_kills(conn: sqlite3.Connection) -> tuple[list[float], list[tuple[float, str]]]:
    """When the run launched and killed machines, in minutes from its start (for the chart's marks)."""
    def minute(text: str) -> float:
        return (clocks.parse_iso(text) - START).total_seconds() / 60

    launches = [minute(row[0]) for row in conn.execute("SELECT created_at FROM instances ORDER BY created_at")]
    kills = [(minute(row[0]), row[1] or "none") for row in conn.execute(
        "SELECT killed_at, kill_code FROM instances WHERE killed_at IS NOT NULL ORDER BY killed_at")]
    return launches, kills


def _note_kills(conn: sqlite3.Connection, billed: Mapping[int, float], billed_at_kill: dict[int, float],
                now: datetime) -> None:
    """Remember, for each machine killed since the last minute, its billed hours at the kill.

    Kills by reconcile and agent-step happen at `now`; a machine's own report (a failed
    benchmark) kills it a little earlier, and those seconds are counted as billed too.
    """
    for row in conn.execute("SELECT vast_id, killed_at FROM instances WHERE killed_at IS NOT NULL"
                            " AND vast_id IS NOT NULL"):
        if row["vast_id"] in billed_at_kill or row["vast_id"] not in billed:
            continue
        before = (now - clocks.parse_iso(row["killed_at"])).total_seconds() / 3600
        billed_at_kill[row["vast_id"]] = billed[row["vast_id"]] - max(0.0, before)


class RoutedCalls:
    """The day's proofs as the proof router records them: whole calls, each a proof_calls row.

    The market proves in fractions of a proof a minute (sim_engine.Share). Each machine keeps the fraction it
    has not yet made a call of, and takes a call at the moment within the minute its share reaches the next
    whole proof, so its calls stay within one of its proofs. Calls are first come first proved: the k-th
    call taken is the k-th proof to arrive, at the moment the arrivals (spread evenly over each minute) reach
    k. Its row, in the router's shape (route/server.py): kind porep, the machine's uuid and label, result
    completed, attempt 1, held = taken − arrived, on the prover the time one proof takes that machine at its
    true rate with `slots` calls at once (slots × 3600 / rate; the daemon's total_ms the same, its queue and
    SRS load nothing: the simulator does not split a proof further), answered (`at`) when that ends.

    A row is written (deliveries.record_calls) once the clock passes its end, as the router writes a call
    when it ends. `finish` writes, at the day's end, the calls still on a prover (taken before the end,
    answered after it) and, for each proof still queued that has waited past max_wait, a call the router
    held until the end: result expired, never sent (attempt 0, no machine), its held time its wait so far.
    Those are the late the answered calls' figures leave out (`late`); younger ones are not judged.
    """

    KIND = "porep"  # route/wire.KIND_NAMES: the demand curve's work is PoRep
    REQUEST_BYTES = 51_000_000  # a 32 GiB PoRep's C1 output, as Curio sends it (the published c1.json: ~51 MB)

    def __init__(self, conn: sqlite3.Connection, *, slots: int):
        self.conn = conn
        self.slots = slots
        self.taken = 0  # calls taken so far (the number of the last)
        self.late = 0  # expired calls `finish` wrote
        self.until = START  # past the end of every row written
        self._arrived = [0.0]  # proofs arrived by the start of each minute (and the end of the last)
        self._remainder: dict[int, float] = {}  # vast id → the fraction of a proof not yet a call
        self._pending: list[tuple[float, int, dict[str, Any]]] = []  # (end s, order, row) not yet written
        self._queued = 0

    def arrive(self, proofs: float) -> None:
        """The next minute's arrivals."""
        self._arrived.append(self._arrived[-1] + max(0.0, proofs))

    def take(self, minute: int, shares: list[Share]) -> None:
        """The machines' shares of minute `minute`'s work as calls; the calls ended by its end written."""
        begin = minute * STEP_S
        moments = []
        for share in shares:
            before = self._remainder.get(share.vast_id, 0.0)
            whole = math.floor(before + share.proofs + 1e-9)
            for j in range(1, whole + 1):  # the moment within the minute its share reaches the j-th proof
                moments.append((begin + STEP_S * min(1.0, max(0.0, (j - before) / share.proofs)), share.vast_id,
                                share))
            self._remainder[share.vast_id] = max(0.0, before + share.proofs - whole)
        for at, _vast_id, share in sorted(moments, key=lambda item: item[:2]):
            self.taken += 1
            held = max(0.0, at - self._arrival(self.taken))
            prover = self.slots * 3600 / share.rate
            self._queue(at + prover, {"request_id": f"sim-{self.taken}", "kind": self.KIND, "uuid": share.uuid,
                                      "label": share.label, "result": "completed", "held_ms": _ms(held),
                                      "prover_ms": _ms(prover), "attempt": 1, "size_bytes": self.REQUEST_BYTES,
                                      "queue_wait_ms": 0, "srs_load_ms": 0, "total_ms": _ms(prover)})
        self._write(begin + STEP_S)

    def finish(self, minutes: int, max_wait_s: float) -> None:
        """At the end of minute `minutes`: every call taken written, and the late proofs still queued."""
        end = minutes * STEP_S
        self._write(math.inf)
        number = self.taken
        while number + 1 <= self._arrived[-1] + 1e-9:
            number += 1
            waited = end - self._arrival(number)
            if waited <= max_wait_s:
                break  # the rest arrived later still: not yet late, not judged
            self.late += 1
            self._queue(end, {"request_id": f"sim-{number}", "kind": self.KIND, "result": "expired",
                              "held_ms": _ms(waited), "attempt": 0, "size_bytes": self.REQUEST_BYTES,
                              "detail": "still held at the end of the simulated day, past agent.max_wait"})
        self._write(math.inf)

    def _arrival(self, number: int) -> float:
        """Seconds from the start at which the arrivals reached `number` proofs."""
        index = min(len(self._arrived) - 1, max(1, bisect.bisect_left(self._arrived, number - 1e-9)))
        low, high = self._arrived[index - 1], self._arrived[index]
        return (index - 1 + (min(1.0, (number - low) / (high - low)) if high > low else 1.0)) * STEP_S

    def _queue(self, end: float, row: dict[str, Any]) -> None:
        self._queued += 1  # ties in the order queued
        heapq.heappush(self._pending, (end, self._queued, row))

    def _write(self, until: float) -> None:
        rows = []
        while self._pending and self._pending[0][0] <= until:
            end, _order, row = heapq.heappop(self._pending)
            moment = START + timedelta(seconds=end)
            rows.append({**row, "at": clocks.to_iso(moment)})
            self.until = max(self.until, moment + timedelta(microseconds=1))
        deliveries.record_calls(self.conn, rows)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def proof_waits(conn: sqlite3.Connection, calls: RoutedCalls, max_wait_s: float) -> dict[str, Any]:
    """The day's proof waits as production measures them (deliveries.proof_wait over the day's calls: held +
    proving time of each answered call, `fleet --json`'s and /metrics' figures), with the proofs still held
    past max_wait at the end counted as late in the share within it (the percentiles are the answered calls')."""
    waits = deliveries.proof_wait(conn, since=START, until=calls.until, max_wait_s=max_wait_s)
    judged = waits["calls"] + calls.late
    within = waits["within_max_wait"]
    if calls.late and judged:
        within = round((within or 0.0) * waits["calls"] / judged, 4)
    return {"judged": judged, "within": within, "p50": waits["p50_s"], "p95": waits["p95_s"], "p99": waits["p99_s"]}


def wait_minutes(conn: sqlite3.Connection, calls: RoutedCalls) -> dict[int, float]:
    """Whole minutes waited → calls judged (answered, and the late still held): the chart's histogram."""
    weights: dict[int, float] = {}
    for (wait_ms,) in conn.execute(
            "SELECT held_ms + coalesce(prover_ms, 0) FROM proof_calls WHERE at >= ? AND at < ?"
            " AND result IN ('completed', 'failed', 'expired')", (clocks.to_iso(START), clocks.to_iso(calls.until))):
        minute = int((wait_ms or 0) // 60_000)
        weights[minute] = weights.get(minute, 0.0) + 1
    return weights


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def detection_latencies(conn: sqlite3.Connection, records: list[dict[str, Any]]) -> tuple[list[float], int]:
    """Seconds from each machine's death (the market's died_at) to our kill of it; and deaths not yet killed."""
    killed = {row["vast_id"]: clocks.from_iso(row["killed_at"]) for row in conn.execute(
        "SELECT vast_id, killed_at FROM instances WHERE vast_id IS NOT NULL")}
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


def lower_bound_cost(market, config: Config, curve: DemandCurve, minutes: int, *, whole: bool = False,
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
    it, any host of the allowed models. `interruptible` prices every host at its min_bid (never outbid).
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


def least_costs(market, config: Config, curve: DemandCurve, minutes: int) -> dict[str, Any]:
    """The day's true lower bounds (vastctl.bound's program: every freedom the market gives), in $:

      honest         the hosts the fleet may rent (its models, RAM, bandwidth, reliability, price cap, a host
                     that can pass the benchmark gate), on demand
      any_host       every host of the market, no filter of the fleet's, on demand
      interruptible  the honest hosts, each rented at its min_bid (a bid that is never outbid)

    The work is the demand curve's arrivals, each proof done within agent.max_wait.
    """
    from vastctl import bound
    from vastctl.operations import DEFAULT_MIN_RELIABILITY
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

    def rentable(host: sim_market.Host, *, bid: bool, cap: float | None) -> bound.Rentable:
        prices: list[float | None] = []
        for minute, at in enumerate(moments):
            price = (sim_market.min_bid(market.seed, host, at, disk) if bid
                     else sim_market.gpu_price(host, at) + sim_market.storage_price(host, disk))
            free = host.machine_id not in taken[minute // 60]
            prices.append(price if free and (cap is None or price <= cap) else None)
        return bound.Rentable(key=host.machine_id, rate=host.true_rate, storage_dph=sim_market.storage_price(host, disk),
                              prices=prices)

    honest = [host for host in everyone if passes(host)]
    wait = config.agent.max_wait
    return {
        "honest": bound.least_cost([rentable(h, bid=False, cap=config.fleet.max_dph) for h in honest], arrivals, wait),
        "any_host": bound.least_cost([rentable(h, bid=False, cap=None) for h in everyone], arrivals, wait),
        "interruptible": bound.least_cost([rentable(h, bid=True, cap=config.fleet.max_dph) for h in honest],
                                          arrivals, wait),
    }


def _figures(conn, config, options, totals, market, curve, *, arrived, done, backlog, counted, met,
             billed_at_kill, errors, latencies, undetected, asked, waits) -> dict[str, Any]:
    kills: dict[str, int] = {}
    for row in conn.execute("SELECT kill_code, count(*) AS n FROM instances WHERE state = 'killed'"
                            " GROUP BY kill_code ORDER BY kill_code"):
        kills[row["kill_code"] or "none"] = row["n"]
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
    launched = conn.execute("SELECT count(*) FROM instances").fetchone()[0]
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


def check_keep(path: Path) -> None:
    """--keep FILE: a new file in a directory that exists (an operator's state file is never overwritten)."""
    if any(Path(f"{path}{suffix}").exists() for suffix in KEPT_BESIDE):
        raise BadInput(f"--keep {path}: the file (or {path}.secret, {path}.admin-token) already exists: name a new file")
    if not path.resolve().parent.is_dir():
        raise BadInput(f"--keep {path}: the directory {path.resolve().parent} does not exist")


KEPT_BESIDE = ("", ".secret", ".admin-token")  # the kept file and what is kept beside it


def keep_state(directory: Path, path: Path) -> str:
    """Copy the demo's state file out of its scratch `directory` as one self-contained file (SQLite's backup:
    the write-ahead log folded in), its token secret beside it and a fresh admin token for its dashboard (which
    serve reads from beside the file when no config names one), all readable by the owner only. The token."""
    import os
    import secrets
    import shutil

    check_keep(path)
    source = sqlite3.connect(directory / "demo.db")
    target = sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    secret = Path(f"{path}.secret")
    shutil.copyfile(directory / "demo.db.secret", secret)
    token = secrets.token_urlsafe(32)
    fd = os.open(config_module.admin_token_file(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    for name in (path, secret):
        os.chmod(name, 0o600)
    return token


def end_of(options: DemoOptions) -> str:
    """The simulated clock's time at the end of the run (where `serve --as-of` shows the kept file)."""
    return clocks.parse_iso(clocks.to_iso(START + timedelta(minutes=options.minutes))).strftime("%Y-%m-%dT%H:%M:%SZ")


CHART_COLOURS = {  # the dashboard's chart draws target, capacity, queue and spend in these (dashboard.css)
    "arrival": "#bbbbbb", "target": "#d62728", "capacity": "#1f77b4", "proving": "#2ca02c", "queue": "#9467bd",
    "spend": "#8c564b", "outage": "#ffdd99", "launch": "#444444",
}
KILL_COLOURS = ("#e377c2", "#ff7f0e", "#17becf", "#bcbd22", "#7f7f7f", "#9edae5", "#c49c94", "#98df8a", "#aec7e8",
                "#ffbb78")


def write_chart(result: DemoResult, path: Path) -> None:
    """The run on one page, as SVG or PNG by the file's extension (matplotlib): work arriving, target and capacity
    with launches, kills (by reason) and the demand outage marked; the queue; spend per hour and cumulative;
    how long proofs waited."""
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise BadInput(f"--chart {path}: the file must end in .svg or .png")
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "vastctl-demo"  # the same run writes the same SVG
    from matplotlib import pyplot

    colour = CHART_COLOURS
    samples = result.samples
    hours = [sample.minute / 60 for sample in samples]
    end = hours[-1] if hours else 0.0
    figure = pyplot.figure(figsize=(11, 10.5))
    grid = figure.add_gridspec(4, 1, height_ratios=[3, 1.2, 1.3, 1.5], hspace=0.35)
    rates = figure.add_subplot(grid[0])
    queue = figure.add_subplot(grid[1], sharex=rates)
    spend = figure.add_subplot(grid[2], sharex=rates)
    waits_axis = figure.add_subplot(grid[3])

    rates.plot(hours, [s.arrival for s in samples], color=colour["arrival"], linewidth=0.8, label="work arriving")
    rates.plot(hours, [s.target for s in samples], color=colour["target"], linewidth=1.6, label="target")
    rates.plot(hours, [s.believed for s in samples], color=colour["capacity"], linewidth=0.9, linestyle="--",
               label="capacity vastctl counts")
    rates.plot(hours, [s.capacity for s in samples], color=colour["proving"], linewidth=1.4,
               label="capacity proving (simulator)")
    top = max([s.arrival for s in samples] + [s.target for s in samples] + [s.capacity for s in samples] + [1.0])
    launched = [minute / 60 for minute in result.launches if minute / 60 <= end]
    if launched:
        rates.plot(launched, [-0.03 * top] * len(launched), linestyle="none", marker="^", markersize=5,
                   color=colour["launch"], label=f"launch ({len(launched)})")
    by_reason: dict[str, list[float]] = {}
    for minute, code in result.kills:
        if minute / 60 <= end:
            by_reason.setdefault(code, []).append(minute / 60)
    for index, (code, moments) in enumerate(sorted(by_reason.items())):
        rates.plot(moments, [-0.07 * top] * len(moments), linestyle="none", marker="v", markersize=6,
                   color=KILL_COLOURS[index % len(KILL_COLOURS)], label=f"kill: {code} ({len(moments)})")
    rates.set_ylim(-0.1 * top, top * 1.08)
    rates.set_ylabel("proofs / hour")
    figures = result.figures
    rates.set_title(f"vastctl demo: seed {figures['seed']}, policy {figures['policy']}, failures {figures['failures']}"
                    f" — attainment {_pct(figures['target_attainment'])}, ${figures['cost']:.2f},"
                    f" {figures['proofs']} proofs", fontsize=10)

    queue.plot(hours, [s.queued for s in samples], color=colour["queue"], linewidth=1.0)
    queue.set_ylabel("queued")
    spend.plot(hours, [s.spend_per_hour for s in samples], color=colour["spend"], linewidth=1.0, label="$/hour")
    spend.set_ylabel("spend $/h")
    spent = spend.twinx()
    total, cumulative = 0.0, []
    for sample in samples:
        total += sample.spend_per_hour / 60
        cumulative.append(total)
    spent.plot(hours, cumulative, color=colour["spend"], linewidth=1.2, linestyle=":", label="$ so far")
    spent.set_ylabel("$ so far")
    spend.legend(handles=spend.get_lines() + spent.get_lines(), loc="upper left", fontsize=8)
    spend.set_xlabel("simulated hours")

    outage_labelled = False
    for axis in (rates, queue, spend):
        axis.grid(True, linewidth=0.3)
        for day in range(int(end // 24) + 1 if hours else 0):
            if day * 24 + OUTAGE[0] <= end:
                label = None if outage_labelled or axis is not rates else "demand source down (nothing reported)"
                axis.axvspan(day * 24 + OUTAGE[0], min(end, day * 24 + OUTAGE[1]), color=colour["outage"], alpha=0.4,
                             linewidth=0, label=label)
                outage_labelled = outage_labelled or label is not None
    rates.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)

    if result.waits:  # each call's wait as the day's proof_calls rows hold it: the summary's figures, drawn
        figures = result.figures
        top_wait = max(1.0, (figures["proof_wait_p99_s"] or 60.0) / 60)
        waits_axis.hist([min(float(wait), top_wait) for wait in result.waits], weights=list(result.waits.values()),
                        bins=40, color=colour["queue"], alpha=0.8)
        for name, style in (("p50", "-"), ("p95", "--")):
            value = figures[f"proof_wait_{name}_s"]
            if value is None:
                continue
            waits_axis.axvline(value / 60, color="#333333", linewidth=1.0, linestyle=style,
                               label=f"{name} {value / 60:.0f} min")
        waits_axis.set_yscale("log")  # most proofs wait their proving time alone: the tail would not show on a linear axis
        waits_axis.legend(loc="upper right", fontsize=8)
    waits_axis.set_xlabel("minutes a proof waited, arrival to its answer: held, then proving (first in, first out;"
                          " the top 1% at the right)")
    waits_axis.set_ylabel("proofs")
    waits_axis.grid(True, linewidth=0.3)
    metadata = {"Date": None} if suffix == ".svg" else {"Software": None}
    figure.savefig(path, format=suffix[1:], metadata=metadata, bbox_inches="tight")
    pyplot.close(figure)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"
