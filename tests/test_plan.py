"""The planning policy (agent.policy plan), where it decides: plan.plan() on constructed observations, the guard
over its actions, and agent-step running it at the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from helpers.agent_cli import running
from helpers.serving import query

from vastctl import clock
from vastctl import config as config_module
from vastctl.agent import plan, rules, sizing, step
from vastctl.agent.plan_forecast import DemandPast, forecast
from vastctl.agent.plan_odds import PRIOR_BOOTS, PRIOR_OK, STEPS, WINDOW, BootOdds, read_boot_odds
from vastctl.agent.sizing import HEALTHY_BENCH_S, LATE_BENCH_S
from vastctl.errors import BadInput
from vastctl.facts.demand import Demand
from vastctl.observe import Observation
from vastctl.providers.base import Offer

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SETTINGS = {"target_proofs_per_hour": 300.0, "min_bench_rate": 40.0, "max_instances": 10,
            "max_hourly_spend": 10.0, "max_dph": 1.0}
CONFIG = config_module.from_mapping({"agent": {"plan_horizon": "30m", "max_actions_per_step": 5},
                                     "demand": {"lookahead_window": "20m"}})
HOUR_AHEAD = config_module.from_mapping({"agent": {"plan_horizon": "30m", "max_actions_per_step": 5},
                                         "demand": {"lookahead_window": "1h"}})


def demand(queued, lookahead, in_flight=0, arrivals=None):
    return Demand(queued=queued, proofs_per_hour=50.0, at=NOW, age_s=30, source="command", known=True,
                  empty_since=None if queued or lookahead or in_flight else NOW - timedelta(minutes=30),
                  in_flight=in_flight, lookahead=lookahead, arrivals=arrivals)


def m(label, state="running", rate=60.0, dph=0.5, resumes=0, heartbeat_min=1.0):
    beat = (NOW - timedelta(minutes=heartbeat_min)).isoformat()
    return {"uuid": f"u-{label}", "label": label, "state": state, "expected_rate": rate, "dph": dph,
            "vast_id": 100 + len(label), "vast_status": "exited" if state == "stopped" else "running",
            "vast_missing": 0, "gpu_name": "RTX 4090", "resumes": resumes, "bid": None,
            "state_since": (NOW - timedelta(hours=3)).isoformat(), "last_heartbeat_at": beat,
            "billed_per_hour": 0.01 if state == "stopped" else dph}


def offer(offer_id, dph=0.5):
    return Offer(id=offer_id, machine_id=offer_id * 10, gpu_name="RTX 4090", num_gpus=1, dph_total=dph)


def observation(machines, work, **settings):
    return Observation(now=NOW, settings={**SETTINGS, **settings}, demand=work, machines=list(machines),
                       capacity=sum(x["expected_rate"] for x in machines if x["state"] == "running"),
                       pending_capacity=0.0,
                       spend_per_hour=sum(x["dph"] for x in machines if x["state"] != "stopped"),
                       events=[], last_actions=[], model_rates={"RTX 4090": 60.0}, spent_today=0.0)


MARKET = [offer(1, dph=0.5), offer(2, dph=0.55)]


def kinds(actions):
    return [(a.kind, a.label or a.offer_id) for a in actions]


# --- the forecast: where the look-ahead's proofs fall -------------------------------------------------------


def slots_of(work, past, config=HOUR_AHEAD):
    return [round(x, 3) for x in forecast(observation([], work), config, past, plan.HORIZON_SLOTS, plan.SLOT_S).arrivals]


def test_the_source_s_arrivals_put_the_look_ahead_in_its_own_slots_and_the_profile_goes_on_past_them():
    """60 proofs coming within the hour, all of them in its last 20 minutes (a burst of precommits an hour ago):
    spread along the line they would be 10 a slot; timed, the first 40 minutes bring none, and past the window
    the level held is that of its last 20 minutes (180/h: 30 a slot), not the line's 60/h. The buckets past the
    window count only sectors precommitted so far: the 5 of the seventh slot are below the level held, the 40 above."""
    past = DemandPast(last_window=60)
    burst = demand(0, 60, arrivals=(0, 0, 0, 0, 30, 30, 5, 40, 0))
    assert slots_of(burst, past) == [0.0, 0.0, 0.0, 0.0, 30.0, 30.0, 30.0, 40.0] + [30.0] * 7
    reason = plan.decide(observation([m("vastctl-a")], burst), HOUR_AHEAD, MARKET, past).hold or ""
    assert ("60/h coming over 60m (was 60/h) as the source times it, beyond it held at the window's end rate 180/h"
            " (its last timed 20m)") in reason
    # look-ahead no bucket times (no seed epoch yet) comes at the window's end, and counts in its level (150/h)
    untimed = slots_of(demand(0, 60, arrivals=(10, 0, 0, 0, 10, 0)), past)
    assert untimed == [10.0, 0.0, 0.0, 0.0, 10.0, 40.0] + [25.0] * 9
    # a 20-minute window: 20 and 10 timed within it, the 25 untimed at its end, then its 55 in 20 min held (165/h)
    assert slots_of(demand(0, 60, arrivals=(20, 10, 5)), past, CONFIG)[:4] == [20.0, 35.0, 27.5, 27.5]


def test_without_arrivals_the_forecast_is_the_line_it_was():
    """A source that does not time its look-ahead (or times none of it): the line from the past window's 30/h to
    the coming 60/h, scaled to hold the 60, then the window's end rate held."""
    line = [7.917, 8.75, 9.583, 10.417, 11.25, 12.083] + [12.5] * 9
    assert slots_of(demand(0, 60), DemandPast(last_window=30)) == line
    assert slots_of(demand(0, 60, arrivals=()), DemandPast(last_window=30)) == line
    reason = plan.decide(observation([m("vastctl-a")], demand(0, 60)), HOUR_AHEAD, MARKET, DemandPast(last_window=30)).hold
    assert "as the source times it" not in (reason or "")


