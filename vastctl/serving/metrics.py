"""`GET /metrics`: the fleet in Prometheus' text format, read from the state file at each scrape.

Nothing is counted in memory: every value comes from the file when
Prometheus asks, so a restart of `serve` loses nothing and a scrape shows what
reconcile and the agent (other processes) did. Totals that the file derives
from rows it keeps (kills from the instances table, agent figures from
`agent_steps`) are exported as counters. jobs/prometheus-alerts.yml names
these metrics; tests/test_metrics.py checks it names no other.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Iterator, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from vastctl import guard
from vastctl.config import Config
from vastctl.facts import cost, deliveries
from vastctl.observe import observe
from vastctl.state.lifecycle import State
from vastctl.views import fleet, overview

if TYPE_CHECKING:
    from vastctl.facts.cost import CostView
    from vastctl.facts.demand import DemandView
    from vastctl.views.fleet import RouterStatus
    from vastctl.views.overview import AgentTotals, DestroysPending, ReconcileStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(conn: sqlite3.Connection, config: Config, now: datetime) -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FleetCollector(conn, config, now))
    return generate_latest(registry)


class _FleetCollector:
    def __init__(self, conn: sqlite3.Connection, config: Config, now: datetime):
        self.conn, self.config, self.now = conn, config, now

    def collect(self) -> Iterator[Metric]:
        conn, config, now = self.conn, self.config, self.now
        obs = observe(conn, config, now=now)
        summary = fleet.fleet_view(conn, config, now=now, obs=obs, listed=False)["summary"]
        limits = obs.settings

        machines = GaugeMetricFamily("vastctl_machines", "Machines by our state (killed: not yet destroyed at vast).",
                                     labels=["state"])
        for state in State:
            machines.add_metric([str(state)], summary["by_state"].get(str(state), 0))
        yield machines
        yield _gauge("vastctl_capacity_proofs_per_hour",
                     "Expected proofs/hour of running machines that can prove (the sum of fleet's counted/h; `fleet`"
                     " and the dashboard show it to one decimal).",
                     summary["capacity_proofs_per_hour"])
        yield _gauge("vastctl_pending_capacity_proofs_per_hour", "Expected proofs/hour of machines not yet running.",
                     obs.pending_capacity)
        yield _gauge("vastctl_target_proofs_per_hour", "The target_proofs_per_hour setting.",
                     limits["target_proofs_per_hour"])
        yield _gauge("vastctl_spend_dollars_per_hour", "$/hour vast bills for our machines (GPU and disk),"
                     " as far as the state file and the last vast listing know (`fleet` and the dashboard show it"
                     " to the cent).", summary["spend_per_hour"])
        yield _gauge("vastctl_max_hourly_spend_dollars_per_hour", "The max_hourly_spend setting.",
                     limits["max_hourly_spend"])
        yield _gauge("vastctl_spent_today_dollars", "$ spent since 00:00 UTC, vastctl's account (as `vastctl cost"
                     " --since` that midnight): what max_daily_spend is checked against.", obs.spent())
        yield _gauge("vastctl_max_daily_spend_dollars", "The max_daily_spend setting.", limits["max_daily_spend"])
        yield _gauge("vastctl_max_instances", "The max_instances setting.", limits["max_instances"])
        yield _gauge("vastctl_warm_machines", "Machines in the floor of agent.min_machines: proving, or booting and"
                     " not dead at vast (guard.warm).", sum(guard.warm(m, config, now) for m in obs.machines))
        yield _gauge("vastctl_min_machines", "The agent.min_machines floor (0: none).", config.agent.min_machines)
        yield _gauge("vastctl_disagreements", "Machines whose state here and at vast disagree.",
                     summary["disagreements"])
        yield from _demand(overview.demand_view(obs))
        yield from _reconcile(overview.reconcile_status(conn, now), overview.destroys_pending(conn, now))
        kills = CounterMetricFamily("vastctl_kills", "Machines killed, by kill code.", labels=["code"])
        for code, count in overview.kills_by_code(conn).items():
            kills.add_metric([code], count)
        yield kills
        yield from _agent(overview.agent_totals(conn))
        yield from _cost(cost.account(conn, now=now))
        yield from _router(summary["router"], overview.route_results(conn, now))


def _router(router: RouterStatus, results: dict[str, int]) -> Iterator[Metric]:
    yield _gauge("vastctl_route_running", "1 when the proof router wrote its status within the last 30 s.",
                 1 if router["router_running"] else 0)
    yield _gauge("vastctl_route_held_calls", "Calls the proof router holds for a free prover.", router["held"])
    yield _gauge("vastctl_route_oldest_held_seconds", "How long the oldest held call has waited (0: none held).",
                 router["oldest_held_s"] or 0.0)
    yield _gauge("vastctl_route_calls_on_provers", "Calls the proof router has on provers now.", router["in_flight"])
    wait = router["proof_wait_last_day"]
    quantiles = GaugeMetricFamily("vastctl_proof_wait_seconds", "Held + proving time of the calls the router"
                                  " answered in the last 24 h, by quantile, in seconds to the millisecond (`fleet`"
                                  " and the dashboard show them rounded; NaN: none answered).", labels=["quantile"])
    for quantile, seconds in (("0.5", wait["p50_s"]), ("0.95", wait["p95_s"]), ("0.99", wait["p99_s"])):
        quantiles.add_metric([quantile], math.nan if seconds is None else seconds)
    yield quantiles
    yield _gauge("vastctl_proofs_within_max_wait_ratio", "Share of the calls answered in the last 24 h done within"
                 " agent.max_wait of arriving at the router (NaN: none answered).",
                 math.nan if wait["within_max_wait"] is None else wait["within_max_wait"])
    calls = GaugeMetricFamily("vastctl_route_calls_last_day", "The router's attempts that ended in the last 24 h, by"
                              " result (completed and failed: the calls answered that proof wait is measured over;"
                              " vastctl_cost_proofs counts since the state file began).", labels=["result"])
    for result in deliveries.RESULTS:
        calls.add_metric([result], results.get(result, 0))
    yield calls


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


def _timestamp(moment: datetime | None) -> float:
    """Seconds since the epoch; 0 for never, so `time() - x` alerts fire on a file that never saw one."""
    return 0.0 if moment is None else moment.timestamp()


def _demand(demand: DemandView | None) -> Iterator[Metric]:
    """Demand as the decisions read it (observe): NaN while unknown, so `queued > 0` alerts stay quiet then."""
    yield _gauge("vastctl_demand_known", "1 when the newest demand sample is good and fresh (demand.stale_after).",
                 bool(demand is not None and demand["known"]))
    for name, key, documentation in _DEMAND_GAUGES:
        value = None if demand is None else demand[key]
        yield _gauge(name, documentation, math.nan if value is None else value)


_DEMAND_GAUGES: tuple[tuple[str, Literal["queued", "in_flight", "lookahead", "proofs_per_hour", "age_s"], str], ...] = (
    ("vastctl_demand_queued", "queued", "Proofs queued, as of the newest demand sample (NaN: unknown)."),
    ("vastctl_demand_in_flight", "in_flight",
     "Proofs claimed and waiting or proving at a daemon, newest sample (NaN: unknown or not reported)."),
    ("vastctl_demand_lookahead", "lookahead",
     "Proofs about to be queued (PoRep look-ahead), newest sample (NaN: unknown or not reported)."),
    ("vastctl_demand_proofs_per_hour", "proofs_per_hour", "Demanded proofs/hour, newest sample (NaN: unknown)."),
    ("vastctl_demand_age_seconds", "age_s", "Age of the newest demand sample (NaN: none kept)."),
)


def _reconcile(status: ReconcileStatus, pending: DestroysPending) -> Iterator[Metric]:
    yield _gauge("vastctl_reconcile_last_success_timestamp_seconds", "When reconcile last listed vast successfully.",
                 _timestamp(status["last_success"]))
    yield _gauge("vastctl_reconcile_last_attempt_timestamp_seconds", "When reconcile last tried to list vast.",
                 _timestamp(status["last_attempt"]))
    yield _gauge("vastctl_reconcile_consecutive_failures", "Failed vast listings since the last good one.",
                 status["consecutive_failures"])
    yield _gauge("vastctl_reconcile_failures_last_day", "Failed vast listings in the last 24 hours.",
                 status["failures_last_day"])
    yield _gauge("vastctl_reconcile_passes_last_day", "vast listings (reconcile passes) in the last 24 hours.",
                 status["passes_last_day"])
    yield _gauge("vastctl_destroys_pending", "Killed machines vast has not confirmed destroyed.", pending["count"])
    yield _gauge("vastctl_destroy_pending_oldest_age_seconds", "How long the oldest pending destroy has waited.",
                 pending["oldest_age_s"])


def _agent(totals: AgentTotals) -> Iterator[Metric]:
    steps = CounterMetricFamily("vastctl_agent_steps", "Agent steps, by outcome.", labels=["outcome"])
    for outcome, count in sorted(totals["steps"].items()):
        steps.add_metric([outcome], count)
    yield steps
    tokens = CounterMetricFamily("vastctl_agent_tokens", "Model tokens the agent used, by kind.", labels=["kind"])
    for kind, count in totals["tokens"].items():
        tokens.add_metric([kind], count)
    yield tokens
    yield CounterMetricFamily("vastctl_agent_cost_dollars", "What the agent's model calls cost.", value=totals["cost"])
    yield CounterMetricFamily("vastctl_agent_refused_actions", "Agent actions the guard refused.",
                              value=totals["refused"])
    yield _gauge("vastctl_agent_last_step_timestamp_seconds", "When the agent last finished a step.",
                 _timestamp(totals["last_step"]))


def _cost(figures: CostView) -> Iterator[Metric]:
    """vastctl's account of what vast billed (cost.account, as `vastctl cost`): vast's invoice is the truth."""
    spent = GaugeMetricFamily("vastctl_cost_dollars", "$ vast billed for our machines as vastctl accounts for it"
                              " (vast's invoice is the truth), by part: rented, stopped_storage, after_kill.",
                              labels=["part"])
    for part in cost.PARTS:
        spent.add_metric([part], figures[part])
    yield spent
    yield _gauge("vastctl_cost_proofs", "Proofs since the state file began, vastctl's account (as `vastctl cost`): the"
                 " calls the proof router answered, a machine it never sent to by its own count; the count the cost"
                 " per proof divides by (vastctl_route_calls_last_day counts the last 24 h).", figures["proofs"])
    per = figures["cost_per_1000_proofs"]
    yield _gauge("vastctl_cost_per_1000_proofs_dollars", "$ per 1,000 proofs, vastctl's account (NaN: no proofs yet).",
                 math.nan if per is None else per)
    yield _gauge("vastctl_cost_never_proved_dollars", "$ spent on machines that never proved (boots, failed benches,"
                 " machines dead before a first proof).", figures["never_proved_cost"])
    yield _gauge("vastctl_cost_dead_until_detected_dollars", "$ machines that had proved billed between their last"
                 " heartbeat and their kill for dying.", figures["dead_until_detected_cost"])
