"""reconcile: the deterministic safety net between the state file and what vast says.

One pass (`run_pass`): take the `reconcile` lease, list every vast instance,
decide with the pure `plan()`, record what was seen, then `apply()` the
actions through lifecycle (kills, each one event with source `reconcile` and
a kill code) and operations (destroys, retried every pass until vast confirms).

A failed listing, or one in which more than `max_vanish_fraction` of the
live fleet vanished at once, aborts the pass before anything is killed: a
broken API looks exactly like a mass death.

Rules, in the order `plan()` applies them to one live row (first match wins):

  disappeared         missing from `disappear_confirmations` consecutive good listings
  start_failed        vast's status_msg reports a start failure and the container is not running
  exited / offline    vast status exited (or unknown/offline) in two consecutive good listings
  scheduling_timeout  resumed, still launching, vast keeps it stopped/created past SCHEDULING_DEADLINE_S
  bench_failed        bench_done with a rate below the current min_bench_rate (a lost bench report)
  timeout_<state>     launching/registered/params_done/bench_done longer than timeouts.<state>
  heartbeat_timeout   running without a heartbeat for longer than timeouts.heartbeat
  tunnel_down         running with a tunnel (launch.join ssh) the manager could not reach the daemon through
                      for longer than tunnel.down_timeout (never joined: counted from `running`)

The vast-status rules (start_failed, exited/offline, scheduling_timeout) skip
`stopped` rows: their container is down because we asked; `start` moves them
back to launching, under every rule again.

Before planning, every running machine's tunnel is probed (tunnel.check: joined or not, since when);
after applying, the tunnel account's authorized_keys is rewritten from the rows (a killed machine's key
pruned) and nginx's upstream list refreshed (provers.refresh); a failure of either is one of the
pass's errors, and the next pass tries again.

Killed rows whose machine is not confirmed destroyed are destroyed again on
every pass. A vast instance labelled with our prefix that has no row is an
orphan: nothing reports to us from it, so after a grace of timeouts.launching
(the time a healthy machine has to register, which would have adopted it)
it is destroyed (one event, code `orphan`). A machine vast still lists
STILL_LISTED_GRACE_S after confirming its destroy is destroyed again.
Instances without our prefix and no row are never touched.

A machine's own word is a claim: a row is paired with a listing entry by the
vast id the manager recorded, else only by the row's label (a claimed id
picks among those), and a destroy by id never reaches an instance listed
under another label (operations.destroy). A pass ends by reconcile.deadline:
the vast calls it could not make are skipped and recorded, and it exits 1.
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence

from vastctl import clock, guard, operations, upstream
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.errors import Refused, Unavailable, UnknownInstance
from vastctl.facts import provers, tunnel
from vastctl.observe import LIVE_ROWS, observe
from vastctl.observe import VAST_DEAD_CODES as DEAD_STATUSES  # vast status → kill code
from vastctl.providers.base import DeadlinePassed, Provider, ProviderError, RemoteInstance
from vastctl.state import blocklist, locks, settings
from vastctl.state.audit import record_action, settle_pending_launches
from vastctl.state.db import transaction
from vastctl.state.lifecycle import LIVE_STATES, State, kill, record_event

LEASE = "reconcile"
LEASE_TTL_S = 10 * 60  # renewed before each action; a crashed holder on this host is ignored at once (locks.py)
LEASE_SLACK_S = 5 * 60  # the lease lasts at least this beyond reconcile.deadline
SCHEDULING_DEADLINE_S = 5 * 60  # vast's advice: still scheduling after ~30 s means the GPU is taken
STILL_LISTED_GRACE_S = 5 * 60  # vast confirmed a destroy but still lists the instance: destroy again after this
LISTINGS_KEPT_S = 7 * 86400  # vast_listings older than this are pruned (one row a pass would grow without bound)
OUTBID_GRACE_S = 2 * 3600  # an outbid machine is waited for this long after its last heartbeat, then timed out
START_FAILURE = re.compile(r"oci runtime|error|failed|exception|traceback|permission denied", re.IGNORECASE)
REASON_CHARS = 160  # vast's text quoted into a reason (an event, the table), through upstream.clip
SCHEDULING_STATUSES = frozenset({None, "", "stopped", "created", "scheduling"})
TIMED_STATES = {
    State.LAUNCHING: "launching", State.REGISTERED: "registered",
    State.PARAMS_DONE: "params_done", State.BENCH_DONE: "bench_done",
}


class ListingDistrusted(Unavailable):
    """Too much of the live fleet vanished at once: the listing is not believed, nobody is killed (exit 1)."""


@dataclass(frozen=True)
class Action:
    """One thing a pass does. `kill` marks a row killed; `destroy` asks vast to destroy a machine.

    A destroy with a `uuid` goes through the row (operations.destroy, which
    sets destroyed_at only on confirmation); one without (an orphan, or a
    machine still listed after its destroy was confirmed) goes to vast by id.
    """

    kind: str
    label: str
    reason: str
    uuid: str | None = None
    vast_id: int | None = None
    code: str | None = None
    expect: tuple | None = field(default=None, compare=False)  # (state, state_since, last_heartbeat_at) at plan time

    def view(self, result: str) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "reason": self.reason, "result": result,
                "code": self.code, "uuid": self.uuid, "vast_id": self.vast_id}


@dataclass
class Matched:
    """Which listing entry each row is, and what was learned by matching."""

    by_uuid: dict[str, RemoteInstance]
    recovered: dict[str, int]  # uuid → vast_id found by label (a launch that crashed before recording it)
    unclaimed: list[RemoteInstance]  # listing entries no unfinished row claims


@dataclass
class PassResult:
    actions: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    listed: int = 0
    dry_run: bool = False
    deadline_passed: bool = False  # some vast calls were not made; they are in `errors` and the actions table

    def to_json(self) -> dict[str, Any]:
        return {"actions": self.actions, "refused": self.refused, "errors": self.errors,
                "listed": self.listed, "dry_run": self.dry_run, "deadline_passed": self.deadline_passed}


class Budget:
    """A pass's time on the injected clock: `deadline` is the monotonic instant after which vast is not called."""

    def __init__(self, clock: Clock, seconds: float):
        self.clock = clock
        self.seconds = seconds
        self.deadline = clock.monotonic() + seconds

    def passed(self) -> bool:
        return self.clock.monotonic() >= self.deadline

    def __str__(self) -> str:
        return f"reconcile.deadline {clock.human_duration(self.seconds)}"


