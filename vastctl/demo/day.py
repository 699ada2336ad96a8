"""The simulated day: everything cron and an operator's scripts would do, minute by minute on a VirtualClock.

A fresh state file in a temporary directory (never the operator's), `provider: sim`:

  every minute   Curio's proving work arrives (setting.DemandCurve); a script reports the queue
                 (`demand report`): the proofs waiting or in flight plus those arriving within the
                 hour (the look-ahead of docs/workload.md: precommitted sectors reach PoRep ~75 min
                 later), except during the outage of the demand source, when nothing is reported
                 and demand goes unknown after demand.stale_after;
                 `reconcile`, then `agent-step --if-events`, as cron runs them;
                 the machines the market says are proving take work off the queue at their true rates,
                 and the proof router sees it as calls (calls.RoutedCalls)
  every 10 min   the operator's script sets target_proofs_per_hour to the peak arrival rate of the
                 coming hour (the look-ahead of docs/workload.md: precommitted sectors arrive ~75 min
                 later), rounded up to 10; it keeps the last target while the demand source is down

The figures are the simulator's truth, not what vastctl believes: capacity is
the sum of the true proof rates of the machines the market has proving at that
minute (a machine vastctl counts as running but that died, or proves slower
than it benchmarked, does not count in full), cost is the market's billing,
proofs are the ones actually taken off the queue. `target_attainment` is the
fraction of the minutes after the first hour (warm-up: a first machine takes
20-40 minutes to boot) with work queued during which that capacity was at
least the target. The proof waits are production's, from the router's calls
(calls.proof_waits).

The same seed gives the same figures to the digit: the market, the demand, the
clock and the machines' labels are all functions of the seed, and no wall-clock
time enters.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from vastctl import clock as clocks
from vastctl import identities, reconcile
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.demo.calls import RoutedCalls, proof_waits, wait_minutes
from vastctl.demo.figures import detection_latencies, summary
from vastctl.demo.setting import START, STEP_S, TARGET_EVERY_MINUTES, WARMUP_MINUTES, DemandCurve, DemoOptions, demo_config
from vastctl.errors import VastctlError
from vastctl.facts import demand
from vastctl.state import db, instances, settings, tokens

if TYPE_CHECKING:  # the simulator is imported where it is used
    from vastctl.providers.sim_store import InstanceRecord


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
    figures: dict[str, Any]  # summary()'s DaySummary, and what the command adds (cli/demo.py: the accounting)
    samples: list[Sample] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds from each death to its kill
    launches: list[float] = field(default_factory=list)  # minutes of the run at which vastctl launched a machine
    kills: list[tuple[float, str]] = field(default_factory=list)  # (minute, kill code) of each kill
    waits: dict[int, float] = field(default_factory=dict)  # whole minutes waited → calls judged (wait_minutes)

    def to_json(self) -> dict[str, Any]:
        return dict(self.figures)


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
    Its machines' uuids and labels are drawn from the seed too (identities.seeded).
    """
    with identities.seeded(options.seed):
        return _run(options, directory, env=env, progress=progress, configure=configure)


def _run(options: DemoOptions, directory: Path, *, env: Mapping[str, str] | None,
         progress: Callable[[int, int], None] | None, configure: Callable[[Config], None] | None) -> DemoResult:
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
                          lookahead=math.ceil(curve.coming(minute) - 1e-9), arrivals=curve.arrivals(minute),
                          later=curve.later(minute))
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
        _note_kills(conn, totals.instances, billed_at_kill, now)
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
    figures = summary(conn, config, options, totals, market, curve, arrived=arrived, done=done, backlog=backlog,
                       counted=counted, met=met, billed_at_kill=billed_at_kill, errors=errors,
                       waits=proof_waits(conn, calls, config.agent.max_wait),
                       latencies=latencies, undetected=undetected,
                       asked=[sample.target * (1 + config.agent.headroom) for sample in samples])
    launches, kills = _launches_and_kills(conn)
    waits = wait_minutes(conn, calls)
    conn.close()
    return DemoResult(options=options, figures=dict(figures), samples=samples, latencies=latencies, launches=launches,
                      kills=kills, waits=waits)


def _launches_and_kills(conn: sqlite3.Connection) -> tuple[list[float], list[tuple[float, str]]]:
    """When the run launched and killed machines, in minutes from its start (for the chart's marks)."""
    def minute(text: str) -> float:
        return (clocks.parse_iso(text) - START).total_seconds() / 60

    launches = [minute(created_at) for created_at in instances.creation_times(conn)]
    kills = [(minute(killed_at), code or "none") for killed_at, code in instances.kills(conn)]
    return launches, kills


KILLS_NOTED_WITHIN = timedelta(hours=1)  # a kill is written within a minute of its time


def _note_kills(conn: sqlite3.Connection, records: list[InstanceRecord], billed_at_kill: dict[int, float],
                now: datetime) -> None:
    """Remember, for each machine killed since the last minute, its billed hours at the kill.

    Kills by reconcile and agent-step happen at `now`; a machine's own report (a failed
    benchmark) kills it a little earlier, and those seconds are counted as billed too. Only the kills of the last
    KILLS_NOTED_WITHIN are read (a kill is never undone, nor written with a time so far back): the rows of a long
    run's dead machines are not read again at every minute.
    """
    kills = instances.kill_times(conn, since=clocks.to_iso(now - KILLS_NOTED_WITHIN))
    if all(vast_id in billed_at_kill for vast_id, _killed_at in kills):
        return
    billed = {record["vast_id"]: record["billed_hours"] for record in records}
    for vast_id, killed_at in kills:
        if killed_at is None or vast_id in billed_at_kill or vast_id not in billed:
            continue
        before = (now - clocks.parse_iso(killed_at)).total_seconds() / 3600
        billed_at_kill[vast_id] = billed[vast_id] - max(0.0, before)
