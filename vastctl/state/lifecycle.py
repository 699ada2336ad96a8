"""The instance lifecycle: states, the one table of allowed moves, transition() and kill().

_move_in_tx() is the only code that changes `instances.state`. In one
transaction it does a compare-and-set UPDATE against the allowed sources and,
only when a row changed, appends the event. So the primary path (a bench
report) and the safety net (reconcile) can race for the same kill: exactly one
wins and exactly one event exists. transition() makes every move but a kill;
kill_in_tx() (kill() in a transaction of its own) writes every kill, and takes its KillCode from the caller:
`git grep KillCode.X` finds every function that decides a kill coded X.

The instance reports (register, params_done, bench_report, running, heartbeat)
are idempotent: a report delivered twice (a retry after a lost answer) changes
nothing the second time and writes no second event. The two that carry a rate, bench_report and heartbeat,
are rates.py's; the bounds their figures are stored within, plausible.py's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Literal, Mapping, NoReturn

from vastctl import clock, upstream, validate
from vastctl.errors import BadInput, BenchFailed, Refused, UnknownInstance
from vastctl.state import plausible
from vastctl.state.db import inserted_id, transaction
from vastctl.state.rows import InstanceChanges, InstanceRow, JSONValue, column_values, typed
from vastctl.validate import Invalid, NotFound

try:
    from enum import StrEnum as StrEnum  # re-exported: guard.py takes it from here, which works on 3.10 too
except ImportError:  # Python 3.10

    class StrEnum(str, Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)


class State(StrEnum):
    LAUNCHING = "launching"
    REGISTERED = "registered"
    PARAMS_DONE = "params_done"
    BENCH_DONE = "bench_done"
    RUNNING = "running"
    STOPPED = "stopped"
    KILLED = "killed"


S = State
ALLOWED: dict[State, frozenset[State]] = {
    S.LAUNCHING: frozenset({S.REGISTERED, S.STOPPED, S.KILLED}),
    S.REGISTERED: frozenset({S.PARAMS_DONE, S.STOPPED, S.KILLED}),
    S.PARAMS_DONE: frozenset({S.BENCH_DONE, S.REGISTERED, S.STOPPED, S.KILLED}),
    S.BENCH_DONE: frozenset({S.RUNNING, S.REGISTERED, S.STOPPED, S.KILLED}),
    S.RUNNING: frozenset({S.REGISTERED, S.STOPPED, S.KILLED}),
    S.STOPPED: frozenset({S.LAUNCHING, S.REGISTERED, S.KILLED}),
    S.KILLED: frozenset(),
}
LIVE_STATES = frozenset(s for s in State if s is not S.KILLED)
Source = Literal["instance", "reconcile", "agent", "operator"]  # who moved a machine: its event's `source`
SOURCES: tuple[Source, ...] = ("instance", "reconcile", "agent", "operator")


class KillCode(StrEnum):
    """Why a machine was killed: its kill event's `code` and the row's `kill_code` (the contract's list)."""

    BENCH_FAILED = "bench_failed"
    DISAPPEARED = "disappeared"
    EXITED = "exited"
    OFFLINE = "offline"
    START_FAILED = "start_failed"
    SCHEDULING_TIMEOUT = "scheduling_timeout"
    TIMEOUT_LAUNCHING = "timeout_launching"
    TIMEOUT_REGISTERED = "timeout_registered"
    TIMEOUT_PARAMS_DONE = "timeout_params_done"
    TIMEOUT_BENCH_DONE = "timeout_bench_done"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    TUNNEL_DOWN = "tunnel_down"
    ROUTE_FAILING = "route_failing"
    ORPHAN = "orphan"
    OPERATOR = "operator"
    AGENT = "agent"


# vast statuses that mean the machine is dead → the kill code reconcile gives it once two listings agree
# (the observation's disagreement, the rules, the guard and reconcile read this one table)
VAST_DEAD_CODES = {"exited": KillCode.EXITED, "unknown": KillCode.OFFLINE, "offline": KillCode.OFFLINE}


@dataclass(frozen=True)
class Cause:
    """Why an actor moved a machine: the reason its decision gave (a rule's, the model's, the operator's) and, for
    an agent step's action, the step's id. Its move's event keeps them in `data` as {"reason", "step"}, so
    `events` shows why a machine was launched, stopped, resumed or killed and `agent history --label` finds the
    step without reading the reason text."""

    reason: str
    step: int | None = None

    def data(self) -> dict[str, JSONValue]:
        found: dict[str, JSONValue] = {"reason": self.reason}
        if self.step is not None:
            found["step"] = self.step
        return found


def allowed_sources(to_state: State) -> list[str]:
    return sorted(str(src) for src, targets in ALLOWED.items() if to_state in targets)


def get(conn: sqlite3.Connection, uuid: str) -> InstanceRow:
    row = conn.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone()
    if row is None:
        raise NotFound("uuid", "(see `vastctl fleet --all`)", lead=f"no instance with uuid {uuid!r}: check ")
    return typed(row, InstanceRow)


def resolve(conn: sqlite3.Connection, label_or_uuid: str) -> InstanceRow:
    """The row named by a label or a uuid (operators type labels)."""
    row = conn.execute(
        "SELECT * FROM instances WHERE label = ? OR uuid = ? ORDER BY label = ? DESC LIMIT 1",
        (label_or_uuid, label_or_uuid, label_or_uuid),
    ).fetchone()
    if row is None:
        raise UnknownInstance(f"no instance labelled or with uuid {label_or_uuid!r}: see `vastctl fleet --all`")
    return typed(row, InstanceRow)


def record_event(
    conn: sqlite3.Connection,
    *,
    kind: str,
    source: str,
    reason: str,
    now: datetime,
    uuid: str | None = None,
    label: str | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    code: str | None = None,
    data: Mapping[str, JSONValue] | None = None,
) -> int:
    """Append one event. Call inside the transaction that made the change.

    `reason` is for people; what a reader decides on is in the columns and in `data` (a setting's
    {"key", "old", "new"}, a forced move's {"forced": true}), never parsed back out of the reason."""
    cursor = conn.execute(
        "INSERT INTO events (at, kind, uuid, label, from_state, to_state, reason, source, code, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (clock.to_iso(now), kind, uuid, label, from_state, to_state, reason, source, code,
         None if data is None else json.dumps(dict(data), sort_keys=True)),
    )
    return inserted_id(cursor)


