"""Provider calls that spend or stop spending money on a machine rented, each audited and reflected in the state file.

stop/start pause and resume one, rebid changes an interruptible one's bid, kill ends one, destroy
ends the billing of a killed one; every action passes the guard first (pass_guard, which a launch uses too:
renting is launches.py's). Callers pass who asks (`actor`: operator,
reconcile or agent); it becomes the event source and the audit's actor. The agent passes why (its `cause`: the
reason its policy gave and its step's id); an operator's command without one is said to be the operator's
(asked()). Either way the move's event keeps it in its data.
"""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import datetime
from typing import Callable, Mapping

from vastctl import clock, guard, upstream, validate
from vastctl.config import Config
from vastctl.errors import BadInput, GuardRefused, Refused, Unavailable
from vastctl.facts import tunnel
from vastctl.guard import Kind
from vastctl.observe import observe
from vastctl.providers.base import (
    DeadlinePassed,
    Provider,
    ProviderError,
    RemoteInstance,
)
from vastctl.state import blocklist, instances, lifecycle
from vastctl.state.audit import begin_action, finish_action, record_action
from vastctl.state.db import transaction
from vastctl.state.lifecycle import Cause, KillCode, State
from vastctl.state.rows import InstanceChanges, InstanceRow


def asked(actor: str, command: str, cause: Cause | None = None) -> Cause:
    """The cause a move's event keeps: the one given (the agent's), else the actor's own command."""
    if cause is not None:
        return cause
    return Cause(f"the operator ran `vastctl {command}`" if actor == "operator" else f"{command} by {actor}")


def destroy(conn: sqlite3.Connection, provider: Provider | None, row: InstanceRow, *, actor: str,
            now: datetime, listed: Mapping[int, RemoteInstance] | None = None) -> bool:
    """Destroy the row's machine at the market; True once the market confirms it is gone.

    `destroyed_at` is set only on confirmation. A failure is recorded on the row
    (`destroy_attempts`, `destroy_error`) and in the audit, and False is returned:
    the caller (every reconcile pass) tries again. Raises no ProviderError but DeadlinePassed (recorded
    the same way first), so that a caller with a deadline knows to stop calling the market.

    A destroy by vast id happens only for an instance the market lists under
    the row's label: `listed` is a fresh listing by id (reconcile's), else the
    instance is looked up. One listed under another label is left alone and
    the refusal recorded like a failure, whoever's claim put its id here.
    """
    if row.get("destroyed_at"):
        return True
    vast_id = row.get("vast_id")
    if vast_id is None:  # nothing was ever created at the market under this row
        mark(conn, row["uuid"], {"destroyed_at": clock.to_iso(now), "destroy_error": None})
        return True
    assert provider is not None, "a row with a vast instance is destroyed through the market"
    try:
        remote = listed.get(vast_id) if listed is not None else provider.show_instance(vast_id)
        if remote is not None and remote.label != row["label"]:
            return _destroy_failed(conn, row, actor, now, (
                f"not destroyed: vast lists instance {vast_id} under the label {remote.label!r}, not"
                f" {row['label']!r}; a destroy by id needs the row's label (check the instance at vast)"))
        provider.destroy_instance(vast_id)
    except ProviderError as exc:
        _destroy_failed(conn, row, actor, now, str(exc))
        if isinstance(exc, DeadlinePassed):
            raise
        return False
    record_action(conn, actor=actor, kind=Kind.DESTROY, ok=True, result="destroyed", uuid=row["uuid"],
                  label=row["label"], vast_id=row["vast_id"], now=now)
    mark(conn, row["uuid"], {"destroyed_at": clock.to_iso(now), "destroy_error": None})
    return True


def _destroy_failed(conn: sqlite3.Connection, row: InstanceRow, actor: str, now: datetime, error: str) -> bool:
    error = upstream.clip(error, 1000)
    record_action(conn, actor=actor, kind=Kind.DESTROY, ok=False, result=error, uuid=row["uuid"],
                  label=row["label"], vast_id=row["vast_id"], now=now)
    instances.count_destroy_failure(conn, row["uuid"], error)
    return False


