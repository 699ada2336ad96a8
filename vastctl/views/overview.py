"""What the dashboard and /metrics show, read from the state file in one place.

Read-only: one function per question an operator asks (is the fleet big
enough, what does it cost, is the safety net running, what did the agent do),
each returning plain dicts. Agent steps are read as agent-step writes them
(agent/step.py); a stored JSON value that does not parse (a file edited by
hand) is shown as text rather than failing the page.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import threading
from datetime import datetime, timedelta
from typing import Callable, Literal, Mapping, Sequence, TypedDict, cast

from vastctl import clock
from vastctl.config import Config
from vastctl.facts import appended, deliveries
from vastctl.facts.demand import DemandView
from vastctl.facts.json_value import JSON
from vastctl.observe import Observation, expected_rate, observe
from vastctl.state import fleet_rows, settings
from vastctl.state.lifecycle import LIVE_STATES, State
from vastctl.state.rows import AgentStepRow, selected
from vastctl.views import fleet
from vastctl.views.proof_waits import HISTORY as HISTORY  # the page's last day, as dashboard reads it
from vastctl.views.proof_waits import ProofWaits, proof_waits, stored_moment

BILLING_STATES = frozenset(str(state) for state in LIVE_STATES - {State.STOPPED})
CHART_STEP = timedelta(minutes=4)  # 360 steps a day: finer than the chart's pixels
TokenKind = Literal["input", "output", "cache_read", "cache_write"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("input", "output", "cache_read", "cache_write")


class ReconcileStatus(TypedDict):
    """The safety net's health from its listings."""

    last_success: datetime | None
    last_attempt: datetime | None
    last_error: str | None
    consecutive_failures: int
    failures_last_day: int
    passes_last_day: int


class DestroysPending(TypedDict):
    count: int
    oldest_age_s: float


class AgentStep(TypedDict):
    """An agent_steps row as the page shows it: its JSON columns parsed (text where they do not parse), and its
    tokens by kind added."""

    id: int
    started_at: str
    finished_at: str | None
    policy: str
    outcome: str
    event_cursor: int | None
    observation: JSON
    actions: JSON
    refused: JSON
    errors: JSON
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float
    hold: str | None
    tokens: dict[TokenKind, int]


class AgentTotals(TypedDict):
    """Every step the file keeps, summed (what /metrics counts)."""

    steps: dict[str, int]  # by outcome
    tokens: dict[TokenKind, int]
    cost: float
    refused: int
    last_step: datetime | None


Steps = list[tuple[datetime, float]]  # (from time, value), oldest first


class History(TypedDict):
    """The last day as step functions (history()), and the times the chart spans."""

    capacity: Steps
    spend: Steps
    target: Steps
    queue: Steps
    reconcile_failures: list[datetime]
    start: datetime
    end: datetime
    first: datetime | None  # the fleet's first record, when younger than the day


class PageSummary(fleet.Summary):
    """fleet --json's summary and what the page adds to it."""

    pending_capacity_proofs_per_hour: float
    settings: dict[str, float | int]
    demand: DemandView | None
    reconcile: ReconcileStatus
    destroys_pending: DestroysPending


class _Overview(TypedDict):
    now: datetime
    instances: list[fleet.InstanceView]
    summary: PageSummary
    settings: Sequence[Mapping[str, object]]  # settings.listing's
    events: list[fleet.EventView]  # newest first
    steps: list[AgentStep]
    skipped_steps: list[AgentStep]
    skipped_step_count: int
    waits: ProofWaits
    observation: Observation


class Overview(_Overview, total=False):
    """Everything the dashboard shows (overview()); `history` only when the chart is asked for."""

    history: History


class _SettingChange(TypedDict):
    key: str | None


class SettingChange(_SettingChange, total=False):
    """A setting event's data (settings.set_value): the key, its old and new values."""

    old: JSON
    new: JSON





def demand_view(obs: Observation) -> DemandView | None:
    """The demand the decisions read (observe), as the page and /metrics show it; None when no sample is kept."""
    return None if obs.demand.at is None else obs.demand.view()