# --- a lull: held through when work returns before a new rental pays off, released when it does not -------


def test_a_cheap_rented_host_is_held_through_a_lull_work_returns_from():
    """Nothing comes in the next 20 min, then the profile of a day ago says 45/h again: the machine rented at
    $0.30/h is cheaper to keep idle for the lull than a fresh boot at $0.50/h later."""
    cheap = m("vastctl-a", dph=0.3)
    returning = DemandPast(day_before_now=1.0, day_before=(1.0, 1.0) + (15.0,) * 13)  # 45/h from 20 min on
    decision = plan.decide(observation([cheap], demand(0, 1)), CONFIG, MARKET, returning)
    assert decision.actions == []
    assert decision.hold is not None and "capacity 60 running + 0 booting covers the plan now" in decision.hold
    assert "a day ago at the same time" in decision.hold


def test_a_lull_with_no_work_returning_releases_the_machine_destroyed_with_its_reason():
    """Released is destroyed, not stopped: the program never takes it back, and its disk would bill for a resume
    that saves a quarter hour of boot and fails more often than a fresh boot."""
    cheap = m("vastctl-a", dph=0.3)
    actions = plan.plan(observation([cheap], demand(0, 0)), CONFIG, MARKET, DemandPast())
    assert kinds(actions) == [("destroy", "vastctl-a")]
    assert "the plan keeps 0 of 60 proofs/h running now" in actions[0].reason
    assert "destroyed (the plan takes no released machine back within its 2.5h: stopped, its disk would bill" in actions[0].reason


# --- a peak: worked off by waiting when it can be, rented for when it cannot ------------------------------


def test_a_peak_of_minutes_waits_in_the_queue_instead_of_renting():
    """30 proofs queued (6 min old at the 300/h of the past hour), 100/h coming, 120/h running: the rules rent for
    the backlog drained within agent.plan_horizon; the plan lets it wait, within agent.max_wait."""
    fleet = [m("vastctl-a"), m("vastctl-b")]
    obs = observation(fleet, demand(30, 100))
    past = DemandPast(last_window=300)
    assert [a.kind for a in rules.plan(obs, HOUR_AHEAD, MARKET)] == ["launch"]
    decision = plan.decide(obs, HOUR_AHEAD, MARKET, past)
    assert decision.actions == []
    assert "30 waiting (oldest ~6m)" in (decision.hold or "")


