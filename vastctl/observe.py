"""The one Observation every decision reads: built once per decision from the state file.

reconcile's guard, agent-step (rules and llm), the operator commands' guard and
`fleet`'s summary all read capacity, spend and demand from here, so a change
in how capacity is counted changes it everywhere at once.

  capacity          sum of the expected rates of machines in state `running`
  pending_capacity  the same for machines on their way (launching .. bench_done)
  expected rate     measured proofs/hour, else the machine's bench rate, else the
                    median bench rate seen for its GPU model, else fleet.default_rate;
                    every figure a machine reported was bounded when it was stored (plausible.py:
                    rate_ceiling, measured_rate_bound), and a machine with an `implausible_rate` event counts
                    for no more than its model's rate among the machines that never over-claimed.
                    Those are claims: where the proof router saw the machine complete
                    deliveries.ROUTED_MIN_PROOFS calls in the last hour, its figures win: the
                    rate is held within [routed rate, routed rate max] (deliveries.routed_rates;
                    one figure when the router kept it full), within plausible.rate_ceiling.
                    `rate_source` says which figure it is: router, heartbeats, bench, gpu_model,
                    default. The model's rate (model_rates) stays the bench rates' median: it
                    predicts a machine not yet rented, and every machine benched the same way
  spend_per_hour    $/h vast bills us, as far as the file and the last good listing know: every
                    machine of ours, by whichever of the two heard of it last (the rules at facts/spend.py's billing())
  spent_today       $ spent since 00:00 UTC, as `vastctl cost` accounts it (facts/cost.py): what
                    max_daily_spend is checked against

Nothing here calls a provider or runs the demand command: demand is the newest
sample (demand.refresh() takes a new one first when the caller wants it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, TypedDict, cast

from vastctl import clock as clock_module
from vastctl.config import Config
from vastctl.facts import cost as cost_module
from vastctl.facts import deliveries, tunnel
from vastctl.facts import demand as demand_module
from vastctl.facts.demand import Demand
from vastctl.facts.spend import billing
from vastctl.state import instances, kept_rows, settings
from vastctl.state.lifecycle import LIVE_STATES, VAST_DEAD_CODES, State
from vastctl.state.plausible import rate_ceiling
from vastctl.state.rates import IMPLAUSIBLE
from vastctl.state.rows import EventFacts, InstanceRow

__all__ = ["Demand", "Observation", "observe"]

PENDING_STATES = frozenset({State.LAUNCHING, State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE})
RATE_DIGITS = 1  # the model is shown proofs/hour to one decimal, as `fleet` shows them
BRIEF_TIMES = ("state_since", "last_heartbeat_at", "joined_at", "tunnel_down_since", "outbid_since")
EVENTS_KEPT = 200  # newest events after the cursor one observation carries


class MachineFacts(TypedDict):
    """One machine's facts as machine_facts() reads them from its row (stored values: displays format them)."""

    uuid: str
    label: str
    state: str
    vast_id: int | None
    vast_status: str | None  # None while the listings miss it: not the last status it had, as if current
    gpu_name: str | None
    num_gpus: int | None
    bench_rate: float | None
    dph: float | None
    proofs_per_hour: float | None
    proofs_done: int
    state_since: str
    last_heartbeat_at: str | None
    kill_reason: str | None
    kill_code: str | None
    destroyed_at: str | None
    vast_missing: int
    vast_seen_at: str | None
    last_contact_at: str | None  # its last report of any kind, where the caller added it to the row (fleet)
    vast_status_msg: str | None
    disagreement: str | None
    tunnel_port: int | None
    joined: bool | None  # launch.join ssh: the manager reaches its daemon through its tunnel (None: no tunnel)
    joined_at: str | None
    tunnel_down_since: str | None


class _Flagged(TypedDict, total=False):
    implausible_claims: int  # only where some of its reports were bounded as implausible (rates.IMPLAUSIBLE)


def _flags(claims: int | None) -> _Flagged:
    return {} if claims is None else {"implausible_claims": claims}


class Machine(MachineFacts, _Flagged):
    """One machine as a decision reads it: its facts and what the observation counts it for."""

    expected_rate: float
    rate_source: str  # router, heartbeats, bench, gpu_model or default
    routed_rate: float | None
    routed_rate_max: float | None
    routed_proofs: int
    machine_id: int | None
    resumes: int
    billed_per_hour: float
    bid: float | None
    ask_dph: float | None
    outbid_since: str | None