def mark(conn: sqlite3.Connection, uuid: str, changes: InstanceChanges) -> None:
    with transaction(conn):
        lifecycle.update_fields(conn, uuid, changes)


def pass_guard(conn: sqlite3.Connection, config: Config, action: guard.Action, *,
               now: datetime) -> guard.Verdict:
    """The guard on a fresh observation; a refusal (recorded) raises GuardRefused, an override is recorded."""
    verdict = guard.check(observe(conn, config, now=now), action, config)
    guard.record(conn, action, verdict, now=now)
    if not verdict.allowed:
        raise GuardRefused(verdict.why, limit=verdict.limit)
    return verdict


# --- stop / start -----------------------------------------------------------------------------------


def stop(conn: sqlite3.Connection, provider: Provider, label_or_uuid: str, *, config: Config,
         actor: str = "operator", force: bool = False, reason: str = "", cause: Cause | None = None,
         now: datetime) -> InstanceRow:
    """Stop a live machine at vast (it keeps its disk and bills storage), then mark it stopped.

    The guard refuses a stop that would leave nothing running while work is queued
    or demand is unknown; an operator's `force` passes that rule, and the event says so.
    """
    row = lifecycle.resolve(conn, label_or_uuid)
    _check_move(row, State.STOPPED, "stopped", "stop")
    verdict = pass_guard(conn, config, guard.Action(kind=Kind.STOP, actor=actor, label=row["label"],
                                                    uuid=row["uuid"], vast_id=row["vast_id"], reason=reason,
                                                    force=force), now=now)
    _call(conn, provider, row, Kind.STOP, actor, now)
    why = f"stopped by {actor}" + (f": {reason}" if reason else "") + (" (forced)" if verdict.forced else "")
    return lifecycle.transition(conn, row["uuid"], State.STOPPED, why, actor, updates={"resumed_at": None},
                                forced=verdict.forced, cause=asked(actor, "stop", cause), now=now)


def start(conn: sqlite3.Connection, provider: Provider, config: Config, label_or_uuid: str, *,
          actor: str = "operator", cause: Cause | None = None, now: datetime) -> InstanceRow:
    """Resume a stopped machine: vast start, then state launching with `resumed_at` set.

    vast accepts a start even when the machine's GPU was taken (it then sits
    in "scheduling"); reconcile enforces the deadline from `resumed_at`.
    """
    row = lifecycle.resolve(conn, label_or_uuid)
    if row["state"] != State.STOPPED:
        raise Refused(f"instance {row['label']} is {row['state']}: only a stopped machine can be started")
    _check_move(row, State.LAUNCHING, "started", "start")
    pass_guard(conn, config, guard.Action(kind=Kind.START, actor=actor, label=row["label"], uuid=row["uuid"],
                                          vast_id=row["vast_id"], dph=row["dph"]), now=now)
    _call(conn, provider, row, Kind.START, actor, now)
    return lifecycle.transition(conn, row["uuid"], State.LAUNCHING, f"resumed by {actor}", actor,
                                updates={"resumed_at": clock.to_iso(now)}, cause=asked(actor, "start", cause),
                                now=now)


def _check_move(row: InstanceRow, to_state: State, verb: str, action: str) -> None:
    if to_state not in lifecycle.ALLOWED[State(row["state"])]:
        raise Refused(f"instance {row['label']} is {row['state']}: it cannot be {verb}")
    if row["vast_id"] is None:
        raise Refused(without_vast_id(row, action))