def test_a_peak_that_runs_minutes_into_the_margin_buys_no_boot(monkeypatch):
    """34 proofs wait (the oldest ~28 min), 72/h come for 20 minutes, then 30/h: the machine proving 60/h works it
    off with a few proofs a few minutes past the planned 30 min, well within agent.max_wait. Into the margin a
    proof costs a few proofs' price a slot, not a boot's: the plan holds; priced as late, it would rent a machine
    that the next steps release once it is up."""
    obs = observation([m("vastctl-a")], demand(34, 24))
    past = DemandPast(last_window=24, day_before_now=24.0, day_before=(24.0,) * 2 + (10.0,) * 13)
    decision = plan.decide(obs, CONFIG, MARKET, past)
    assert decision.actions == []
    assert "34 waiting (oldest ~28m)" in (decision.hold or "") and "proof-slots late" in (decision.hold or "")
    monkeypatch.setattr(plan, "MARGIN_LATE_COST", plan.LATE_COST)
    assert [a.kind for a in plan.decide(obs, CONFIG, MARKET, past).actions] == ["launch"]


def test_proofs_late_before_any_boot_could_prove_round_no_start_up_to_any_share():
    """A cold start: 10 proofs waiting, nothing running. The first of them are late in the first three slots
    whatever is rented (a fresh boot proves from the fourth), so renting more cannot help them: the second offer,
    planned at a fifth of its rate, is not started (at any share it would be, were proofs late where it proves)."""
    obs = observation([], demand(10, 5))
    past = DemandPast(last_window=5)
    setup = plan._setup(obs, CONFIG, MARKET, past, set(), plan.BootOdds())
    solution = plan.plan_lp.solve(setup.problem)
    assert sum(solution.overdue[:plan.FRESH_FIRST_SLOT]) > 0.5 and sum(solution.overdue[plan.FRESH_FIRST_SLOT:]) < 1e-6
    assert 0.1 < solution.shares["offer:2"][plan.FRESH_FIRST_SLOT] < plan.ROUND_UP
    assert [(a.kind, a.offer_id) for a in plan.plan(obs, CONFIG, MARKET, past)] == [("launch", 1)]


def test_a_peak_the_queue_cannot_absorb_rents_whole_machines_with_the_figures():
    """150 queued, 300/h coming, 60/h running: proofs would wait past max_wait, so the plan rents now."""
    obs = observation([m("vastctl-a")], demand(150, 300))
    actions = plan.plan(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=300))
    launched = [a for a in actions if a.kind == "launch"]
    assert sorted(a.offer_id for a in launched) == [1, 2]  # every offer there is
    assert "150 waiting" in launched[0].reason and "proofs/h more proving 30m from now" in launched[0].reason
    assert "$8.33 per 1000 proofs" in launched[0].reason


def test_a_fleet_behind_its_proofs_rents_above_the_ceiling_to_catch_up_and_not_for_a_queue_it_works_off(monkeypatch):
    """Two machines prove 120/h, at the operator's ceiling (target 100/h × 1.15 = 115/h; what runs is more). With
    150 proofs waiting and 100/h coming the queue never drains, so proofs go late for the whole horizon: the plan
    rents above the ceiling, at a price less than what keeping them in time is worth. Kept to the ceiling it would
    leave them late for hours; 20 waiting it works off in time, and it stays within the ceiling."""
    fleet = [m("vastctl-a"), m("vastctl-b")]
    past = DemandPast(last_window=100)
    behind = observation(fleet, demand(150, 100), target_proofs_per_hour=100.0)
    launched = plan.plan(behind, HOUR_AHEAD, MARKET, past)
    assert launched and {a.kind for a in launched} == {"launch"}
    assert "/h over the ceiling (120/h) where proofs would go late" in launched[0].reason
    keeping_up = plan.decide(observation(fleet, demand(20, 100), target_proofs_per_hour=100.0), HOUR_AHEAD, MARKET, past)
    assert keeping_up.actions == [] and "over the ceiling" not in (keeping_up.hold or "")
    monkeypatch.setattr(plan, "OVER_CEILING_COST", None)
    kept_to_it = plan.decide(behind, HOUR_AHEAD, MARKET, past)
    assert kept_to_it.actions == [] and "proof-slots late" in (kept_to_it.hold or "")