def reconcile_status(conn: sqlite3.Connection, now: datetime) -> ReconcileStatus:
    """The safety net's health from its listings: last success, last attempt, failures since the last success."""
    good = conn.execute("SELECT id, at FROM vast_listings WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    last = conn.execute("SELECT at, ok, error FROM vast_listings ORDER BY id DESC LIMIT 1").fetchone()
    failing = conn.execute("SELECT count(*) FROM vast_listings WHERE ok = 0 AND id > ?",
                           (good["id"] if good else 0,)).fetchone()[0]
    since = clock.to_iso(now - HISTORY)
    failed_day = conn.execute("SELECT count(*) FROM vast_listings WHERE ok = 0 AND at >= ?", (since,)).fetchone()[0]
    passes_day = conn.execute("SELECT count(*) FROM vast_listings WHERE at >= ?", (since,)).fetchone()[0]
    return {
        "last_success": stored_moment(good["at"]) if good else None,
        "last_attempt": stored_moment(last["at"]) if last else None,
        "last_error": None if last is None or last["ok"] else last["error"],
        "consecutive_failures": failing, "failures_last_day": failed_day, "passes_last_day": passes_day,
    }


def route_results(conn: sqlite3.Connection, now: datetime) -> dict[str, int]:
    """The proof router's attempts of the last day, by result (facts/deliveries.py)."""
    since, until = deliveries.window(now, HISTORY.total_seconds() / 3600)
    return deliveries.results(conn, since=since, until=until)


def kills_by_code(conn: sqlite3.Connection) -> dict[str, int]:
    return fleet_rows.kills_by_code(conn)


def destroys_pending(conn: sqlite3.Connection, now: datetime) -> DestroysPending:
    """Killed machines vast has not confirmed destroyed: how many, and how long the oldest has waited."""
    count, oldest_text = fleet_rows.pending_destroys(conn)
    oldest = stored_moment(oldest_text)
    return {"count": count, "oldest_age_s": 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())}


# --- agent steps ------------------------------------------------------------------------------------


def agent_steps(conn: sqlite3.Connection, *, limit: int = 10, skipped: bool | None = None) -> list[AgentStep]:
    """The newest agent steps, newest first, each with its JSON columns parsed (text when they do not parse).

    `skipped` True: only the steps --if-events skipped; False: only those that ran; None: both."""
    where = {None: "", True: " WHERE outcome = 'skipped'", False: " WHERE outcome != 'skipped'"}[skipped]
    return [{**row, "observation": _parsed(row["observation"]), "actions": _parsed(row["actions"]),
             "refused": _parsed(row["refused"]), "errors": _parsed(row["errors"]),
             "tokens": {"input": row["input_tokens"], "output": row["output_tokens"],
                        "cache_read": row["cache_read_tokens"], "cache_write": row["cache_write_tokens"]}}
            for row in selected(conn, AgentStepRow, f"SELECT * FROM agent_steps{where} ORDER BY id DESC LIMIT ?",
                                (limit,))]


def agent_totals(conn: sqlite3.Connection) -> AgentTotals:
    """Every step the file keeps, summed: steps by outcome, tokens by kind, cost, refused actions."""
    sums = [f"sum({kind}_tokens)" for kind in TOKEN_KINDS]
    refused = "coalesce(sum(CASE WHEN json_valid(refused) THEN json_array_length(refused) END), 0)"
    steps: dict[str, int] = {}
    tokens = dict.fromkeys(TOKEN_KINDS, 0)
    cost, refused_count = 0.0, 0
    for row in conn.execute(f"SELECT outcome, count(*), {', '.join(sums)}, sum(cost), {refused} FROM agent_steps"
                            " GROUP BY 1"):
        steps[row[0]] = row[1]
        for i, kind in enumerate(TOKEN_KINDS):
            tokens[kind] += row[2 + i]
        cost += row[6]
        refused_count += row[7]
    return {"steps": steps, "tokens": tokens, "cost": cost, "refused": refused_count,
            "last_step": stored_moment(conn.execute("SELECT max(finished_at) FROM agent_steps").fetchone()[0])}