# --- pure decisions ----------------------------------------------------------------------------


def match(rows: Sequence[Mapping[str, Any]], listing: Sequence[RemoteInstance], label_prefix: str = "") -> Matched:
    """Pair rows with listing entries: by the vast_id the manager recorded, else by label.

    A row without a vast_id yet (a launch that crashed before recording it, or
    a machine adopted by `register`) is paired only with an entry vast lists
    under the row's label; a machine's claimed id only picks among those. A
    row the manager did not launch is paired only with an entry carrying our
    label prefix: a machine cannot adopt an instance we would never touch.
    """
    by_id = {entry.id: entry for entry in listing}
    by_uuid: dict[str, RemoteInstance] = {}
    claimed: set[int] = set()
    without_id = []
    for row in rows:
        vast_id = row.get("vast_id")
        if vast_id is None:
            without_id.append(row)
        elif vast_id in by_id:
            by_uuid[row["uuid"]] = by_id[vast_id]
            claimed.add(vast_id)
    recovered: dict[str, int] = {}
    if without_id:
        by_label: dict[str, list[RemoteInstance]] = defaultdict(list)
        for entry in listing:
            if entry.label and entry.id not in claimed:
                by_label[entry.label].append(entry)
        for row in without_id:
            if not launched(row) and not carries_prefix(row["label"], label_prefix):
                continue
            candidates = [entry for entry in by_label.get(row["label"], ()) if entry.id not in claimed]
            if candidates:
                claim = [entry for entry in candidates if entry.id == row.get("claimed_vast_id")]
                entry = (claim or sorted(candidates, key=lambda item: item.id))[0]
                by_uuid[row["uuid"]] = entry
                recovered[row["uuid"]] = entry.id
                claimed.add(entry.id)
    unclaimed = [entry for entry in listing if entry.id not in claimed]
    return Matched(by_uuid=by_uuid, recovered=recovered, unclaimed=unclaimed)


def launched(row: Mapping[str, Any]) -> bool:
    """Whether the manager rented this machine (launch records the offer) rather than adopting it."""
    return row.get("offer_id") is not None


def carries_prefix(label: str | None, prefix: str) -> bool:
    """Our label prefix marks the instances reconcile may act on; with no prefix, none are."""
    return bool(prefix) and label is not None and label.startswith(prefix)