# --- what holds whatever the program says -----------------------------------------------------------------


def test_never_the_last_machine_while_work_is_queued():
    actions = plan.plan(observation([m("vastctl-a", rate=120)], demand(1, 0)), CONFIG, MARKET, DemandPast())
    assert actions == []


UNKNOWN = Demand(queued=None, proofs_per_hour=None, at=NOW - timedelta(hours=2), age_s=7200, source="command",
                 known=False, error="demand.command timed out after 20s", empty_since=NOW - timedelta(hours=3))


def test_unknown_demand_never_known_is_the_rules_sizing_as_if_work_were_queued():
    decision = plan.decide(observation([m("vastctl-a"), m("vastctl-b")], UNKNOWN), CONFIG, MARKET, DemandPast())
    assert decision.actions and {a.kind for a in decision.actions} == {"launch"}
    assert all(a.reason.startswith("demand unknown, the rules' hold: ") for a in decision.actions)


def test_unknown_demand_is_planned_on_the_newest_good_sample_and_never_shrinks_the_fleet():
    """The newest good sample said nothing was coming: known, the plan would release both machines; unknown, it
    releases nothing."""
    fleet = [m("vastctl-a", dph=0.3), m("vastctl-b", dph=0.3)]
    assert [a.kind for a in plan.plan(observation(fleet, demand(0, 0)), CONFIG, MARKET, DemandPast())] == ["destroy"] * 2
    obs = observation(fleet, UNKNOWN)
    obs.last_known_demand = {"at": NOW - timedelta(minutes=40), "ok": True, "queued": 0, "in_flight": 0,
                             "lookahead": 0, "proofs_per_hour": 0.0}
    decision = plan.decide(obs, CONFIG, MARKET, DemandPast())
    assert decision.actions == []
    assert (decision.hold or "").startswith("demand unknown, held to its newest good sample (40m old), nothing released")


def test_blind_the_queue_of_the_newest_good_sample_grows_by_what_it_had_coming_less_what_runs():
    """The source went silent 30 minutes ago with 30 proofs waiting and 40 coming within its 20-minute window
    (120/h); one machine proves 60/h. Blind, the work did not stop: 30 + (120 − 60) × 0.5 h = 60 wait now (held as
    sampled, it would plan on 30), and the plan rents for them; with 120/h running the queue stays at 30."""
    obs = observation([m("vastctl-a", dph=0.3)], UNKNOWN)
    obs.last_known_demand = {"at": NOW - timedelta(minutes=30), "ok": True, "queued": 30, "in_flight": 0,
                             "lookahead": 40, "proofs_per_hour": 120.0}
    decision = plan.decide(obs, CONFIG, MARKET, DemandPast(last_window=40))
    assert "demand unknown, held to its newest good sample (30m old), nothing released; plan 2.5h: 60 waiting" in (
        decision.actions[0].reason if decision.actions else decision.hold or "")
    assert [a.kind for a in decision.actions] == ["launch", "launch"]
    served = replace(obs, machines=obs.machines + [m("vastctl-b", dph=0.3)], capacity=120.0)
    calm = plan.decide(served, CONFIG, MARKET, DemandPast(last_window=40))  # 120/h runs: the queue stays at 30
    assert calm.actions == [] and "plan 2.5h: 30 waiting" in (calm.hold or "")


def test_min_machines_is_the_floor():
    floored = config_module.from_mapping({"agent": {"min_machines": 1}, "demand": {"lookahead_window": "20m"}})
    assert plan.plan(observation([m("vastctl-a", dph=0.3)], demand(0, 0)), floored, MARKET, DemandPast()) == []


def test_the_same_inputs_give_the_same_actions():
    obs = observation([m("vastctl-a")], demand(150, 300))
    first = plan.plan(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=300))
    assert first == plan.plan(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=300))


# --- the guard refuses part of a plan ----------------------------------------------------------------------