# --- the last day, as step functions ----------------------------------------------------------------


def history(conn: sqlite3.Connection, config: Config, now: datetime, *, capacity: float, spend: float,
            target: float, model_rates: dict[str, float]) -> History:
    """Capacity, target, spend and queue over the last day, each a list of (from time, value) steps, oldest first.

    Capacity and spend are replayed backwards from their values now through the
    transition events (a machine counts at its current rate and price), the
    target through the `setting` events, the queue from demand samples.
    Reconcile's failed listings come as times.
    """
    start = now - HISTORY
    since = clock.to_iso(start)
    machines = fleet_rows.amounts(conn)
    moves = _MOVES.get(conn)
    with moves.lock:
        moves.read_on(conn)
        events, ordered, earliest_event = moves.events, moves.ordered, moves.earliest
        # the events of the day: the suffix from the first at `since` when times never go back in id order
        lo = bisect.bisect_left(events, since, key=lambda move: move[0]) if ordered else 0
        basis = (len(events), capacity, spend, target, tuple(sorted(model_rates.items())), config.fleet.default_rate,
                 None if ordered else since)
        replay = moves.replay
        if replay is None or replay.events is not events or replay.basis != basis or replay.lo > lo \
                or replay.machines != machines:
            rates = _RATES.get(conn).matching(model_rates, config.fleet.default_rate)
            replay = moves.replay = _Replay(events, lo, since, machines, basis, _amounts(
                machines, rates, model_rates, config.fleet.default_rate), (capacity, spend, target))
        values, kept = replay.at(lo)
    capacity_steps, spend_steps, target_steps = (_thin([(start, values[index]), *reversed(kept[index])], start)
                                                 for index in range(3))
    queue = _thin(_queue_history(conn, since), start)
    failures = [at for at in (stored_moment(row[0]) for row in conn.execute(
        "SELECT at FROM vast_listings WHERE ok = 0 AND at >= ? ORDER BY id", (since,))) if at]
    first = [stored_moment(earliest_event)] + [stored_moment(conn.execute(f"SELECT min(at) FROM {table}").fetchone()[0])
                                         for table in ("demand_samples", "vast_listings")]  # their `at` indexes
    return {"capacity": capacity_steps, "spend": spend_steps, "target": target_steps, "queue": queue,
            "reconcile_failures": failures, "start": start, "end": now,
            "first": min((at for at in first if at is not None), default=None)}  # a fleet younger than the day


# a machine's fleet_rows.AMOUNT_COLUMNS values, in that order (fleet_rows.amounts)
_Amounts = tuple[object, ...]


class AmountRow(TypedDict):
    """fleet_rows.AMOUNT_COLUMNS as a row: what the history counts a machine's rate (expected_rate) and price by."""

    uuid: str
    state: str
    gpu_name: str | None
    proofs_per_hour: float | None
    bench_rate: float | None
    dph: float | None


# (at as stored, at parsed, kind, uuid, from_state, to_state, reason)
_Move = tuple[str, "datetime | None", str, "str | None", "str | None", "str | None", "str | None"]


