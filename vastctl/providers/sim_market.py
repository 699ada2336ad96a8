"""The simulated market's model: its hosts, their true proof rates, what a boot takes, and how things fail.

Pure functions of a seed (random.Random seeded with text, never the global
generator), so the same seed builds the same market and the same fate for
every machine, whatever order or how often the market is consulted. The
figures follow the workload notes: rates set by host RAM and GPU model,
2026 on-demand prices, a ~53 GiB parameter fetch at the offer's bandwidth,
a benchmark of five cold proofs.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Sequence

from vastctl.providers.host_ram import rate_allowed

GIB_BITS = 8 * 1024 ** 3
PARAMS_GIB = 53.0  # 32 GiB PoRep + PoSt + SnapDeals parameters
IMAGE_GIB = 8.0  # a CUDA devel image
BENCH_PROOFS = 5  # cuzk-bench batch --count 5
HOURS_PER_MONTH = 720.0
TAKEN_SHARE = 0.15  # the chance that another renter holds a host for a given hour
PRICE_SWING = 0.08  # prices move ±8% over a day

# proofs/hour a host's RAM allows (32 GiB PoRep C2 with cuzk; the 5070 Ti measurements), interpolated between
RAM_CAP = ((128, 24.0), (192, 46.0), (256, 68.0), (384, 84.0), (512, 110.0))


@dataclass(frozen=True)
class GpuModel:
    name: str  # as vast spells it
    cap: float  # proofs/hour the GPU allows on a host with RAM to spare
    price: tuple[float, float]  # GPU $/h range
    hosts: int  # how many the market has


GPUS = (
    GpuModel("RTX 3090", 50.0, (0.20, 0.35), 12),
    GpuModel("RTX 4090", 80.0, (0.35, 0.90), 48),
    GpuModel("RTX 5070 Ti", 95.0, (0.20, 0.40), 20),
    GpuModel("RTX 5090", 100.0, (0.85, 1.15), 24),
    GpuModel("A100 SXM4", 70.0, (0.80, 1.20), 10),
    GpuModel("H100 SXM", 100.0, (1.85, 3.20), 10),
)
RAM_CHOICES = ((128, 0.10), (192, 0.10), (256, 0.35), (384, 0.25), (512, 0.20))
SLOW_SHARE = 0.15  # hosts slower than their RAM and GPU promise (throttling, a weak CPU, shared RAM)


@dataclass(frozen=True)
class Host:
    """One machine the market rents out, with its one offer (ask)."""

    machine_id: int
    offer_id: int
    gpu_name: str
    num_gpus: int
    cpu_ram_gb: float
    inet_down_mbps: float
    reliability: float
    base_dph: float  # GPU $/h around which its price moves
    storage_cost: float  # $/GB/month
    true_rate: float  # proofs/hour it really delivers
    slow: bool  # slower than its model and RAM promise
    phase: float  # where in the day its price peaks (radians)


def model_rate(gpu_name: str, ram_gb: float) -> float:
    """What a healthy host of this GPU and RAM proves per hour: the tighter of the two limits."""
    gpu = next((model for model in GPUS if model.name == gpu_name), None)
    cap = gpu.cap if gpu else 50.0
    return min(cap, rate_allowed(RAM_CAP, ram_gb))


def make_hosts(seed: int) -> list[Host]:
    rng = random.Random(f"{seed}/hosts")
    hosts = []
    number = 0
    for gpu in GPUS:
        for _ in range(gpu.hosts):
            number += 1
            ram = _weighted(rng, RAM_CHOICES)
            down = rng.choice((200, 300, 500, 600, 800, 1000, 1000, 1500, 2000, 2500)) * rng.uniform(0.9, 1.1)
            slow = rng.random() < SLOW_SHARE
            factor = rng.uniform(0.5, 0.85) if slow else rng.uniform(0.97, 1.03)
            low, high = gpu.price
            hosts.append(Host(
                machine_id=40000 + number * 37, offer_id=9000000 + number * 101, gpu_name=gpu.name, num_gpus=1,
                cpu_ram_gb=float(ram), inet_down_mbps=round(down, 1), reliability=round(rng.uniform(0.95, 0.999), 4),
                base_dph=round(rng.uniform(low, high) * (0.9 + 0.1 * ram / 256), 4),
                storage_cost=round(rng.uniform(0.08, 0.20), 4), true_rate=round(model_rate(gpu.name, ram) * factor, 2),
                slow=slow, phase=rng.uniform(0, 2 * math.pi),
            ))
    return hosts


def _weighted(rng: random.Random, choices: Sequence[tuple[float, float]]) -> float:
    pick = rng.random()
    for value, weight in choices:
        pick -= weight
        if pick < 0:
            return value
    return choices[-1][0]


def gpu_price(host: Host, at: float) -> float:
    """GPU $/h of the host's offer at epoch second `at`: a daily swing around its base."""
    return round(host.base_dph * (1 + PRICE_SWING * math.sin(2 * math.pi * at / 86400 + host.phase)), 4)