def test_the_guard_refuses_part_of_the_plan_and_passes_the_rest():
    """The plan releases the dearer machine and keeps the cheap one, which has not reported for an hour: the guard
    counts no machine proving then (never_scale_to_zero) and refuses the release; the destroy of a machine stopped
    after its one resume goes through."""
    fleet = [m("vastctl-a", dph=0.6), m("vastctl-b", dph=0.3, heartbeat_min=60), m("vastctl-s", "stopped", resumes=1)]
    obs = observation(fleet, demand(2, 0))
    planned = plan.plan(obs, CONFIG, MARKET, DemandPast())
    assert kinds(planned) == [("destroy", "vastctl-s"), ("destroy", "vastctl-a")]
    executor = step.Executor(None, None, CONFIG, obs, NOW, dry_run=True)  # type: ignore[arg-type]
    for action in planned:
        executor.submit(action)
    assert [(a["kind"], a["label"]) for a in executor.actions] == [("destroy", "vastctl-s")]
    assert [(r["kind"], r["label"], r["limit"]) for r in executor.refused] == [("destroy", "vastctl-a", "never_scale_to_zero")]


# --- the policy's name in the config and at the command line ---------------------------------------------


def test_the_config_accepts_plan_and_a_bad_policy_is_one_line_naming_the_choices():
    assert config_module.from_mapping({"agent": {"policy": "plan"}}).agent.policy == "plan"
    assert step.resolve_policy(None, config_module.from_mapping({"agent": {"policy": "plan"}}), {}) == "plan"
    with pytest.raises(BadInput) as bad:
        config_module.from_mapping({"agent": {"policy": "planner"}})
    assert str(bad.value) == "config key 'agent.policy' must be one of auto, rules, llm, plan, got 'planner'"
    with pytest.raises(BadInput, match="^--policy must be one of rules, llm, plan"):
        step.resolve_policy("magic", CONFIG, {})


def test_auto_is_the_plan_without_an_api_key_and_the_model_with_one():
    default = config_module.from_mapping({})
    assert default.agent.policy == "auto"
    assert step.resolve_policy(None, default, {}) == "plan"
    assert step.resolve_policy(None, default, {"ANTHROPIC_API_KEY": "sk-test"}) == "llm"
    assert step.resolve_policy("rules", default, {"ANTHROPIC_API_KEY": "sk-test"}) == "rules"


@pytest.fixture
def ready(agent_ready):
    """Initialised under the agent's config (helpers/agent_cli.py)."""


def test_agent_step_runs_the_plan_through_the_guard_and_records_it(ready, cli, market, db_path):
    running(cli, "vastctl-a")
    assert cli("demand", "report", "--queued", "500").code == 0
    result = cli("agent-step", "--policy", "plan", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert (data["policy"], data["refused"], data["errors"]) == ("plan", [], [])
    assert data["actions"] and all(a["kind"] == "launch" for a in data["actions"])
    assert all(a["result"].startswith("launched vastctl-") and a["reason"].startswith("plan 2.5h: 500 waiting")
               for a in data["actions"])
    (row,) = query(db_path, "SELECT policy, outcome FROM agent_steps")
    assert row == {"policy": "plan", "outcome": "ok"}
    history = cli("agent", "history")
    assert history.code == 0 and "plan 2.5h: 500 waiting" in history.out
    bad = cli("agent-step", "--policy", "magic")
    assert bad.code == 2 and bad.err.count("\n") == 1 and "--policy must be one of rules, llm, plan" in bad.err
    assert clock is not None


def test_make_before_break_a_boot_on_its_way_does_not_release_a_running_machine_yet(monkeypatch):
    """Two machines prove 120/h for 100/h coming, a third boots: the program lets the dearer running one go now
    (the queue bridges the minutes until the boot is up), but a boot may fail or run late, so what stays running
    must cover the plan's next slots without it."""
    booting = {**m("vastctl-c", state="params_done", dph=0.3), "state_since": (NOW - timedelta(minutes=5)).isoformat()}
    obs = observation([m("vastctl-a", dph=0.6), m("vastctl-b", dph=0.3), booting], demand(5, 100))
    assert plan.plan(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=100)) == []
    monkeypatch.setattr(plan, "MAKE_BEFORE_BREAK_SLOTS", 0)  # the program alone would break before making
    assert kinds(plan.plan(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=100))) == [("destroy", "vastctl-a")]


