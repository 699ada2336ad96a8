"""Queries and views of the state file shared by `fleet`, `events`, `notify` and `serve`."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from datetime import datetime
from typing import Iterable, Literal, Mapping, TypedDict, cast

from vastctl import clock
from vastctl.config import Config
from vastctl.errors import BadInput
from vastctl.facts import appended, deliveries, tunnel
from vastctl.observe import Machine, MachineFacts, Observation, disagreement, event_facts, machine_facts, observe
from vastctl.state import fleet_rows
from vastctl.state.db import transaction
from vastctl.state.lifecycle import VAST_DEAD_CODES, State, record_event
from vastctl.state.rows import InstanceRow

TimeField = Literal["state_since", "last_heartbeat_at", "destroyed_at", "vast_seen_at", "joined_at",
                    "tunnel_down_since", "last_contact_at"]
TIME_FIELDS: tuple[TimeField, ...] = ("state_since", "last_heartbeat_at", "destroyed_at", "vast_seen_at", "joined_at",
                                      "tunnel_down_since", "last_contact_at")
RATE_DIGITS = 1  # proofs/hour are shown to one decimal, in the table, the summary and --json alike
# What `fleet` shows without --all: a killed machine only while it may still bill (rented, destroy unconfirmed).
SHOWN_WITHOUT_ALL = fleet_rows.SHOWN_WITHOUT_ALL
ORPHAN_WARN_FRACTION = 0.5  # the dashboard warns once the fleet's newest contact is half of launch.orphan_after old


class ShownRow(InstanceRow, total=False):
    """A row `fleet` lists: its columns, and its last report of any kind once fleet_view added it."""

    last_contact_at: str | None


class DisplayedFacts(TypedDict):
    """A machine's facts (observe.MachineFacts) formatted for display: the same keys, in the same order, the rate
    rounded to RATE_DIGITS and the times (TIME_FIELDS) display ISO."""

    uuid: str
    label: str
    state: str
    vast_id: int | None
    vast_status: str | None
    gpu_name: str | None
    num_gpus: int | None
    bench_rate: float | None
    dph: float | None
    proofs_per_hour: float | None
    proofs_done: int
    state_since: str | None
    last_heartbeat_at: str | None
    kill_reason: str | None
    kill_code: str | None
    destroyed_at: str | None
    vast_missing: int
    vast_seen_at: str | None
    last_contact_at: str | None
    vast_status_msg: str | None
    disagreement: str | None
    tunnel_port: int | None
    joined: bool | None
    joined_at: str | None
    tunnel_down_since: str | None


class InstanceView(DisplayedFacts):
    """One machine of `fleet --json` (docs/interface.md): its displayed facts, then its boot and its rate figures
    (from the observation: None, and 0 proofs, for a machine it does not count)."""

    boot_stages: dict[str, float] | None
    expected_rate: float | None
    rate_source: str | None
    routed_rate: float | None
    routed_rate_max: float | None
    routed_proofs: int
    counted_rate: float | None  # what `fleet`'s capacity counts it at (counted_rate()); None: not counted
    not_joined_since: str | None  # running with a tunnel the manager cannot reach: since when (tunnel.down_since)
    bid: float | None  # interruptible: its bid, $/h (None: rented on demand)
    outbid_since: str | None  # since when vast has it stopped for a higher bid (outbid_since())


class ListingStatus(TypedDict):
    listing_at: str | None
    listing_age_s: int | None
    listing_instances: int | None
    listing_error: str | None


class ContactStatus(TypedDict):
    last_contact_at: str | None
    contact_age_s: int | None
    orphan_after_s: int
    orphan_warning: str | None


class RouterStatus(deliveries.HeldView):
    proof_wait_last_day: deliveries.ProofWait


class Summary(TypedDict):
    """`fleet --json`'s summary, in this order."""

    by_state: dict[str, int]
    capacity_proofs_per_hour: float
    not_joined_proofs_per_hour: float
    target_proofs_per_hour: float | int
    spend_per_hour: float
    disagreements: int
    listing_at: str | None
    listing_age_s: int | None
    listing_instances: int | None
    listing_error: str | None
    last_contact_at: str | None
    contact_age_s: int | None
    orphan_after_s: int
    orphan_warning: str | None
    router: RouterStatus


class FleetView(TypedDict):
    """The `fleet --json` object (docs/interface.md)."""

    instances: list[InstanceView]
    summary: Summary


