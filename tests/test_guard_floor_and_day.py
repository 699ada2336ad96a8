"""guard.check's max_daily_spend and agent.min_machines: the agent trying to pass them, the operator, reconcile."""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import timedelta

import pytest
from helpers.guard_observations import EMPTY, NOW, QUEUED, launch, machine, obs

from vastctl import config as config_module
from vastctl import guard
from vastctl.guard import Action, Kind

REMOVALS = [Kind.STOP, Kind.KILL, Kind.DESTROY]


def floor_config(n: int):
    return config_module.from_mapping({"agent": {"max_actions_per_step": 5, "min_machines": n}})


def spent(observation, dollars: float):
    return dataclasses.replace(observation, spent_today=dollars)


@pytest.fixture
def cfg():
    return config_module.from_mapping({"agent": {"max_actions_per_step": 5}})


@pytest.mark.parametrize("actor", ["agent", "operator", "reconcile"])
def test_a_launch_past_the_day_is_refused_whoever_asks(cfg, actor):
    # $1/h billing now, $20 spent today, limit $22: $20 + 1h × ($1 + $0.9) = $21.90 passes, a second does not
    fleet = spent(obs([machine("vastctl-a", dph=1.0)], max_daily_spend=22.0, max_instances=10), 20.0)
    assert guard.check(fleet, launch(actor, dph=0.9), cfg).allowed
    verdict = guard.check(fleet, launch(actor, dph=0.9, count=2), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "max_daily_spend")
    assert "$22.80 ($20.00 spent since 00:00 UTC, plus the next hour at $2.80/h)" in verdict.why
    assert "max_daily_spend is $22 (vastctl settings set max_daily_spend X)" in verdict.why
    # what the step already allowed counts, as for max_hourly_spend
    assert guard.check(fleet, launch(actor, dph=0.9), cfg, earlier=[launch(actor, dph=0.9)]).limit == "max_daily_spend"


def test_a_start_past_the_day_is_refused_and_its_kept_disk_is_not_counted_twice(cfg):
    stopped = machine("vastctl-s", state="stopped", dph=0.8, billed_per_hour=0.1)
    fleet = spent(obs([stopped], demand=EMPTY, max_daily_spend=10.0), 9.2)
    start = Action(kind=Kind.START, actor="agent", label="vastctl-s")
    assert guard.check(fleet, start, cfg).allowed  # $9.20 + 1h × $0.70 more = $9.90
    verdict = guard.check(spent(fleet, 9.4), start, cfg)
    assert (verdict.allowed, verdict.limit) == (False, "max_daily_spend") and "starting vastctl-s" in verdict.why


def test_the_day_limit_never_stops_what_runs(cfg):
    fleet = spent(obs([machine("vastctl-a"), machine("vastctl-b")], demand=EMPTY, max_daily_spend=5.0), 50.0)
    assert guard.check(fleet, Action(kind=Kind.STOP, actor="agent", label="vastctl-a"), cfg).allowed
    assert guard.check(fleet, Action(kind=Kind.NOTE, actor="agent", text="over the day"), cfg).allowed


def test_the_hourly_limit_is_checked_first(cfg):
    fleet = spent(obs([machine("vastctl-a", dph=0.9)], max_daily_spend=1.0, max_hourly_spend=1.0), 5.0)
    assert guard.check(fleet, launch("agent", dph=0.5), cfg).limit == "max_hourly_spend"