def without_vast_id(row: InstanceRow, verb: str, label_prefix: str | None = None) -> str:
    """Why a row without a confirmed vast id cannot be stopped or started at vast, and what would confirm one.

    A machine's `register --vast-id` is only a claim (claimed_vast_id): vast is asked about an instance only
    once a listing (reconcile's) shows it under the row's label and the manager records its id.
    """
    label = row["label"]
    if row["state"] == State.LAUNCHING:
        return (f"{label} has no vast instance id yet (its create answer is pending or was lost): there is nothing"
                f" to {verb} at vast until `vastctl reconcile` finds it listed under its label; or kill it")
    if row.get("claimed_vast_id") is None:
        return (f"{label} was never rented (it has no vast instance id): there is nothing to {verb} at vast;"
                " `vastctl kill` retires it")
    claimed = row["claimed_vast_id"]
    if label_prefix is not None and not (label_prefix and label.startswith(label_prefix)):
        confirm = (f"reconcile never confirms it: the label lacks our prefix {label_prefix!r}, and vastctl acts"
                   " only on instances it can tell are its own")
    else:
        confirm = (f"`vastctl reconcile` confirms it once vast lists instance {claimed} under the label {label!r}"
                   f" (see `vastctl fleet`)")
    return (f"{label} claims vast instance {claimed} (its register --vast-id), but no vast listing has confirmed"
            f" it: vastctl does not {verb} an instance on a machine's word; {confirm}. `vastctl kill` retires the"
            " row")


def rebid(conn: sqlite3.Connection, provider: Provider, config: Config, label_or_uuid: str, price: float, *,
          actor: str = "operator", reason: str = "", now: datetime) -> InstanceRow:
    """Change an interruptible machine's bid at vast (the guard first: within max_dph and max_hourly_spend),
    then record it; an outbid machine's wait starts again from now (the new bid is given its chance)."""
    row = lifecycle.resolve(conn, label_or_uuid)
    if row.get("bid") is None or row.get("vast_id") is None:
        raise BadInput(f"{row['label']} is not an interruptible machine at vast: only a bid can be changed")
    pass_guard(conn, config, guard.Action(kind=Kind.REBID, actor=actor, label=row["label"], uuid=row["uuid"],
                                          vast_id=row["vast_id"], dph=price, reason=reason), now=now)
    change = getattr(provider, "change_bid", None)
    if change is None:
        raise Unavailable(f"provider {config.provider} cannot change a bid")
    intent = begin_action(conn, actor=actor, kind=Kind.REBID, uuid=row["uuid"], label=row["label"], now=now,
                          request={"price": price},
                          what=f"bid ${price:g}/h for instance {row['vast_id']} sent; the listing shows whether it took")
    try:
        change(row["vast_id"], price)
    except ProviderError as exc:
        finish_action(conn, intent, ok=False, result=str(exc), vast_id=row["vast_id"])
        raise
    finish_action(conn, intent, ok=True, result="accepted", vast_id=row["vast_id"])
    paused = row.get("outbid_since") is not None
    changes = InstanceChanges(bid=price, dph=price)
    if paused:
        changes["outbid_since"] = clock.to_iso(now)
    mark(conn, row["uuid"], changes)
    return lifecycle.get(conn, row["uuid"])


def _call(conn: sqlite3.Connection, provider: Provider, row: InstanceRow, kind: Kind, actor: str,
          now: datetime) -> None:
    """A stop or start at vast, its intent committed first: a start spends money again, so a crash (or a full
    disk) at any point leaves a row that says the call may have been made, and no call goes out unrecorded."""
    method = {Kind.STOP: provider.stop_instance, Kind.START: provider.start_instance}[kind]
    intent = begin_action(conn, actor=actor, kind=kind, uuid=row["uuid"], label=row["label"], now=now,
                          what=f"{kind} of instance {row['vast_id']} sent; if this stays pending, vast may have"
                               f" {'resumed' if kind is Kind.START else 'stopped'} it: reconcile's listing shows which")
    vast_id = row["vast_id"]
    assert vast_id is not None, "_check_move refused a row without a vast id"
    try:
        method(vast_id)
    except ProviderError as exc:
        finish_action(conn, intent, ok=False, result=str(exc), vast_id=row["vast_id"])
        raise
    finish_action(conn, intent, ok=True, result="accepted", vast_id=row["vast_id"])


# --- kill -------------------------------------------------------------------------------------------


KILL_REASON_MAX = 500  # one line in the event log and the fleet table; a longer story goes in `notify`


def needs_provider_to_kill(row: InstanceRow) -> bool:
    """Whether killing this row has to talk to the market (it has, or may have, a vast instance)."""
    return row["vast_id"] is not None or row["state"] == State.LAUNCHING