class Work(TypedDict):
    """The work a demand sample names (what sizing.needed sizes the fleet to); None: the source said nothing."""

    queued: int | None
    in_flight: int | None
    lookahead: int | None
    proofs_per_hour: float | None


class DemandSample(Work):
    """A demand_samples row as the rules read it: its time parsed, ok a bool."""

    at: datetime
    ok: bool


@dataclass
class Observation:
    now: datetime
    settings: dict[str, float | int]  # every setting in force (settings.effective)
    demand: Demand
    machines: list[Machine]
    capacity: float
    pending_capacity: float
    spend_per_hour: float
    events: list[EventFacts]
    last_actions: list[dict[str, Any]]
    model_rates: dict[str, float] = field(default_factory=dict)  # GPU model → median bench rate seen
    host_rates: dict[int, float] = field(default_factory=dict)  # vast machine_id → its newest bench rate
    # demand samples of the last agent.scale_down_after, oldest first: what the rules release capacity against
    demand_history: list[DemandSample] = field(default_factory=list)
    # the newest good demand sample, whatever its age: what the rules hold the fleet to while demand is unknown
    last_known_demand: DemandSample | None = None
    # what the proof router holds now (its route_status; fresh False: no router running)
    router: deliveries.Held = field(default_factory=lambda: deliveries.Held(fresh=False))
    spent_today: float | None = None  # $ since 00:00 UTC (cost.spent_today); None until spent() first reads it
    min_machines: int = 0  # agent.min_machines: the floor of warm machines the guard and the rules keep
    day_spend: Callable[[], float] | None = field(default=None, repr=False, compare=False)
    # the rows not yet destroyed it was built from, as the file has them (what fleet_view lists, read once)
    rows: list[InstanceRow] = field(default_factory=list, repr=False, compare=False)

    def spent(self) -> float:
        """$ spent since 00:00 UTC, what max_daily_spend is checked against: read from the file the first time a
        decision asks (a launch or start to check, the model's prompt), as it reads every machine's billing and
        most observations never need it."""
        if self.spent_today is None:
            self.spent_today = float(self.day_spend()) if self.day_spend is not None else 0.0
        return self.spent_today

    def running(self) -> list[Machine]:
        return [m for m in self.machines if m["state"] == State.RUNNING]

    def live(self) -> list[Machine]:
        return [m for m in self.machines if m["state"] in LIVE_STATES]

    def to_prompt(self) -> dict[str, Any]:
        """A compact, JSON-able view for the model: numbers first, one short line of facts per machine."""
        return {
            "now": _iso(self.now),
            "settings": dict(self.settings),
            "demand": self.demand.view(),
            # the proof router's held calls (demand.held) and the oldest one's age: calls waiting for a prover now
            **({"router": {"held": self.router.held, "oldest_held_s": self.router.view()["oldest_held_s"],
                           "on_provers": self.router.in_flight}} if self.router.fresh else {}),
            "capacity_proofs_per_hour": round(self.capacity, 1),
            "pending_capacity_proofs_per_hour": round(self.pending_capacity, 1),
            "spend_per_hour": round(self.spend_per_hour, 3),
            "spent_today": round(self.spent(), 2),
            "min_machines": self.min_machines,
            "expected_rate_by_gpu": {name: round(rate, 1) for name, rate in sorted(self.model_rates.items())},
            "machines": [_machine_brief(m) for m in self.machines],
            "events": [{k: clock_module.display_iso(e.get(k)) if k == "at" else e.get(k)
                        for k in ("id", "at", "label", "from_state", "to_state", "reason", "source", "code", "kind")}
                       for e in self.events],
            "last_actions": list(self.last_actions),
            # while demand is unknown the rules hold the fleet to what this sample needed (sizing.wanted_capacity)
            **({"last_known_demand": {k: _iso(self.last_known_demand["at"]) if k == "at" else v
                                      for k, v in self.last_known_demand.items() if k != "ok"}}
               if not self.demand.known and self.last_known_demand is not None else {}),
        }


