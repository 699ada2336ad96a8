"""How often a boot here comes up: the planning policy counts a boot's capacity at that share.

A create or a resume may never prove (the container does not start, the parameter fetch stalls, the benchmark
hangs, a resume finds its GPU taken), and each failure is found only after minutes, when a replacement boots
from the start. A plan that counts every boot as a whole machine is short exactly when boots fail most, and its
proofs go late while it replaces them one at a time. So each boot on its way or planned counts at the share of
recent boots (the last WINDOW) that reached proving, fresh and resumed apart, with a prior of PRIOR_OK of
PRIOR_BOOTS so a few boots do not swing it.

A boot fails at one of its steps: the container's start (launching), the parameter fetch (registered) or the
benchmark (params_done). One already past some of them has only the rest ahead, so a machine on its way counts
at the share of the recent boots that reached its step and came up: a start failure seen in the first minutes
of a day says little of a machine already fetching its parameters, and counting that machine at the odds of a
fresh start would boot more than the fleet needs, to release it later. The prior's failures are spread evenly
over the three steps (a boot past all of them, in bench_done, has none of the prior's left).

A boot reached proving when its machine heartbeat since it began (a machine heartbeats only once it proves); it
failed when the machine was killed first (by reconcile's timeouts, vast's start failure, or the policy giving up
on a benchmark past LATE_BENCH_S); one still booting is not counted yet, and neither is one the policy released
before then (work it no longer needed): that says nothing of how the market boots, and counted as a failure it
would make the next plan boot more, to release more. read_boot_odds() is the only part that reads the file: one
query over the instances begun within the window.
"""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta

from vastctl import clock
from vastctl.agent.sizing import LATE_BENCH_S
from vastctl.state import instances
from vastctl.state.lifecycle import KillCode, State

WINDOW = timedelta(hours=6)  # the boots that tell how this market boots now
PRIOR_OK, PRIOR_BOOTS = 5.0, 6.0  # five of six boots come up until the file says otherwise
STEPS = (State.LAUNCHING, State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE)  # a boot's, in order
RISKY_STEPS = 3  # the start, the parameter fetch and the benchmark: where a boot fails


@dataclass(frozen=True)
class BootOdds:
    """Boots begun within WINDOW that came up or failed, fresh and resumed apart; and of the failed ones, those
    that had reached each later step (registered, params_done, bench_done). Every boot that came up passed every
    step, so the boots that reached a step are those that came up and the failed ones past it."""

    fresh_ok: int = 0
    fresh_failed: int = 0
    resume_ok: int = 0
    resume_failed: int = 0
    fresh_failed_past: tuple[int, ...] = (0,) * (len(STEPS) - 1)
    resume_failed_past: tuple[int, ...] = (0,) * (len(STEPS) - 1)

    @property
    def fresh(self) -> float:
        """The share of a fresh boot's rate the plan counts on."""
        return _share(self.fresh_ok, self.fresh_failed)

    @property
    def resume(self) -> float:
        """The share of a resume's rate the plan counts on."""
        return _share(self.resume_ok, self.resume_failed)

    def on_its_way(self, resumed: bool, state: str) -> float:
        """The share of the rate of a machine booting in `state` the plan counts on: the odds of the boots that
        reached that step (a step not among STEPS is counted as a start)."""
        step = STEPS.index(State(state)) if state in STEPS else 0
        ok, failed = (self.resume_ok, self.resume_failed) if resumed else (self.fresh_ok, self.fresh_failed)
        if step > 0:
            failed = (self.resume_failed_past if resumed else self.fresh_failed_past)[step - 1]
        return _share(ok, failed, step)

    def words(self) -> str:
        """The odds as the plan's reasons say them."""
        return (f"boots came up {self.fresh_ok} of {self.fresh_ok + self.fresh_failed} fresh,"
                f" {self.resume_ok} of {self.resume_ok + self.resume_failed} resumed in {WINDOW.total_seconds() / 3600:g}h:"
                f" counted at {self.fresh:.0%} and {self.resume:.0%} of their rates; a fresh one on its way at"
                f" {'/'.join(f'{self.on_its_way(False, step):.0%}' for step in STEPS[1:])} past its start/parameters/"
                "benchmark")


def _share(ok: int, failed: int, step: int = 0) -> float:
    """(ok + the prior's) of (all + the prior's), the prior's failures those of the steps still ahead."""
    prior_failed = (PRIOR_BOOTS - PRIOR_OK) * max(0, RISKY_STEPS - step) / RISKY_STEPS
    return (ok + PRIOR_OK) / (ok + failed + PRIOR_OK + prior_failed)


def read_boot_odds(conn: sqlite3.Connection, now: datetime) -> BootOdds:
    """The boots begun within WINDOW before `now` and how they ended (module docstring)."""
    since = clock.to_iso(now - WINDOW)
    counts = {"fresh_ok": 0, "fresh_failed": 0, "resume_ok": 0, "resume_failed": 0}
    failed_past = {"fresh": [0] * (len(STEPS) - 1), "resume": [0] * (len(STEPS) - 1)}
    for boot in instances.boots_since(conn, since):
        for kind, began, ended in (("fresh", boot.created_at, boot.resumed_at), ("resume", boot.resumed_at, None)):
            if began is None or began < since:
                continue
            came_up = boot.last_heartbeat_at is not None and boot.last_heartbeat_at > began or (ended is not None)
            if came_up:  # it heartbeat, or was stopped after proving and resumed
                counts[f"{kind}_ok"] += 1
            elif boot.killed_at is not None and not _released_on_its_way(boot, began):
                counts[f"{kind}_failed"] += 1
                for step in range(_reached(boot, began)):
                    failed_past[kind][step] += 1
    return BootOdds(**counts, fresh_failed_past=tuple(failed_past["fresh"]),
                    resume_failed_past=tuple(failed_past["resume"]))


def _reached(boot: instances.Boot, began: str) -> int:
    """How many steps past the start the boot begun at `began` got (0: it never registered)."""
    steps = (boot.registered_at, boot.bench_began_at, boot.bench_done_at)
    return sum(1 for _ in itertools.takewhile(lambda at: at is not None and at >= began, steps))


def _released_on_its_way(boot: instances.Boot, began: str) -> bool:
    """Killed by the policy while booting, before its benchmark was late: the fleet's choice, not a failed boot."""
    if boot.kill_code != KillCode.AGENT:
        return False
    bench = clock.from_iso(boot.bench_began_at) if boot.bench_began_at and boot.bench_began_at >= began else None
    killed = clock.from_iso(boot.killed_at)
    return bench is None or killed is None or (killed - bench).total_seconds() < LATE_BENCH_S
