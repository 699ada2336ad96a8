"""The rules policy with agent.min_machines and max_daily_spend: where it decides (plan, needs_offers, hold_reason)."""

from __future__ import annotations

import dataclasses

from helpers.rules_observations import CONFIG, MARKET, m, observation, queued

from vastctl import config as config_module
from vastctl.agent import rules


def floor(n: int):
    return dataclasses.replace(CONFIG, agent=dataclasses.replace(CONFIG.agent, min_machines=n))


def kinds(actions):
    return [(a.kind.value, a.label or a.offer_id) for a in actions]


def test_no_work_past_the_cooldown_releases_down_to_the_floor_and_no_further():
    fleet = [m("vastctl-a"), m("vastctl-b", dph=0.6), m("vastctl-c", dph=0.7), m("vastctl-d")]
    empty = queued(0, empty_for_min=61)
    obs = observation(fleet, empty, target_proofs_per_hour=50.0)
    assert kinds(rules.plan(obs, CONFIG, MARKET)) == [("stop", "vastctl-c"), ("stop", "vastctl-b"), ("stop", "vastctl-a")]
    assert kinds(rules.plan(obs, floor(2), MARKET)) == [("stop", "vastctl-c"), ("stop", "vastctl-b")]
    at_floor = observation([m("vastctl-a"), m("vastctl-d")], empty, target_proofs_per_hour=0.0)
    assert rules.plan(at_floor, floor(2), MARKET) == []
    assert rules.hold_reason(at_floor, floor(2), MARKET) == (
        "no work for 61m: agent.min_machines keeps 2 warm (2 proving or booting)")


def test_an_empty_fleet_under_the_floor_rents_up_to_it_whatever_the_queue_says():
    obs = observation([], queued(0, empty_for_min=61), target_proofs_per_hour=0.0)
    assert rules.plan(obs, CONFIG, MARKET) == []
    assert not rules.needs_offers(obs, CONFIG)
    assert rules.needs_offers(obs, floor(2))
    actions = rules.plan(obs, floor(2), MARKET)
    assert kinds(actions) == [("launch", 2), ("launch", 1)]  # the cheapest per expected proof first
    assert all("agent.min_machines 2: 0 warm (proving or booting), whatever the queue says" in a.reason
               for a in actions)


def test_booting_machines_count_so_the_floor_is_not_rented_twice():
    obs = observation([m("vastctl-a", state="registered"), m("vastctl-b", state="launching")],
                      queued(0, empty_for_min=1), target_proofs_per_hour=0.0)
    assert rules.plan(obs, floor(2), MARKET) == []
    assert not rules.needs_offers(obs, floor(2))


def test_the_floor_resumes_a_stopped_machine_before_renting_and_keeps_dead_ones_out_of_the_count():
    fleet = [m("vastctl-x", status="exited"), m("vastctl-s", state="stopped")]
    obs = observation(fleet, queued(0, empty_for_min=61), target_proofs_per_hour=0.0)
    # the dead one is released as any idle machine is; the floor is two warm: resume, then rent
    assert kinds(rules.plan(obs, floor(2), MARKET)) == [("stop", "vastctl-x"), ("start", "vastctl-s"), ("launch", 2)]


def test_the_floor_stays_inside_max_instances_and_the_spend_limits():
    obs = observation([m("vastctl-a")], queued(0, empty_for_min=61), target_proofs_per_hour=0.0, max_instances=2,
                      max_daily_spend=9.8)
    assert kinds(rules.plan(obs, floor(3), MARKET)) == [("launch", 2)]  # max_instances 2: one more, not two
    late_in_the_day = dataclasses.replace(obs, spent_today=9.0)  # $9 + 1h × ($0.5 + $0.4) = $9.90 > $9.80
    assert rules.plan(late_in_the_day, floor(3), MARKET) == []
    hourly = observation([m("vastctl-a")], queued(0, empty_for_min=61), target_proofs_per_hour=0.0,
                         max_hourly_spend=0.8)
    assert rules.plan(hourly, floor(2), MARKET) == []  # $0.5 + the cheapest $0.4 passes $0.8/h


def test_work_waiting_grows_only_within_the_day_and_says_so():
    obs = observation([m("vastctl-a")], queued(59), max_daily_spend=10.0)
    assert kinds(rules.plan(obs, CONFIG, MARKET)) == [("launch", 2)]  # wanted 115/h: one more machine
    late_in_the_day = dataclasses.replace(obs, spent_today=9.2)  # + 1h × ($0.5 + $0.4) = $10.10 > $10
    assert rules.plan(late_in_the_day, CONFIG, MARKET) == []
    reason = rules.hold_reason(late_in_the_day, CONFIG, MARKET)
    assert "max_daily_spend ($9.20 spent today of $10)" in reason


def test_the_floor_default_changes_nothing():
    assert config_module.Config().agent.min_machines == 0