def event_source(source: str) -> Source:
    """`source` as one of SOURCES (who moved a machine); ValueError for any other text."""
    for known in SOURCES:
        if source == known:
            return known
    raise ValueError(f"unknown event source {source!r}")


def transition(
    conn: sqlite3.Connection,
    uuid: str,
    to_state: State,
    reason: str,
    source: str,
    *,
    updates: InstanceChanges | None = None,
    forced: bool = False,
    cause: Cause | None = None,
    now: datetime,
) -> InstanceRow:
    """Move one instance to `to_state` (any state but killed: kill() writes those) and record the event,
    atomically; `forced`: the move passed the guard by an operator's force (the event's data says so); `cause`:
    why the actor moved it (the event's data says that too).

    Raises UnknownInstance when there is no row and Refused when the move is
    not allowed from the row's current state; either way nothing changes.
    Returns the row as it is after the move.
    """
    with transaction(conn):
        return transition_in_tx(conn, uuid, State(to_state), reason, source, updates=updates, forced=forced,
                                 cause=cause, now=now)


def transition_in_tx(
    conn: sqlite3.Connection,
    uuid: str,
    to_state: State,
    reason: str,
    source: str,
    *,
    now: datetime,
    updates: InstanceChanges | None = None,
    forced: bool = False,
    cause: Cause | None = None,
) -> InstanceRow:
    """transition() inside the caller's transaction."""
    if to_state is S.KILLED:
        raise ValueError("a machine is killed through lifecycle.kill() or kill_in_tx(), with its KillCode")
    return _move_in_tx(conn, uuid, to_state, reason, event_source(source), now=now,
                       changes=updates.copy() if updates else InstanceChanges(), forced=forced, cause=cause)


def kill(
    conn: sqlite3.Connection,
    uuid: str,
    reason: str,
    *,
    source: str,
    code: KillCode,
    forced: bool = False,
    cause: Cause | None = None,
    now: datetime,
) -> InstanceRow:
    """Mark killed (terminal), in a transaction of its own. Destroying the machine at the provider is the
    caller's next step. kill_in_tx (module docstring) writes it."""
    with transaction(conn):
        return kill_in_tx(conn, uuid, reason, source=source, code=code, forced=forced, cause=cause, now=now)