def benchmarking(label, minutes):
    machine = m(label, state="params_done")
    machine["state_since"] = (NOW - timedelta(minutes=minutes)).isoformat()
    return machine


def test_a_benchmark_past_its_time_is_released_even_while_the_plan_rents_for_a_peak():
    """A benchmark 26 min in is not counted and could not pass the gate: it goes in the step that rents around it
    (the rules keep one while the fleet is short); one 20 min in is still on its way."""
    obs = observation([m("vastctl-a"), benchmarking("vastctl-stuck", 26), benchmarking("vastctl-slowish", 20)],
                      demand(150, 300))
    decision = plan.decide(obs, HOUR_AHEAD, MARKET, DemandPast(last_window=300))
    destroyed = [a for a in decision.actions if a.kind == "destroy"]
    assert [a.label for a in destroyed] == ["vastctl-stuck"]
    assert "benchmarking for 26m" in destroyed[0].reason and "would not pass the gate" in destroyed[0].reason
    assert any(a.kind == "launch" for a in decision.actions)
    assert rules._release_late_benchmarks(obs, HOUR_AHEAD, 5) == []  # the rules' own keeps it: the fleet is short


def test_a_benchmark_past_a_healthy_one_s_time_is_not_counted_and_the_plan_rents_around_it():
    """60/h running and 60/h benchmarking for 115/h coming: 10 min into its benchmark the machine counts and nothing
    is rented; 18 min in, past the longest a healthy benchmark takes (HEALTHY_BENCH_S), it is likely stuck, and
    the plan rents around it then, not once it is released at LATE_BENCH_S; it is not released yet."""
    odds = BootOdds(fresh_ok=50)

    def decided(minutes):
        obs = observation([m("vastctl-a"), benchmarking("vastctl-b", minutes)], demand(20, 115))
        return plan.decide(obs, ODDS_CONFIG, MARKET, DemandPast(last_window=115), odds).actions

    assert HEALTHY_BENCH_S < 18 * 60 < LATE_BENCH_S
    assert not [a for a in decided(10) if a.kind == "launch"]
    overdue = decided(18)
    assert [a for a in overdue if a.kind == "launch"]
    assert not [a for a in overdue if a.label == "vastctl-b"]


def test_a_parameter_fetch_past_a_healthy_one_s_time_is_not_counted_and_the_plan_rents_around_it():
    """60/h running and 60/h fetching its parameters for 115/h coming: 10 min into its fetch the machine counts
    and nothing is rented; 22 min in, past the longest a healthy fetch takes at the fleet's slowest link
    (sizing.healthy_fetch_s: ~53 GiB at 500 Mbit/s and its checks), its fetch has likely stalled, and the plan
    rents around it then, not once reconcile kills it at timeouts.registered (30 min). Where that time is unknown
    (a 64GiB set), it counts until then."""
    odds = BootOdds(fresh_ok=50)

    def decided(minutes, config=ODDS_CONFIG):
        fetching = {**m("vastctl-b", state="registered"), "state_since": (NOW - timedelta(minutes=minutes)).isoformat()}
        obs = observation([m("vastctl-a"), fetching], demand(20, 115))
        return plan.decide(obs, config, MARKET, DemandPast(last_window=115), odds).actions

    assert 10 * 60 < sizing.healthy_fetch_s(ODDS_CONFIG) < 22 * 60 < ODDS_CONFIG.timeouts.registered
    assert not [a for a in decided(10) if a.kind == "launch"]
    stalled = decided(22)
    assert [a for a in stalled if a.kind == "launch"]
    assert not [a for a in stalled if a.label == "vastctl-b"]
    big_sectors = config_module.from_mapping({"agent": {"max_actions_per_step": 8}, "demand": {"lookahead_window": "1h"},
                                              "launch": {"sector_size": "64GiB", "bench_input": "https://x.example/c1"}})
    assert sizing.healthy_fetch_s(big_sectors) is None
    assert not [a for a in decided(22, big_sectors) if a.kind == "launch"]