def disagreement(row: Mapping[str, Any]) -> str | None:
    """Where our state and vast's (as of the last good listing) tell different stories, in words; else None."""
    state, status = row.get("state"), row.get("vast_status")
    missing = int(row.get("vast_missing") or 0)
    if state == State.KILLED:
        if row.get("destroyed_at"):
            return None
        if row.get("destroy_attempts"):
            return f"killed but not destroyed at vast ({row['destroy_attempts']} failed: {row.get('destroy_error')})"
        return "killed, destroy pending" if status and not missing else None
    if missing:
        return f"missing from vast ({missing} listing{'s' if missing > 1 else ''})"
    if status is None:
        return None
    if state == State.STOPPED:
        return "stopped here but vast says running (GPU billed)" if status == "running" else None
    if status in VAST_DEAD_CODES:
        return f"{state} here but vast says {status}"
    if state == State.RUNNING and status != "running":
        return f"running here but vast says {status}"
    return None


def machine_facts(row: Mapping[str, Any]) -> MachineFacts:
    """One machine's facts from its raw row, as stored (unrounded rates, stored times): what decisions read.
    Displays format them at the edge (fleet.display, Observation.to_prompt).

    `row`: an InstanceRow, or one a view extended (`last_contact_at`); a Mapping, as views/fleet.py passes its
    own rows too."""
    missing = int(row.get("vast_missing") or 0)
    joined = tunnel.joined(cast("tunnel.TunnelFields", row))  # a Mapping: views/fleet.py passes rows it extended
    return {
        "uuid": row["uuid"], "label": row["label"], "state": row["state"], "vast_id": row.get("vast_id"),
        # vast says nothing about it now: do not show the last status it had as if current
        "vast_status": None if missing else row.get("vast_status"),
        "gpu_name": row.get("gpu_name"), "num_gpus": row.get("num_gpus"), "bench_rate": row.get("bench_rate"),
        "dph": row.get("dph"), "proofs_per_hour": row.get("proofs_per_hour"), "proofs_done": row["proofs_done"],
        "state_since": row["state_since"], "last_heartbeat_at": row.get("last_heartbeat_at"),
        "kill_reason": row.get("kill_reason"), "kill_code": row.get("kill_code"), "destroyed_at": row.get("destroyed_at"),
        "vast_missing": missing, "vast_seen_at": row.get("vast_seen_at"), "last_contact_at": row.get("last_contact_at"),
        "vast_status_msg": row.get("vast_status_msg"), "disagreement": disagreement(row),
        "tunnel_port": row.get("tunnel_port"), "joined": joined, "joined_at": row.get("joined_at") if joined else None,
        "tunnel_down_since": row.get("tunnel_down_since"),
    }


def event_facts(row: Mapping[str, Any] | sqlite3.Row) -> EventFacts:
    """One event's columns as stored."""
    return {"id": row["id"], "at": row["at"], "kind": row["kind"], "uuid": row["uuid"], "label": row["label"],
            "from_state": row["from_state"], "to_state": row["to_state"], "reason": row["reason"],
            "source": row["source"], "code": row["code"]}


def recent_events(conn: sqlite3.Connection, *, since: int, limit: int) -> list[EventFacts]:
    """The newest `limit` events after id `since`, oldest first, as stored."""
    rows = conn.execute("SELECT * FROM (SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?) ORDER BY id",
                        (since, limit))
    return [event_facts(row) for row in rows]


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _machine_brief(machine: Machine) -> dict[str, Any]:
    keys = ("label", "state", "vast_status", "gpu_name", "num_gpus", "dph", "bench_rate", "proofs_per_hour",
            "expected_rate", "rate_source", "routed_rate", "state_since", "last_heartbeat_at", "disagreement",
            "resumes", "kill_reason", "implausible_claims", "joined", "joined_at", "tunnel_down_since", "bid",
            "ask_dph", "outbid_since")
    shown: dict[str, Any] = {k: machine.get(k) for k in keys if machine.get(k) is not None}
    if "bid" in shown:  # what the model needs to rebid: the rental, its bid, its offer's on-demand price, the pause
        shown["rental"] = "interruptible"
    for name in ("proofs_per_hour", "routed_rate"):
        if name in shown:
            shown[name] = round(shown[name], RATE_DIGITS)
    for name in BRIEF_TIMES:
        if name in shown:
            shown[name] = clock_module.display_iso(shown[name])
    return shown