def storage_price(host: Host, disk_gb: float) -> float:
    """$/h for `disk_gb` of the host's storage."""
    return host.storage_cost * disk_gb / HOURS_PER_MONTH


def taken_by_others(seed: int, hosts: list[Host], hour: int) -> frozenset[int]:
    """The machine ids another renter holds during hour number `hour` since the epoch (they are not offered)."""
    rng = random.Random(f"{seed}/taken/{hour}")
    return frozenset(host.machine_id for host in hosts if rng.random() < TAKEN_SHARE)


# --- failures --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureRates:
    """How often each way of failing happens. Per boot: a chance; per hour: a hazard; per call: a chance."""

    start_failed: float  # per boot: the container never starts (OCI runtime error in status_msg)
    stall: float  # per boot: registers, then the parameter fetch never finishes
    slow_bench: float  # per boot: the benchmark takes hours instead of minutes
    scheduling: float  # per resume: the GPU was taken, the instance sits in scheduling
    destroy_refused: float  # per instance: destroys are refused for a while
    exit_per_hour: float  # while the container runs: it exits
    vanish_per_hour: float  # while listed: the instance drops out of the listing
    offline_per_hour: float  # while the container runs: the host goes unknown (and maybe offline)
    api_error: float  # per call: a transient error (HTTP 5xx)
    truncated_listing: float  # per listing: a partial answer
    outbid_per_hour: float = 0.0  # while an interruptible container runs: another renter bids for its host


FAILURES = {
    "low": FailureRates(start_failed=0.01, stall=0.01, slow_bench=0.01, scheduling=0.1, destroy_refused=0.03,
                        exit_per_hour=0.002, vanish_per_hour=0.001, offline_per_hour=0.001, api_error=0.002,
                        truncated_listing=0.001, outbid_per_hour=0.03),
    "default": FailureRates(start_failed=0.05, stall=0.05, slow_bench=0.05, scheduling=0.25, destroy_refused=0.2,
                            exit_per_hour=0.01, vanish_per_hour=0.005, offline_per_hour=0.006, api_error=0.01,
                            truncated_listing=0.005, outbid_per_hour=0.08),
    "high": FailureRates(start_failed=0.12, stall=0.1, slow_bench=0.1, scheduling=0.5, destroy_refused=0.3,
                         exit_per_hour=0.03, vanish_per_hour=0.015, offline_per_hour=0.015, api_error=0.03,
                         truncated_listing=0.02, outbid_per_hour=0.15),
}


@dataclass(frozen=True)
class BootPlan:
    """One container start (a create or a resume), drawn once when it begins.

    Offsets are seconds from the start. Every number is drawn whatever the
    failure level, in a fixed order, so a level changes which faults happen
    and not the rest of the machine's timeline.
    """

    provision_s: float  # until the container is created and the image pull begins
    pull_s: float  # image pull, until the container runs (GPU billing starts)
    install_s: float  # the boot script installs vastctl, then registers
    fetch_s: float  # the parameter fetch (and digest check), until params-done
    bench_s: float  # cuzk start, SRS load, PCE extraction, five cold proofs, until bench-report
    bench_rate: float  # what the benchmark reports
    boot_fault: str | None  # start_failed | stall | slow_bench | None
    container_fault: str | None  # exit | vanish | offline | None (the first to strike)
    container_fault_s: float | None  # seconds after the container runs
    offline_after_s: float | None  # an `unknown` host that then goes `offline` after this; None stays unknown


