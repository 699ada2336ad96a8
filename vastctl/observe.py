"""The one Observation every decision reads: built once per decision from the state file.

reconcile's guard, agent-step (rules and llm), the operator commands' guard and
`fleet`'s summary all read capacity, spend and demand from here, so a change
in how capacity is counted changes it everywhere at once.

  capacity          sum of the expected rates of machines in state `running`
  pending_capacity  the same for machines on their way (launching .. bench_done)
  expected rate     measured proofs/hour, else the machine's bench rate, else the
                    median bench rate seen for its GPU model, else fleet.default_rate;
                    every figure a machine reported is bounded first (lifecycle.rate_ceiling,
                    measured_rate_bound), and a machine with an `implausible_rate` event counts
                    for no more than its model's rate among the machines that never over-claimed
  spend_per_hour    $/h of every live machine that is not stopped (GPU billed)

Nothing here calls a provider or runs the demand command: demand is the newest
sample (demand.refresh() takes a new one first when the caller wants it).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from . import demand as demand_module
from . import fleet, lifecycle, settings
from .config import Config
from .demand import Demand
from .lifecycle import LIVE_STATES, State

__all__ = ["Demand", "Observation", "observe"]

PENDING_STATES = frozenset({State.LAUNCHING, State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE})
BILLING_STATES = LIVE_STATES - {State.STOPPED}
EVENTS_KEPT = 200  # newest events after the cursor one observation carries


@dataclass
class Observation:
    now: datetime
    settings: dict
    demand: Demand
    machines: list[dict]
    capacity: float
    pending_capacity: float
    spend_per_hour: float
    events: list[dict]
    last_actions: list[dict]
    model_rates: dict[str, float] = field(default_factory=dict)  # GPU model → median bench rate seen

    def running(self) -> list[dict]:
        return [m for m in self.machines if m["state"] == State.RUNNING]

    def live(self) -> list[dict]:
        return [m for m in self.machines if m["state"] in LIVE_STATES]

    def to_prompt(self) -> dict:
        """A compact, JSON-able view for the model: numbers first, one short line of facts per machine."""
        return {
            "now": _iso(self.now),
            "settings": dict(self.settings),
            "demand": self.demand.view(),
            "capacity_proofs_per_hour": round(self.capacity, 1),
            "pending_capacity_proofs_per_hour": round(self.pending_capacity, 1),
            "spend_per_hour": round(self.spend_per_hour, 3),
            "expected_rate_by_gpu": {name: round(rate, 1) for name, rate in sorted(self.model_rates.items())},
            "machines": [_machine_brief(m) for m in self.machines],
            "events": [{k: e.get(k) for k in ("id", "at", "label", "from_state", "to_state", "reason", "source",
                                               "code", "kind")} for e in self.events],
            "last_actions": list(self.last_actions),
        }


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _machine_brief(machine: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("label", "state", "vast_status", "gpu_name", "num_gpus", "dph", "bench_rate", "proofs_per_hour",
            "expected_rate", "state_since", "last_heartbeat_at", "disagreement", "resumes", "kill_reason",
            "implausible_claims")
    return {k: machine.get(k) for k in keys if machine.get(k) is not None}


def model_rates(conn: sqlite3.Connection, implausible: Iterable[str] = ()) -> dict[str, float]:
    """GPU model → the median bench rate seen for it, over every machine that ever reported one, each bounded
    by its ceiling, without the machines in `implausible` (their word does not set what a model proves)."""
    liars = set(implausible)
    rates: dict[str, list[float]] = defaultdict(list)
    for row in conn.execute("SELECT uuid, gpu_name, num_gpus, bench_rate FROM instances WHERE bench_rate IS NOT NULL"
                            " AND gpu_name IS NOT NULL"):
        if row["uuid"] not in liars:
            rates[row["gpu_name"]].append(lifecycle.bounded(row["bench_rate"], lifecycle.rate_ceiling(dict(row))))
    return {name: statistics.median(values) for name, values in rates.items()}


def implausible_claims(conn: sqlite3.Connection) -> dict[str, int]:
    """uuid → how many of its reports were bounded as implausible (lifecycle.IMPLAUSIBLE events)."""
    return {row["uuid"]: row["n"] for row in conn.execute(
        "SELECT uuid, count(*) AS n FROM events WHERE kind = ? AND uuid IS NOT NULL GROUP BY uuid",
        (lifecycle.IMPLAUSIBLE,))}


def rate_of_model(gpu_name: str | None, rates: Mapping[str, float], default_rate: float) -> float:
    """What a machine of this model is expected to prove per hour before it has proved anything."""
    return float(rates.get(gpu_name, default_rate)) if gpu_name else float(default_rate)


def expected_rate(row: Mapping[str, Any], rates: Mapping[str, float], default_rate: float, *,
                  implausible: bool = False) -> float:
    """What one machine proves per hour: measured, else benchmarked, else its model's rate; each figure bounded
    by what the machine can plausibly prove, and a machine caught over-claiming by its model's rate."""
    model = rate_of_model(row.get("gpu_name"), rates, default_rate)
    for value, bound in ((row.get("proofs_per_hour"), lifecycle.measured_rate_bound(row)),
                         (row.get("bench_rate"), lifecycle.rate_ceiling(row))):
        if value is not None:
            rate = lifecycle.bounded(value, bound)
            return min(rate, model) if implausible else rate
    return model