def bench_rates(conn: sqlite3.Connection, implausible: Iterable[str] = ()) -> tuple[dict[str, float], dict[int, float]]:
    """What machines of ours benchmarked, over every machine that ever reported a rate (each stored within its
    ceiling), without the machines in `implausible` (their word does not set what a model or a host proves):

    - GPU model → the median rate of its machines;
    - vast machine_id → the newest rate a machine of ours reported on that host: hosts of one model differ (a
      slow CPU, shared RAM), and renting a host again should expect what it proved, not what its model does.

    One read of the rows for both (the simulated loop observes twice a minute, over every machine ever); while no
    machine's benchmark columns changed since the last reading, not even that (_same_benches).
    """
    liars = set(implausible)
    reading = kept_rows.read(conn)
    kept = _BENCH_RATES[0]  # one read: another thread may replace it meanwhile
    if kept is not None and kept[0][1] == liars and _same_benches(kept[0][0], reading):
        _BENCH_RATES[0] = ((reading, liars), *kept[1:])  # the next call compares with this reading
        return dict(kept[1]), dict(kept[2])
    rows = instances.benches(conn)
    by_model: dict[str, list[float]] = defaultdict(list)
    by_host: dict[int, float] = {}
    for uuid, gpu_name, machine_id, _num_gpus, bench_rate in rows:
        if uuid in liars:
            continue
        rate = float(bench_rate)
        if gpu_name is not None:
            by_model[gpu_name].append(rate)
        if machine_id is not None:
            by_host[machine_id] = rate
    medians = {name: statistics.median(values) for name, values in by_model.items()}
    _BENCH_RATES[0] = ((reading, liars), dict(medians), dict(by_host))
    return medians, by_host


# the reading bench_rates last saw (and the machines it left out), and what it made of the rows
_BENCH_RATES: list[Any] = [None]
_BENCH_COLUMNS = ("uuid", "gpu_name", "machine_id", "num_gpus", "bench_rate", "created_at")  # what benches() reads


def _same_benches(before: kept_rows.Rows, now: kept_rows.Rows) -> bool:
    """Whether two readings give the same instances.benches(): the same machines in the same order, each with
    the same benchmark columns. A row unchanged is the very tuple kept, so a long run's dead machines cost an
    identity check each, not a tuple built each."""
    if before is now:
        return True
    if before.names != now.names or list(before.by_id) != list(now.by_id):
        return False
    columns = itemgetter(*(now.position[name] for name in _BENCH_COLUMNS))
    return all(old is new or columns(old) == columns(new) for old, new in zip(before.by_id.values(), now.by_id.values()))


def implausible_claims(conn: sqlite3.Connection) -> dict[str, int]:
    """uuid → how many of its reports were bounded as implausible (rates.IMPLAUSIBLE events)."""
    return {row["uuid"]: row["n"] for row in conn.execute(
        "SELECT uuid, count(*) AS n FROM events WHERE kind = ? AND uuid IS NOT NULL GROUP BY uuid",
        (IMPLAUSIBLE,))}


def rate_of_model(gpu_name: str | None, rates: Mapping[str, float], default_rate: float) -> float:
    """What a machine of this model is expected to prove per hour before it has proved anything."""
    return float(rates.get(gpu_name, default_rate)) if gpu_name else float(default_rate)


def expected_rate(row: Mapping[str, Any], rates: Mapping[str, float], default_rate: float, *,
                  implausible: bool = False, routed: deliveries.Routed | None = None) -> float:
    """What one machine proves per hour (rate_and_source without the source)."""
    return rate_and_source(row, rates, default_rate, implausible=implausible, routed=routed)[0]


def rate_and_source(row: Mapping[str, Any], rates: Mapping[str, float], default_rate: float, *,
                    implausible: bool = False, routed: deliveries.Routed | None = None) -> tuple[float, str]:
    """What one machine proves per hour and which figure says so: what it claims (measured, else benchmarked,
    else its model's rate; each bounded by what the machine can plausibly prove, and a machine caught
    over-claiming by its model's rate), held within what the router saw it prove when it saw enough."""
    rate, source = _claimed_rate(row, rates, default_rate, implausible=implausible)
    if routed is None or not routed.enough:
        return rate, source
    ceiling = rate_ceiling(row)
    low, high = min(routed.rate, ceiling), min(routed.rate_max, ceiling)
    if rate < low:  # it proved more than it claims
        return low, "router"
    if rate > high:  # it claims more than its calls took time for
        return high, "router"
    return rate, source