def boot_plan(seed: int, host: Host, turn: int, epoch: int, rates: FailureRates, *, resume: bool) -> BootPlan:
    """The `epoch`-th start of the `turn`-th rental of `host`. Drawn by host and turn, not by instance id, so two
    fleets on one seed that rent a host for the same turn (its first, say) meet the same boot there: a comparison
    of policies measures the policies, not which faults their instance numbers happened to draw."""
    rng = random.Random(f"{seed}/boot/{host.machine_id}/{turn}/{epoch}")
    provision_s = rng.uniform(5, 30) if resume else rng.uniform(10, 60)
    image_s = IMAGE_GIB * GIB_BITS / (host.inet_down_mbps * 1e6) * rng.uniform(1.0, 1.5) + 20
    pull_s = rng.uniform(10, 40) if resume else image_s  # a resumed container has its image
    install_s = rng.uniform(30, 90)
    efficiency = rng.uniform(0.75, 0.95)
    digest_s = rng.uniform(120, 240)
    fetch_s = digest_s if resume else PARAMS_GIB * GIB_BITS / (host.inet_down_mbps * 1e6 * efficiency) + digest_s
    cold_proof_s = sum(rng.uniform(89, 117) for _ in range(BENCH_PROOFS)) * math.sqrt(95 / max(host.true_rate, 10))
    bench_s = 20 + 15 + 47 + cold_proof_s
    bench_rate = round(host.true_rate * rng.uniform(0.96, 1.03), 1)
    slow_bench_s = rng.uniform(100, 200) * 60
    pick = rng.random()
    boot_fault = None
    for kind in ("start_failed", "stall", "slow_bench"):
        pick -= getattr(rates, kind)
        if pick < 0:
            boot_fault = kind
            break
    if boot_fault == "slow_bench":
        bench_s += slow_bench_s
    strikes = {}
    for kind, per_hour in (("exit", rates.exit_per_hour), ("vanish", rates.vanish_per_hour),
                           ("offline", rates.offline_per_hour)):
        draw = rng.random()
        if per_hour > 0:
            strikes[kind] = -math.log(1 - draw) / per_hour * 3600
    goes_offline = rng.random() < 0.5
    offline_after = rng.uniform(120, 600)
    container_fault = min(strikes, key=lambda kind: strikes[kind]) if strikes and boot_fault != "start_failed" else None
    return BootPlan(
        provision_s=round(provision_s), pull_s=round(pull_s), install_s=round(install_s), fetch_s=round(fetch_s),
        bench_s=round(bench_s), bench_rate=bench_rate, boot_fault=boot_fault, container_fault=container_fault,
        container_fault_s=round(strikes[container_fault]) if container_fault else None,
        offline_after_s=round(offline_after) if goes_offline else None,
    )


def resume_stuck(seed: int, machine_id: int, turn: int, epoch: int, rates: FailureRates) -> bool:
    """Whether this resume finds its GPU taken and sits in scheduling (drawn by host and turn, as boot_plan)."""
    return random.Random(f"{seed}/resume/{machine_id}/{turn}/{epoch}").random() < rates.scheduling


def destroy_refused_for(seed: int, machine_id: int, turn: int, rates: FailureRates) -> float:
    """Seconds after the first destroy call during which destroys are refused (0: none; by host and turn)."""
    rng = random.Random(f"{seed}/destroy/{machine_id}/{turn}")
    refused, seconds = rng.random() < rates.destroy_refused, rng.uniform(3, 20) * 60
    return round(seconds) if refused else 0.0


def call_faults(seed: int, call: int, rates: FailureRates) -> tuple[bool, bool, float]:
    """For the market's `call`-th answer: (transient error, truncated listing, a uniform draw for details)."""
    rng = random.Random(f"{seed}/call/{call}")
    return rng.random() < rates.api_error, rng.random() < rates.truncated_listing, rng.random()


# --- interruptible rentals -------------------------------------------------------------------------

BID_FLOOR = (0.5, 0.7)  # a host's min_bid as a share of its on-demand GPU price
OUTBID_PRICE = (1.05, 1.8)  # a rival bid for the GPU, as a multiple of the host's GPU floor at the moment it comes
OUTBID_MEAN_S = 45 * 60  # how long a rival keeps the host, on average (exponential)
OUTBID_MOST_S = 6 * 3600
OUTBID_LOOK_S = 24 * 3600  # how far ahead a machine's next outbid is looked for (none: looked for again then)


@functools.lru_cache(maxsize=4096)
def bid_floor(seed: int, host: Host) -> float:
    """The share of its on-demand GPU price a host accepts as the lowest bid (its min_bid's)."""
    return random.Random(f"{seed}/bidfloor/{host.machine_id}").uniform(*BID_FLOOR)