def _expected_in_listing(row: Mapping[str, Any], matched: Matched) -> bool:
    """A row vast should be listing: it has a vast id, and it is not a fresh launch vast may not list yet."""
    has_id = row.get("vast_id") is not None or row["uuid"] in matched.recovered
    return has_id and (row.get("vast_seen_at") is not None or row["state"] != State.LAUNCHING)


def missing_after(row: Mapping[str, Any], matched: Matched) -> int:
    """The row's count of consecutive good listings it was missing from, this listing included."""
    if row["uuid"] in matched.by_uuid:
        return 0
    if _expected_in_listing(row, matched):
        return int(row.get("vast_missing") or 0) + 1
    return int(row.get("vast_missing") or 0)


def check_trust(rows: Sequence[Mapping[str, Any]], matched: Matched, config: Config) -> None:
    """Raise ListingDistrusted when more than max_vanish_fraction of the live fleet vanished at once.

    "At once" counts rows that were seen in the previous good listing and are
    missing from this one; rows already counted missing do not count again.
    """
    fleet = [row for row in rows if row["state"] in LIVE_STATES and _expected_in_listing(row, matched)]
    vanished = [row for row in fleet if row["uuid"] not in matched.by_uuid and not row.get("vast_missing")]
    limit = config.reconcile.max_vanish_fraction
    if vanished and len(vanished) > limit * len(fleet):
        names = ", ".join(sorted(row["label"] for row in vanished)[:5]) + (", …" if len(vanished) > 5 else "")
        raise ListingDistrusted(
            f"vast listing distrusted: {len(vanished)} of {len(fleet)} live machines vanished at once"
            f" ({names}; max_vanish_fraction {limit:g}); nothing was killed. If they really are gone, kill them"
            " with `vastctl kill LABEL --reason …`; otherwise retry later"
        )