def _claimed_rate(row: Mapping[str, Any], rates: Mapping[str, float], default_rate: float, *,
                  implausible: bool) -> tuple[float, str]:
    model = rate_of_model(row.get("gpu_name"), rates, default_rate)
    for value, source in ((row.get("proofs_per_hour"), "heartbeats"), (row.get("bench_rate"), "bench")):
        if value is not None:  # stored within its bound
            rate = float(value)
            return (min(rate, model), source if rate <= model else "gpu_model") if implausible else (rate, source)
    return model, "gpu_model" if row.get("gpu_name") in rates else "default"


def capacity(machines: Iterable[Machine]) -> float:
    total: float = sum(m["expected_rate"] for m in machines if m["state"] == State.RUNNING)
    return total


def pending_capacity(machines: Iterable[Machine]) -> float:
    total: float = sum(m["expected_rate"] for m in machines if m["state"] in PENDING_STATES)
    return total


def machine_rows(conn: sqlite3.Connection) -> list[InstanceRow]:
    """Every row not yet destroyed, as the file has it, by creation then label."""
    return instances.undestroyed(conn, ordered=True)


def _resumes(conn: sqlite3.Connection, uuids: list[str]) -> dict[str, int]:
    """uuid → how many times the machine was resumed (stopped → launching), of the machines `uuids` (those
    observed, not every machine ever: the resumes of a long run's dead machines are no longer read)."""
    return {row["uuid"]: row["n"] for row in conn.execute(
        "SELECT uuid, count(*) AS n FROM events WHERE from_state = 'stopped' AND to_state = 'launching'"
        " AND uuid IN (SELECT value FROM json_each(?)) GROUP BY uuid", (json.dumps(uuids),))}