def kill_in_tx(
    conn: sqlite3.Connection,
    uuid: str,
    reason: str,
    *,
    source: str,
    code: KillCode,
    now: datetime,
    forced: bool = False,
    updates: InstanceChanges | None = None,
    cause: Cause | None = None,
) -> InstanceRow:
    """The one writer of a kill, inside the caller's transaction: the row's kill_reason, kill_code, killed_at
    and kill_forced set with its move to killed (and `updates`, columns the same report changes), and the
    transition event carrying `code`. Every kill in the package comes here, each caller naming its KillCode.X."""
    changes = updates.copy() if updates else InstanceChanges()
    killed = KillCode(code)  # a code no KillCode names is refused (ValueError), never stored
    changes["kill_reason"], changes["kill_code"] = reason, str(killed)
    changes["killed_at"], changes["kill_forced"] = clock.to_iso(now), int(forced)
    return _move_in_tx(conn, uuid, S.KILLED, reason, event_source(source), now=now, changes=changes, forced=forced,
                       code=killed, cause=cause)


def _move_in_tx(
    conn: sqlite3.Connection,
    uuid: str,
    to_state: State,
    reason: str,
    source: Source,
    *,
    now: datetime,
    changes: InstanceChanges,
    forced: bool,
    code: KillCode | None = None,
    cause: Cause | None = None,
) -> InstanceRow:
    """The compare-and-set of one move and its event (module docstring): the only UPDATE of instances.state."""
    before = get(conn, uuid)
    columns = {"state": str(to_state), "state_since": clock.to_iso(now), **column_values(changes)}
    sources = allowed_sources(to_state)
    assignments = ", ".join(f"{name} = ?" for name in columns)
    placeholders = ", ".join("?" for _ in sources)
    cursor = conn.execute(
        f"UPDATE instances SET {assignments} WHERE uuid = ? AND state IN ({placeholders})",
        (*columns.values(), uuid, *sources),
    )
    if cursor.rowcount != 1:
        raise Refused(
            f"instance {before['label']} is {before['state']}; it cannot go to {to_state}"
            f" (only from {', '.join(sources) or 'nowhere'})"
        )
    record_event(
        conn, kind="transition", source=source, reason=reason, now=now, uuid=uuid, label=before["label"],
        from_state=before["state"], to_state=str(to_state), code=None if code is None else str(code),
        data=_event_data(forced, cause),
    )
    return get(conn, uuid)


def _event_data(forced: bool, cause: Cause | None) -> dict[str, JSONValue] | None:
    """A move's event data: {"forced": true} past the guard by force, and its cause's {"reason", "step"}."""
    data: dict[str, JSONValue] = {"forced": True} if forced else {}
    if cause is not None:
        data.update(cause.data())
    return data or None


def create(
    conn: sqlite3.Connection,
    *,
    uuid: str,
    label: str,
    state: State,
    reason: str,
    source: str,
    now: datetime,
    fields: InstanceChanges | None = None,
    cause: Cause | None = None,
) -> InstanceRow:
    """Insert a new row with its first event (a launch, or adoption of an unknown machine); `cause`: why."""
    with transaction(conn):
        return _create_in_tx(conn, uuid=uuid, label=label, state=State(state), reason=reason, source=source,
                             now=now, fields=fields, cause=cause)


def _create_in_tx(
    conn: sqlite3.Connection,
    *,
    uuid: str,
    label: str,
    state: State,
    reason: str,
    source: str,
    now: datetime,
    fields: InstanceChanges | None = None,
    cause: Cause | None = None,
) -> InstanceRow:
    taken = conn.execute("SELECT uuid FROM instances WHERE label = ? AND uuid != ?", (label, uuid)).fetchone()
    if taken:
        raise BadInput(f"label {label!r} already belongs to instance {taken['uuid']}: choose another label")
    changes = InstanceChanges(uuid=uuid, label=label, state=str(state), created_at=clock.to_iso(now),
                              state_since=clock.to_iso(now))
    changes.update(fields or {})
    columns = column_values(changes)
    names = ", ".join(columns)
    conn.execute(f"INSERT INTO instances ({names}) VALUES ({', '.join('?' for _ in columns)})", tuple(columns.values()))
    record_event(conn, kind="transition", source=source, reason=reason, now=now, uuid=uuid, label=label,
                 from_state=None, to_state=str(state), data=_event_data(False, cause))
    return get(conn, uuid)


# --- the reports a rented machine's boot script makes -------------------------------------------
#
# Each value is checked once, where it enters, and there are two such places because a value arrives in two forms:
# a command line's text (cli/instance.py, with the validate_* functions here and in rates.py: before it chooses the
# state file or the manager, so a bad value is exit 2 with nothing opened and no request sent) and an HTTP body's
# JSON (serving/server.py's _fields and the uuid in the path, with the same rules: the manager trusts no client, so
# a machine's own check does not count there). Past them (LocalReports, RemoteReports, the reports below, rates.py)
# a value is typed and checked nowhere again; the one bound applied after is plausibility, as a rate is stored.


