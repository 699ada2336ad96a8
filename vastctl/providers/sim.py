"""SimProvider: an embedded, seeded vast.ai market behind the Provider interface, on an injected Clock.

Its machines boot as rented ones do (container provisioning, the image pull,
the boot script's register, the ~53 GiB parameter fetch at the offer's
bandwidth, the benchmark, then proving with a heartbeat a minute) and report
each step through the `Reports` the builder hands in, stamped with the
simulated moment the step happens. They fail the ways real ones do
(sim_market.FailureRates), and the market bills them: GPU and storage while
the container runs, storage while it is stopped or not started, nothing once
a destroy lands or the instance vanished or while its host is offline. An
exited container still holds its GPU and is billed for it until destroyed:
the costly reading of vast's billing, so a slow kill shows as money.

The market lives in the state file in its own `sim_*` tables, created here
(CREATE TABLE IF NOT EXISTS) rather than by a db migration: a file that never
runs the simulator never carries them, the manager's schema stays the
manager's, and this module needs no state module. Every call first runs the
market from the last time it was consulted up to clock.now(), event by event
in time order (no fixed time step: each machine's next event is scheduled),
so with `provider: sim` every command works offline on wall time, and
`vastctl demo` runs the same code on virtual time.

Randomness comes from random.Random seeded with text derived from the seed
(a machine's fate from its id and boot number, a call's faults from the
call's number), never the global generator: the same seed and the same calls
give the same market to the digit. A market keeps the seed it was built with.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import math
import operator
import os
import random
import sqlite3
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator, overload

from vastctl import clock as clocks
from vastctl.clock import Clock
from vastctl.errors import BadInput, BenchFailed, Refused, VastctlError
from vastctl.providers import sim_market as model
from vastctl.providers.base import CreateRequest, Offer, OfferGone, OfferQuery, ProviderError, ProviderRejected, RemoteInstance

if TYPE_CHECKING:
    from vastctl.machine.reports import Reports

SCHEMA_VERSION = 2  # 2: interruptible rentals (bid, rival bids, pauses)
HEARTBEAT_S = 60.0
BUSY_TTL_S = 120.0  # a process that died while advancing the market blocks it no longer than this
FIRST_VAST_ID = 7_000_001
START_FAILURE_MSG = ("Error response from daemon: failed to create task for container: failed to create shim task:"
                     " OCI runtime create failed: runc create failed: unable to start container process:"
                     " error during container init: nvidia-container-cli: initialization error: driver rpc error")
SCHEDULING_MSG = "waiting for the GPU to become available"
FAULT_KINDS = ("start_failed", "stall", "slow_bench", "scheduling", "destroy_refused", "exit", "vanish", "offline",
               "api_error", "truncated_listing")
DEATHS = ("start_failed", "exit", "vanish", "offline")  # the faults that end a working machine (died_at)
OUTBID_MSG = "stopped: outbid (a higher bid holds the host); resumes when the bid wins again"
RESTART_S = (90.0, 300.0)  # an outbid container resumed: it starts again, cuzk loads its SRS, then proves

SCHEMA = """
CREATE TABLE IF NOT EXISTS sim_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    advanced_to TEXT NOT NULL,
    calls INTEGER NOT NULL,
    next_vast_id INTEGER NOT NULL,
    version INTEGER NOT NULL,
    busy_by TEXT,
    busy_until TEXT
);
CREATE TABLE IF NOT EXISTS sim_hosts (
    machine_id INTEGER PRIMARY KEY,
    offer_id INTEGER NOT NULL UNIQUE,
    gpu_name TEXT NOT NULL,
    num_gpus INTEGER NOT NULL,
    cpu_ram_gb REAL NOT NULL,
    inet_down_mbps REAL NOT NULL,
    reliability REAL NOT NULL,
    base_dph REAL NOT NULL,
    storage_cost REAL NOT NULL,
    true_rate REAL NOT NULL,
    slow INTEGER NOT NULL,
    phase REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sim_instances (
    vast_id INTEGER PRIMARY KEY,
    machine_id INTEGER NOT NULL,
    offer_id INTEGER NOT NULL,
    label TEXT,
    uuid TEXT,
    env_label TEXT,
    image TEXT,
    disk_gb REAL NOT NULL,
    gpu_dph REAL NOT NULL,
    storage_dph REAL NOT NULL,
    intended_status TEXT NOT NULL,
    actual_status TEXT,
    cur_state TEXT NOT NULL,
    status_msg TEXT,
    listed INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    epoch_at TEXT NOT NULL,
    step TEXT,
    step_at TEXT,
    fault TEXT,
    fault_at TEXT,
    proving_since TEXT,
    refused_at TEXT,
    created_at TEXT NOT NULL,
    died_at TEXT,
    destroy_requested_at TEXT,
    destroy_refused_s REAL NOT NULL,
    destroyed_at TEXT,
    cost REAL NOT NULL,
    billed_s REAL NOT NULL,
    gpu_s REAL NOT NULL,
    billed_at TEXT NOT NULL,
    bid REAL,
    outbids INTEGER NOT NULL DEFAULT 0,
    outbid_at TEXT,
    outbid_price REAL,
    paused_at TEXT,
    resume_at TEXT
);
CREATE INDEX IF NOT EXISTS sim_instances_live ON sim_instances(destroyed_at);
CREATE TABLE IF NOT EXISTS sim_faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    vast_id INTEGER,
    detail TEXT
)
"""


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
    outbids: int = 0  # rival bids drawn so far (the next one's number)
    outbid_at: float | None = None  # when the next rival bid comes (while it proves)
    outbid_price: float | None = None  # that rival's bid (or, while paused, the one holding the host)
    paused_at: float | None = None  # vast stopped it for a higher bid at this moment
    resume_at: float | None = None  # the rival lets go of the host: it resumes

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


@dataclass
class SimTotals:
    """What the simulated market has billed, for the demo's figures."""

    at: datetime
    cost: float  # $ so far, every instance
    billed_hours: float  # instance-hours during which anything was billed
    gpu_hours: float  # instance-hours billed for a GPU
    instances: list[dict[str, Any]] = field(default_factory=list)  # one record per instance, oldest first
    faults: dict[str, int] = field(default_factory=dict)  # fault kind → how many times it happened
    outbids: int = 0  # times a rival bid paused an interruptible instance (not a fault: the rental's nature)