def last_step_actions(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The actions (with their results) of the agent's previous step that ran (not skipped, not a dry run)."""
    row = conn.execute("SELECT actions, refused FROM agent_steps WHERE outcome IN ('ok', 'error')"
                       " ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return []
    actions: list[dict[str, Any]] = stored_json(row["actions"])
    refused: list[dict[str, Any]] = stored_json(row["refused"])
    return actions + refused


def stored_json(text: str | None, kind: type = list) -> Any:
    """A stored JSON value of type `kind` (list or dict); an empty one when absent, unreadable or of another
    type (a file edited by hand must not stop every decision)."""
    try:
        value = json.loads(text or "null")
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


SAMPLE_COLUMNS = "at, ok, queued, in_flight, lookahead, proofs_per_hour"
HISTORY_ROWS = 2000  # newest samples read for the window: bounded whatever the file's age or the report cadence


def demand_history(conn: sqlite3.Connection, since: datetime) -> list[DemandSample]:
    """The demand samples taken at or after `since`, and the one before (in force at `since`), oldest first
    (failed ones too: they mean "unknown")."""
    rows = conn.execute(f"SELECT {SAMPLE_COLUMNS} FROM demand_samples ORDER BY id DESC LIMIT ?", (HISTORY_ROWS,))
    kept = []
    for row in rows:  # newest first, read only as far as the window's start
        at = clock_module.from_iso(row["at"])
        if at is None:
            break
        kept.append(_sample(row, at))
        if at <= since:
            break
    return kept[::-1]


def last_known_demand(conn: sqlite3.Connection) -> DemandSample | None:
    """The newest good demand sample (None if there never was one): while the source is down or stale, the rules
    size the fleet to what this one needed instead of to the operator's ceiling."""
    row = conn.execute(f"SELECT {SAMPLE_COLUMNS} FROM demand_samples WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    at = clock_module.from_iso(row["at"]) if row is not None else None
    return None if at is None else _sample(row, at)


def _sample(row: sqlite3.Row, at: datetime) -> DemandSample:
    """A demand_samples row as the rules read it (rules.needed)."""
    return {"at": at, "ok": bool(row["ok"]), "queued": row["queued"], "in_flight": row["in_flight"],
            "lookahead": row["lookahead"], "proofs_per_hour": row["proofs_per_hour"]}


def observe(conn: sqlite3.Connection, config: Config, *, now: datetime,
            events_since: int | None = None) -> Observation:
    """One snapshot for one decision. `events_since`: the event cursor (None: no events)."""
    rows = machine_rows(conn)
    billed, unlisted = billing(conn, rows, config.vast.label_prefix)
    flagged = implausible_claims(conn)
    rates, hosts = bench_rates(conn, flagged)
    resumes = _resumes(conn, [row["uuid"] for row in rows])
    router = deliveries.held(conn, now=now)
    routed = deliveries.routed_rates(conn, now=now, slots=config.launch.bench_concurrency)
    machines: list[Machine] = []
    kept = _KEPT.matching(rows, rates, config.fleet.default_rate)
    for row in rows:
        values = tuple(row.values())
        facts = kept.facts.get(values)
        if facts is None:
            facts = kept.facts[values] = machine_facts(row)
        measured = routed.get(row["uuid"])
        implausible = row["uuid"] in flagged
        found = kept.rates.get((values, implausible, measured))
        if found is None:
            found = kept.rates[(values, implausible, measured)] = rate_and_source(
                row, rates, config.fleet.default_rate, implausible=implausible, routed=measured)
        rate, source = found
        view: Machine = {
            **facts, "expected_rate": rate, "rate_source": source,
            # unrounded, as the observation carries them per machine (displays round)
            "routed_rate": measured.rate if measured is not None else None,
            "routed_rate_max": measured.rate_max if measured is not None else None,
            "routed_proofs": measured.proofs if measured is not None else 0,
            "machine_id": row["machine_id"], "resumes": resumes.get(row["uuid"], 0),
            "billed_per_hour": billed[row["uuid"]],
            # interruptible: its bid, its offer's on-demand price, since when it is outbid
            "bid": row["bid"], "ask_dph": row["ask_dph"], "outbid_since": row["outbid_since"],
            **_flags(flagged.get(row["uuid"])),
        }
        machines.append(view)
    return Observation(
        now=now,
        settings=settings.effective(conn, config),
        demand=with_held(demand_module.current(conn, config, now=now), router),
        machines=machines,
        capacity=capacity(machines),
        pending_capacity=pending_capacity(machines),
        spend_per_hour=sum(billed.values()) + unlisted,
        events=[] if events_since is None else recent_events(conn, since=events_since, limit=EVENTS_KEPT),
        last_actions=last_step_actions(conn),
        model_rates=rates,
        host_rates=hosts,
        demand_history=demand_history(conn, now - timedelta(seconds=config.agent.scale_down_after)),
        last_known_demand=last_known_demand(conn),
        router=router,
        day_spend=functools.partial(cost_module.spent_today, conn, now=now),
        min_machines=config.agent.min_machines,
        rows=rows,
    )


class _Kept:
    """Each row's facts and rate by the row's whole content (and what the rate is computed against): a page, its
    refresh and a scrape observe a thousand rows that mostly did not change since the last one."""

    KEPT = 20_000

    def __init__(self) -> None:
        self.basis: tuple[Any, ...] | None = None
        self.facts: dict[tuple[Any, ...], MachineFacts] = {}
        self.rates: dict[tuple[Any, ...], tuple[float, str]] = {}

    def matching(self, rows: list[InstanceRow], rates: Mapping[str, float], default_rate: float) -> "_Kept":
        """Itself, emptied when the columns, the model rates or the default rate changed (or it grew too big)."""
        basis = (tuple(rows[0]) if rows else None, tuple(sorted(rates.items())), default_rate)
        if basis != self.basis or len(self.facts) + len(self.rates) > self.KEPT:
            self.basis, self.facts, self.rates = basis, {}, {}
        return self


_KEPT = _Kept()


def with_held(demand: Demand, router: deliveries.Held) -> Demand:
    """The demand with the calls the proof router holds: work the manager measured itself, whatever the
    demand source says (an empty fleet with calls waiting launches; a fleet never shrinks under them)."""
    return dataclasses.replace(demand, held=router.held) if router.fresh else demand