class EventCause(TypedDict):
    """Why an actor moved a machine, as its event's data keeps it (lifecycle.Cause): the reason its decision gave,
    and the agent step's id when a step did it."""

    reason: str
    step: int | None


class EventView(TypedDict):
    """One event as `events --json` shows it: its columns but its data, its time display ISO, and its cause."""

    id: int
    at: str | None
    kind: str
    uuid: str | None
    label: str | None
    from_state: str | None
    to_state: str | None
    reason: str | None
    source: str
    code: str | None
    cause: EventCause | None


class _Step(TypedDict):
    id: int | None
    at: str | None
    what: Literal["event", "vast", "now"]  # an event, a call made to vast for it, where it stands now
    kind: str
    from_state: str | None
    to_state: str | None
    source: str
    code: str | None
    reason: str | None


class PathStep(_Step, total=False):
    """One step of a machine's path (`events --label`); an event's carries its uuid and label too."""

    uuid: str | None
    label: str | None
    cause: EventCause | None


def _rate(value: float | None) -> float | None:
    return round(value, RATE_DIGITS) if isinstance(value, float) else value


def instance_view(row: ShownRow, observed: Machine | None = None) -> InstanceView:
    """One machine as `fleet --json` shows it: the observation's facts, its rate rounded and its times the
    contract's whole-second ISO text. Once vast confirmed its destroy, vast's status is `destroyed`, not the
    last one listed (`fleet --all` would show a destroyed machine as still running at vast).

    `observed`: the machine as the observation counts it (absent for a destroyed one): the rate capacity counts
    it at, the figure that set it (`rate_source`) and what the proof router saw it prove over the last hour."""
    facts = display(machine_facts(row))
    if row.get("destroyed_at") and row.get("vast_id") is not None:
        facts["vast_status"] = "destroyed"
    unreached = tunnel.down_since(cast("tunnel.TunnelFields", row)) if facts["joined"] is False else None
    reach: _Reach = {"not_joined_since": clock.display_iso(unreached), "bid": row.get("bid"),
                     "outbid_since": outbid_since(row)}
    if not observed:
        return {**facts, "boot_stages": boot_stages(row), "expected_rate": None, "rate_source": None,
                "routed_rate": None, "routed_rate_max": None, "routed_proofs": 0, "counted_rate": None, **reach}
    return {**facts, "boot_stages": boot_stages(row), "expected_rate": _rate(observed.get("expected_rate")),
            "rate_source": observed.get("rate_source"), "routed_rate": _rate(observed.get("routed_rate")),
            "routed_rate_max": _rate(observed.get("routed_rate_max")),
            "routed_proofs": observed.get("routed_proofs", 0), "counted_rate": counted_rate(observed), **reach}


class _Reach(TypedDict):
    not_joined_since: str | None
    bid: float | None
    outbid_since: str | None


def counted_rate(machine: Machine) -> float | None:
    """What `fleet`'s capacity counts a machine at (its `counted/h`; the capacity is their sum): its expected rate,
    to RATE_DIGITS, while it can prove for the fleet: running, not gone, dead or stopped at vast (an interruptible
    machine outbid), and joined when it has a tunnel (launch.join ssh: the proof router reaches it through it
    alone). None otherwise: capacity the router cannot reach is not capacity.

    The agent's sizing counts one more kind (agent/sizing.py counted_capacity): a running machine not joined yet,
    which joins at the manager's next check or is killed past tunnel.down_timeout; it would rent a second machine
    for each one joining. `not_joined_proofs_per_hour` is what that adds."""
    if machine["state"] != State.RUNNING or machine["joined"] is False or _stopped_at_vast(machine):
        return None
    return round(machine["expected_rate"], RATE_DIGITS)


def _not_joined_rate(machine: Machine) -> float:
    """The rate a running machine not joined would count at once joined (0 for any other)."""
    waiting = machine["state"] == State.RUNNING and machine["joined"] is False and not _stopped_at_vast(machine)
    return round(machine["expected_rate"], RATE_DIGITS) if waiting else 0.0


def _stopped_at_vast(machine: MachineFacts) -> bool:
    """Not proving whatever its row says, as agent/sizing.py's vast_dead reads it: vast lists it dead or not at
    all, or stopped (an interruptible machine outbid)."""
    status = machine["vast_status"]
    return bool(machine["vast_missing"]) or status in VAST_DEAD_CODES or status == "stopped"