@pytest.mark.parametrize("kind", REMOVALS)
@pytest.mark.parametrize("demand", [EMPTY, QUEUED], ids=["empty", "queued"])
def test_the_agent_cannot_go_below_the_floor_whatever_the_queue_says(kind, demand):
    cfg = floor_config(3)
    fleet = obs([machine("vastctl-a"), machine("vastctl-b"), machine("vastctl-d"),
                 machine("vastctl-c", state="params_done")], demand=demand)
    first = Action(kind=kind, actor="agent", label="vastctl-a")
    assert guard.check(fleet, first, cfg).allowed  # four warm: one may go
    verdict = guard.check(fleet, Action(kind=kind, actor="agent", label="vastctl-b"), cfg, earlier=[first])
    assert (verdict.allowed, verdict.limit) == (False, "min_machines")
    assert "would leave 2 warm machine(s)" in verdict.why and "agent.min_machines keeps 3" in verdict.why
    # the boot counts as warm: retiring it is refused too once the floor is reached
    boot = Action(kind=kind, actor="agent", label="vastctl-c")
    assert guard.check(fleet, boot, cfg, earlier=[first]).limit == "min_machines"


def test_what_is_not_warm_may_go_and_reconcile_is_never_held():
    cfg = floor_config(2)
    stale = clock_iso(NOW - timedelta(hours=1))
    fleet = obs([machine("vastctl-a"), machine("vastctl-x", vast_status="exited"),
                 machine("vastctl-m", state="launching", vast_missing=2),
                 machine("vastctl-h", state_since=stale, last_heartbeat_at=stale),
                 machine("vastctl-s", state="stopped")], demand=EMPTY)
    for label in ("vastctl-x", "vastctl-m", "vastctl-h", "vastctl-s"):
        assert guard.check(fleet, Action(kind=Kind.DESTROY, actor="agent", label=label), cfg).allowed, label
    kill = Action(kind=Kind.KILL, actor="reconcile", label="vastctl-a", uuid="u-vastctl-a")
    assert guard.check(fleet, kill, cfg).allowed
    assert guard.check(fleet, Action(kind=Kind.STOP, actor="agent", label="vastctl-a"), cfg).limit == "min_machines"


def test_an_operator_is_held_by_the_floor_unless_forced_and_the_force_is_recorded(tmp_path):
    from vastctl.state import db

    cfg = floor_config(1)
    fleet = obs([machine("vastctl-a"), machine("vastctl-b")], demand=EMPTY)
    held = guard.check(fleet, Action(kind=Kind.KILL, actor="operator", label="vastctl-a"), cfg,
                       earlier=[Action(kind=Kind.KILL, actor="operator", label="vastctl-b")])
    assert held.limit == "min_machines" and "(pass --force to do it anyway)" in held.why
    forced_action = Action(kind=Kind.KILL, actor="operator", label="vastctl-a", force=True)
    forced = guard.check(fleet, forced_action, cfg, earlier=[Action(kind=Kind.KILL, actor="operator", label="vastctl-b")])
    assert forced.allowed and forced.forced and forced.limit == "min_machines"
    conn = db.connect(tmp_path / "f.db", now=NOW, create=True)
    guard.record(conn, forced_action, forced, now=NOW)
    row = conn.execute("SELECT actor, ok, result FROM actions").fetchone()
    assert isinstance(row, sqlite3.Row) and (row["actor"], row["ok"]) == ("operator", 1)
    assert row["result"].startswith("forced past the guard (min_machines)")


def test_no_floor_by_default():
    fleet = obs([machine("vastctl-a"), machine("vastctl-b")], demand=EMPTY)
    cfg = config_module.Config()
    assert cfg.agent.min_machines == 0
    assert guard.check(fleet, Action(kind=Kind.DESTROY, actor="agent", label="vastctl-a"), cfg).allowed
    assert guard.check(fleet, Action(kind=Kind.DESTROY, actor="agent", label="vastctl-b"), cfg,
                       earlier=[Action(kind=Kind.DESTROY, actor="agent", label="vastctl-a")]).allowed


def test_a_floor_above_max_instances_is_a_config_error():
    from vastctl.errors import BadInput

    with pytest.raises(BadInput, match="agent.min_machines.*above fleet.max_instances"):
        config_module.from_mapping({"agent": {"min_machines": 3}, "fleet": {"max_instances": 2}})


def clock_iso(moment):
    from vastctl import clock

    return clock.to_iso(moment)