def plan(
    rows: Sequence[Mapping[str, Any]],
    listing: Sequence[RemoteInstance],
    settings: Mapping[str, Any],
    config: Config,
    now: datetime,
    *,
    first_seen: Mapping[int, str] | None = None,
    history: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[Action]:
    """What one pass should do, from snapshots only.

    rows: every instance row not yet destroyed, as it was before this listing
    (vast_missing / vast_status are the previous listing's). listing: one good
    listing. first_seen: vast_id → ISO time the cache first saw it (orphan
    grace; unknown ids count as first seen now). history: vast_id → destroyed
    row, for listed instances whose row is already destroyed.
    Raises ListingDistrusted instead of planning kills from a broken listing.
    """
    matched = match(rows, listing, config.vast.label_prefix)
    check_trust(rows, matched, config)
    first_seen = first_seen or {}
    history = history or {}
    actions: list[Action] = []
    for row in rows:
        entry = matched.by_uuid.get(row["uuid"])
        vast_id = row.get("vast_id") if row.get("vast_id") is not None else matched.recovered.get(row["uuid"])
        if row["state"] == State.KILLED:
            if not row.get("destroyed_at"):
                actions.append(_destroy_row(row, vast_id, now))
            continue
        verdict = _verdict(row, entry, matched, settings, config, now)
        if verdict is None:
            continue
        code, reason = verdict
        actions.append(Action(
            kind="kill", label=row["label"], reason=reason, uuid=row["uuid"], vast_id=vast_id, code=code,
            expect=(row["state"], row.get("state_since"), row.get("last_heartbeat_at")),
        ))
        actions.append(Action(kind="destroy", label=row["label"], reason=f"killed: {reason}", uuid=row["uuid"],
                              vast_id=vast_id, code=code))
    actions.extend(_strays(matched.unclaimed, config, now, first_seen, history))
    return actions


def _verdict(row, entry, matched, settings, config, now) -> tuple[str, str] | None:
    """The kill code and reason for one live row, or None when it may live."""
    state = State(row["state"])
    if entry is None:
        missing = missing_after(row, matched)
        needed = max(1, config.reconcile.disappear_confirmations)
        if missing >= needed:
            seen = clock.from_iso(row.get("vast_seen_at"))
            last = f", last seen {clock.human_age(seen, now)} ago" if seen else ", never seen"
            return "disappeared", (f"disappeared from vast: instance {row.get('vast_id')} missing from {missing}"
                                   f" consecutive listings{last}")
    elif state is not State.STOPPED:  # a machine we stopped is not running because we asked: no status rule
        status = entry.actual_status or None
        if status != "running" and entry.status_msg and START_FAILURE.search(entry.status_msg):
            return "start_failed", f"vast reports a start failure (status {status or 'none'}): {upstream.clip(entry.status_msg, REASON_CHARS)}"
        if status in DEAD_STATUSES and row.get("vast_status") in DEAD_STATUSES and row.get("vast_seen_at"):
            since = clock.from_iso(row["vast_seen_at"])
            detail = f": {upstream.clip(entry.status_msg, REASON_CHARS)}" if entry.status_msg else ""
            return DEAD_STATUSES[status], f"vast status {status} for {clock.human_age(since, now)} (2 listings){detail}"
        if (state is State.LAUNCHING and row.get("resumed_at") and status in SCHEDULING_STATUSES
                and (entry.intended_status in (None, "", "running"))):
            resumed = clock.from_iso(row["resumed_at"])
            deadline = min(SCHEDULING_DEADLINE_S, config.timeouts.launching)
            if (now - resumed).total_seconds() > deadline:
                return "scheduling_timeout", (
                    f"resumed {clock.human_age(resumed, now)} ago but vast still has it {status or 'unscheduled'}"
                    f" (limit {clock.human_duration(deadline)}): its GPU is likely taken"
                )
    if state is State.BENCH_DONE and row.get("bench_rate") is not None:
        gate = float(settings["min_bench_rate"])
        if float(row["bench_rate"]) < gate:
            return "bench_failed", f"bench rate {row['bench_rate']:g} below gate {gate:g} (still bench_done)"
    since = clock.from_iso(row["state_since"])
    if since is None:  # every row has entered its state at some moment; a row without one is not judged
        return None
    if state in TIMED_STATES:
        name = TIMED_STATES[state]
        limit = getattr(config.timeouts, name)
        if (now - since).total_seconds() > limit:
            return f"timeout_{name}", f"{name} for {clock.human_age(since, now)} (limit {clock.human_duration(limit)})"
    if state is State.RUNNING:
        limit = config.timeouts.heartbeat
        beat = clock.from_iso(row.get("last_heartbeat_at"))
        paused = (entry is not None and outbid(entry)) or row.get("outbid_since") is not None
        if paused and beat is not None and (now - beat).total_seconds() < OUTBID_GRACE_S:
            return None  # paused by vast for a higher bid (or restarting since), disk kept: not dead
        if not guard.heartbeat_fresh(row, limit, now):  # the one liveness rule, the guard's too
            if beat is None or beat < since:
                return "heartbeat_timeout", f"running for {clock.human_age(since, now)} without a heartbeat (limit {clock.human_duration(limit)})"
            return "heartbeat_timeout", f"no heartbeat for {clock.human_age(beat, now)} (limit {clock.human_duration(limit)})"
        down = clock.from_iso(tunnel.down_since(dict(row)))
        limit = config.tunnel.down_timeout
        if down is not None and (now - down).total_seconds() > limit:
            how = "unreachable" if tunnel.joined_this_run(dict(row)) else "never reached"
            return "tunnel_down", (f"{how} through its tunnel (127.0.0.1:{row['tunnel_port']}) for"
                                   f" {clock.human_age(down, now)} (limit {clock.human_duration(limit)})")
    return None


def outbid(entry: RemoteInstance) -> bool:
    """An interruptible instance vast has stopped while we asked it to run: outbid (vast-api.md "Interruptible").
    It stays listed, keeps its disk and bills storage; it resumes when its bid wins again."""
    return entry.raw.get("is_bid") is True and "stopped" in (entry.actual_status, entry.cur_state)


def _destroy_row(row: Mapping[str, Any], vast_id: int | None, now: datetime) -> Action:
    killed = clock.from_iso(row.get("killed_at") or row.get("state_since"))
    attempts = int(row.get("destroy_attempts") or 0)
    reason = f"killed {clock.human_age(killed, now)} ago ({row.get('kill_code') or 'no code'}), not yet destroyed"
    if attempts:
        reason += f"; attempt {attempts + 1}, last error: {upstream.clip(row.get('destroy_error') or '?', REASON_CHARS)}"
    return Action(kind="destroy", label=row["label"], reason=reason, uuid=row["uuid"], vast_id=vast_id,
                  code=row.get("kill_code"))


def _strays(unclaimed: Iterable[RemoteInstance], config: Config, now: datetime,
            first_seen: Mapping[int, str], history: Mapping[int, Mapping[str, Any]]) -> list[Action]:
    """Listed instances no unfinished row claims: orphans with our prefix, or machines destroyed but still listed."""
    prefix = config.vast.label_prefix
    grace = config.timeouts.launching
    actions = []
    for entry in unclaimed:
        gone = history.get(entry.id)
        if gone is not None and entry.label == gone["label"]:
            destroyed = clock.from_iso(gone["destroyed_at"]) or now
            if entry.cur_state != "unloaded" and (now - destroyed).total_seconds() > STILL_LISTED_GRACE_S:
                actions.append(Action(
                    kind="destroy", label=gone["label"], vast_id=entry.id, code=gone.get("kill_code"),
                    reason=(f"destroyed {clock.human_age(destroyed, now)} ago but vast still lists instance {entry.id}"
                            f" ({entry.actual_status or 'no status'})"),
                ))
            continue
        if not carries_prefix(entry.label, prefix):
            continue  # not ours: never touched
        seen = clock.from_iso(first_seen.get(entry.id)) or now
        if (now - seen).total_seconds() > grace:
            actions.append(Action(
                kind="destroy", label=entry.label or "", vast_id=entry.id, code="orphan",
                reason=(f"orphan: vast instance {entry.id} carries our prefix but has no row and never registered;"
                        f" listed for {clock.human_age(seen, now)} (grace {clock.human_duration(grace)})"),
            ))
    return actions


# --- effects -----------------------------------------------------------------------------------


def apply(conn: sqlite3.Connection, provider: Provider, actions: Sequence[Action], config: Config, *,
          now: datetime, keepalive: Callable[[], None] | None = None,
          listing: Sequence[RemoteInstance] | None = None, budget: Budget | None = None) -> PassResult:
    """Perform the actions. A kill that loses a race is a result, not an error; a failed destroy is an error
    (recorded on the row and retried next pass). `keepalive` runs before each action: a pass whose
    destroys wait long on vast renews its lease instead of letting a second pass start beside it.
    `listing` (the pass's) is what a destroy checks the row's label against before it asks vast.
    Once the `budget` is spent no destroy is sent: each is recorded as skipped (kills, which never call
    vast, still happen), and the result says `deadline_passed`."""
    listed = None if listing is None else {entry.id: entry for entry in listing}
    result = PassResult()
    stopped: str | None = None  # why this pass calls vast no more
    skipped: list[str] = []
    obs = None  # built at the first action: most passes apply nothing
    for action in actions:
        if keepalive is not None:
            keepalive()
        target = "row" if action.uuid is not None else "vast id" if action.vast_id is not None else "nothing"
        branch = {("kill", "row"): "kill", ("destroy", "row"): "destroy row",
                  ("destroy", "vast id"): "destroy by id"}.get((action.kind, target))
        if branch is None:  # every other kind, or a kind without what it needs, is an error: never a destroy
            outcome = f"error: reconcile does not apply a {action.kind!r} action to {target}"
            result.errors.append(f"{action.label}: {outcome}")
            result.actions.append(action.view(outcome))
            continue
        asked = guard.Action(kind=action.kind, actor="reconcile", label=action.label, uuid=action.uuid,
                             vast_id=action.vast_id, reason=action.reason, code=action.code)
        obs = obs or observe(conn, config, now=now)
        verdict = guard.check(obs, asked, config)
        guard.record(conn, asked, verdict, now=now)
        if not verdict.allowed:
            result.refused.append(verdict.refusal(asked))
            continue
        if branch == "kill":  # kills never call vast: they happen whatever the deadline
            result.actions.append(action.view(_apply_kill(conn, action, config, now)))
            continue
        if stopped is None and budget is not None and budget.passed():
            stopped = f"{budget} passed"
        if stopped is not None:
            outcome = _skip(conn, action, stopped, now)
            skipped.append(f"{action.kind} {action.label}")
        else:
            try:
                if branch == "destroy row":
                    outcome = _apply_destroy_row(conn, provider, action, now, result.errors, listed)
                else:
                    outcome = _apply_destroy_stray(conn, provider, action, now, result.errors)
            except DeadlinePassed as exc:
                stopped = f"{budget or 'the deadline'} reached ({exc})"
                outcome = f"not done: {exc}; retried next pass"
                skipped.append(f"{action.kind} {action.label}")
        result.actions.append(action.view(outcome))
    if stopped is not None:
        result.deadline_passed = True
        result.errors.append(f"stopped calling vast: {stopped}; {len(skipped)} action(s) left for the next pass:"
                             f" {', '.join(skipped)}")
    return result


def _skip(conn: sqlite3.Connection, action: Action, why: str, now: datetime) -> str:
    """A vast call this pass did not make, recorded in the audit so the file says what was left undone."""
    text = f"skipped: {why}; retried next pass"
    record_action(conn, actor="reconcile", kind=action.kind, ok=False, result=text, uuid=action.uuid,
                  label=action.label, vast_id=action.vast_id, now=now)
    return text


def _apply_kill(conn: sqlite3.Connection, action: Action, config: Config, now: datetime) -> str:
    assert action.uuid is not None and action.code is not None, "plan() kills rows, with a code"
    try:
        row = dict(conn.execute("SELECT * FROM instances WHERE uuid = ?", (action.uuid,)).fetchone() or {})
        if not row:
            return "skipped: the row is gone"
        if action.expect and (row["state"], row["state_since"], row["last_heartbeat_at"]) != action.expect:
            if row["state"] == State.KILLED:
                return f"already killed by {_killer(conn, action.uuid)}: {row['kill_reason']}"
            return f"skipped: it moved on since the plan (now {row['state']})"
        killed = kill(conn, action.uuid, action.reason, source="reconcile", code=action.code, now=now)
    except (Refused, UnknownInstance):  # lost the race: someone else moved it first
        row = dict(conn.execute("SELECT state, kill_reason FROM instances WHERE uuid = ?", (action.uuid,)).fetchone()
                   or {"state": "gone", "kill_reason": None})
        if row["state"] == State.KILLED:
            return f"already killed by {_killer(conn, action.uuid)}: {row['kill_reason']}"
        return f"skipped: now {row['state']}"
    # a machine that failed the gate or died early is not rented again for a while (blocklist.py decides)
    if blocklist.block_row(conn, killed, config.vast.blocklist_ttl):
        return "killed; machine blocklisted"
    return "killed"


def _killer(conn: sqlite3.Connection, uuid: str) -> str:
    row = conn.execute("SELECT source FROM events WHERE uuid = ? AND to_state = 'killed' ORDER BY id DESC LIMIT 1",
                       (uuid,)).fetchone()
    return row["source"] if row else "someone else"


def _apply_destroy_row(conn: sqlite3.Connection, provider: Provider, action: Action, now: datetime,
                       errors: list[str], listed: Mapping[int, RemoteInstance] | None) -> str:
    row = conn.execute("SELECT * FROM instances WHERE uuid = ?", (action.uuid,)).fetchone()
    if row is None:
        return "skipped: the row is gone"
    row = dict(row)
    if row["state"] != State.KILLED:  # never destroy a machine whose row is alive
        return f"skipped: not killed (now {row['state']})"
    if row["destroyed_at"]:
        return "already destroyed"
    if row["vast_id"] is None and action.vast_id is not None:
        row["vast_id"] = action.vast_id  # found by label in this listing (recorded before apply)
    if operations.destroy(conn, provider, row, actor="reconcile", now=now, listed=listed):
        if row["vast_id"] is not None:
            return "destroyed"
        if row.get("claimed_vast_id") is not None:
            return (f"marked destroyed; its claimed vast instance {row['claimed_vast_id']} was never listed under"
                    f" its label, so it was not touched")
        return "destroyed (nothing was created at vast)"
    error = conn.execute("SELECT destroy_error, destroy_attempts FROM instances WHERE uuid = ?",
                         (action.uuid,)).fetchone()
    text = f"destroy failed (attempt {error['destroy_attempts']}): {error['destroy_error']}; retried next pass"
    errors.append(f"{action.label} (vast {row['vast_id']}): {text}")
    return text


def _apply_destroy_stray(conn: sqlite3.Connection, provider: Provider, action: Action, now: datetime,
                         errors: list[str]) -> str:
    assert action.vast_id is not None, "a stray is destroyed by the id vast listed it under"
    try:
        provider.destroy_instance(action.vast_id)
    except ProviderError as exc:
        record_action(conn, actor="reconcile", kind="destroy", ok=False, result=str(exc), label=action.label,
                      vast_id=action.vast_id, now=now)
        if isinstance(exc, DeadlinePassed):
            raise
        errors.append(f"{action.label} (vast {action.vast_id}): destroy failed: {exc}; retried next pass")
        return f"destroy failed: {exc}; retried next pass"
    record_action(conn, actor="reconcile", kind="destroy", ok=True, result="destroyed", label=action.label,
                  vast_id=action.vast_id, now=now)
    if action.code == "orphan":  # the one event for a machine that never had a row
        with transaction(conn):
            record_event(conn, kind="orphan", source="reconcile", reason=action.reason, now=now,
                         label=action.label, code="orphan")
    return "destroyed"


def record_failed_listing(conn: sqlite3.Connection, error: str, now: datetime) -> None:
    with transaction(conn):
        conn.execute("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, 0, NULL, ?)",
                     (clock.to_iso(now), upstream.clip(error, 1000)))
        _prune_listings(conn, now)


def _prune_listings(conn: sqlite3.Connection, now: datetime) -> None:
    """Keep a week of listing history; the newest good listing is kept whatever its age (fleet shows its age)."""
    conn.execute(
        "DELETE FROM vast_listings WHERE at < ? AND id != (SELECT coalesce(max(id), 0) FROM vast_listings WHERE ok = 1)",
        (clock.to_iso(now - timedelta(seconds=LISTINGS_KEPT_S)),),
    )


def record_listing(conn: sqlite3.Connection, rows: Sequence[Mapping[str, Any]], listing: Sequence[RemoteInstance],
                   matched: Matched, now: datetime) -> None:
    """Cache one good listing: vast_listings, vast_cache, and each row's view of vast; one transaction."""
    at = clock.to_iso(now)
    seen, missing = [], []
    for row in rows:
        entry = matched.by_uuid.get(row["uuid"])
        if entry is not None:
            paused = at if outbid(entry) and row.get("state") == State.RUNNING else None
            seen.append((entry.actual_status, entry.status_msg, at, paused, entry.machine_id, entry.gpu_name,
                         entry.num_gpus, entry.dph_total, row["uuid"]))
        else:
            count = missing_after(row, matched)
            if count != int(row.get("vast_missing") or 0):
                missing.append((count, row["uuid"]))
    with transaction(conn):
        conn.execute("INSERT INTO vast_listings (at, ok, instances, error) VALUES (?, 1, ?, NULL)", (at, len(listing)))
        _prune_listings(conn, now)
        conn.executemany(
            "INSERT INTO vast_cache (vast_id, label, actual_status, intended_status, cur_state, status_msg, machine_id,"
            " gpu_name, num_gpus, dph, storage_dph, first_seen_at, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(vast_id) DO UPDATE SET label = excluded.label, actual_status = excluded.actual_status,"
            " intended_status = excluded.intended_status, cur_state = excluded.cur_state,"
            " status_msg = excluded.status_msg, machine_id = excluded.machine_id, gpu_name = excluded.gpu_name,"
            " num_gpus = excluded.num_gpus, dph = excluded.dph, storage_dph = excluded.storage_dph,"
            " seen_at = excluded.seen_at",
            [(e.id, e.label, e.actual_status, e.intended_status, e.cur_state, e.status_msg, e.machine_id, e.gpu_name,
              e.num_gpus, e.dph_total, e.storage_dph, at, at) for e in listing],
        )
        conn.execute("DELETE FROM vast_cache WHERE seen_at != ?", (at,))
        conn.executemany(
            "UPDATE instances SET vast_id = ? WHERE uuid = ? AND vast_id IS NULL",
            [(vast_id, uuid) for uuid, vast_id in matched.recovered.items()],
        )
        for uuid, vast_id in matched.recovered.items():  # the launch a crash left pending in the audit
            settle_pending_launches(conn, uuid, vast_id, by="reconcile")
        conn.executemany(
            "UPDATE instances SET vast_status = ?1, vast_status_msg = ?2, vast_seen_at = ?3, vast_missing = 0,"
            " outbid_since = CASE WHEN ?4 IS NOT NULL THEN COALESCE(outbid_since, ?4)"
            " WHEN last_heartbeat_at > outbid_since THEN NULL ELSE outbid_since END,"  # kept until it proves again
            " machine_id = COALESCE(machine_id, ?5), gpu_name = COALESCE(gpu_name, ?6),"
            " num_gpus = COALESCE(num_gpus, ?7), dph = COALESCE(dph, ?8) WHERE uuid = ?9",
            seen,
        )
        conn.executemany("UPDATE instances SET vast_missing = ? WHERE uuid = ?", missing)


def _snapshot(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(LIVE_ROWS)]


def _strays_context(conn: sqlite3.Connection, config: Config,
                    unclaimed: Sequence[RemoteInstance]) -> tuple[dict, dict]:
    """first_seen and history for the (normally few) listed instances no unfinished row claims."""
    first_seen, history = {}, {}
    prefix = config.vast.label_prefix
    for entry in unclaimed:
        if prefix and entry.label and entry.label.startswith(prefix):
            cached = conn.execute("SELECT first_seen_at FROM vast_cache WHERE vast_id = ?", (entry.id,)).fetchone()
            if cached:
                first_seen[entry.id] = cached["first_seen_at"]
        gone = conn.execute(
            "SELECT uuid, label, vast_id, kill_code, destroyed_at FROM instances"
            " WHERE vast_id = ? AND destroyed_at IS NOT NULL ORDER BY destroyed_at DESC LIMIT 1", (entry.id,),
        ).fetchone()
        if gone:
            history[entry.id] = dict(gone)
    return first_seen, history


def _list(provider: Provider, budget: "Budget") -> list[RemoteInstance]:
    try:
        listing = list(provider.list_instances())
    except DeadlinePassed as exc:
        raise DeadlinePassed(f"reconcile stopped at its deadline ({budget}) before vast listed the fleet: {exc};"
                             " nothing was planned or killed, the next pass tries again") from None
    ids = [entry.id for entry in listing]
    if len(set(ids)) != len(ids):
        raise ProviderError("vast listing names the same instance twice; not trusting it")
    return listing


def lease_ttl(config: Config) -> float:
    """The lease outlives a pass however long reconcile.deadline is, so a second pass is turned away meanwhile."""
    return max(LEASE_TTL_S, config.reconcile.deadline + LEASE_SLACK_S)


def listing_notes(provider: Provider) -> list[str]:
    """What the provider left out of its last listing (entries it could not represent), to be reported."""
    notes = getattr(provider, "listing_notes", None)
    return [str(note) for note in notes] if isinstance(notes, list) else []


def _after_pass(conn: sqlite3.Connection, config: Config) -> list[str]:
    """The tunnel account's keys and nginx's upstream list brought in line with the rows; what failed, in words."""
    errors = []
    for step in (tunnel.write_authorized_keys, provers.refresh):
        try:
            step(conn, config)
        except Unavailable as exc:
            errors.append(str(exc))
    return errors


def run_pass(conn: sqlite3.Connection, provider: Provider, config: Config, *, clock: Clock,
             dry_run: bool = False) -> PassResult:
    """One reconcile pass. Raises Unavailable (exit 1) when the lease is held, the listing failed, or it is
    distrusted; in each of those cases nothing was killed. `dry_run` plans and changes nothing at all.

    The pass reads its time from `clock` (the system clock from the CLI, virtual time in the simulator)
    and ends by `reconcile.deadline` on it (cron starts the next one a minute later): the
    provider starts no call and waits for no retry past it, and the vast calls left are skipped and
    recorded; the result then has `deadline_passed` set (the CLI exits 1).
    """
    now = clock.now()
    budget = Budget(clock, config.reconcile.deadline)
    previous, provider.deadline = getattr(provider, "deadline", None), budget.deadline
    try:
        if dry_run:
            listing = _list(provider, budget)
            rows = _snapshot(conn)
            matched = match(rows, listing, config.vast.label_prefix)
            first_seen, history = _strays_context(conn, config, matched.unclaimed)
            actions = plan(rows, listing, settings.effective(conn, config), config, now,
                           first_seen=first_seen, history=history)
            return PassResult(actions=[a.view("planned (dry run)") for a in actions], listed=len(listing),
                              dry_run=True, errors=listing_notes(provider))
        with locks.held(conn, LEASE, ttl_s=lease_ttl(config), now=now) as lease:
            try:
                listing = _list(provider, budget)
            except ProviderError as exc:
                record_failed_listing(conn, str(exc), clock.now())
                raise
            # The pass judges and stamps its events as of the listing's return, not its own start: the
            # listing may take seconds (retries), and machines' reports written meanwhile carry later times,
            # so a pass stamped at its start would write events whose times run backwards in id order.
            now = clock.now()
            tunnel.check(conn, config, now=now)  # joined or not, before the plan reads the rows
            rows = _snapshot(conn)
            matched = match(rows, listing, config.vast.label_prefix)
            first_seen, history = _strays_context(conn, config, matched.unclaimed)
            try:
                actions = plan(rows, listing, settings.effective(conn, config), config, now,
                               first_seen=first_seen, history=history)
            except ListingDistrusted as exc:
                record_failed_listing(conn, str(exc), now)
                raise
            record_listing(conn, rows, listing, matched, now)
            result = apply(conn, provider, actions, config, now=now, keepalive=lambda: lease.renew(clock.now()), listing=listing,
                           budget=budget)
            result.listed = len(listing)
            result.errors[:0] = listing_notes(provider) + _after_pass(conn, config)
            return result
    finally:
        provider.deadline = previous
