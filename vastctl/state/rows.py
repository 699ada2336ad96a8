"""One typed row per table the code reads: each table's columns, in one place, as a query returns them.

Rows stay plain dicts at run time (what `--json` prints, what the views copy and extend), so these are
TypedDicts: `mypy --strict` checks every key a caller reads against the columns here, and a misspelled key or a
renamed column fails the type check instead of a test, if any. migrations.py is the schema's history; this is
its present. A migration that adds, drops or renames a column changes the TypedDict of its table here too
(tests/test_rows.py compares the two on a freshly migrated file).

A nullable column is `X | None`; `NOT NULL` columns and columns with a default are `X`. SQLite's INTEGER holds
the booleans too (0/1: `ok`, `vast_missing`, `kill_forced`), and times are ISO-8601 UTC text (clock.py).
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, TypeAlias, TypedDict, TypeVar, cast


class InstanceRow(TypedDict):
    """One machine of ours, from its launch (or adoption) on; never deleted (`destroyed_at` ends it)."""

    uuid: str
    label: str
    state: str  # a lifecycle.State's value
    vast_id: int | None  # what the manager recorded at launch or vast listed under the label (trusted)
    machine_id: int | None  # vast's host
    offer_id: int | None
    gpu_name: str | None
    num_gpus: int | None
    dph: float | None  # $/h it rents at (its bid when interruptible)
    bench_rate: float | None
    proofs_done: int  # the prover's raw counter as last reported
    proofs_per_hour: float | None
    restarts: int
    created_at: str
    state_since: str
    last_heartbeat_at: str | None
    kill_reason: str | None
    kill_code: str | None
    killed_at: str | None
    destroyed_at: str | None
    vast_status: str | None  # the last good listing's word on it
    vast_status_msg: str | None
    vast_seen_at: str | None
    vast_missing: int  # listings in a row that did not show it
    resumed_at: str | None
    destroy_attempts: int
    destroy_error: str | None
    claimed_vast_id: int | None  # what the machine itself reported (not trusted)
    tunnel_port: int | None
    tunnel_public_key: str | None
    joined_at: str | None
    tunnel_down_since: str | None
    tunnel_checked_at: str | None
    storage_dph: float | None
    vast_status_since: str | None
    bid: float | None
    ask_dph: float | None
    outbid_since: str | None
    proofs_total: int
    route_failing_since: str | None
    route_failure: str | None
    boot_stages: str | None  # JSON: stage → seconds
    kill_forced: int


class InstanceChanges(TypedDict, total=False):
    """Some of an `instances` row's columns, as a write sets them (lifecycle.create's fields, a transition's
    updates, update_fields): InstanceRow's keys, each optional (tests/test_db.py holds the two equal)."""

    uuid: str
    label: str
    state: str  # a lifecycle.State's value
    vast_id: int | None  # what the manager recorded at launch or vast listed under the label (trusted)
    machine_id: int | None  # vast's host
    offer_id: int | None
    gpu_name: str | None
    num_gpus: int | None
    dph: float | None  # $/h it rents at (its bid when interruptible)
    bench_rate: float | None
    proofs_done: int  # the prover's raw counter as last reported
    proofs_per_hour: float | None
    restarts: int
    created_at: str
    state_since: str
    last_heartbeat_at: str | None
    kill_reason: str | None
    kill_code: str | None
    killed_at: str | None
    destroyed_at: str | None
    vast_status: str | None  # the last good listing's word on it
    vast_status_msg: str | None
    vast_seen_at: str | None
    vast_missing: int  # listings in a row that did not show it
    resumed_at: str | None
    destroy_attempts: int
    destroy_error: str | None
    claimed_vast_id: int | None  # what the machine itself reported (not trusted)
    tunnel_port: int | None
    tunnel_public_key: str | None
    joined_at: str | None
    tunnel_down_since: str | None
    tunnel_checked_at: str | None
    storage_dph: float | None
    vast_status_since: str | None
    bid: float | None
    ask_dph: float | None
    outbid_since: str | None
    proofs_total: int
    route_failing_since: str | None
    route_failure: str | None
    boot_stages: str | None  # JSON: stage → seconds
    kill_forced: int


class GoneRow(TypedDict):
    """A destroyed machine's columns that a listed instance no unfinished row claims is judged by (reconcile's
    strays): fleet_rows.GONE_COLUMNS, of a row whose query asked for a vast id and a destroyed_at (both set)."""

    uuid: str
    label: str
    vast_id: int
    kill_code: str | None
    destroyed_at: str


class InstanceRevisionRow(TypedDict):
    """A machine's revision: past the file's highest at each insert and update of its row (a trigger sets it;
    kept_rows reads only the machines changed since the revision it kept)."""

    uuid: str
    revision: int


class EventFacts(TypedDict):
    """One event's columns but its data: what the observation and the views carry of it."""

    id: int
    at: str
    kind: str
    uuid: str | None
    label: str | None
    from_state: str | None
    to_state: str | None
    reason: str | None
    source: str
    code: str | None


class EventRow(EventFacts):
    """One thing that happened: a transition, a setting changed, a report bounded, …"""

    data: str | None  # JSON: the event's structured fields


class SettingRow(TypedDict):
    key: str
    value: str
    updated_at: str


class VastListingRow(TypedDict):
    """One listing of our instances at vast, good (ok) or failed."""

    id: int
    at: str
    ok: int
    instances: int | None
    error: str | None


