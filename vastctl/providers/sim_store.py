"""The simulated market's rows: its machines, hosts, faults and bookkeeping in the state file's `sim_*` tables.

The tables come through the state file's migrations (migrations.MIGRATIONS), like
every other table: this module only reads and writes them, so the simulator
imports no state module (providers sit below the state layer). A market is
set up in a file the first time a SimProvider is built on it (its meta row and
its hosts), and keeps the seed it was built with.

Times are ISO-8601 text in the file and epoch seconds in memory. What the
demo reads every simulated minute (the billing of every instance, the fault
counts) is kept in memory for the instances that are destroyed, which never
change again, so that a minute's read costs the live instances only; the
cache is rebuilt whenever another process moved the market (its version).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sqlite3
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, TypedDict, overload

from vastctl import clock as clocks
from vastctl.errors import BadInput
from vastctl.providers import sim_market as model

SCHEMA_VERSION = 4  # of the market's rows (sim_meta.schema_version); 2: interruptible rentals (bid, rival bids,
# pauses); 3: the proofs each machine did (its prover's counter); 4: boots drawn by host and its rental's turn
FIRST_VAST_ID = 7_000_001


@dataclass
class Machine:
    """One rented instance as the simulator keeps it (a row of sim_instances; times in epoch seconds)."""

    vast_id: int
    machine_id: int
    offer_id: int
    label: str | None
    uuid: str | None
    env_label: str | None
    image: str | None
    disk_gb: float
    gpu_dph: float
    storage_dph: float
    intended_status: str
    actual_status: str | None
    cur_state: str
    status_msg: str | None
    listed: int
    epoch: int
    epoch_at: float
    step: str | None  # the boot script's next step: provision pull register params bench running heartbeat
    step_at: float | None
    fault: str | None  # the container fault pending in this boot: exit vanish offline unknown_to_offline
    fault_at: float | None
    proving_since: float | None
    refused_at: float | None  # the manager told it to stop (a refused report): it idles
    created_at: float
    died_at: float | None
    destroy_requested_at: float | None
    destroy_refused_s: float
    destroyed_at: float | None
    cost: float
    billed_s: float
    gpu_s: float
    billed_at: float
    bid: float | None = None  # $/h the instance bids (interruptible); None: on demand
    outbids: int = 0  # looks for the host's next rival bid so far (numbers its restarts)
    outbid_at: float | None = None  # when a rival bid next outbids it (while it proves), or it looks again
    outbid_price: float | None = None  # the highest rival bid then, with the disk (while paused: the one to beat)
    paused_at: float | None = None  # vast stopped it for a higher bid at this moment
    resume_at: float | None = None  # the rival lets go of the host: it resumes
    proofs: float = 0.0  # proofs its prover did in this run of it (the counter its heartbeats report)
    turn: int = 0  # this market's earlier rentals of the same host: with it, the host's boots are drawn

    @property
    def next_at(self) -> float | None:
        times = [t for t in (self.step_at, self.fault_at, self.outbid_at, self.resume_at) if t is not None]
        return min(times) if times else None

    @property
    def gpu_billed(self) -> bool:
        return (self.destroyed_at is None and bool(self.listed)
                and self.actual_status in ("running", "exited", "unknown"))

    @property
    def storage_billed(self) -> bool:
        return self.destroyed_at is None and bool(self.listed) and self.actual_status != "offline"


MACHINE_FIELDS = tuple(f.name for f in fields(Machine))
TIME_FIELDS = frozenset(name for name in MACHINE_FIELDS if name.endswith("_at") or name == "proving_since")
SAVE_MACHINE = (f"INSERT OR REPLACE INTO sim_instances ({', '.join(MACHINE_FIELDS)})"
                f" VALUES ({', '.join('?' for _ in MACHINE_FIELDS)})")
_machine_values = operator.attrgetter(*MACHINE_FIELDS)
_TIME_POSITIONS = tuple(i for i, name in enumerate(MACHINE_FIELDS) if name in TIME_FIELDS)
HOST_FIELDS = tuple(f.name for f in fields(model.Host))

Fault = tuple[float, str, "int | None", "str | None"]  # at, kind, vast id, detail


class InstanceRecord(TypedDict):
    """One instance as the demo's figures read it (SimStore.records): its host, its billing, its fate."""

    vast_id: int
    label: str | None
    uuid: str | None
    machine_id: int
    gpu_name: str
    true_rate: float
    dph_total: float
    created_at: datetime | None
    died_at: datetime | None
    destroy_requested_at: datetime | None
    destroyed_at: datetime | None
    listed: bool
    cost: float
    billed_hours: float
    gpu_hours: float
    bid: float | None
    outbids: int


