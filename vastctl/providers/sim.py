"""SimProvider: an embedded, seeded vast.ai market behind the Provider interface, on an injected Clock.

Its machines boot as rented ones do and report each step through the
`Reports` the builder hands in, stamped with the simulated moment the step
happens (sim_engine: the events and the billing). They fail the ways real ones
do (sim_market: the hosts, prices and FailureRates), and the market bills them.
This module is the API: each call as vast answers it, the faults of the call
itself (a transient error, a truncated listing), and a caller's deadline.

The market lives in the state file in its own `sim_*` tables (sim_store: the
rows; the tables come through the file's migrations). Every call first runs the
market from the last time it was consulted up to clock.now(), event by event
in time order, so with `provider: sim` every command works offline on wall
time, and `vastctl demo` runs the same code on virtual time. On the wall clock, a machine launched with
launch.join ssh gets a stand-in cuzk daemon at its tunnel port while it proves (sim_join, sim_daemon).

Randomness comes from random.Random seeded with text derived from the seed
(a machine's fate from its id and boot number, a call's faults from the
call's number), never the global generator: the same seed and the same calls
give the same market to the digit. A market keeps the seed it was built with.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterator

from vastctl import validate
from vastctl.clock import Clock
from vastctl.errors import BadInput
from vastctl.providers import sim_join
from vastctl.providers import sim_market as model
from vastctl.providers.base import (
    CreateRequest,
    DeadlinePassed,
    Offer,
    OfferGone,
    OfferQuery,
    ProviderError,
    ProviderRejected,
    RemoteInstance,
)
from vastctl.providers.reports_sink import Reports
from vastctl.providers.sim_engine import Engine, Share
from vastctl.providers.sim_store import FIRST_VAST_ID, FaultRecord, InstanceRecord, Machine, SimStore, at_of, moment, seconds

__all__ = ["FAULT_KINDS", "FIRST_VAST_ID", "SimProvider", "SimTotals"]  # FIRST_VAST_ID: sim_store's, named here for callers

BUSY_TTL_S = 120.0  # a process that died while advancing the market blocks it no longer than this
SCHEDULING_MSG = "waiting for the GPU to become available"
FAULT_KINDS = ("start_failed", "stall", "slow_bench", "scheduling", "destroy_refused", "exit", "vanish", "offline",
               "api_error", "truncated_listing")


@dataclass
class SimTotals:
    """What the simulated market has billed, for the demo's figures."""

    at: datetime
    cost: float  # $ so far, every instance
    billed_hours: float  # instance-hours during which anything was billed
    gpu_hours: float  # instance-hours billed for a GPU
    instances: list[InstanceRecord] = field(default_factory=list)  # one record per instance, oldest first
    faults: dict[str, int] = field(default_factory=dict)  # fault kind → how many times it happened
    outbids: int = 0  # times a rival bid paused an interruptible instance (not a fault: the rental's nature)