class VastCacheRow(TypedDict):
    """One instance as the last good listing showed it."""

    vast_id: int
    label: str | None
    actual_status: str | None
    intended_status: str | None
    cur_state: str | None
    status_msg: str | None
    machine_id: int | None
    gpu_name: str | None
    num_gpus: int | None
    dph: float | None
    first_seen_at: str
    seen_at: str
    storage_dph: float | None


class ActionRow(TypedDict):
    """One provider call (or its intent), in the audit."""

    id: int
    at: str
    actor: str
    kind: str
    uuid: str | None
    label: str | None
    vast_id: int | None
    request: str | None  # JSON
    ok: int
    result: str | None


class BlocklistRow(TypedDict):
    machine_id: int
    reason: str
    until: str


class LockRow(TypedDict):
    name: str
    holder: str
    acquired_at: str
    expires_at: str


class AgentMessageRow(TypedDict):
    id: int
    step_id: int | None
    at: str
    role: str
    content: str


class AgentNoteRow(TypedDict):
    id: int
    step_id: int | None
    at: str
    text: str


class DemandSampleRow(TypedDict):
    id: int
    at: str
    queued: int | None
    proofs_per_hour: float | None
    source: str
    ok: int
    error: str | None
    in_flight: int | None
    lookahead: int | None
    arrivals: str | None  # a JSON list of counts, one each facts/demand.ARRIVAL_BUCKET_S
    later: int | None


class AgentStepRow(TypedDict):
    id: int
    started_at: str
    finished_at: str | None
    policy: str
    outcome: str
    event_cursor: int | None
    observation: str | None  # JSON
    actions: str | None  # JSON
    refused: str | None  # JSON
    errors: str | None  # JSON
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float
    hold: str | None


class SignOutRow(TypedDict):
    session: str
    expires_at: str
    signed_out_at: str


class WebhookDeliveryRow(TypedDict):
    event_id: str
    received_at: str
    notif_type: str | None
    attempt: int | None
    event: int | None  # the events row it made
    signed: str | None


class MachineLogRow(TypedDict):
    uuid: str
    name: str
    at: str
    text: str
    cut: int


class ProofCallRow(TypedDict):
    """One call the proof router delivered (facts/deliveries.py says what each column means)."""

    id: int
    at: str
    request_id: str | None
    kind: str
    uuid: str | None
    label: str | None
    result: str
    held_ms: int
    prover_ms: int | None
    attempt: int
    size_bytes: int
    queue_wait_ms: int | None
    srs_load_ms: int | None
    synthesis_ms: int | None
    gpu_compute_ms: int | None
    total_ms: int | None
    detail: str | None


class RouteStatusRow(TypedDict):
    id: int
    updated_at: str
    held: int
    held_bytes: int
    oldest_held_s: float | None
    in_flight: int
    provers: int
    routing: str | None  # JSON: proof kind name → own_daemon, fleet or refused (route/routing.py)


# table name → its row type: what tests/test_rows.py holds against the migrated schema (the simulator's
# sim_* tables are the simulated market's own, read only by providers/sim_store.py, and not listed)
TABLES: dict[str, type] = {
    "instances": InstanceRow, "events": EventRow, "settings": SettingRow, "vast_listings": VastListingRow,
    "vast_cache": VastCacheRow, "actions": ActionRow, "blocklist": BlocklistRow, "locks": LockRow,
    "agent_messages": AgentMessageRow, "agent_notes": AgentNoteRow, "demand_samples": DemandSampleRow,
    "agent_steps": AgentStepRow, "dashboard_sign_outs": SignOutRow, "webhook_deliveries": WebhookDeliveryRow,
    "machine_logs": MachineLogRow, "proof_calls": ProofCallRow, "route_status": RouteStatusRow,
    "instance_revisions": InstanceRevisionRow,
}

Row = TypeVar("Row")
SQLValue: TypeAlias = "str | int | float | bytes | None"  # what a column holds, as sqlite3 reads and writes it
# JSON as json.loads returns it and json.dumps takes it (an event's `data`, an action's `request`)
JSONValue: TypeAlias = "dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None"
KeptRow: TypeAlias = "tuple[SQLValue, ...]"  # a row's values in its query's column order (kept_rows)


def column_values(changes: InstanceChanges) -> dict[str, SQLValue]:
    """The columns and values of `changes`, to write: every InstanceRow value is an SQL value."""
    return cast("dict[str, SQLValue]", dict(changes))


def typed(row: sqlite3.Row | dict[str, SQLValue], kind: type[Row]) -> Row:
    """A whole row (SELECT *) of the table `kind` stands for, as a dict. The one place a row read from the file
    becomes its TypedDict: sqlite3 cannot say which columns a query returned, the schema (and test_rows) does."""
    return cast(Row, dict(row))


def selected(conn: sqlite3.Connection, kind: type[Row], sql: str, args: Iterable[SQLValue] = ()) -> list[Row]:
    """Every row a `SELECT *` of the table `kind` stands for returns, as dicts (through plain tuples: half the
    time of sqlite3.Row for a thousand wide rows)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    cursor.execute(sql, tuple(args))
    names = [column[0] for column in cursor.description]
    # the query is a SELECT * of kind's table: its columns are kind's keys (test_rows holds the two equal)
    return [cast(Row, dict(zip(names, row))) for row in cursor]