def capacity(machines: Iterable[Mapping[str, Any]]) -> float:
    return sum(m["expected_rate"] for m in machines if m["state"] == State.RUNNING)


def pending_capacity(machines: Iterable[Mapping[str, Any]]) -> float:
    return sum(m["expected_rate"] for m in machines if m["state"] in PENDING_STATES)


def spend_per_hour(rows: Iterable[Mapping[str, Any]]) -> float:
    """$/h of the machines billing GPU time (live and not stopped)."""
    return sum(float(row.get("dph") or 0.0) for row in rows if row["state"] in BILLING_STATES)


def machine_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every row not yet destroyed, as the file has it."""
    return [dict(row) for row in conn.execute(
        "SELECT * FROM instances WHERE destroyed_at IS NULL ORDER BY created_at, label")]


def _resumes(conn: sqlite3.Connection) -> dict[str, int]:
    """uuid → how many times the machine was resumed (stopped → launching)."""
    return {row["uuid"]: row["n"] for row in conn.execute(
        "SELECT uuid, count(*) AS n FROM events WHERE from_state = 'stopped' AND to_state = 'launching'"
        " GROUP BY uuid")}


def last_step_actions(conn: sqlite3.Connection) -> list[dict]:
    """The actions (with their results) of the agent's previous step that ran (not skipped, not a dry run)."""
    row = conn.execute("SELECT actions, refused FROM agent_steps WHERE outcome IN ('ok', 'error')"
                       " ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return []
    return stored_json(row["actions"]) + stored_json(row["refused"])


def stored_json(text: str | None, kind: type = list) -> Any:
    """A stored JSON value of type `kind` (list or dict); an empty one when absent, unreadable or of another
    type (a file edited by hand must not stop every decision)."""
    try:
        value = json.loads(text or "null")
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


def observe(conn: sqlite3.Connection, config: Config, *, now: datetime,
            events_since: int | None = None) -> Observation:
    """One snapshot for one decision. `events_since`: the event cursor (None: no events)."""
    rows = machine_rows(conn)
    flagged = implausible_claims(conn)
    rates = model_rates(conn, flagged)
    resumes = _resumes(conn)
    machines = []
    for row in rows:
        view = fleet.instance_view(row)
        view["expected_rate"] = expected_rate(row, rates, config.fleet.default_rate,
                                              implausible=row["uuid"] in flagged)
        view["machine_id"] = row.get("machine_id")
        view["resumes"] = resumes.get(row["uuid"], 0)
        if row["uuid"] in flagged:
            view["implausible_claims"] = flagged[row["uuid"]]
        machines.append(view)
    return Observation(
        now=now,
        settings=settings.effective(conn, config),
        demand=demand_module.current(conn, config, now=now),
        machines=machines,
        capacity=capacity(machines),
        pending_capacity=pending_capacity(machines),
        spend_per_hour=spend_per_hour(rows),
        events=[] if events_since is None else fleet.events(conn, since=events_since, limit=EVENTS_KEPT),
        last_actions=last_step_actions(conn),
        model_rates=rates,
    )