def outbid_since(row: ShownRow) -> str | None:
    """Since when vast has this interruptible machine stopped for a higher bid (display ISO), as agent/outbid.py
    reads it: it bids, its row is running and vast's last listing has it stopped; since that listing's first
    sighting of it so (the row's outbid_since), else since the listing. None for any other machine."""
    paused = row.get("bid") is not None and row["state"] == State.RUNNING and row.get("vast_status") == "stopped"
    if not paused or row.get("vast_missing"):
        return None
    return clock.display_iso(row.get("outbid_since") or row.get("vast_seen_at"))


def _kept_view(row: ShownRow, observed: Machine | None = None) -> InstanceView:
    """instance_view(row, observed), kept by the row's whole content and the observation's rate figures: the page
    and its 5 s refresh list a thousand rows that mostly did not change since the last request. A copy each time
    (callers may add to it)."""
    rates = (observed.get("expected_rate"), observed.get("rate_source"), observed.get("routed_rate"),
             observed.get("routed_rate_max"), observed.get("routed_proofs")) if observed else None  # the view's rate figures
    key = (tuple(row), tuple(row.values()), rates)
    view = _VIEWS.get(key)
    if view is None:
        if len(_VIEWS) > VIEWS_KEPT:
            _VIEWS.clear()
        view = _VIEWS[key] = instance_view(row, observed)
    copy = view.copy()
    stages = view["boot_stages"]
    if stages:
        copy["boot_stages"] = dict(stages)
    return copy


VIEWS_KEPT = 20_000
_VIEWS: dict[tuple[object, ...], InstanceView] = {}


def boot_stages(row: InstanceRow) -> dict[str, float] | None:
    """Where a machine's boot went, {stage: seconds} in the order they ran, as its boot script timed them (null
    before `running` or from a script that does not time them)."""
    try:
        stages = json.loads(row.get("boot_stages") or "null")
    except ValueError:  # a row edited by hand
        return None
    return stages if isinstance(stages, dict) else None


def display(facts: MachineFacts) -> DisplayedFacts:
    """A machine's facts formatted for display (a copy): proofs/hour to RATE_DIGITS, times as display ISO."""
    view = cast(DisplayedFacts, dict(facts))  # the same keys: the rate and the times are formatted below
    rate = view.get("proofs_per_hour")
    if rate is not None:
        view["proofs_per_hour"] = round(rate, RATE_DIGITS)
    for name in TIME_FIELDS:
        if name in view:
            view[name] = clock.display_iso(view[name])
    return view