class _Moves:
    """The events the history replays (settings, and moves into or out of running, stopped or killed: the only ones
    that change capacity or spend), in id order, their times parsed: kept per state file and read on from the
    last event seen (facts/appended.py), as the page asks at every refresh; and the last replay of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # serve's worker threads share it (--threads)
        self.tail = appended.Tail()
        self.events: list[_Move] = []
        self.ordered = True  # no event's time is before an earlier id's (the day's events are then a suffix)
        self.earliest: str | None = None  # the least `at` of every event read, of any kind (min(at) of the table)
        self.replay: _Replay | None = None

    def read_on(self, conn: sqlite3.Connection) -> None:
        """Read the events appended since the last read (under self.lock)."""
        span = self.tail.span(conn)
        if span is not None:
            after, upto = span
            if after == 0:
                self.events, self.ordered, self.earliest = [], True, None
            known = len(self.events)
            (least,) = conn.execute("SELECT min(at) FROM events WHERE id > ? AND id <= ?", (after, upto)).fetchone()
            if least is not None:  # the two compared as SQLite compares them (min() over the table would)
                self.earliest = least if self.earliest is None else conn.execute(
                    "SELECT min(?, ?)", (self.earliest, least)).fetchone()[0]
            self.events.extend((at, stored_moment(at), kind, uuid, before, to, data) for at, kind, uuid, before, to, data
                               in conn.execute(
                "SELECT at, kind, uuid, from_state, to_state, data FROM events WHERE id > ? AND id <= ? AND"
                " (kind = 'setting' OR (kind = 'transition' AND (from_state IS NULL OR from_state IN ('running',"
                " 'stopped', 'killed') OR to_state IN ('running', 'stopped', 'killed')))) ORDER BY id", (after, upto)))
            times = [move[0] for move in self.events[max(0, known - 1):]]
            self.ordered = self.ordered and all(a <= b for a, b in zip(times, times[1:]))


class _Replay:
    """The three series replayed backwards from their values now through events[lo:] (newest first), each step
    remembered with the index of the event that made it: a later page whose day starts at a later event takes
    the steps of the events it still holds and the values they leave, the same as replaying those alone."""

    def __init__(self, events: list[_Move], lo: int, since: str, machines: Mapping[str, _Amounts],
                 basis: tuple[object, ...], amount: Callable[[str], tuple[float, float]],
                 now_values: tuple[float, float, float]):
        self.events, self.lo, self.basis, self.machines = events, lo, basis, machines
        self.now_values = now_values
        self.steps: tuple[list[tuple[datetime, float]], ...] = ([], [], [])  # per series, newest first
        self.step_of: tuple[list[int], ...] = ([], [], [])  # −(index of the event) of each step: ascending
        self.after: list[tuple[float, float, float]] = []  # the values once events[i:] are replayed, i ≥ lo
        capacity, spend, target = now_values
        for index in range(len(events) - 1, lo - 1, -1):
            at_text, at, kind, uuid, before, after, data = events[index]
            if at is not None and at_text >= since:  # those of the day (ISO text sorts as time)
                if kind == "transition" and uuid is not None and uuid in machines:
                    running = (after == "running") - (before == "running")
                    billing = (after in BILLING_STATES) - (before in BILLING_STATES)
                    if running or billing:
                        rate, price = amount(uuid)
                        if running:
                            self._step(0, at, capacity, index)
                            capacity = max(0.0, capacity - running * rate)
                        if billing:
                            self._step(1, at, spend, index)
                            spend = max(0.0, spend - billing * price)
                elif kind == "setting" and (setting := _setting_change(data))["key"] == "target_proofs_per_hour":
                    old = setting["old"]
                    if isinstance(old, (int, float)):
                        self._step(2, at, target, index)
                        target = old
            self.after.append((capacity, spend, target))
        self.after.reverse()

    def _step(self, series: int, at: datetime, value: float, index: int) -> None:
        self.steps[series].append((at, value))
        self.step_of[series].append(-index)

    def at(self, lo: int) -> tuple[tuple[float, float, float], list[list[tuple[datetime, float]]]]:
        """(the values at the day's start, each series' steps newest first) replaying events[lo:] only."""
        values = self.after[lo - self.lo] if lo < len(self.events) else self.now_values
        return values, [steps[:bisect.bisect_right(of, -lo)] for steps, of in zip(self.steps, self.step_of)]


def _amounts(machines: Mapping[str, _Amounts], rates: dict[_Amounts, float], model_rates: dict[str, float],
             default_rate: float) -> Callable[[str], tuple[float, float]]:
    """uuid → (its rate, its price) as the history counts them, worked out for the machines events move."""
    amounts: dict[str, tuple[float, float]] = {}

    def amount(uuid: str) -> tuple[float, float]:
        found = amounts.get(uuid)
        if found is None:
            values = machines[uuid]
            rate = rates.get(values)
            if rate is None:
                row = cast(AmountRow, dict(zip(fleet_rows.AMOUNT_COLUMNS, values)))
                rate = rates[values] = expected_rate(row, model_rates, default_rate)
            price = values[5]
            found = amounts[uuid] = (rate, float(price) if isinstance(price, (int, float)) else 0.0)
        return found

    return amount


_MOVES = appended.PerFile(_Moves)


class _Rates:
    """Each machine's expected rate as the history counts it, by the row fields it is computed from: the rows of
    finished machines, and of live ones between their heartbeats, come back unchanged at every refresh."""

    RATES_KEPT = 50_000

    def __init__(self) -> None:
        self.basis: tuple[object, ...] | None = None
        self.rates: dict[_Amounts, float] = {}

    def matching(self, model_rates: dict[str, float], default_rate: float) -> dict[_Amounts, float]:
        """The kept rates, emptied when what they were computed against (model rates, the default) changed."""
        basis = (tuple(sorted(model_rates.items())), default_rate)
        if basis != self.basis or len(self.rates) > self.RATES_KEPT:
            self.basis, self.rates = basis, {}
        return self.rates


_RATES = appended.PerFile(_Rates)


def _thin(points: list[tuple[datetime, float]], start: datetime) -> list[tuple[datetime, float]]:
    """At most one step per CHART_STEP: the first time in each, with the value the step ends on."""
    kept: list[tuple[datetime, float]] = []
    last_slot = None
    low = high = start  # the last slot's span [low, high): a point inside it needs no division
    for moment, value in points:
        if low <= moment < high:
            slot = last_slot
        else:
            slot = (moment - start) // CHART_STEP
            low = start + slot * CHART_STEP
            high = low + CHART_STEP
        if slot == last_slot:
            kept[-1] = (kept[-1][0], value)
        else:
            kept.append((moment, value))
            last_slot = slot
    return kept


def _queue_history(conn: sqlite3.Connection, since: str | None) -> list[tuple[datetime, float]]:
    rows = conn.execute("SELECT at, queued FROM demand_samples WHERE at >= ? AND queued IS NOT NULL AND ok = 1"
                        " ORDER BY id", (since,))
    return [(at, float(row[1])) for row in rows if (at := stored_moment(row[0])) is not None]


def _setting_change(data: str | None) -> SettingChange:
    """A setting event's data ({"key", "old", "new"}, settings.set_value); {"key": None} for one without."""
    try:
        change = json.loads(data) if data else {}
    except ValueError:
        change = {}
    return cast(SettingChange, change) if isinstance(change, dict) and "key" in change else {"key": None}