def validate_register(uuid: object, *, label: object = None, vast_id: object = None, gpu_name: object = None,
                      num_gpus: object = None) -> None:
    """A register report's values: the uuid, label and GPU model one line of printable text, the vast id and the
    GPU count whole numbers the file can store (a count of at least 1)."""
    validate.text(uuid, "uuid")
    if label is not None:
        validate.text(label, "label")
    if gpu_name is not None:
        validate.text(gpu_name, "gpu_name")
    if vast_id is not None:
        validate.whole(vast_id, "vast_id")
    if num_gpus is not None:
        validate.whole(num_gpus, "num_gpus", minimum=1)


def register(
    conn: sqlite3.Connection,
    uuid: str,
    *,
    label: str | None = None,
    vast_id: int | None = None,
    gpu_name: str | None = None,
    num_gpus: int | None = None,
    label_prefix: str = "",
    now: datetime,
) -> InstanceRow:
    """The boot script started.

    Unknown uuid: the row is created (a machine launched by hand is adopted).
    A live row further along means the container restarted: it goes back to
    `registered` and the event says so. A killed row is refused.

    The machine's `vast_id` is a claim, kept in `claimed_vast_id`: it never
    sets or changes `vast_id`, which only the manager writes (at launch, or
    when reconcile finds the instance listed under the row's label). Believing
    it would let one machine point reconcile's destroy at another. Likewise
    the GPU model and count a launch recorded from the offer stand: the
    machine's own report fills them in only where the manager knows nothing.
    An adopted label without `label_prefix` is said in the adoption event (prefix_note). The values are ones
    validate_register() passed.
    """
    details = InstanceChanges()
    if vast_id is not None:
        details["claimed_vast_id"] = vast_id
    if gpu_name is not None:
        details["gpu_name"] = gpu_name
    if num_gpus is not None:
        details["num_gpus"] = num_gpus
    with transaction(conn):
        found = conn.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone()
        if found is None:
            if not label:
                raise Invalid("label", lead=f"instance {uuid} is new here: register it with ")
            note = prefix_note(label, label_prefix)
            return _create_in_tx(conn, uuid=uuid, label=label, state=S.REGISTERED, source="instance", now=now,
                                 reason="registered without a launch record: adopted" + (f"; {note}" if note else ""),
                                 fields=details)
        row = typed(found, InstanceRow)
        state = State(row["state"])
        if state is S.KILLED:
            raise Refused(f"instance {row['label']} was killed ({row['kill_reason']}): it must not run; shut down")
        if row["offer_id"] is not None:  # launched by us: the offer said what it is, the machine cannot re-say it
            if row["gpu_name"] is not None:
                details.pop("gpu_name", None)
            if row["num_gpus"] is not None:
                details.pop("num_gpus", None)
        details = plausible.within(row, details)  # fewer GPUs re-said: its stored rates, within the new ceiling
        if state is S.REGISTERED:  # a repeated report: refresh the details, no event
            if details:
                update_fields(conn, uuid, details)
            return get(conn, uuid)
        if state in (S.LAUNCHING, S.STOPPED):
            reason = "boot script started"
            updates = details
        else:
            reason = f"container restarted (was {state})"
            updates = details.copy()
            updates["restarts"] = row["restarts"] + 1
        return transition_in_tx(conn, uuid, S.REGISTERED, reason, "instance", updates=updates, now=now)


def prefix_note(label: str | None, prefix: str) -> str | None:
    """What a label without our prefix means for its machine, or None when it carries the prefix."""
    if not prefix or not label or label.startswith(prefix):
        return None
    return (f"the label {label!r} lacks our prefix {prefix!r}: reconcile never pairs it with a vast instance,"
            " so vastctl will not stop, start or destroy anything at vast for it; `vastctl kill` retires only the row")


def params_done(conn: sqlite3.Connection, uuid: str, *, now: datetime) -> InstanceRow:
    """Proving parameters are fetched; the benchmark starts."""
    return _report_once(conn, uuid, S.PARAMS_DONE, "proving parameters fetched", now=now)


def _report_once(conn: sqlite3.Connection, uuid: str, state: State, reason: str, *, now: datetime) -> InstanceRow:
    """A machine's report of reaching `state`: the transition, or the row unchanged when it is there already (a
    boot script retries a report whose answer it lost)."""
    with transaction(conn):
        row = get(conn, uuid)
        if row["state"] == state:
            return row
        return transition_in_tx(conn, uuid, state, reason, "instance", now=now)