class FaultRecord(TypedDict):
    """One failure the market made happen (SimStore.faults)."""

    at: datetime | None
    kind: str
    vast_id: int | None
    detail: str | None


def seconds(moment: datetime) -> float:
    return moment.timestamp()


@overload
def moment(seconds: float) -> datetime: ...
@overload
def moment(seconds: None) -> None: ...
def moment(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


@functools.lru_cache(maxsize=4096)  # most times are saved again unchanged (created_at, epoch_at, …)
def iso(seconds: float | None) -> str | None:
    return clocks.to_iso(moment(seconds))


@functools.lru_cache(maxsize=4096)
def _from_iso(text: str | None) -> float | None:
    found = clocks.from_iso(text)
    return None if found is None else found.timestamp()


def at_of(text: str) -> float:
    """A simulated moment from a NOT NULL column."""
    return clocks.parse_iso(text).timestamp()


def row_of(machine: Machine) -> list[object]:
    """The machine's sim_instances row, in MACHINE_FIELDS order (this runs for every change: kept lean)."""
    values = list(_machine_values(machine))
    for position in _TIME_POSITIONS:
        values[position] = iso(values[position])
    return values


def machine_of(row: sqlite3.Row) -> Machine:
    values: dict[str, Any] = {name: _from_iso(row[name]) if name in TIME_FIELDS else row[name] for name in MACHINE_FIELDS}
    return Machine(**values)


def simulated_until(path: Path) -> datetime | None:
    """How far the simulated market in the state file at `path` has run (None: no market there, or no file).

    Read-only and without migrating: a kept `demo` day is read at this moment by default, since it lies years
    after the wall clock and every "last hour" would otherwise be empty."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT advanced_to FROM sim_meta WHERE id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:  # not SQLite, no market table, unreadable: the file is read on the wall clock
        return None
    return clocks.from_iso(row[0]) if row else None


class SimStore:
    """The market's tables in one state file (which its opener migrated: the tables exist)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self._hosts: dict[int, model.Host] | None = None
        self._cached_version: int | None = None  # the market's version the caches below are of (None: none)
        self._closed: dict[int, InstanceRecord] = {}  # vast id → record, for destroyed instances (final)
        self._fault_counts: Counter[str] = Counter()

    # --- the market's meta row and hosts -----------------------------------------------------------

    def open(self, seed: int, now: datetime) -> int:
        """Set up the market on first use (its meta row and the hosts drawn from `seed`); the seed it keeps."""
        meta = self.conn.execute("SELECT * FROM sim_meta WHERE id = 1").fetchone()
        if meta is None:
            started = clocks.to_iso(now)
            with self.writing():
                self.conn.execute(
                    "INSERT OR IGNORE INTO sim_meta (id, schema_version, seed, started_at, advanced_to, calls,"
                    " next_vast_id, version) VALUES (1, ?, ?, ?, ?, 0, ?, 0)",
                    (SCHEMA_VERSION, seed, started, started, FIRST_VAST_ID))
                self.conn.executemany(
                    f"INSERT OR IGNORE INTO sim_hosts ({', '.join(HOST_FIELDS)})"
                    f" VALUES ({', '.join('?' for _ in HOST_FIELDS)})",
                    [tuple(getattr(host, name) for name in HOST_FIELDS) for host in model.make_hosts(seed)],
                )
            meta = self.conn.execute("SELECT * FROM sim_meta WHERE id = 1").fetchone()
        if meta["schema_version"] != SCHEMA_VERSION:
            raise BadInput(f"the simulated market in this state file is of an older vastctl (schema"
                           f" {meta['schema_version']}): point VASTCTL_DB at a fresh file for `provider: sim`")
        return int(meta["seed"])

    def hosts(self) -> dict[int, model.Host]:
        """machine id → host, every host of the market (they never change: read once)."""
        if self._hosts is None:
            self._hosts = {row["machine_id"]: model.Host(**{name: row[name] for name in HOST_FIELDS})
                           for row in self.conn.execute("SELECT * FROM sim_hosts ORDER BY machine_id")}
        return self._hosts

    # --- holding the market while it runs -------------------------------------------------------------

    def claim(self, holder: str, now: float, until: float, *, counted: bool) -> sqlite3.Row | None:
        """Mark the market busy by `holder` (unless another holds it): calls, advanced_to, next_vast_id, version."""
        claimed = self.conn.execute(  # fetchall: the UPDATE commits only once its RETURNING rows are read
            "UPDATE sim_meta SET busy_by = ?, busy_until = ?, calls = calls + ? WHERE id = 1"
            " AND (busy_until IS NULL OR busy_until < ? OR busy_by = ?)"
            " RETURNING calls, advanced_to, next_vast_id, version",
            (holder, iso(until), int(counted), iso(now), holder),
        ).fetchall()
        return claimed[0] if claimed else None

    def rentals_of(self, machine_id: int) -> int:
        """How many instances this market has rented on the host so far (destroyed or not)."""
        rented: int = self.conn.execute("SELECT count(*) FROM sim_instances WHERE machine_id = ?",
                                        (machine_id,)).fetchone()[0]
        return rented

    def live_machines(self) -> dict[int, Machine]:
        """vast id → machine, every instance not destroyed."""
        return {row["vast_id"]: machine_of(row) for row in
                self.conn.execute("SELECT * FROM sim_instances WHERE destroyed_at IS NULL")}

    def save(self, changed: list[Machine], faults: list[Fault], *, advanced_to: float, next_vast_id: int,
             version: int, holder: str) -> None:
        """Write the changed machines and the new faults, move the market to `version` and release it."""
        with self.writing():
            self.conn.executemany(SAVE_MACHINE, [row_of(machine) for machine in changed])
            self.conn.executemany("INSERT INTO sim_faults (at, kind, vast_id, detail) VALUES (?, ?, ?, ?)",
                                  [(iso(at), kind, vast_id, detail) for at, kind, vast_id, detail in faults])
            self.conn.execute(
                "UPDATE sim_meta SET advanced_to = ?, next_vast_id = ?, version = ?, busy_by = NULL,"
                " busy_until = NULL WHERE id = 1 AND busy_by = ?",
                (iso(advanced_to), next_vast_id, version, holder))
        if self._cached_version == version - 1:  # the caches were current: bring them along
            self._remember_closed([m.vast_id for m in changed if m.destroyed_at is not None])
            self._fault_counts.update(kind for _at, kind, _vast_id, _detail in faults)
            self._cached_version = version

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One write transaction on the market's tables (taken up front, so writers queue)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # --- what the market billed and what failed ---------------------------------------------------------

    def records(self) -> list[InstanceRecord]:
        """One record per instance, oldest first (a record is shared with the next call: read, do not change)."""
        self._catch_up()
        live = [self._record(row) for row in
                self.conn.execute("SELECT * FROM sim_instances WHERE destroyed_at IS NULL ORDER BY vast_id")]
        return sorted([*self._closed.values(), *live], key=operator.itemgetter("vast_id"))

    def fault_counts(self) -> list[tuple[str, int]]:
        """(kind, how many times it happened), by kind, every kind that happened."""
        self._catch_up()
        return sorted(self._fault_counts.items())

    def faults(self) -> list[FaultRecord]:
        """Every fault, oldest first: at, kind, vast_id, detail."""
        return [{"at": clocks.from_iso(r["at"]), "kind": r["kind"], "vast_id": r["vast_id"], "detail": r["detail"]}
                for r in self.conn.execute("SELECT * FROM sim_faults ORDER BY id")]

    def _catch_up(self) -> None:
        """Rebuild the caches of destroyed instances and fault counts when the market moved without us."""
        version = self.conn.execute("SELECT version FROM sim_meta WHERE id = 1").fetchone()[0]
        if version == self._cached_version:
            return
        self._closed = {row["vast_id"]: self._record(row) for row in
                        self.conn.execute("SELECT * FROM sim_instances WHERE destroyed_at IS NOT NULL")}
        self._fault_counts = Counter({row["kind"]: row["n"] for row in
                                      self.conn.execute("SELECT kind, count(*) AS n FROM sim_faults GROUP BY kind")})
        self._cached_version = version

    def _remember_closed(self, vast_ids: Iterable[int]) -> None:
        ids = list(vast_ids)
        if ids:
            self._closed.update((row["vast_id"], self._record(row)) for row in self.conn.execute(
                f"SELECT * FROM sim_instances WHERE vast_id IN ({', '.join('?' for _ in ids)})", ids))

    def _record(self, row: sqlite3.Row) -> InstanceRecord:
        host = self.hosts()[row["machine_id"]]
        return {
            "vast_id": row["vast_id"], "label": row["label"], "uuid": row["uuid"], "machine_id": row["machine_id"],
            "gpu_name": host.gpu_name, "true_rate": host.true_rate, "dph_total": row["gpu_dph"] + row["storage_dph"],
            "created_at": clocks.from_iso(row["created_at"]), "died_at": clocks.from_iso(row["died_at"]),
            "destroy_requested_at": clocks.from_iso(row["destroy_requested_at"]),
            "destroyed_at": clocks.from_iso(row["destroyed_at"]), "listed": bool(row["listed"]),
            "cost": row["cost"], "billed_hours": row["billed_s"] / 3600, "gpu_hours": row["gpu_s"] / 3600,
            "bid": row["bid"], "outbids": row["outbids"],
        }