def listing_status(conn: sqlite3.Connection, now: datetime) -> ListingStatus:
    """When vast was last listed successfully (the age of every vast_status shown), and the last failure if newer."""
    good = conn.execute("SELECT at, instances FROM vast_listings WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    last = conn.execute("SELECT at, ok, error FROM vast_listings ORDER BY id DESC LIMIT 1").fetchone()
    at = clock.from_iso(good["at"]) if good else None
    return {
        "listing_at": clock.display_iso(good["at"]) if good else None,
        "listing_age_s": None if at is None else max(0, round((now - at).total_seconds())),
        "listing_instances": good["instances"] if good else None,
        "listing_error": last["error"] if last is not None and not last["ok"] else None,
    }


def fleet_view(conn: sqlite3.Connection, config: Config, *, include_killed: bool = False,
               now: datetime, obs: "Observation | None" = None, listed: bool = True) -> FleetView:
    """The `fleet --json` object: every machine we pay for (or paid for, with include_killed) and a summary.

    Without include_killed a killed machine is listed only while it has a vast id and vast has not
    confirmed its destroy: it may still bill. One killed before it was ever rented is history.

    Beside the contract's keys: per instance `vast_missing`, `vast_seen_at`, `vast_status_msg`,
    `disagreement` and `last_contact_at` (its last report of any kind); in the summary `disagreements`, the age
    of the vast listing the statuses come from, and the fleet's newest contact (contact_status()).
    `listed` False: the summary alone (instances empty), what /metrics reads.
    """
    given = obs is not None and bool(obs.rows)
    obs = obs or observe(conn, config, now=now)  # a caller that already observed passes its observation
    rows = shown_rows(conn, obs if given else None, include_killed=include_killed)
    contacts = last_reports(conn)
    for row in rows:
        row["last_contact_at"] = max(filter(None, (row.get("last_heartbeat_at"), contacts.get(row["uuid"]))), default=None)
    observed = {machine["uuid"]: machine for machine in obs.machines} if listed else {}
    instances = [_kept_view(row, observed.get(row["uuid"])) for row in rows] if listed else []
    summary: Summary = {
        "by_state": dict(Counter(row["state"] for row in rows)),
        # the sum of the counted/h column (counted_rate), not the observation's capacity the agent sizes with
        "capacity_proofs_per_hour": round(sum(counted_rate(m) or 0.0 for m in obs.machines), RATE_DIGITS),
        "not_joined_proofs_per_hour": round(sum(_not_joined_rate(m) for m in obs.machines), RATE_DIGITS),
        "target_proofs_per_hour": obs.settings["target_proofs_per_hour"],
        "spend_per_hour": round(obs.spend_per_hour, 4),
        "disagreements": sum(1 for row in rows if disagreement(row)),
        **listing_status(conn, now),
        **contact_status(rows, config, now),
        "router": router_status(conn, config, obs, now),
    }
    return {"instances": instances, "summary": summary}


def shown_rows(conn: sqlite3.Connection, obs: "Observation | None", *, include_killed: bool) -> list[ShownRow]:
    """The rows fleet_view lists, ordered by creation then label: without include_killed, the observation's rows
    (every row not yet destroyed) that SHOWN_WITHOUT_ALL keeps, and the few destroyed rows it keeps too, so the
    page and /metrics read the wide rows once per request."""
    if include_killed or obs is None:
        return _shown(fleet_rows.listed(conn, include_killed=include_killed))
    rows = _shown(row.copy() for row in obs.rows if row["state"] != State.KILLED or row.get("vast_id") is not None)
    destroyed = _shown(fleet_rows.destroyed_not_killed(conn))
    if destroyed:
        rows = sorted(rows + destroyed, key=lambda row: (row["created_at"], row["label"]))
    return rows


def _shown(rows: Iterable[Mapping[str, object]]) -> list[ShownRow]:
    """Whole instances rows (SELECT *), new dicts the caller may add to, as the rows fleet_view lists."""
    return [cast(ShownRow, row) for row in rows]


def router_status(conn: sqlite3.Connection, config: Config, obs: "Observation", now: datetime) -> RouterStatus:
    """What the proof router holds now (observation.router) and the proof wait it measured over the last day:
    held + proving time of each answered call, p50/p95/p99 in seconds and the share within agent.max_wait."""
    since, until = deliveries.window(now)
    return {**obs.router.view(),
            "proof_wait_last_day": deliveries.proof_wait(conn, since=since, until=until,
                                                         max_wait_s=config.agent.max_wait)}


def last_reports(conn: sqlite3.Connection) -> dict[str, str]:
    """uuid → when its newest report that changed something landed (the events a machine's reports record);
    heartbeats, which record none, are `last_heartbeat_at`. Kept per file and read on from the last event seen
    (facts/appended.py): the page and /metrics ask at every request."""
    kept = _REPORTS.get(conn)
    with kept.lock:
        span = kept.tail.span(conn)
        if span is not None:
            after, upto = span
            if after == 0:
                kept.newest = {}
            for uuid, at in conn.execute(
                    "SELECT uuid, max(at) FROM events WHERE id > ? AND id <= ? AND source = 'instance'"
                    " AND uuid IS NOT NULL GROUP BY uuid", (after, upto)):
                if at is not None and (uuid not in kept.newest or at > kept.newest[uuid]):
                    kept.newest[uuid] = at
        return dict(kept.newest)


class _Reports:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # serve's worker threads share it (--threads)
        self.tail = appended.Tail()
        self.newest: dict[str, str] = {}


_REPORTS = appended.PerFile(_Reports)


def contact_status(rows: list[ShownRow], config: Config, now: datetime) -> ContactStatus:
    """The newest report from any live machine, and whether the machines' dead-man switch is getting near.

    Machines destroy themselves when the manager has not answered them for launch.orphan_after. A manager that
    is up but unreachable from the fleet (its URL, TLS proxy, DNS or firewall broken) hears nothing while its
    machines count down: the age of the fleet's newest contact is that countdown, as the manager sees it.
    """
    orphan_after = config.launch.orphan_after
    live = [row for row in rows if row["state"] != State.KILLED and row.get("vast_id") is not None]
    newest = max((contact for row in live if (contact := row.get("last_contact_at"))), default=None)
    created = [moment for row in live if (moment := clock.from_iso(row["created_at"])) is not None]
    since = clock.from_iso(newest) or min(created, default=None)
    age = None if since is None else max(0, round((now - since).total_seconds()))
    warning = None
    if age is not None and orphan_after > 0 and age >= ORPHAN_WARN_FRACTION * orphan_after:
        left = max(0.0, orphan_after - age)
        warning = (f"no machine has reached the manager for {clock.human_duration(age)}: they destroy themselves"
                   f" {'now' if left == 0 else 'in ' + clock.human_duration(left)} (launch.orphan_after"
                   f" {clock.human_duration(orphan_after)}); check that server.url reaches this manager from outside")
    return {"last_contact_at": clock.display_iso(newest), "contact_age_s": age,
            "orphan_after_s": round(orphan_after), "orphan_warning": warning}


def event_view(row: sqlite3.Row) -> EventView:
    """One event as `events --json` shows it: its time the contract's whole-second ISO text, its cause from its
    data (null for an event no actor's decision caused: a machine's report, a note)."""
    return {**event_facts(row), "at": clock.display_iso(row["at"]), "cause": event_cause(row["data"])}


def event_cause(data: str | None) -> EventCause | None:
    """The cause an event's data keeps ({"reason", "step"}), or None; data edited by hand is no cause."""
    try:
        found = json.loads(data or "null")
    except ValueError:
        return None
    if not isinstance(found, dict) or not isinstance(reason := found.get("reason"), str):
        return None
    step = found.get("step")
    return {"reason": reason, "step": step if isinstance(step, int) and not isinstance(step, bool) else None}


MAX_EVENT_ID = 2**63 - 1  # the largest id (and count) SQLite can hold


def events(conn: sqlite3.Connection, *, since: int | None = None, limit: int = 50,
           uuid: str | None = None) -> list[EventView]:
    """Events oldest first, in id order (the order written): the newest `limit` of those after `since`, of one
    machine when `uuid` is given.

    `since` is an id, so a reader that follows the log by id never misses one; each `at` is the time its
    writer judged the change (see `vastctl events --help`)."""
    if limit < 1:
        raise BadInput(f"--limit must be at least 1, got {limit}")
    for name, value in (("--since", since), ("--limit", limit)):
        if value is not None and value > MAX_EVENT_ID:  # SQLite's INTEGER: a larger number cannot even be compared
            raise BadInput(f"{name} must be at most {MAX_EVENT_ID}, got a {len(str(value))}-digit number")
    mine = "" if uuid is None else " AND uuid = ?"
    rows = conn.execute(
        f"SELECT * FROM (SELECT * FROM events WHERE id > ?{mine} ORDER BY id DESC LIMIT ?) ORDER BY id",
        (since or 0, *(() if uuid is None else (uuid,)), limit),
    ).fetchall()
    return [event_view(row) for row in rows]


def machine_path(conn: sqlite3.Connection, row: InstanceRow) -> list[PathStep]:
    """One machine's whole path for `events --label`: its events and the calls made to vast for it (launch,
    stop, start, destroy: the `actions` table), in the order they happened, then where it stands now."""
    steps: list[PathStep] = [{**e, "what": "event"} for e in events(conn, uuid=row["uuid"], limit=MAX_EVENT_ID)]
    for action in conn.execute("SELECT * FROM actions WHERE uuid = ? ORDER BY id", (row["uuid"],)):
        steps.append({"id": None, "at": clock.display_iso(action["at"]), "what": "vast", "kind": action["kind"],
                      "from_state": None, "to_state": None, "source": action["actor"], "code": None,
                      "reason": f"vast {action['kind']}: {action['result'] or ('ok' if action['ok'] else 'failed')}"})
    steps.sort(key=lambda step: (step["at"] or "", step["what"] == "vast"))  # an event before the call it made
    heartbeat = clock.display_iso(row.get("last_heartbeat_at"))
    now = f"now {row['state']} since {clock.display_iso(row.get('state_since'))}"
    if heartbeat:
        now += f", last heartbeat {heartbeat} ({row.get('proofs_done') or 0} proofs)"
    if row.get("destroyed_at"):
        now += f", destroyed at vast {clock.display_iso(row['destroyed_at'])}"
    steps.append({"id": None, "at": None, "what": "now", "kind": "now", "from_state": None, "to_state": None,
                  "source": "-", "code": None, "reason": now})
    return steps


def notify(conn: sqlite3.Connection, text: str, *, source: str = "operator", now: datetime) -> int:
    """An operator's note for the agent: an event with no instance."""
    text = text.strip()
    if not text:
        raise BadInput("the note is empty: say something, e.g. vastctl notify 'price spike expected tonight'")
    if len(text) > 4000:
        raise BadInput("the note is longer than 4000 characters: shorten it")
    with transaction(conn):
        return record_event(conn, kind="note", source=source, reason=text, now=now)