# --- how often boots come up (agent/plan_odds.py) ------------------------------------------------------------

ODDS_CONFIG = config_module.from_mapping({"agent": {"max_actions_per_step": 8}, "demand": {"lookahead_window": "1h"}})



def at(minutes_ago: float | None) -> str | None:
    return None if minutes_ago is None else clock.to_iso(NOW - timedelta(minutes=minutes_ago))


def row(conn, label, created, resumed=None, killed=None, beat=None, state="killed", code=None, bench=None,
        registered=None, bench_done=None):
    conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, resumed_at, killed_at,"
                 " last_heartbeat_at, kill_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (f"u-{label}", label, state, at(created), at(created), at(resumed), at(killed), at(beat), code))
    # the steps it reached, then: registered, its benchmark began (params_done), its benchmark passed (bench_done)
    for when, from_state, to_state in ((registered, "launching", "registered"), (bench, "registered", "params_done"),
                                       (bench_done, "params_done", "bench_done")):
        if when is not None:
            conn.execute("INSERT INTO events (at, kind, uuid, label, from_state, to_state, source) VALUES"
                         " (?, 'transition', ?, ?, ?, ?, 'instance')", (at(when), f"u-{label}", label, from_state, to_state))


def test_boots_are_counted_by_how_they_ended_within_the_window(conn):
    row(conn, "proved", created=120, beat=5, state="running")  # a fresh boot that heartbeats: came up
    row(conn, "stuck", created=90, killed=60)  # killed before any heartbeat: failed
    row(conn, "booting", created=10, state="registered")  # still booting: not counted yet
    row(conn, "resumed-ok", created=300, resumed=50, beat=20, state="running")  # its fresh boot came up, so did the resume
    row(conn, "resumed-taken", created=200, resumed=40, killed=34, beat=100)  # beat before the resume only: failed
    row(conn, "old", created=WINDOW.total_seconds() / 60 + 30, killed=WINDOW.total_seconds() / 60)  # begun before it
    # the policy's own kills: one released on its way (work it no longer needed) says nothing of the market, one
    # whose benchmark ran past LATE_BENCH_S failed, as one reconcile's timeout killed
    row(conn, "released", created=80, killed=70, code="agent", bench=72)
    row(conn, "released-early", created=80, killed=75, code="agent")
    row(conn, "late-bench", created=100, killed=50, code="agent", bench=50 + LATE_BENCH_S / 60 + 1, registered=90)
    odds = read_boot_odds(conn, NOW)
    # every boot that came up passed every step; "stuck" and the two failed at the start, "late-bench" in its
    # benchmark (it reached params_done)
    assert odds == BootOdds(fresh_ok=3, fresh_failed=2, resume_ok=1, resume_failed=1, fresh_failed_past=(1, 1, 0))
    assert odds.fresh == pytest.approx((3 + PRIOR_OK) / (5 + PRIOR_BOOTS))
    assert odds.resume == pytest.approx((1 + PRIOR_OK) / (2 + PRIOR_BOOTS))
    assert "boots came up 3 of 5 fresh, 1 of 2 resumed in 6h" in odds.words()


def test_with_no_boots_yet_the_prior_is_counted(conn):
    assert read_boot_odds(conn, NOW) == BootOdds()
    assert BootOdds().fresh == pytest.approx(PRIOR_OK / PRIOR_BOOTS)
    # the prior's failures are spread over the three risky steps: a boot past them all has none left
    assert [BootOdds().on_its_way(False, state) for state in STEPS] == pytest.approx(
        [PRIOR_OK / (PRIOR_OK + (PRIOR_BOOTS - PRIOR_OK) * left / 3) for left in (3, 2, 1, 0)])