def min_bid(seed: int, host: Host, at: float, disk_gb: float) -> float:
    """The interruptible floor of the host's offer at epoch second `at`, in $/h with the disk (like dph_total)."""
    return round(gpu_price(host, at) * bid_floor(seed, host) + storage_price(host, disk_gb), 4)


@dataclass(frozen=True)
class Rival:
    """Another renter's bid for a host: from `at` until `until` (epoch seconds) it holds the host against any
    interruptible rental whose bid for the GPU (its bid less its disk's $/h) is lower than `gpu_bid`."""

    at: float
    until: float
    gpu_bid: float  # $/h


@dataclass(frozen=True)
class Outbid:
    """A stretch in which a rival's bid is over a machine's: it cannot prove from `start` until `end`."""

    start: float
    end: float
    top: float  # the highest rival bid for the GPU in it, $/h (a bid raised to this, plus the disk, resumes it)


@functools.lru_cache(maxsize=65536)
def _rivals_in_hour(seed: int, host: Host, hour: int, per_hour: float) -> tuple[Rival, ...]:
    """The rival bids that come for the host in hour number `hour` since the epoch (a Poisson process)."""
    if per_hour <= 0:
        return ()
    rng = random.Random(f"{seed}/rival/{host.machine_id}/{hour}")
    found: list[Rival] = []
    offset = 0.0
    while True:
        offset += -math.log(1 - rng.random()) / per_hour * 3600
        if offset >= 3600:
            return tuple(found)
        at = hour * 3600 + round(offset)
        price = round(gpu_price(host, at) * bid_floor(seed, host) * rng.uniform(*OUTBID_PRICE), 4)
        hold = min(OUTBID_MOST_S, -math.log(1 - rng.random()) * OUTBID_MEAN_S)
        found.append(Rival(at=at, until=at + round(max(60.0, hold)), gpu_bid=price))


def rivals(seed: int, host: Host, start: float, end: float, rates: FailureRates) -> list[Rival]:
    """The rival bids holding the host at some moment in [start, end), in the order they come.

    The market's own process, whatever anyone rents: a function of the seed, the host and the hour, so a
    bound can know it in hindsight as it knows the arrivals.
    """
    first, last = math.floor((start - OUTBID_MOST_S - 60) / 3600), math.floor(end / 3600)
    return [rival for hour in range(first, last + 1) for rival in _rivals_in_hour(seed, host, hour, rates.outbid_per_hour)
            if rival.until > start and rival.at < end]


def outbid(seed: int, host: Host, after: float, gpu_bid: float, rates: FailureRates) -> Outbid | None:
    """The first stretch from `after` on in which a rival's bid for the host is over `gpu_bid` (None: none
    within OUTBID_LOOK_S): it begins when such a rival comes (or at `after`, one holding the host then) and
    ends when no rival over `gpu_bid` holds it."""
    over = [rival for rival in rivals(seed, host, after, after + OUTBID_LOOK_S, rates) if rival.gpu_bid > gpu_bid]
    if not over:
        return None
    start, end, top = max(after, over[0].at), over[0].until, over[0].gpu_bid
    for rival in over[1:]:
        if rival.at > end:
            break
        end, top = max(end, rival.until), max(top, rival.gpu_bid)
    if end >= after + OUTBID_LOOK_S:  # a stretch running past what was looked at: its later rivals too
        for rival in rivals(seed, host, after + OUTBID_LOOK_S, end + OUTBID_MOST_S, rates):
            if rival.gpu_bid > gpu_bid and rival.at <= end:
                end, top = max(end, rival.until), max(top, rival.gpu_bid)
    return Outbid(start=start, end=end, top=top)


def rival_floors(seed: int, host: Host, start: float, span_s: float, spans: int, rates: FailureRates) -> list[float]:
    """For each of `spans` spans of span_s seconds from `start`: the lowest the highest rival bid for the host's
    GPU is at any moment of it (0: a moment with no rival). An interruptible rental proves in the span only at
    a bid for the GPU of at least this (a lower one is outbid whenever it proves)."""
    held = rivals(seed, host, start, start + span_s * spans, rates)
    floors = []
    for number in range(spans):
        begin, end = start + number * span_s, start + (number + 1) * span_s
        moments = [begin] + [rival.until for rival in held if begin < rival.until < end]
        floors.append(min(max((r.gpu_bid for r in held if r.at <= at < r.until), default=0.0) for at in moments))
    return floors