def _seconds(moment: datetime) -> float:
    return moment.timestamp()


@overload
def _moment(seconds: float) -> datetime: ...
@overload
def _moment(seconds: None) -> None: ...
def _moment(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


@functools.lru_cache(maxsize=4096)  # most times are saved again unchanged (created_at, epoch_at, …)
def _iso(seconds: float | None) -> str | None:
    return clocks.to_iso(_moment(seconds))


@functools.lru_cache(maxsize=4096)
def _from_iso(text: str | None) -> float | None:
    moment = clocks.from_iso(text)
    return None if moment is None else moment.timestamp()


def _at(text: str) -> float:
    """A simulated moment from a NOT NULL column."""
    return clocks.parse_iso(text).timestamp()


class SimProvider:
    """The simulated market. `reports(at)` gives the Reports a machine uses for a report made at `at`."""

    def __init__(self, conn: sqlite3.Connection, reports: Callable[[datetime], "Reports"], *,
                 clock: Clock, seed: int = 1, failures: str = "default",
                 rates: model.FailureRates | None = None):
        """`failures` names a level of sim_market.FAILURES; `rates` replaces it outright (tuning, tests)."""
        if rates is None and failures not in model.FAILURES:
            raise BadInput(f"sim.failures must be one of {', '.join(model.FAILURES)}, got {failures!r}")
        self.conn = conn
        self.reports = reports
        self.clock = clock
        self.deadline: float | None = None  # base.Provider's: every call here is instant on the virtual clock
        self.seed = int(seed)
        self.failures = failures if rates is None else "custom"
        self.rates = rates or model.FAILURES[failures]
        self._holder = f"{os.getpid()}:{id(self)}"
        self._hosts: dict[int, model.Host] | None = None
        self._machines: dict[int, Machine] = {}
        self._plans: dict[tuple[int, int], model.BootPlan] = {}
        self._taken: tuple[int | None, frozenset[int]] = (None, frozenset())
        self._version: int | None = None  # the market's version our loaded machines are (None: load them)
        self._dirty: set[int] = set()
        self._new_faults: list[tuple[float, str, int | None, str | None]] = []
        self._call_number = self._next_vast_id = 0  # as of the call in progress (read from sim_meta)
        self._transient = self._truncated = False  # this call's faults
        self._setup()

    def __repr__(self) -> str:
        return f"SimProvider(seed={self.seed}, failures={self.failures!r})"

    # --- the Provider interface ------------------------------------------------------------------

    def list_instances(self) -> list[RemoteInstance]:
        with self._call("GET /api/v1/instances/") as (now, draw):
            listed = [m for m in self._machines.values() if m.listed and m.destroyed_at is None]
            if self._truncated and listed:
                shown = int(draw * len(listed))
                self._fault(now, "truncated_listing", None, f"{shown} of {len(listed)}")
                raise ProviderError(f"vast listing: got {shown} of {len(listed)} instances (partial); not trusting it")
            return [self._remote(m) for m in sorted(listed, key=lambda m: m.vast_id)]

    def show_instance(self, vast_id: int) -> RemoteInstance | None:
        with self._call(f"GET /api/v0/instances/{vast_id}/"):
            found = self._machines.get(int(vast_id))
            return self._remote(found) if found is not None and found.listed else None

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        with self._call("POST /api/v0/bundles/") as (now, _draw):
            if query.offer_id is not None:
                hosts = [host for host in self._offered(now) if host.offer_id == query.offer_id]
            else:
                hosts = [host for host in self._offered(now) if _host_matches(host, query)]
            offers = [self._offer(host, now, query.disk_gb) for host in hosts]
            if query.offer_id is None and query.max_dph is not None:
                offers = [offer for offer in offers if offer.dph_total <= query.max_dph]
            return sorted(offers, key=lambda offer: (offer.dph_total, offer.id))[: max(0, int(query.limit))]

    def create_instance(self, request: CreateRequest) -> int:
        path = f"PUT /api/v0/asks/{request.offer_id}/"
        with self._call(path, transient=False) as (now, draw):
            host = next((h for h in self._offered(now) if h.offer_id == request.offer_id), None)
            if host is None:
                raise OfferGone(f"offer {request.offer_id} is no longer available (HTTP 404 no_such_ask)")
            if request.price is not None:
                floor = model.min_bid(self.seed, host, now, float(request.disk_gb))
                if not math.isfinite(request.price) or request.price < floor:  # cancel_unavail: nothing rented
                    raise ProviderRejected(f"vast {path}: the bid ${request.price:g}/h is under the offer's min_bid"
                                           f" ${floor:g}/h: it cannot start now (HTTP 400 bid_too_low)")
            if self._transient and draw >= 0.5:  # the error came before the rental took effect
                self._fault(now, "api_error", None, f"{path}; nothing rented")
                raise ProviderError(f"vast {path}: HTTP 503 Service Unavailable; the outcome is unknown")
            machine = self._rent(host, request, now)
            if self._transient:  # rented, but the answer was lost
                self._fault(now, "api_error", machine.vast_id, f"{path}; rented anyway")
                raise ProviderError(f"vast {path}: HTTP 504 Gateway Timeout; the outcome is unknown")
            return machine.vast_id

    def destroy_instance(self, vast_id: int) -> None:
        with self._call(f"DELETE /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self._machines.get(int(vast_id))
            if machine is None:
                return  # already gone: counts as destroyed
            first = machine.destroy_requested_at is None
            if first:
                machine.destroy_requested_at = now
                self._dirty.add(machine.vast_id)
            refused_until = (machine.destroy_requested_at or now) + machine.destroy_refused_s  # set just above
            if machine.listed and now < refused_until:
                if first:  # one incident, however many calls it refuses
                    self._fault(now, "destroy_refused", machine.vast_id, f"for {machine.destroy_refused_s:.0f}s")
                raise ProviderRejected(f"vast destroy of instance {vast_id} refused: the host is busy; retry later")
            self._accrue(machine, now)
            machine.destroyed_at = now
            machine.cur_state, machine.intended_status = "unloaded", "stopped"
            machine.step = machine.step_at = machine.fault = machine.fault_at = None
            machine.outbid_at = machine.resume_at = None
            self._dirty.add(machine.vast_id)

    def stop_instance(self, vast_id: int) -> None:
        with self._call(f"PUT /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "stop")
            self._accrue(machine, now)
            machine.intended_status = machine.actual_status = machine.cur_state = "stopped"
            machine.status_msg = None
            machine.step = machine.step_at = machine.fault = machine.fault_at = None  # its processes end
            machine.outbid_at = machine.resume_at = machine.paused_at = machine.outbid_price = None
            self._dirty.add(machine.vast_id)

    def start_instance(self, vast_id: int) -> None:
        with self._call(f"PUT /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "start")
            if machine.intended_status == "running":
                return
            self._accrue(machine, now)
            machine.intended_status = "running"
            machine.epoch += 1
            machine.refused_at = None
            if model.resume_stuck(self.seed, machine.vast_id, machine.epoch, self.rates):
                machine.status_msg = SCHEDULING_MSG  # stays stopped: its GPU went to another renter
                self._fault(now, "scheduling", machine.vast_id, None)
            else:
                self._begin_boot(machine, now)
            self._dirty.add(machine.vast_id)

    def change_bid(self, vast_id: int, price: float) -> None:
        """Raise (or lower) an interruptible instance's bid; one paused by a rival whose bid it now beats
        resumes at once."""
        with self._call(f"PUT /api/v0/instances/bid_price/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "change-bid")
            if machine.bid is None:
                raise ProviderRejected(f"vast change-bid of instance {vast_id}: not an interruptible instance"
                                       " (HTTP 400 invalid_args)")
            if (isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price)
                    or not 0.001 <= price <= 32.0):
                raise ProviderRejected(f"vast change-bid of instance {vast_id}: price {price!r} is not 0.001-32"
                                       " (HTTP 400 invalid_args)")
            self._accrue(machine, now)
            machine.bid = round(float(price), 4)
            machine.gpu_dph = max(0.0, machine.bid - machine.storage_dph)
            if machine.paused_at is not None and machine.resume_at is not None and machine.bid >= (
                    machine.outbid_price or 0.0):
                self._rival_leaves(machine, now)
            self._dirty.add(machine.vast_id)

    def set_label(self, vast_id: int, label: str) -> None:
        with self._call(f"PUT /api/v0/instances/{vast_id}/"):
            machine = self._existing(vast_id, "label")
            machine.label = label
            self._dirty.add(machine.vast_id)

    # --- figures for the demo ----------------------------------------------------------------------

    def totals(self) -> SimTotals:
        """Billing so far (the market first advanced to now), per instance and in all. Not an API call: no faults."""
        with self._consulted() as now:
            for machine in self._machines.values():
                self._accrue(machine, now)
        records = [self._record(row) for row in self.conn.execute("SELECT * FROM sim_instances ORDER BY vast_id")]
        faults = {kind: 0 for kind in FAULT_KINDS}
        outbids = 0
        for row in self.conn.execute("SELECT kind, count(*) AS n FROM sim_faults GROUP BY kind"):
            if row["kind"] == "outbid":
                outbids = row["n"]
            else:
                faults[row["kind"]] = row["n"]
        return SimTotals(
            at=_moment(now), cost=sum(r["cost"] for r in records),
            billed_hours=sum(r["billed_hours"] for r in records), gpu_hours=sum(r["gpu_hours"] for r in records),
            instances=records, faults=faults, outbids=outbids,
        )

    def faults(self) -> list[dict[str, Any]]:
        """Every failure the market made happen, oldest first: at, kind, vast_id, detail."""
        return [{"at": clocks.from_iso(r["at"]), "kind": r["kind"], "vast_id": r["vast_id"], "detail": r["detail"]}
                for r in self.conn.execute("SELECT * FROM sim_faults ORDER BY id")]

    def hosts(self) -> list[model.Host]:
        """Every host of the market, rented or not (the demo's lower bound prices from these)."""
        return list(self._all_hosts().values())

    def _record(self, row: sqlite3.Row) -> dict[str, Any]:
        host = self._all_hosts()[row["machine_id"]]
        return {
            "vast_id": row["vast_id"], "label": row["label"], "uuid": row["uuid"], "machine_id": row["machine_id"],
            "gpu_name": host.gpu_name, "true_rate": host.true_rate, "dph_total": row["gpu_dph"] + row["storage_dph"], "created_at": clocks.from_iso(row["created_at"]),
            "died_at": clocks.from_iso(row["died_at"]),
            "destroy_requested_at": clocks.from_iso(row["destroy_requested_at"]),
            "destroyed_at": clocks.from_iso(row["destroyed_at"]), "listed": bool(row["listed"]),
            "cost": row["cost"], "billed_hours": row["billed_s"] / 3600, "gpu_hours": row["gpu_s"] / 3600,
            "bid": row["bid"], "outbids": row["outbids"],
        }

    # --- the state in the file ---------------------------------------------------------------------

    def _setup(self) -> None:
        for statement in (part.strip() for part in SCHEMA.split(";")):
            if statement:
                self.conn.execute(statement)
        meta = self.conn.execute("SELECT * FROM sim_meta WHERE id = 1").fetchone()
        if meta is None:
            now = clocks.to_iso(self.clock.now())
            with self._writing():
                self.conn.execute(
                    "INSERT OR IGNORE INTO sim_meta (id, schema_version, seed, started_at, advanced_to, calls,"
                    " next_vast_id, version) VALUES (1, ?, ?, ?, ?, 0, ?, 0)", (SCHEMA_VERSION, self.seed, now, now, FIRST_VAST_ID))
                names = [f.name for f in fields(model.Host)]
                self.conn.executemany(
                    f"INSERT OR IGNORE INTO sim_hosts ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                    [tuple(getattr(host, name) for name in names) for host in model.make_hosts(self.seed)],
                )
            meta = self.conn.execute("SELECT * FROM sim_meta WHERE id = 1").fetchone()
        if meta["schema_version"] != SCHEMA_VERSION:
            raise BadInput(f"the simulated market in this state file is of an older vastctl (schema"
                           f" {meta['schema_version']}): point VASTCTL_DB at a fresh file for `provider: sim`")
        self.seed = meta["seed"]  # a market keeps the seed it was built with

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction on the market's tables (taken up front, so writers queue)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _all_hosts(self) -> dict[int, model.Host]:
        if self._hosts is None:
            names = [f.name for f in fields(model.Host)]
            self._hosts = {row["machine_id"]: model.Host(**{name: row[name] for name in names})
                           for row in self.conn.execute("SELECT * FROM sim_hosts ORDER BY machine_id")}
        return self._hosts

    @contextlib.contextmanager
    def _consulted(self, *, counted: bool = False) -> Iterator[float]:
        """Hold the market, load it, run it up to now; save and release after the block.

        Another process advancing the same market at this moment makes this
        call fail like a busy API (ProviderError: retry later).
        """
        now = _seconds(self.clock.now())
        claimed = self.conn.execute(  # fetchall: the UPDATE commits only once its RETURNING rows are read
            "UPDATE sim_meta SET busy_by = ?, busy_until = ?, calls = calls + ? WHERE id = 1"
            " AND (busy_until IS NULL OR busy_until < ? OR busy_by = ?)"
            " RETURNING calls, advanced_to, next_vast_id, version",
            (self._holder, _iso(now + BUSY_TTL_S), int(counted), _iso(now), self._holder),
        ).fetchall()
        if not claimed:
            raise ProviderError("the simulated market is busy (another vastctl is advancing it): retry later")
        meta = claimed[0]
        self._call_number, self._next_vast_id = meta["calls"], meta["next_vast_id"]
        advanced_to = max(_at(meta["advanced_to"]), now)
        if meta["version"] != self._version:  # someone else moved the market since we last held it
            self._machines = {row["vast_id"]: _machine(row) for row in
                              self.conn.execute("SELECT * FROM sim_instances WHERE destroyed_at IS NULL")}
            self._version = meta["version"]
        self._dirty, self._new_faults = set(), []
        try:
            self._advance(now)
            yield now
        finally:
            self._save(advanced_to)

    @contextlib.contextmanager
    def _call(self, what: str, *, transient: bool = True) -> Iterator[tuple[float, float]]:
        """One API call: the market advanced to now, then this call's own faults drawn.

        Yields (now, a uniform draw for the call's details). With `transient`
        a transient error is raised here; otherwise the call decides (a create
        may have rented before its answer was lost).
        """
        with self._consulted(counted=True) as now:
            failed, truncated, draw = model.call_faults(self.seed, self._call_number, self.rates)
            self._transient, self._truncated = failed, truncated and what == "GET /api/v1/instances/"
            if failed and transient:
                self._fault(now, "api_error", None, what)
                raise ProviderError(f"vast {what}: HTTP 503 Service Unavailable: retry later")
            yield now, draw

    def _save(self, advanced_to: float) -> None:
        changed = [self._machines[vast_id] for vast_id in sorted(self._dirty)]
        with self._writing():
            self.conn.executemany(SAVE_MACHINE, [_row_of(machine) for machine in changed])
            self.conn.executemany("INSERT INTO sim_faults (at, kind, vast_id, detail) VALUES (?, ?, ?, ?)",
                                  [(_iso(at), kind, vast_id, detail) for at, kind, vast_id, detail in self._new_faults])
            self.conn.execute(
                "UPDATE sim_meta SET advanced_to = ?, next_vast_id = ?, version = ?, busy_by = NULL,"
                " busy_until = NULL WHERE id = 1 AND busy_by = ?",
                (_iso(advanced_to), self._next_vast_id, (self._version or 0) + 1, self._holder))
        self._version = (self._version or 0) + 1  # loaded by _holding() before any save
        self._dirty, self._new_faults = set(), []
        for machine in changed:
            if machine.destroyed_at is not None:
                del self._machines[machine.vast_id]

    # --- the market --------------------------------------------------------------------------------

    def _rented_machines(self) -> set[int]:
        return {m.machine_id for m in self._machines.values() if m.destroyed_at is None and m.listed}

    def _offered(self, now: float) -> list[model.Host]:
        hour = int(now // 3600)
        if self._taken[0] != hour:
            self._taken = (hour, model.taken_by_others(self.seed, list(self._all_hosts().values()), hour))
        unavailable = self._rented_machines() | self._taken[1]
        return [host for host in self._all_hosts().values() if host.machine_id not in unavailable]

    def _offer(self, host: model.Host, now: float, disk_gb: float) -> Offer:
        gpu = model.gpu_price(host, now)
        total = round(gpu + model.storage_price(host, disk_gb), 4)
        raw = {"id": host.offer_id, "machine_id": host.machine_id, "gpu_name": host.gpu_name,
               "num_gpus": host.num_gpus, "dph_total": total, "dph_base": gpu, "cpu_ram": host.cpu_ram_gb * 1000,
               "inet_down": host.inet_down_mbps, "reliability": host.reliability, "storage_cost": host.storage_cost,
               "rentable": True, "verified": True, "min_bid": model.min_bid(self.seed, host, now, disk_gb)}
        return Offer(id=host.offer_id, machine_id=host.machine_id, gpu_name=host.gpu_name, num_gpus=host.num_gpus,
                     dph_total=total, cpu_ram_gb=host.cpu_ram_gb, inet_down_mbps=host.inet_down_mbps,
                     reliability=host.reliability, raw=raw)

    def _rent(self, host: model.Host, request: CreateRequest, now: float) -> Machine:
        vast_id = self._next_vast_id
        self._next_vast_id += 1
        machine = Machine(
            vast_id=vast_id, machine_id=host.machine_id, offer_id=host.offer_id, label=request.label,
            uuid=request.env.get("VASTCTL_UUID") or None, env_label=request.env.get("VASTCTL_LABEL") or None,
            image=request.image, disk_gb=float(request.disk_gb), gpu_dph=model.gpu_price(host, now),
            storage_dph=model.storage_price(host, float(request.disk_gb)), intended_status="running",
            actual_status=None, cur_state="running", status_msg=None, listed=1, epoch=0, epoch_at=now, step=None,
            step_at=None, fault=None, fault_at=None, proving_since=None, refused_at=None, created_at=now,
            died_at=None, destroy_requested_at=None,
            destroy_refused_s=model.destroy_refused_for(self.seed, vast_id, self.rates), destroyed_at=None,
            cost=0.0, billed_s=0.0, gpu_s=0.0, billed_at=now,
        )
        if request.price is not None:  # billed at its bid (with the disk, like dph_total), not the ask
            machine.bid = round(float(request.price), 4)
            machine.gpu_dph = max(0.0, machine.bid - machine.storage_dph)
        self._machines[vast_id] = machine
        self._begin_boot(machine, now)
        return machine

    def _existing(self, vast_id: int, what: str) -> Machine:
        machine = self._machines.get(int(vast_id))
        if machine is None or not machine.listed:
            raise ProviderRejected(f"vast {what} of instance {vast_id}: no such instance (HTTP 404 no_such_instance)")
        return machine

    def _plan(self, machine: Machine) -> model.BootPlan:
        key = (machine.vast_id, machine.epoch)
        if key not in self._plans:
            host = self._all_hosts()[machine.machine_id]
            self._plans[key] = model.boot_plan(self.seed, machine.vast_id, machine.epoch, host, self.rates,
                                               resume=machine.epoch > 0)
        return self._plans[key]

    def _begin_boot(self, machine: Machine, now: float) -> None:
        """A container start (create or resume): provisioning first, the rest follows from its BootPlan."""
        machine.epoch_at = now
        machine.actual_status, machine.cur_state, machine.status_msg = None, "running", None
        machine.fault = machine.fault_at = machine.proving_since = None
        machine.step, machine.step_at = "provision", now + self._plan(machine).provision_s
        self._dirty.add(machine.vast_id)

    def _fault(self, at: float, kind: str, vast_id: int | None, detail: str | None) -> None:
        self._new_faults.append((at, kind, vast_id, detail))

    def _die(self, machine: Machine, at: float, kind: str, detail: str | None = None) -> None:
        self._fault(at, kind, machine.vast_id, detail)
        if machine.died_at is None and machine.refused_at is None:
            machine.died_at = at

    def _accrue(self, machine: Machine, until: float) -> None:
        """Bill the machine from its last billing moment up to `until` at its current rates."""
        seconds = until - machine.billed_at
        if seconds <= 0:
            return
        gpu, storage = machine.gpu_billed, machine.storage_billed
        machine.cost += seconds / 3600 * (machine.gpu_dph * gpu + machine.storage_dph * storage)
        machine.billed_s += seconds if gpu or storage else 0.0
        machine.gpu_s += seconds if gpu else 0.0
        machine.billed_at = until
        self._dirty.add(machine.vast_id)

    def _advance(self, now: float) -> None:
        """Run every machine's events up to `now` in time order (ties by instance id).

        Billing is brought up to each event (rates change only at events);
        `totals()` bills the quiet stretch since then.
        """
        queue = [(m.next_at, m.vast_id) for m in self._machines.values() if m.next_at is not None and m.next_at <= now]
        heapq.heapify(queue)
        while queue:
            at, vast_id = heapq.heappop(queue)
            machine = self._machines[vast_id]
            if machine.next_at != at:
                continue
            self._accrue(machine, at)
            if machine.fault_at is not None and machine.fault_at == at:
                self._strike(machine, at)
            elif machine.outbid_at is not None and machine.outbid_at == at:
                self._rival_comes(machine, at)
            elif machine.resume_at is not None and machine.resume_at == at:
                self._rival_leaves(machine, at)
            else:
                self._step(machine, at, now)
            self._dirty.add(vast_id)
            if machine.next_at is not None and machine.next_at <= now:
                heapq.heappush(queue, (machine.next_at, vast_id))

    def _strike(self, machine: Machine, at: float) -> None:
        """The container's own fault: it exits, vanishes from the listing, or its host drops off."""
        kind = machine.fault
        machine.fault = machine.fault_at = None
        if kind == "unknown_to_offline":
            machine.actual_status = "offline"
            return
        machine.step = machine.step_at = None
        if kind == "exit":
            machine.actual_status, machine.status_msg = "exited", "container exited with code 137"
            self._die(machine, at, "exit")
        elif kind == "vanish":
            machine.listed = 0
            self._die(machine, at, "vanish")
        elif kind == "offline":
            machine.actual_status, machine.status_msg = "unknown", None
            later = self._plan(machine).offline_after_s
            if later is not None:
                machine.fault, machine.fault_at = "unknown_to_offline", at + later
            self._die(machine, at, "offline", "unknown, then offline" if later is not None else "unknown")

    def _step(self, machine: Machine, at: float, now: float) -> None:
        """The next step of the container start or of the boot script, as onstart.sh does it."""
        plan = self._plan(machine)
        step, machine.step, machine.step_at = machine.step, None, None
        if step == "provision":
            if plan.boot_fault == "start_failed":
                machine.actual_status, machine.status_msg = "created", START_FAILURE_MSG
                self._die(machine, at, "start_failed")
                return
            machine.actual_status = "loading"
            self._next(machine, "pull", at + plan.pull_s)
        elif step == "pull":
            machine.actual_status, machine.status_msg = "running", f"success, running {machine.image}/ssh"
            if plan.container_fault is not None and plan.container_fault_s is not None:
                machine.fault, machine.fault_at = plan.container_fault, at + plan.container_fault_s
            if machine.uuid and machine.env_label:  # else: "not launched by vastctl?", the script exits
                self._next(machine, "register", at + plan.install_s)
        elif step == "register":
            host = self._all_hosts()[machine.machine_id]
            if self._report(machine, at, "register", label=machine.env_label, vast_id=machine.vast_id,
                            gpu_name=host.gpu_name, num_gpus=host.num_gpus) != "ok":
                return
            if plan.boot_fault == "stall":
                self._fault(at, "stall", machine.vast_id, "the parameter fetch never finishes")
                return
            self._next(machine, "params", at + plan.fetch_s)
        elif step == "params":
            if self._report(machine, at, "params_done") != "ok":
                return
            if plan.boot_fault == "slow_bench":
                self._fault(at, "slow_bench", machine.vast_id, f"the benchmark takes {plan.bench_s // 60:.0f} min")
            self._next(machine, "bench", at + plan.bench_s)
        elif step == "bench":
            if self._report(machine, at, "bench_report", plan.bench_rate) == "ok":
                self._next(machine, "running", at + 2)
        elif step == "running":
            if self._report(machine, at, "running") == "ok":
                machine.proving_since = at
                self._schedule_rival(machine, at)
                self._beat(machine, at)
        elif step == "restart":  # resumed after an outbid: proving again, its proof count carried on
            machine.actual_status, machine.status_msg = "running", f"success, running {machine.image}/ssh"
            if machine.proving_since is not None and machine.paused_at is not None:
                machine.proving_since += at - machine.paused_at
            machine.paused_at = None
            self._schedule_rival(machine, at)
            self._beat(machine, at)
        elif step == "heartbeat":
            superseded = self._last_beat_before(machine, at, now)
            if superseded > at:  # a later heartbeat in this same advance overwrites this one: skip to it
                self._next(machine, "heartbeat", superseded)
            else:
                self._beat(machine, at)

    def _schedule_rival(self, machine: Machine, at: float) -> None:
        """Draw the next rival bid for an interruptible machine that proves (none for one on demand)."""
        if machine.bid is None:
            return
        host = self._all_hosts()[machine.machine_id]
        rival = model.outbid(self.seed, machine.vast_id, machine.outbids,
                             model.min_bid(self.seed, host, at, machine.disk_gb), self.rates)
        machine.outbids += 1
        if rival is not None:
            machine.outbid_at, machine.outbid_price = at + rival.after_s, rival.price
            if machine.fault_at is not None and machine.fault_at <= machine.outbid_at:
                machine.outbid_at = machine.outbid_price = None  # its container fails first

    def _rival_comes(self, machine: Machine, at: float) -> None:
        """A rival bid for the host: one over ours pauses the machine (vast stops it, keeps its disk and bills
        storage) until the rival lets go or our bid is raised over it."""
        machine.outbid_at = None
        if machine.bid is None or machine.proving_since is None or machine.actual_status != "running":
            return
        if machine.bid >= (machine.outbid_price or 0.0):
            self._schedule_rival(machine, at)  # ours is higher: the rival goes elsewhere
            return
        host = self._all_hosts()[machine.machine_id]
        hold = model.outbid(self.seed, machine.vast_id, machine.outbids - 1,
                            model.min_bid(self.seed, host, at, machine.disk_gb), self.rates)
        self._fault(at, "outbid", machine.vast_id, f"a bid of ${machine.outbid_price:g}/h over ours ${machine.bid:g}/h")
        machine.actual_status = machine.cur_state = "stopped"
        machine.status_msg = OUTBID_MSG
        machine.step = machine.step_at = None  # its processes end; intended_status stays running
        machine.fault = machine.fault_at = None
        machine.paused_at = at
        machine.resume_at = at + (hold.hold_s if hold is not None else model.OUTBID_MEAN_S)

    def _rival_leaves(self, machine: Machine, at: float) -> None:
        """The host is ours again: the container starts again (its disk kept) and proves after cuzk restarts."""
        machine.resume_at = machine.outbid_price = None
        if machine.paused_at is None or machine.intended_status != "running":
            return
        machine.actual_status, machine.cur_state, machine.status_msg = "loading", "running", None
        self._next(machine, "restart", at + restart_delay(self.seed, machine.vast_id, machine.outbids))

    def _next(self, machine: Machine, step: str, at: float) -> None:
        machine.step, machine.step_at = step, at

    def _last_beat_before(self, machine: Machine, at: float, now: float) -> float:
        """The last heartbeat time at + k·HEARTBEAT_S that is ≤ now and before a pending fault."""
        beats = math.floor((now - at) / HEARTBEAT_S)
        if machine.fault_at is not None:
            beats = min(beats, math.ceil((machine.fault_at - at) / HEARTBEAT_S) - 1)
        return at + max(0, beats) * HEARTBEAT_S

    def _beat(self, machine: Machine, at: float) -> None:
        host = self._all_hosts()[machine.machine_id]
        proofs = model.BENCH_PROOFS + int(host.true_rate * (at - (machine.proving_since or at)) / 3600)
        if self._report(machine, at, "heartbeat", proofs) in ("ok", "error"):  # an error: the loop beats again
            self._next(machine, "heartbeat", at + HEARTBEAT_S)

    def _report(self, machine: Machine, at: float, method: str, *args: Any, **kwargs: Any) -> str:
        """Make one report at simulated time `at`: ok, refused (the machine is told to stop), or error."""
        try:
            getattr(self.reports(_moment(at)), method)(machine.uuid, *args, **kwargs)
        except (BenchFailed, Refused, BadInput):
            machine.refused_at = at  # as the boot script: stop proving, stay up idle
            return "refused"
        except VastctlError:
            return "error"
        return "ok"

    def _remote(self, machine: Machine) -> RemoteInstance:
        host = self._all_hosts()[machine.machine_id]
        dph = round(machine.gpu_dph + machine.storage_dph, 4)
        raw = {"id": machine.vast_id, "label": machine.label, "actual_status": machine.actual_status,
               "intended_status": machine.intended_status, "cur_state": machine.cur_state,
               "status_msg": machine.status_msg, "machine_id": machine.machine_id, "gpu_name": host.gpu_name,
               "num_gpus": host.num_gpus, "dph_total": dph, "dph_base": machine.gpu_dph,
               "storage_total_cost": machine.storage_dph, "cpu_ram": host.cpu_ram_gb * 1000,
               "inet_down": host.inet_down_mbps, "disk_space": machine.disk_gb, "start_date": machine.created_at,
               "image_uuid": machine.image, "is_bid": machine.bid is not None, "bid_price": machine.bid}
        return RemoteInstance(
            id=machine.vast_id, label=machine.label, actual_status=machine.actual_status,
            intended_status=machine.intended_status, cur_state=machine.cur_state, status_msg=machine.status_msg,
            machine_id=machine.machine_id, gpu_name=host.gpu_name, num_gpus=host.num_gpus, dph_total=dph,
            start_date=machine.created_at, storage_dph=machine.storage_dph, raw=raw,
        )


def _row_of(machine: Machine) -> list[Any]:
    """The machine's sim_instances row, in MACHINE_FIELDS order (this runs for every change: kept lean)."""
    values = list(_machine_values(machine))
    for position in _TIME_POSITIONS:
        values[position] = _iso(values[position])
    return values


def _machine(row: sqlite3.Row) -> Machine:
    fields: dict[str, Any] = {name: _from_iso(row[name]) if name in TIME_FIELDS else row[name] for name in MACHINE_FIELDS}
    return Machine(**fields)


def _host_matches(host: model.Host, query: OfferQuery) -> bool:
    return ((not query.gpu_names or host.gpu_name in query.gpu_names)
            and (not query.min_cpu_ram_gb or host.cpu_ram_gb >= query.min_cpu_ram_gb)
            and (not query.min_inet_down_mbps or host.inet_down_mbps >= query.min_inet_down_mbps)
            and (query.min_reliability is None or host.reliability >= query.min_reliability))


def restart_delay(seed: int, vast_id: int, number: int) -> float:
    """Seconds a resumed outbid container takes to prove again (RESTART_S), drawn from the seed."""
    return round(random.Random(f"{seed}/restart/{vast_id}/{number}").uniform(*RESTART_S))