# --- one read for the page --------------------------------------------------------------------------


def overview(conn: sqlite3.Connection, config: Config, now: datetime, *, events: int = 30,
             steps: int = 10, chart: bool = True) -> Overview:
    """Everything the dashboard shows: the fleet, the summary, events, agent steps, and the last day."""
    obs = observe(conn, config, now=now)
    view = fleet.fleet_view(conn, config, now=now, obs=obs)
    summary: PageSummary = {**view["summary"], "pending_capacity_proofs_per_hour": round(obs.pending_capacity, 3),
                            "settings": obs.settings, "demand": demand_view(obs),
                            "reconcile": reconcile_status(conn, now), "destroys_pending": destroys_pending(conn, now)}
    result: Overview = {
        "now": now, "instances": view["instances"], "summary": summary,
        "settings": settings.listing(conn, config),
        "events": list(reversed(fleet.events(conn, limit=events))),
        "steps": agent_steps(conn, limit=steps, skipped=False),
        "skipped_steps": agent_steps(conn, limit=steps, skipped=True),
        "skipped_step_count": conn.execute("SELECT count(*) FROM agent_steps WHERE outcome = 'skipped'").fetchone()[0],
        "waits": proof_waits(conn, config, now),
        "observation": obs,
    }
    if chart:
        result["history"] = history(conn, config, now, capacity=summary["capacity_proofs_per_hour"],
                                    spend=summary["spend_per_hour"], target=float(summary["target_proofs_per_hour"]),
                                    model_rates=obs.model_rates)
    return result


def _parsed(value: JSON) -> JSON:
    if not isinstance(value, str):
        return value
    try:
        parsed: JSON = json.loads(value)
    except ValueError:
        return value
    return parsed