def test_a_boot_is_counted_by_the_boots_that_reached_its_step(conn):
    """Boots that failed at the start say nothing of one past it: of 4 begun, 2 failed to start, 1 stalled in its
    parameter fetch and 1 came up; a boot fetching its parameters counts at 1 of 2, one benchmarking at 1 of 1."""
    row(conn, "no-start-1", created=100, killed=95)
    row(conn, "no-start-2", created=100, killed=95)
    row(conn, "stalled", created=100, registered=95, killed=60)
    row(conn, "up", created=100, registered=95, bench=80, bench_done=65, beat=30, state="running")
    odds = read_boot_odds(conn, NOW)
    assert (odds.fresh_ok, odds.fresh_failed) == (1, 3)
    assert odds.fresh_failed_past == (1, 0, 0)
    assert odds.on_its_way(False, "launching") == pytest.approx(odds.fresh) == pytest.approx(
        (1 + PRIOR_OK) / (4 + PRIOR_BOOTS))
    prior_left = 2 / 3 * (PRIOR_BOOTS - PRIOR_OK)  # past its start: two of the three steps' share of the prior
    assert odds.on_its_way(False, "registered") == pytest.approx((1 + PRIOR_OK) / (2 + PRIOR_OK + prior_left))
    assert odds.on_its_way(False, "bench_done") == pytest.approx(1.0)
    assert odds.on_its_way(True, "registered") == pytest.approx(BootOdds().on_its_way(True, "registered"))


# 4 of 12 fresh boots came up, 1 of 6 resumes; the 8 fresh boots that failed all registered first
FAILING = BootOdds(fresh_ok=4, fresh_failed=8, resume_ok=1, resume_failed=5, fresh_failed_past=(8, 4, 0))


def test_where_boots_fail_a_peak_rents_more_machines_than_where_they_come_up():
    """The same peak: counted at ~0.5 of their rates, boots are rented for more of it, and the reason says why."""
    obs = observation([m("vastctl-a")], demand(60, 300))
    market = [*MARKET, *(offer(i, dph=0.5 + 0.01 * i) for i in range(3, 10))]
    usual = [a for a in plan.plan(obs, ODDS_CONFIG, market, DemandPast(last_window=300), BootOdds(fresh_ok=50))
             if a.kind == "launch"]
    failing = [a for a in plan.plan(obs, ODDS_CONFIG, market, DemandPast(last_window=300), FAILING) if a.kind == "launch"]
    assert len(failing) > len(usual) >= 1
    assert "boots came up 4 of 12 fresh" in failing[0].reason


def test_a_boot_on_its_way_counts_at_its_odds():
    """60/h running and 60/h booting for 115/h coming: enough where boots come up, not where most fail."""
    booting = m("vastctl-b", state="registered")
    booting["state_since"] = clock.to_iso(NOW - timedelta(minutes=5))
    obs = observation([m("vastctl-a"), booting], demand(20, 115))
    came_up = plan.decide(obs, ODDS_CONFIG, MARKET, DemandPast(last_window=115), BootOdds(fresh_ok=50))
    failing = plan.decide(obs, ODDS_CONFIG, MARKET, DemandPast(last_window=115), FAILING)
    assert not [a for a in came_up.actions if a.kind == "launch"]
    assert [a for a in failing.actions if a.kind == "launch"]


def test_a_boot_past_the_steps_that_fail_counts_at_the_odds_of_those_that_got_there():
    """The same fleet and work, boots failing as often, but all at the start: the machine already fetching its
    parameters has passed where they failed, counts at nearly its whole rate, and nothing more is rented."""
    booting = m("vastctl-b", state="registered")
    booting["state_since"] = clock.to_iso(NOW - timedelta(minutes=5))
    obs = observation([m("vastctl-a"), booting], demand(20, 115))
    at_the_start = replace(FAILING, fresh_failed_past=(0, 0, 0))
    decision = plan.decide(obs, ODDS_CONFIG, MARKET, DemandPast(last_window=115), at_the_start)
    assert not [a for a in decision.actions if a.kind == "launch"]
    # the same machine still starting its container counts at the start's odds (4 of 12): more is rented
    starting = dict(booting, state="launching")
    obs = observation([m("vastctl-a"), starting], demand(20, 115))
    assert [a for a in plan.decide(obs, ODDS_CONFIG, MARKET, DemandPast(last_window=115), at_the_start).actions
            if a.kind == "launch"]