def operator_kill(conn: sqlite3.Connection, config: Config, label_or_uuid: str, reason: str, *,
                  make_provider: Callable[[Config], Provider], force: bool = False,
                  now: datetime) -> tuple[InstanceRow, str | None]:
    """An operator's kill, from the CLI or the dashboard alike: the reason checked, the market asked for only
    when the machine has (or may have) a vast instance, then kill() through the guard."""
    reason = reason.strip()
    if not reason:
        raise BadInput("give a reason for the event log")
    validate.text(reason, "reason", max_len=KILL_REASON_MAX)
    row = lifecycle.resolve(conn, label_or_uuid)
    provider = make_provider(config) if needs_provider_to_kill(row) else None
    return kill(conn, provider, row["uuid"], f"operator: {reason}", config=config, actor="operator",
                code=KillCode.OPERATOR, force=force, cause=Cause(f"operator: {reason}"), now=now)


def kill(conn: sqlite3.Connection, provider: Provider | None, label_or_uuid: str, reason: str, *,
         config: Config, actor: str = "operator", code: KillCode, ttl_s: float | None = None,
         force: bool = False, kind: Kind = Kind.KILL, cause: Cause | None = None,
         now: datetime) -> tuple[InstanceRow, str | None]:
    """Mark killed, then destroy at vast; returns (row, error of the destroy or None).

    The guard sees it first (`kind` kill, or destroy for the agent's tool): a
    kill that would leave nothing running while work is queued is refused
    unless an operator forces it. A failed destroy leaves `destroyed_at`
    empty: every reconcile pass retries. A launching row without a vast id may
    have a machine whose create answer was lost: it is looked up by label
    first. `ttl_s` (the blocklist TTL) blocklists the machine when the kill
    says it failed. `code` is the caller's KillCode.X (lifecycle.kill_in_tx writes it); `cause` (the agent's
    reason and step) goes into the event's data, else the actor's own `vastctl kill` (asked()).
    """
    row = lifecycle.resolve(conn, label_or_uuid)
    was = row["state"]
    if was == State.KILLED:  # before the guard: whatever its label, there is nothing left to decide
        left = "" if row.get("destroyed_at") else "; reconcile destroys it again on every pass until vast confirms"
        raise Refused(f"instance {lifecycle.printable(row['label'])} is killed already"
                      f" ({lifecycle.printable(row.get('kill_reason') or 'no reason')}){left}")
    verdict = pass_guard(conn, config, guard.Action(kind=kind, actor=actor, label=row["label"], uuid=row["uuid"],
                                                    vast_id=row["vast_id"], reason=reason, code=code,
                                                    force=force), now=now)
    if verdict.forced:
        reason += " (forced)"
    listed: dict[int, RemoteInstance] | None = None
    row = lifecycle.kill(conn, row["uuid"], reason, source=actor, code=code, forced=verdict.forced,
                         cause=asked(actor, "kill", cause), now=now)
    if row.get("tunnel_port") is not None:  # its key stops working at its next connect
        with contextlib.suppress(Unavailable):  # an unwritable file is reconcile's error to report, every pass
            tunnel.write_authorized_keys(conn, config)
    if ttl_s is not None:
        blocklist.block_row(conn, row, ttl_s)
    if row["vast_id"] is None and was == State.LAUNCHING:
        if provider is None:
            return row, "no provider to look the machine up by label"
        try:
            listing = provider.list_instances()
        except ProviderError as exc:
            return row, f"could not look {row['label']} up at vast: {exc}"
        listed = {item.id: item for item in listing}
        match = [item for item in listing if item.label == row["label"]]
        if match:
            mark(conn, row["uuid"], {"vast_id": match[0].id})
            row = lifecycle.get(conn, row["uuid"])
    if row["vast_id"] is not None and provider is None:
        return row, "no provider to destroy the machine"
    if not destroy(conn, provider, row, actor=actor, now=now, listed=listed):
        return lifecycle.get(conn, row["uuid"]), lifecycle.get(conn, row["uuid"])["destroy_error"]
    return lifecycle.get(conn, row["uuid"]), None