class SimProvider:
    """The simulated market. `reports(at)` gives the Reports a machine uses for a report made at `at`."""

    def __init__(self, conn: sqlite3.Connection, reports: Callable[[datetime], "Reports"], *,
                 clock: Clock, seed: int = 1, failures: str = "default",
                 rates: model.FailureRates | None = None):
        """`failures` names a level of sim_market.FAILURES; `rates` replaces it outright (tuning, tests).
        `conn` is a state file its opener migrated (db.connect): the market's tables are there."""
        if rates is None and failures not in model.FAILURES:
            raise BadInput(f"sim.failures must be one of {', '.join(model.FAILURES)}, got {failures!r}")
        self.conn = conn
        self.reports = reports
        self.clock = clock
        self.deadline: float | None = None  # base.Provider's: a monotonic instant on `clock` past which no call is made
        self.failures = failures if rates is None else "custom"
        self.rates = rates or model.FAILURES[failures]
        self.store = SimStore(conn)
        self.seed = self.store.open(int(seed), clock.now())  # a market keeps the seed it was built with
        self.engine = Engine(self.seed, self.rates, self.store.hosts, lambda at: self.reports(at))  # reports: replaceable
        self.joins = sim_join.Joins.for_market(conn, clock)  # launch.join ssh on the wall clock: stand-in daemons
        if self.joins is not None:  # a joined machine's heartbeat counts what its stand-in proved
            self.engine.daemon_proofs = self.joins.completed
        self._holder = f"{os.getpid()}:{id(self)}"
        self._taken: tuple[int | None, frozenset[int]] = (None, frozenset())
        self._version: int | None = None  # the market's version our loaded machines are (None: load them)
        self._call_number = self._next_vast_id = 0  # as of the call in progress (read from sim_meta)
        self._transient = self._truncated = False  # this call's faults

    def __repr__(self) -> str:
        return f"SimProvider(seed={self.seed}, failures={self.failures!r})"

    # --- the Provider interface ------------------------------------------------------------------

    def list_instances(self) -> list[RemoteInstance]:
        with self._call("GET /api/v1/instances/") as (now, draw):
            listed = [m for m in self.engine.machines.values() if m.listed and m.destroyed_at is None]
            if self._truncated and listed:
                shown = int(draw * len(listed))
                self.engine.fault(now, "truncated_listing", None, f"{shown} of {len(listed)}")
                raise ProviderError(f"vast listing: got {shown} of {len(listed)} instances (partial); not trusting it")
            return [self._remote(m) for m in sorted(listed, key=lambda m: m.vast_id)]

    def show_instance(self, vast_id: int) -> RemoteInstance | None:
        with self._call(f"GET /api/v0/instances/{vast_id}/"):
            found = self.engine.machines.get(int(vast_id))
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
                if validate.real(request.price) is None or request.price < floor:  # cancel_unavail: nothing rented
                    raise ProviderRejected(f"vast {path}: the bid ${request.price:g}/h is under the offer's min_bid"
                                           f" ${floor:g}/h: it cannot start now (HTTP 400 bid_too_low)")
            if self._transient and draw >= 0.5:  # the error came before the rental took effect
                self.engine.fault(now, "api_error", None, f"{path}; nothing rented")
                raise ProviderError(f"vast {path}: HTTP 503 Service Unavailable; the outcome is unknown")
            machine = self._rent(host, request, now)
            if self._transient:  # rented, but the answer was lost
                self.engine.fault(now, "api_error", machine.vast_id, f"{path}; rented anyway")
                raise ProviderError(f"vast {path}: HTTP 504 Gateway Timeout; the outcome is unknown")
            return machine.vast_id

    def destroy_instance(self, vast_id: int) -> None:
        with self._call(f"DELETE /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self.engine.machines.get(int(vast_id))
            if machine is None:
                return  # already gone: counts as destroyed
            first = machine.destroy_requested_at is None
            if first:
                machine.destroy_requested_at = now
                self.engine.dirty.add(machine.vast_id)
            refused_until = (machine.destroy_requested_at or now) + machine.destroy_refused_s  # set just above
            if machine.listed and now < refused_until:
                if first:  # one incident, however many calls it refuses
                    self.engine.fault(now, "destroy_refused", machine.vast_id, f"for {machine.destroy_refused_s:.0f}s")
                raise ProviderRejected(f"vast destroy of instance {vast_id} refused: the host is busy; retry later")
            self.engine.accrue(machine, now)
            machine.destroyed_at = now
            machine.cur_state, machine.intended_status = "unloaded", "stopped"
            machine.step = machine.step_at = machine.fault = machine.fault_at = None
            machine.outbid_at = machine.resume_at = None
            self.engine.dirty.add(machine.vast_id)

    def stop_instance(self, vast_id: int) -> None:
        with self._call(f"PUT /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "stop")
            self.engine.accrue(machine, now)
            machine.intended_status = machine.actual_status = machine.cur_state = "stopped"
            machine.status_msg = None
            machine.step = machine.step_at = machine.fault = machine.fault_at = None  # its processes end
            machine.outbid_at = machine.resume_at = machine.paused_at = machine.outbid_price = None
            self.engine.dirty.add(machine.vast_id)

    def start_instance(self, vast_id: int) -> None:
        with self._call(f"PUT /api/v0/instances/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "start")
            if machine.intended_status == "running":
                return
            self.engine.accrue(machine, now)
            machine.intended_status = "running"
            machine.epoch += 1
            machine.refused_at = None
            if model.resume_stuck(self.seed, machine.machine_id, machine.turn, machine.epoch, self.rates):
                machine.status_msg = SCHEDULING_MSG  # stays stopped: its GPU went to another renter
                self.engine.fault(now, "scheduling", machine.vast_id, None)
            else:
                self.engine.begin_boot(machine, now)
            self.engine.dirty.add(machine.vast_id)

    def change_bid(self, vast_id: int, price: float) -> None:
        """Raise an interruptible instance's bid; one paused by a rival whose bid it now beats resumes at once.
        A lower bid is refused: a rental by bid pays at least what it was rented at (the bid-aware bound
        counts on it, bound.py)."""
        with self._call(f"PUT /api/v0/instances/bid_price/{vast_id}/") as (now, _draw):
            machine = self._existing(vast_id, "change-bid")
            if machine.bid is None:
                raise ProviderRejected(f"vast change-bid of instance {vast_id}: not an interruptible instance"
                                       " (HTTP 400 invalid_args)")
            number = validate.real(price)
            if number is None or not 0.001 <= number <= 32.0:
                raise ProviderRejected(f"vast change-bid of instance {vast_id}: price {price!r} is not 0.001-32"
                                       " (HTTP 400 invalid_args)")
            if round(number, 4) < machine.bid:
                raise ProviderRejected(f"vast change-bid of instance {vast_id}: ${number:g}/h is under its bid"
                                       f" ${machine.bid:g}/h; a bid is raised, never lowered (HTTP 400 bid_too_low)")
            self.engine.accrue(machine, now)
            machine.bid = round(number, 4)
            machine.gpu_dph = max(0.0, machine.bid - machine.storage_dph)
            if machine.paused_at is not None and machine.resume_at is not None and machine.bid >= (
                    machine.outbid_price or 0.0):
                self.engine.rival_leaves(machine, now)
            else:
                self.engine.rebid(machine, now)
            self.engine.dirty.add(machine.vast_id)

    # --- figures for the demo ----------------------------------------------------------------------

    def totals(self) -> SimTotals:
        """Billing so far (the market first advanced to now), per instance and in all. Not an API call: no faults."""
        with self._consulted() as now:
            for machine in self.engine.machines.values():
                self.engine.accrue(machine, now)
        records = self.store.records()
        faults = {kind: 0 for kind in FAULT_KINDS}
        outbids = 0
        for kind, count in self.store.fault_counts():
            if kind == "outbid":
                outbids = count
            else:
                faults[kind] = count
        return SimTotals(
            at=moment(now), cost=sum(r["cost"] for r in records),
            billed_hours=sum(r["billed_hours"] for r in records), gpu_hours=sum(r["gpu_hours"] for r in records),
            instances=records, faults=faults, outbids=outbids,
        )

    def work(self, queued: float, seconds: float) -> list[Share]:
        """The machines proving now take up to `queued` proofs of the queue over the next `seconds` (the demo's
        work); their counters, which their heartbeats report, count them. Each machine's share of the proofs
        (sim_engine.Share; their sum is the proofs done). Not an API call."""
        with self._consulted() as _now:
            return self.engine.work(queued, seconds)

    def faults(self) -> list[FaultRecord]:
        """Every failure the market made happen, oldest first: at, kind, vast_id, detail."""
        return self.store.faults()

    def hosts(self) -> list[model.Host]:
        """Every host of the market, rented or not (the demo's lower bound prices from these)."""
        return list(self.store.hosts().values())

    # --- one call: the market held, run up to now, saved ----------------------------------------------

    @contextlib.contextmanager
    def _consulted(self, *, counted: bool = False) -> Iterator[float]:
        """Hold the market, load it, run it up to now; save and release after the block.

        Another process advancing the same market at this moment makes this
        call fail like a busy API (ProviderError: retry later).
        """
        now = seconds(self.clock.now())
        meta = self.store.claim(self._holder, now, now + BUSY_TTL_S, counted=counted)
        if meta is None:
            raise ProviderError("the simulated market is busy (another vastctl is advancing it): retry later")
        self._call_number, self._next_vast_id = meta["calls"], meta["next_vast_id"]
        advanced_to = max(at_of(meta["advanced_to"]), now)
        if meta["version"] != self._version:  # someone else moved the market since we last held it
            self.engine.machines = self.store.live_machines()
            self._version = meta["version"]
        self.engine.dirty, self.engine.new_faults = set(), []
        try:
            self.engine.advance(now)
            yield now
        finally:
            self._save(advanced_to)

    @contextlib.contextmanager
    def _call(self, what: str, *, transient: bool = True) -> Iterator[tuple[float, float]]:
        """One API call: none started past the deadline (as vast's: DeadlinePassed, and the market is left as it
        was); else the market advanced to now, then this call's own faults drawn.

        Yields (now, a uniform draw for the call's details). With `transient`
        a transient error is raised here; otherwise the call decides (a create
        may have rented before its answer was lost).
        """
        if self.deadline is not None and self.deadline - self.clock.monotonic() <= 0:
            raise DeadlinePassed(f"vast {what}: not called: the deadline had passed")
        with self._consulted(counted=True) as now:
            failed, truncated, draw = model.call_faults(self.seed, self._call_number, self.rates)
            self._transient, self._truncated = failed, truncated and what == "GET /api/v1/instances/"
            if failed and transient:
                self.engine.fault(now, "api_error", None, what)
                raise ProviderError(f"vast {what}: HTTP 503 Service Unavailable: retry later")
            yield now, draw

    def _save(self, advanced_to: float) -> None:
        engine = self.engine
        version = (self._version or 0) + 1  # loaded by _consulted() before any save
        if self.joins is not None:  # under the market's hold, before it is released
            self.joins.sync(engine.machines)
        self.store.save([engine.machines[vast_id] for vast_id in sorted(engine.dirty)], engine.new_faults,
                        advanced_to=advanced_to, next_vast_id=self._next_vast_id, version=version,
                        holder=self._holder)
        self._version = version
        engine.saved()

    # --- the market --------------------------------------------------------------------------------

    def _rented_machines(self) -> set[int]:
        return {m.machine_id for m in self.engine.machines.values() if m.destroyed_at is None and m.listed}

    def _offered(self, now: float) -> list[model.Host]:
        hour = int(now // 3600)
        if self._taken[0] != hour:
            self._taken = (hour, model.taken_by_others(self.seed, list(self.store.hosts().values()), hour))
        unavailable = self._rented_machines() | self._taken[1]
        return [host for host in self.store.hosts().values() if host.machine_id not in unavailable]

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
        turn = self.store.rentals_of(host.machine_id)  # every earlier rental is saved: one create rents one host
        machine = Machine(
            vast_id=vast_id, machine_id=host.machine_id, offer_id=host.offer_id, label=request.label,
            uuid=request.env.get("VASTCTL_UUID") or None, env_label=request.env.get("VASTCTL_LABEL") or None,
            image=request.image, disk_gb=float(request.disk_gb), gpu_dph=model.gpu_price(host, now),
            storage_dph=model.storage_price(host, float(request.disk_gb)), intended_status="running",
            actual_status=None, cur_state="running", status_msg=None, listed=1, epoch=0, epoch_at=now, step=None,
            step_at=None, fault=None, fault_at=None, proving_since=None, refused_at=None, created_at=now,
            died_at=None, destroy_requested_at=None,
            destroy_refused_s=model.destroy_refused_for(self.seed, host.machine_id, turn, self.rates),
            destroyed_at=None, cost=0.0, billed_s=0.0, gpu_s=0.0, billed_at=now, turn=turn,
        )
        if request.price is not None:  # billed at its bid (with the disk, like dph_total), not the ask
            machine.bid = round(float(request.price), 4)
            machine.gpu_dph = max(0.0, machine.bid - machine.storage_dph)
        self.engine.machines[vast_id] = machine
        if self.joins is not None:
            self.joins.rented(vast_id, request.env, request.label, host.gpu_name, host.true_rate)
        self.engine.begin_boot(machine, now)
        return machine

    def _existing(self, vast_id: int, what: str) -> Machine:
        machine = self.engine.machines.get(int(vast_id))
        if machine is None or not machine.listed:
            raise ProviderRejected(f"vast {what} of instance {vast_id}: no such instance (HTTP 404 no_such_instance)")
        return machine

    def _remote(self, machine: Machine) -> RemoteInstance:
        host = self.store.hosts()[machine.machine_id]
        dph = round(machine.gpu_dph + machine.storage_dph, 4)
        raw: dict[str, object] = {"id": machine.vast_id, "label": machine.label, "actual_status": machine.actual_status,
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


def _host_matches(host: model.Host, query: OfferQuery) -> bool:
    return ((not query.gpu_names or host.gpu_name in query.gpu_names)
            and (not query.min_cpu_ram_gb or host.cpu_ram_gb >= query.min_cpu_ram_gb)
            and (not query.min_inet_down_mbps or host.inet_down_mbps >= query.min_inet_down_mbps)
            and (query.min_reliability is None or host.reliability >= query.min_reliability))

