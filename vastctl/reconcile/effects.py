"""reconcile's effects: the planned actions done, each through the guard first.

A kill marks the row killed through lifecycle (one event, source `reconcile`, the action's code), unless the
row moved on since the plan or someone else killed it first (a result, not an error). A destroy goes through
the row (operations.destroy, which sets destroyed_at only on confirmation, and never reaches an instance
listed under another label), or, for an orphan or a machine still listed after its destroy, to vast by id.
Once the pass's Budget is spent no destroy is sent: each is recorded as skipped and retried next pass.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Literal, Mapping, Sequence, TypedDict

from vastctl import clock, guard, operations
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.errors import Refused, UnknownInstance
from vastctl.facts.json_value import JSON
from vastctl.guard import Action, Kind
from vastctl.observe import observe
from vastctl.providers.base import DeadlinePassed, Provider, ProviderError, RemoteInstance
from vastctl.reconcile.decide import ACTOR
from vastctl.state import blocklist, instances
from vastctl.state.audit import record_action
from vastctl.state.db import transaction
from vastctl.state.lifecycle import KillCode, State, kill, record_event


class ReportedAction(TypedDict):
    """One action of a pass as `reconcile --json` lists it (reported): every field named, the missing ones null."""

    kind: str  # a guard.Kind's value
    label: str | None
    reason: str
    result: str
    code: str | None  # a lifecycle.KillCode's value
    uuid: str | None
    vast_id: int | None


class PassJSON(TypedDict):
    """A pass as `reconcile --json` prints it."""

    actions: list[ReportedAction]
    refused: list[dict[str, JSON]]
    errors: list[str]
    listed: int
    dry_run: bool
    deadline_passed: bool


@dataclass
class PassResult:
    actions: list[ReportedAction] = field(default_factory=list)
    refused: list[dict[str, JSON]] = field(default_factory=list)  # guard.Verdict.refusal's
    errors: list[str] = field(default_factory=list)
    listed: int = 0
    dry_run: bool = False
    deadline_passed: bool = False  # some vast calls were not made; they are in `errors` and the actions table

    def to_json(self) -> PassJSON:
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


def reported(action: Action, result: str) -> ReportedAction:
    """How a pass lists one of its actions (`reconcile --json`): every field named, the missing ones null."""
    return {"kind": str(action.kind), "label": action.label, "reason": action.reason, "result": result,
            "code": None if action.code is None else str(action.code), "uuid": action.uuid,
            "vast_id": action.vast_id}


# (kind, what the action names) → how the pass applies it; any other pair is an error, never a destroy
_BRANCHES: dict[tuple[Kind, str], Literal["kill", "destroy row", "destroy by id"]] = {
    (Kind.KILL, "row"): "kill", (Kind.DESTROY, "row"): "destroy row", (Kind.DESTROY, "vast id"): "destroy by id"}


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
        branch = _BRANCHES.get((action.kind, target))
        if branch is None:  # every other kind, or a kind without what it needs, is an error: never a destroy
            outcome = f"error: reconcile does not apply a {str(action.kind)!r} action to {target}"
            result.errors.append(f"{action.label}: {outcome}")
            result.actions.append(reported(action, outcome))
            continue
        obs = obs or observe(conn, config, now=now)
        verdict = guard.check(obs, action, config)
        guard.record(conn, action, verdict, now=now)
        if not verdict.allowed:
            result.refused.append(verdict.refusal(action))
            continue
        if branch == "kill":  # kills never call vast: they happen whatever the deadline
            result.actions.append(reported(action, _apply_kill(conn, action, config, now)))
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
        result.actions.append(reported(action, outcome))
    if stopped is not None:
        result.deadline_passed = True
        result.errors.append(f"stopped calling vast: {stopped}; {len(skipped)} action(s) left for the next pass:"
                             f" {', '.join(skipped)}")
    return result


def _skip(conn: sqlite3.Connection, action: Action, why: str, now: datetime) -> str:
    """A vast call this pass did not make, recorded in the audit so the file says what was left undone."""
    text = f"skipped: {why}; retried next pass"
    record_action(conn, actor=ACTOR, kind=str(action.kind), ok=False, result=text, uuid=action.uuid,
                  label=action.label, vast_id=action.vast_id, now=now)
    return text


def _apply_kill(conn: sqlite3.Connection, action: Action, config: Config, now: datetime) -> str:
    assert action.uuid is not None and action.code is not None, "plan() kills rows, with a code"
    try:
        row = instances.find(conn, action.uuid)
        if row is None:
            return "skipped: the row is gone"
        if action.expect and (row["state"], row["state_since"], row["last_heartbeat_at"]) != action.expect:
            if row["state"] == State.KILLED:
                return f"already killed by {_killer(conn, action.uuid)}: {row['kill_reason']}"
            return f"skipped: it moved on since the plan (now {row['state']})"
        killed = kill(conn, action.uuid, action.reason, source=ACTOR, code=action.code, now=now)
    except (Refused, UnknownInstance):  # lost the race: someone else moved it first
        now_row = instances.find(conn, action.uuid)
        if now_row is None:
            return "skipped: now gone"
        if now_row["state"] == State.KILLED:
            return f"already killed by {_killer(conn, action.uuid)}: {now_row['kill_reason']}"
        return f"skipped: now {now_row['state']}"
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
    row = instances.find(conn, action.uuid) if action.uuid is not None else None
    if row is None:
        return "skipped: the row is gone"
    if row["state"] != State.KILLED:  # never destroy a machine whose row is alive
        return f"skipped: not killed (now {row['state']})"
    if row["destroyed_at"]:
        return "already destroyed"
    if row["vast_id"] is None and action.vast_id is not None:
        row["vast_id"] = action.vast_id  # found by label in this listing (recorded before apply)
    if operations.destroy(conn, provider, row, actor=ACTOR, now=now, listed=listed):
        if row["vast_id"] is not None:
            return "destroyed"
        if row.get("claimed_vast_id") is not None:
            return (f"marked destroyed; its claimed vast instance {row['claimed_vast_id']} was never listed under"
                    f" its label, so it was not touched")
        return "destroyed (nothing was created at vast)"
    error = instances.find(conn, row["uuid"])
    assert error is not None, "a row is never deleted"
    text = f"destroy failed (attempt {error['destroy_attempts']}): {error['destroy_error']}; retried next pass"
    errors.append(f"{action.label} (vast {row['vast_id']}): {text}")
    return text


def _apply_destroy_stray(conn: sqlite3.Connection, provider: Provider, action: Action, now: datetime,
                         errors: list[str]) -> str:
    assert action.vast_id is not None, "a stray is destroyed by the id vast listed it under"
    try:
        provider.destroy_instance(action.vast_id)
    except ProviderError as exc:
        record_action(conn, actor=ACTOR, kind=Kind.DESTROY, ok=False, result=str(exc), label=action.label,
                      vast_id=action.vast_id, now=now)
        if isinstance(exc, DeadlinePassed):
            raise
        errors.append(f"{action.label} (vast {action.vast_id}): destroy failed: {exc}; retried next pass")
        return f"destroy failed: {exc}; retried next pass"
    record_action(conn, actor=ACTOR, kind=Kind.DESTROY, ok=True, result="destroyed", label=action.label,
                  vast_id=action.vast_id, now=now)
    if action.code == KillCode.ORPHAN:  # the one event for a machine that never had a row
        with transaction(conn):
            record_event(conn, kind="orphan", source=ACTOR, reason=action.reason, now=now,
                         label=action.label, code=KillCode.ORPHAN)
    return "destroyed"