BENCH_FAILED_STATES = (S.REGISTERED, S.PARAMS_DONE)  # where a boot can fail before its bench passes
REASON_CHARS = 500  # a machine's reason: one line in the event log and the fleet table, like a kill --reason


def validate_reason(reason: object) -> str:
    """A failed boot's reason: one printable line of at most REASON_CHARS characters."""
    return validate.text(reason, "reason", max_len=REASON_CHARS)


def bench_failed(conn: sqlite3.Connection, uuid: str, reason: str | None = None, *, now: datetime) -> NoReturn:
    """The boot could not measure a rate (the parameter fetch failed, the daemon never answered, no proof
    completed): killed at once, as a below-gate bench is, so the host is blocklisted and the machine
    destroyed within minutes rather than at a timeout. BenchFailed is raised with the row in `.row`.

    The reason comes from the machine: one printable line (validate_reason passed it where it entered), masked
    and clipped before it is stored. A repeat after the kill answers as the first report did.
    """
    text = upstream.clip(reason or "the machine gave no reason", REASON_CHARS - len("bench failed: "))
    with transaction(conn):
        row = get(conn, uuid)
        if row["state"] == S.KILLED and row["kill_code"] == KillCode.BENCH_FAILED and row["bench_rate"] is None:
            result = row  # the same report again: no second event
        elif row["state"] not in BENCH_FAILED_STATES:
            raise Refused(f"instance {row['label']} is {row['state']}: a failed bench is reported while it boots"
                          f" ({' or '.join(BENCH_FAILED_STATES)})")
        else:
            result = kill_in_tx(conn, uuid, f"bench failed: {text}", source="instance", code=KillCode.BENCH_FAILED,
                                now=now)
    error = BenchFailed(f"instance {result['label']}: {result['kill_reason']}; it is being killed, do not prove")
    error.row = result
    raise error


BOOT_STAGES = ("fetch", "daemon", "warmup", "bench", "join")  # the boot script's stages, in the order they run
MAX_STAGE_S = 7 * 86400  # a stage longer than a week is not a measurement


def validate_stages(stages: object) -> dict[str, float]:
    """The boot's stage durations: {stage: seconds}, each stage one of BOOT_STAGES, each a finite number ≥ 0."""
    if not isinstance(stages, dict):
        raise Invalid("stages", f"must map a stage ({', '.join(BOOT_STAGES)}) to its seconds, got {validate.shown(stages)}")
    checked: dict[str, float] = {}
    for name, seconds in stages.items():
        if name not in BOOT_STAGES:
            raise Invalid("stages", f"has an unknown stage {validate.shown(name)} (known: {', '.join(BOOT_STAGES)})")
        value = validate.finite(seconds, f"stages.{name}", what=" (seconds)", text=True)
        if value > MAX_STAGE_S:
            raise Invalid(f"stages.{name}", f"must be at most {MAX_STAGE_S} seconds, got {value:g}")
        checked[name] = round(value, 1)
    return {name: checked[name] for name in BOOT_STAGES if name in checked}


def running(conn: sqlite3.Connection, uuid: str, *, now: datetime, stages: Mapping[str, float] | None = None) -> InstanceRow:
    """The prover is up and taking work; `stages` is where the boot's time went (fleet --json: boot_stages), as
    validate_stages() returned it."""
    row = _report_once(conn, uuid, S.RUNNING, "proving", now=now)
    if stages:
        with transaction(conn):
            update_fields(conn, uuid, {"boot_stages": json.dumps(dict(stages))})
    return row


def update_fields(conn: sqlite3.Connection, uuid: str, changes: InstanceChanges) -> None:
    """Set columns of one row that are not its state (call inside a transaction); state moves via transition()."""
    if "state" in changes:
        raise ValueError("instances.state changes only through transition()")
    columns = column_values(changes)
    assignments = ", ".join(f"{name} = ?" for name in columns)
    conn.execute(f"UPDATE instances SET {assignments} WHERE uuid = ?", (*columns.values(), uuid))


def printable(text: str) -> str:
    """`text` with every control, bidi and separator character shown as an escape (`\\x1b`, `\\u202e`).

    For text from outside (vast's status messages, machines' reports, old rows) shown in a table, a line
    or a log; JSON output keeps the data as it is. Every character validate.text refuses is escaped.
    """
    return upstream.escape_controls(text)
