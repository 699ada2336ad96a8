"""The simulated market's clockwork: each machine's events run in time order, and the billing between them.

A machine's boot runs as onstart.sh does it (container provisioning, the image
pull, the register report, the parameter fetch, the benchmark, then a heartbeat
a minute), each step a report through the `Reports` for the simulated moment it
happens. Its fate (sim_market.BootPlan) is drawn once per boot; the container's
own faults strike at their times, and an interruptible machine meets rival bids.
There is no fixed time step: each machine's next event is scheduled, and
`advance(now)` runs every event up to `now`, ties by instance id.

Billing: GPU and storage while the container runs (an exited container still
holds its GPU until destroyed), storage while it is stopped or not started,
nothing once a destroy lands, the instance vanished or its host is offline.
`accrue` bills up to a moment at the machine's current rates; rates change only
at events, so each event is billed up to first.

The engine holds the live machines only (a destroyed one is dropped once
saved): an advance costs what is alive, however long the market has run.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Literal

from vastctl.errors import BadInput, BenchFailed, Refused, VastctlError
from vastctl.providers import sim_join_boot
from vastctl.providers import sim_market as model
from vastctl.providers.reports_sink import Reports
from vastctl.providers.sim_store import Fault, Machine, moment

HEARTBEAT_S = 60.0
START_FAILURE_MSG = ("Error response from daemon: failed to create task for container: failed to create shim task:"
                     " OCI runtime create failed: runc create failed: unable to start container process:"
                     " error during container init: nvidia-container-cli: initialization error: driver rpc error")
OUTBID_MSG = "stopped: outbid (a higher bid holds the host); resumes when the bid wins again"
RESTART_S = (90.0, 300.0)  # an outbid container resumed: it starts again, cuzk loads its SRS, then proves


@dataclass(frozen=True)
class Share:
    """One proving machine's part of the work `Engine.work` did: its proofs in fractions, at its true rate."""

    vast_id: int
    uuid: str | None  # the VASTCTL_UUID it was launched with (the prover the router knows it as)
    label: str | None
    rate: float  # its true proofs/hour
    proofs: float


