"""What a simulated day is: its options, the demand curve, the config it runs with, and its clock's start.

The demand curve (hours from the start of each simulated day): a daily swing of
160-400 proofs/hour (low at 03:00, high at 15:00), a burst of +250 from 10:00
to 11:30, a quiet spell with nothing arriving from 16:00 to 19:00, and an
outage of the demand source from 21:00 to 22:30; ±10% noise per 10 minutes,
drawn from the seed. The same seed gives the same curve to the digit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from vastctl import clock as clocks
from vastctl import validate
from vastctl.config import Config
from vastctl.errors import BadInput

START = datetime(2031, 3, 3, tzinfo=timezone.utc)  # far from the wall clock: a wall-clock time in the file stands out
STEP_S = 60  # cron's minute
WARMUP_MINUTES = 60
TARGET_EVERY_MINUTES = 10
LOOKAHEAD_MINUTES = 60
FAILURE_LEVELS = ("low", "default", "high")
POLICIES = ("rules", "llm", "plan")
RENTALS = ("on-demand", "interruptible", "mixed")  # launch.rental's choices
FLEETS = ("rules", "static")  # static: sized for the day's peak once, never scaled down (the bench's baseline)
MAX_HOURS = 7 * 24
DEFAULT_SEED = 351  # the README's day: most failure kinds happen in it (with seed 9's day, every one)

# the demand curve, in hours of the simulated day
SWING_MEAN, SWING_AMPLITUDE, SWING_PEAK_HOUR = 280.0, 120.0, 15.0
BURST = (10.0, 11.5, 250.0)  # from, to, extra proofs/hour
QUIET = (16.0, 19.0)  # nothing arrives: long past agent.scale_down_after, the fleet is released and resumed
OUTAGE = (21.0, 22.5)  # the demand source is down: nothing is reported
NOISE = 0.10


@dataclass(frozen=True)
class DemoOptions:
    hours: float = 24.0
    seed: int = DEFAULT_SEED
    policy: str = "plan"
    failures: str = "default"
    fleet: str = "rules"
    rental: str | None = None  # launch.rental for the day (None: the config's, on-demand)

    def check(self) -> None:
        hours = validate.real(self.hours)
        if hours is None or not 0 < hours <= MAX_HOURS:
            raise BadInput(f"--hours must be more than 0 and at most {MAX_HOURS}, got {self.hours!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise BadInput(f"--seed must be a whole number ≥ 0, got {self.seed!r}")
        for name, value, choices in (("--policy", self.policy, POLICIES), ("--failures", self.failures, FAILURE_LEVELS),
                                     ("fleet", self.fleet, FLEETS)):
            if value not in choices:
                raise BadInput(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if self.rental is not None and self.rental not in RENTALS:
            raise BadInput(f"--rental must be one of {', '.join(RENTALS)}, got {self.rental!r}")

    @property
    def minutes(self) -> int:
        return max(1, int(round(self.hours * 60)))


class DemandCurve:
    """Proofs/hour arriving at each minute of the run, and whether the demand source is down then."""

    def __init__(self, seed: int):
        self.seed = seed
        self._noise: dict[int, float] = {}

    def rate(self, minute: int) -> float:
        hour = (minute / 60) % 24
        if QUIET[0] <= hour < QUIET[1]:
            return 0.0
        base = SWING_MEAN + SWING_AMPLITUDE * math.sin(2 * math.pi * (hour - SWING_PEAK_HOUR + 6) / 24)
        if BURST[0] <= hour < BURST[1]:
            base += BURST[2]
        return base * self._factor(minute // 10)

    def outage(self, minute: int) -> bool:
        hour = (minute / 60) % 24
        return OUTAGE[0] <= hour < OUTAGE[1]

    def coming(self, minute: int) -> float:
        """Proofs arriving within the next hour (what the look-ahead query counts)."""
        return sum(self.rate(m) for m in range(minute + 1, minute + 1 + LOOKAHEAD_MINUTES)) / 60

    def lookahead_target(self, minute: int) -> float:
        """What the operator's script sets: the coming hour's peak arrival rate, rounded up to 10."""
        peak = max(self.rate(m) for m in range(minute, minute + LOOKAHEAD_MINUTES))
        return float(math.ceil(peak / 10) * 10)

    def arrivals(self, minute: int) -> list[int]:
        """When the look-ahead's proofs arrive, as a real Curio's script reports them (jobs/curio-demand.sh
        `arrivals`): the proofs of each 10 minutes from the next minute on, exact within the look-ahead (the day's
        sectors reach PoRep LOOKAHEAD_MINUTES after their precommit lands, so those are on chain with their seed
        known) and 0 beyond it, where no sector is precommitted yet. Rounded as `coming` is in the day's report:
        the counts add up to its look-ahead."""
        from vastctl.facts.demand import ARRIVAL_BUCKET_S, ARRIVAL_BUCKETS

        width = ARRIVAL_BUCKET_S // 60
        rates = [self.rate(m) for m in range(minute + 1, minute + 1 + LOOKAHEAD_MINUTES)]
        known = [math.ceil(sum(rates[:k * width]) / 60 - 1e-9) for k in range(ARRIVAL_BUCKETS + 1)]
        return [after - before for before, after in zip(known, known[1:])]

    def later(self, minute: int, sealing_minutes: int = 180) -> int:
        """The sectors in earlier stages (jobs/curio-demand.sh `later`): the proofs arriving in the `sealing_minutes`
        after the look-ahead (SDR, trees and the precommit take hours), a count with no time."""
        beyond = range(minute + 1 + LOOKAHEAD_MINUTES, minute + 1 + LOOKAHEAD_MINUTES + sealing_minutes)
        return math.ceil(sum(self.rate(m) for m in beyond) / 60 - 1e-9)

    def _factor(self, block: int) -> float:
        if block not in self._noise:
            self._noise[block] = random.Random(f"{self.seed}/demand/{block}").uniform(1 - NOISE, 1 + NOISE)
        return self._noise[block]


def demo_config(directory: Path, options: DemoOptions) -> Config:
    """The config a demo runs with: the simulated market, fleet limits sized for the demand curve."""
    from vastctl.providers import sim_market

    config = Config(db=str(directory / "demo.db"), provider="sim")
    config.server.url = "https://manager.demo.invalid"
    config.fleet.max_instances = 24
    config.fleet.max_hourly_spend = 15.0
    config.fleet.max_dph = 1.2
    config.fleet.gpus = [model.name for model in sim_market.GPUS]  # every model the market offers, up to max_dph
    config.fleet.min_cpu_ram_gb = 384.0  # ≥384 GiB hosts prove 84-95/h: cheaper per proof, fewer below their promise
    config.sim.seed, config.sim.failures = options.seed, options.failures
    config.demand.lookahead_window = LOOKAHEAD_MINUTES * 60.0  # the script's look-ahead counts the coming hour
    if options.rental is not None:
        config.launch.rental = options.rental
    if options.fleet == "static":
        config.agent.scale_down_after = 10 * 365 * 86400.0  # never
        config.agent.plan_horizon = 60.0  # any queue at all sizes it to the target: the old one-way fleet
    return config


def end_of(options: DemoOptions) -> str:
    """The simulated clock's time at the end of the run (where `serve --as-of` shows the kept file)."""
    return clocks.parse_iso(clocks.to_iso(START + timedelta(minutes=options.minutes))).strftime("%Y-%m-%dT%H:%M:%SZ")