class Engine:
    """The live machines of one market between two saves, and what changed among them since the last save."""

    def __init__(self, seed: int, rates: model.FailureRates, hosts: Callable[[], dict[int, model.Host]],
                 reports: Callable[[datetime], "Reports"]):
        self.seed = seed
        self.rates = rates
        self.hosts = hosts
        self.reports = reports
        self.machines: dict[int, Machine] = {}  # vast id → every instance not destroyed
        self.dirty: set[int] = set()  # vast ids changed since the last save
        self.new_faults: list[Fault] = []  # faults since the last save
        self._plans: dict[tuple[int, int], model.BootPlan] = {}
        self._reported: Reports | None = None  # the last report's Reports: the logs pushed with it go through it
        # vast id → what a joined machine's stand-in daemon completed (sim_join.Joins.completed), None for one
        # that does not join: its heartbeat counts that, as a real machine's counts its daemon's proofs
        self.daemon_proofs: Callable[[int], int | None] = lambda _vast_id: None

    def saved(self) -> None:
        """The changes are in the file: start afresh, without the machines a destroy took."""
        for vast_id in self.dirty:
            machine = self.machines.get(vast_id)
            if machine is not None and machine.destroyed_at is not None:
                del self.machines[vast_id]
        self.dirty, self.new_faults = set(), []

    # --- billing ---------------------------------------------------------------------------------------

    def accrue(self, machine: Machine, until: float) -> None:
        """Bill the machine from its last billing moment up to `until` at its current rates."""
        seconds = until - machine.billed_at
        if seconds <= 0:
            return
        gpu, storage = machine.gpu_billed, machine.storage_billed
        machine.cost += seconds / 3600 * (machine.gpu_dph * gpu + machine.storage_dph * storage)
        machine.billed_s += seconds if gpu or storage else 0.0
        machine.gpu_s += seconds if gpu else 0.0
        machine.billed_at = until
        self.dirty.add(machine.vast_id)

    # --- the work ----------------------------------------------------------------------------------------

    def proving(self) -> list[Machine]:
        """The machines whose prover is at work: running, past the benchmark, not paused, refused or dead."""
        return [m for m in self.machines.values() if m.destroyed_at is None and m.listed
                and m.actual_status == "running" and m.proving_since is not None and m.paused_at is None
                and m.refused_at is None and m.died_at is None]

    def work(self, queued: float, seconds: float) -> list[Share]:
        """The proving machines take up to `queued` proofs over `seconds` at their true rates, each its share
        of what is done by its rate (idle capacity proves nothing); each one's share, in fractions of a proof
        (the demo makes whole calls of them, as the proof router would see them)."""
        hosts = self.hosts()
        proving = [(m, hosts[m.machine_id].true_rate) for m in self.proving()]
        capacity = sum(rate for _m, rate in proving) * seconds / 3600
        done = min(max(0.0, queued), capacity)
        if done <= 0:
            return []
        shares = []
        for machine, rate in proving:
            taken = done * rate * seconds / 3600 / capacity
            machine.proofs += taken
            self.dirty.add(machine.vast_id)
            shares.append(Share(vast_id=machine.vast_id, uuid=machine.uuid, label=machine.label, rate=rate,
                                proofs=taken))
        return shares

    # --- the events ------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Run every machine's events up to `now` in time order (ties by instance id).

        Billing is brought up to each event (rates change only at events);
        `SimProvider.totals()` bills the quiet stretch since then.
        """
        queue = [(m.next_at, m.vast_id) for m in self.machines.values() if m.next_at is not None and m.next_at <= now]
        heapq.heapify(queue)
        while queue:
            at, vast_id = heapq.heappop(queue)
            machine = self.machines[vast_id]
            if machine.next_at != at:
                continue
            self.accrue(machine, at)
            if machine.fault_at is not None and machine.fault_at == at:
                self._strike(machine, at)
            elif machine.outbid_at is not None and machine.outbid_at == at:
                self._rival_comes(machine, at)
            elif machine.resume_at is not None and machine.resume_at == at:
                self.rival_leaves(machine, at)
            else:
                self._step(machine, at, now)
            self.dirty.add(vast_id)
            if machine.next_at is not None and machine.next_at <= now:
                heapq.heappush(queue, (machine.next_at, vast_id))

    def begin_boot(self, machine: Machine, now: float) -> None:
        """A container start (create or resume): provisioning first, the rest follows from its BootPlan."""
        machine.epoch_at = now
        machine.actual_status, machine.cur_state, machine.status_msg = None, "running", None
        machine.fault = machine.fault_at = machine.proving_since = None
        machine.proofs = 0.0  # a new container: its prover counts from nothing
        machine.step, machine.step_at = "provision", now + self._plan(machine).provision_s
        self.dirty.add(machine.vast_id)

    def fault(self, at: float, kind: str, vast_id: int | None, detail: str | None) -> None:
        self.new_faults.append((at, kind, vast_id, detail))

    def rival_leaves(self, machine: Machine, at: float) -> None:
        """The host is ours again: the container starts again (its disk kept) and proves after cuzk restarts."""
        machine.resume_at = machine.outbid_price = None
        if machine.paused_at is None or machine.intended_status != "running":
            return
        machine.actual_status, machine.cur_state, machine.status_msg = "loading", "running", None
        self._next(machine, "restart", at + restart_delay(self.seed, machine, machine.outbids))

    def _plan(self, machine: Machine) -> model.BootPlan:
        key = (machine.vast_id, machine.epoch)
        if key not in self._plans:
            host = self.hosts()[machine.machine_id]
            self._plans[key] = model.boot_plan(self.seed, host, machine.turn, machine.epoch, self.rates,
                                               resume=machine.epoch > 0)
        return self._plans[key]

    def _die(self, machine: Machine, at: float, kind: str, detail: str | None = None) -> None:
        self.fault(at, kind, machine.vast_id, detail)
        if machine.died_at is None and machine.refused_at is None:
            machine.died_at = at

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
        if step in ("provision", "pull", "restart"):
            self._container_step(step, machine, at, plan)
        elif step in ("register", "params", "bench", "running"):
            self._script_step(step, machine, at, plan)
        elif step == "heartbeat":
            superseded = self._last_beat_before(machine, at, now)
            if superseded > at:  # a later heartbeat in this same advance overwrites this one: skip to it
                self._next(machine, "heartbeat", superseded)
            else:
                self._beat(machine, at)

    def _container_step(self, step: str, machine: Machine, at: float, plan: model.BootPlan) -> None:
        """vast's part of a boot: the container provisioned, its image pulled, or (resumed) started again."""
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
        elif step == "restart":  # resumed after an outbid: proving again, its restarted prover counting anew
            machine.actual_status, machine.status_msg = "running", f"success, running {machine.image}/ssh"
            machine.proofs = 0.0
            if machine.proving_since is not None and machine.paused_at is not None:
                machine.proving_since += at - machine.paused_at
            machine.paused_at = None
            self._schedule_rival(machine, at)
            self._beat(machine, at)

    def _script_step(self, step: str, machine: Machine, at: float, plan: model.BootPlan) -> None:
        """The boot script's part: each report to the manager, the next step only when it answered ok."""
        if step == "register":
            host = self.hosts()[machine.machine_id]
            if self._report(machine, at, "register", label=machine.env_label, vast_id=machine.vast_id,
                            gpu_name=host.gpu_name, num_gpus=host.num_gpus) != "ok":
                return
            if plan.boot_fault == "stall":
                self.fault(at, "stall", machine.vast_id, "the parameter fetch never finishes")
                return
            self._next(machine, "params", at + plan.fetch_s)
        elif step == "params":
            if self._report(machine, at, "params_done") != "ok":
                return
            self._push_logs(machine, plan, "params")
            if plan.boot_fault == "slow_bench":
                self.fault(at, "slow_bench", machine.vast_id, f"the benchmark takes {plan.bench_s // 60:.0f} min")
            self._next(machine, "bench", at + plan.bench_s)
        elif step == "bench":
            benched = self._report(machine, at, "bench_report", plan.bench_rate)
            self._push_logs(machine, plan, "bench")  # whatever the answer, as the script: a refused rate explained
            if benched == "ok":
                self._next(machine, "running", at + 2)
        elif step == "running":
            if self._report(machine, at, "running", sim_join_boot.stages(plan)) == "ok":
                self._push_logs(machine, plan, "running")
                machine.proving_since = at
                self._schedule_rival(machine, at)
                self._beat(machine, at)

    def _push_logs(self, machine: Machine, plan: model.BootPlan, upto: sim_join_boot.Upto) -> None:
        """The log tails the boot script pushes with the report just made (`vastctl logs`), as sim_join_boot words them."""
        if self._reported is not None:
            sim_join_boot.push(self._reported, machine, plan, self.hosts()[machine.machine_id], upto)

    def _schedule_rival(self, machine: Machine, at: float) -> None:
        """Find when the host's rival bids (the market's, sim_market.rivals) next outbid an interruptible machine
        that proves (none for one on demand): at `at` itself when one over its bid holds the host already."""
        if machine.bid is None:
            return
        spell = model.outbid(self.seed, self.hosts()[machine.machine_id], at, machine.gpu_dph, self.rates)
        machine.outbids += 1
        if spell is None:  # none over its bid ahead: look again later
            machine.outbid_at, machine.outbid_price = at + model.OUTBID_LOOK_S, None
        else:
            machine.outbid_at, machine.outbid_price = spell.start, round(spell.top + machine.storage_dph, 4)
        if machine.fault_at is not None and machine.outbid_at is not None and machine.fault_at <= machine.outbid_at:
            machine.outbid_at = machine.outbid_price = None  # its container fails first
        self.dirty.add(machine.vast_id)

    def rebid(self, machine: Machine, at: float) -> None:
        """Its bid changed while it proves: the rivals that outbid it are others now."""
        if machine.proving_since is not None and machine.paused_at is None and machine.actual_status == "running":
            self._schedule_rival(machine, at)

    def _rival_comes(self, machine: Machine, at: float) -> None:
        """A rival bid over ours holds the host: vast stops the machine (keeps its disk and bills storage) until
        no rival over ours holds it, or our bid is raised over theirs."""
        machine.outbid_at = None
        if machine.bid is None or machine.proving_since is None or machine.actual_status != "running":
            return
        spell = model.outbid(self.seed, self.hosts()[machine.machine_id], at, machine.gpu_dph, self.rates)
        if spell is None or spell.start > at:
            self._schedule_rival(machine, at)  # ours is higher (or nothing came): look ahead again
            return
        machine.outbid_price = round(spell.top + machine.storage_dph, 4)
        self.fault(at, "outbid", machine.vast_id, f"a bid of ${machine.outbid_price:g}/h over ours ${machine.bid:g}/h")
        machine.actual_status = machine.cur_state = "stopped"
        machine.status_msg = OUTBID_MSG
        machine.step = machine.step_at = None  # its processes end; intended_status stays running
        machine.fault = machine.fault_at = None
        machine.paused_at = at
        machine.resume_at = spell.end

    def _next(self, machine: Machine, step: str, at: float) -> None:
        machine.step, machine.step_at = step, at

    def _last_beat_before(self, machine: Machine, at: float, now: float) -> float:
        """The last heartbeat time at + k·HEARTBEAT_S that is ≤ now and before a pending fault."""
        beats = math.floor((now - at) / HEARTBEAT_S)
        if machine.fault_at is not None:
            beats = min(beats, math.ceil((machine.fault_at - at) / HEARTBEAT_S) - 1)
        return at + max(0, beats) * HEARTBEAT_S

    def _beat(self, machine: Machine, at: float) -> None:
        """A heartbeat with the proofs the prover did in this run (`work` credits them; a joined machine's stand-in
        daemon counts what the router had it prove), not its capacity."""
        done = self.daemon_proofs(machine.vast_id)
        proofs = int(machine.proofs) if done is None else done
        if self._report(machine, at, "heartbeat", proofs) in ("ok", "error"):  # an error: the loop beats again
            self._next(machine, "heartbeat", at + HEARTBEAT_S)

    def _report(self, machine: Machine, at: float, method: Literal["register", "params_done", "bench_report", "running",
                                                                   "heartbeat"],
                *args: object, **kwargs: object) -> Literal["ok", "refused", "error"]:
        """Make one report at simulated time `at`: ok, refused (the machine is told to stop), or error."""
        try:
            self._reported = self.reports(moment(at))
            getattr(self._reported, method)(machine.uuid, *args, **kwargs)
        except (BenchFailed, Refused, BadInput):
            machine.refused_at = at  # as the boot script: stop proving, stay up idle
            return "refused"
        except VastctlError:
            return "error"
        return "ok"


def restart_delay(seed: int, machine: Machine, number: int) -> float:
    """Seconds a resumed outbid container takes to prove again (RESTART_S), drawn by host and turn."""
    return round(random.Random(f"{seed}/restart/{machine.machine_id}/{machine.turn}/{number}").uniform(*RESTART_S))
