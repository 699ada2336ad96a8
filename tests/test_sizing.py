"""Two-way sizing of the rules policy, table-driven over observations with their demand history.

Wanted capacity drains what is queued and in flight within agent.plan_horizon and keeps up with the
look-ahead's arrivals, capped by target × (1 + headroom); releases while work is queued keep the most
wanted over agent.scale_down_after, with agent.scale_down_margin to spare.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import config as config_module
from vastctl.agent import outbid, rules, sizing, valuation
from vastctl.facts.demand import Demand
from vastctl.observe import Observation
from vastctl.providers.base import Offer

NOW = datetime(2031, 3, 3, 12, 0, tzinfo=timezone.utc)
SETTINGS = {"target_proofs_per_hour": 300.0, "min_bench_rate": 40.0, "max_instances": 20,
            "max_hourly_spend": 20.0, "max_dph": 1.0}
# sized to at most 345 proofs/h; 30 min to drain the queue; the look-ahead counts the coming hour
CONFIG = config_module.from_mapping({
    "agent": {"headroom": 0.15, "scale_down_after": "30m", "plan_horizon": "30m", "max_wait": "45m",
              "scale_down_margin": 0.2, "max_releases_per_step": 1, "max_actions_per_step": 5,
              "replace_factor": 1.5, "replace_after": "2h"},
    "demand": {"lookahead_window": "1h", "stale_after": "20m"}})


def sample(queued, lookahead=0, in_flight=None, ok=True, minutes_ago=0):
    return {"at": NOW - timedelta(minutes=minutes_ago), "ok": ok, "queued": queued if ok else None,
            "in_flight": in_flight, "lookahead": lookahead if ok else None, "proofs_per_hour": None}


def steady(queued, lookahead=0, in_flight=None):
    """A sample every minute over the last 30 minutes, all the same."""
    return [sample(queued, lookahead, in_flight, minutes_ago=age) for age in range(30, -1, -1)]


def demand_of(history):
    last = history[-1]
    if not last["ok"]:
        return Demand(queued=None, proofs_per_hour=None, at=last["at"], age_s=0, source="report", known=False,
                      error="the demand command failed")
    return Demand(queued=last["queued"], proofs_per_hour=None, at=last["at"], age_s=0, source="report", known=True,
                  in_flight=last["in_flight"], lookahead=last["lookahead"])


def m(label, state="running", rate=60.0, dph=0.5, running_for_h=3.0):
    return {"uuid": f"u-{label}", "label": label, "state": state, "expected_rate": rate, "dph": dph,
            "vast_id": 1000 + sum(map(ord, label)), "vast_status": "running", "vast_missing": 0,
            "gpu_name": "RTX 4090", "resumes": 0, "billed_per_hour": dph,
            "state_since": (NOW - timedelta(hours=running_for_h)).strftime("%Y-%m-%dT%H:%M:%SZ")}


def stopped(label, dph):
    """Stopped 3 h ago; its disk bills $0.01/h (far from what a fresh boot costs: not retired)."""
    return dict(m(label, state="stopped", dph=dph), billed_per_hour=0.01)


def fleet(n, **kw):
    return [m(f"vastctl-{chr(ord('a') + i)}", **kw) for i in range(n)]


def observation(machines, history, **settings):
    live = [x for x in machines if x["state"] not in ("stopped", "killed")]
    good = [x for x in history if x["ok"]]
    return Observation(now=NOW, settings={**SETTINGS, **settings}, demand=demand_of(history), machines=list(machines),
                       capacity=sum(x["expected_rate"] for x in machines if x["state"] == "running"),
                       pending_capacity=sum(x["expected_rate"] for x in machines if x["state"] == "params_done"),
                       spend_per_hour=sum(x["dph"] for x in live), events=[], last_actions=[],
                       model_rates={"RTX 4090": 60.0}, demand_history=list(history),
                       last_known_demand=good[-1] if good else None)


MARKET = [Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45),
          Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.40)]
ALTERNATING = [sample(10 if age % 2 else 150, 120, minutes_ago=age) for age in range(30, -1, -1)]

CASES = [
    # name, machines, history, offers, expected (kind, label or offer id)
    ("busy queue with spare capacity: release one machine a step, the dearest per proof first",
     fleet(5) + [m("vastctl-x", dph=0.6)], steady(20, lookahead=120), MARKET, [("stop", "vastctl-x")]),
    ("busy queue, what is left would not keep the margin: hold",
     fleet(3), steady(20, lookahead=120), MARKET, []),  # wanted 160; 120 left < 160 × 1.2
    ("growing queue: grow to drain it within the horizon",
     fleet(2), [sample(10, 60, minutes_ago=20), sample(40, 60, minutes_ago=10), sample(60, 60)], MARKET,
     [("launch", 2)]),  # 120/h + 60/h wanted, 120 running: one more
    ("a spike 10 minutes ago: never shrink within agent.scale_down_after of it",
     fleet(6), [sample(10, 60, minutes_ago=age) for age in range(30, 11, -1)] + [sample(400, 60, minutes_ago=10)]
     + [sample(10, 60, minutes_ago=age) for age in range(9, -1, -1)], MARKET, []),
    ("a spike now: grow, release nothing",
     fleet(3), steady(10, lookahead=60)[:-1] + [sample(300, 60)], MARKET, [("launch", 2), ("launch", 1)]),
    ("unknown demand: hold, whatever the queue said before",
     fleet(8), steady(5, lookahead=10)[:-1] + [sample(0, ok=False)], MARKET, []),
    ("unknown demand after a good sample: sized to what that sample needed (70/h), not the ceiling (345/h)",
     fleet(2), steady(5, lookahead=60)[:-1] + [sample(0, ok=False)], MARKET, []),
    ("unknown demand, a machine lost meanwhile: replaced up to what the last good sample needed (160/h)",
     fleet(1) + [m("vastctl-x", state="killed")], steady(30, lookahead=100)[:-1] + [sample(0, ok=False)], MARKET,
     [("launch", 2), ("launch", 1)]),
    # whole machines: a shortfall under half the smallest machine to hand is rounded down, not up
    ("short by 20/h, under half the smallest machine on offer (60/h): rounded down, nothing rented",
     fleet(2), steady(10, lookahead=120), MARKET, []),
    ("short by 20/h while 60 proofs wait (30 min of work at 120/h, over half the 30m horizon): rented",
     fleet(2), steady(60, lookahead=20), MARKET, [("launch", 2)]),
    ("short by 30/h, half the smallest machine on offer: rented",
     fleet(2), steady(15, lookahead=120), MARKET, [("launch", 2)]),
    ("no capacity at all: any shortfall is rented (never rounded down to nothing)",
     [], steady(0, lookahead=20), MARKET, [("launch", 2)]),
    ("a stopped 30/h machine is the smallest machine to hand: short by 20/h, it is resumed",
     fleet(2) + [dict(stopped("vastctl-s", dph=0.2), expected_rate=30.0)], steady(10, lookahead=120), MARKET,
     [("start", "vastctl-s")]),
    ("a failed sample within agent.scale_down_after: hold",
     fleet(8), steady(5, lookahead=10)[:15] + [sample(0, ok=False, minutes_ago=15)] + steady(5, lookahead=10)[16:],
     MARKET, []),
    ("history shorter than agent.scale_down_after: hold (the demand before it is not known)",
     fleet(8), [sample(5, 10, minutes_ago=age) for age in range(10, -1, -1)], MARKET, []),
    ("the source quiet for 16 minutes (within demand.stale_after 20m, over half the 30m window): hold",
     fleet(8), [sample(5, 10, minutes_ago=age) for age in range(40, 15, -1)], MARKET, []),
    ("the same window sampled every 10 minutes: spare capacity goes",
     fleet(8), [sample(5, 10, minutes_ago=age) for age in range(40, -1, -10)], MARKET, [("stop", "vastctl-a")]),
    ("the incident: 59 queued, no active flag, a dear machine among them: nothing released (its replacement first)",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c", rate=20, dph=0.9)], steady(59, lookahead=None), MARKET,
     [("launch", 2)]),
    ("the incident without offers: nothing released",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c", rate=20, dph=0.9)], steady(59, lookahead=None), [], []),
    ("alternating queue (10, 150, 10, …): sized to its peak, nothing released on the low minute",
     fleet(6), ALTERNATING, MARKET, []),
    ("a dear machine with its replacement still booting: not released (make before break)",
     fleet(2) + [m("vastctl-x", dph=1.0), m("vastctl-r", state="params_done", dph=0.4, running_for_h=0.2)],
     steady(30, lookahead=100), MARKET, []),
    ("the replacement is running: the dear machine is destroyed, the rest covers what is wanted",
     fleet(2) + [m("vastctl-x", dph=1.0), m("vastctl-r", dph=0.4, running_for_h=0.1)],
     steady(30, lookahead=100), MARKET, [("destroy", "vastctl-x")]),
    ("a dear machine run past agent.replace_after, a host 1.5× cheaper per proof offered: launch it first",
     fleet(2) + [m("vastctl-x", dph=1.0)], steady(30, lookahead=100), MARKET, [("launch", 2)]),
    ("a dear machine run for less than agent.replace_after: kept",
     fleet(2) + [m("vastctl-x", dph=1.0, running_for_h=1.0)], steady(30, lookahead=100), MARKET, []),
    ("offers no cheaper than 1.5× per proof: no replacement",
     fleet(3, dph=0.55), steady(30, lookahead=100), MARKET, []),
    # a benchmark past LATE_BENCH_S is likely stuck (reconcile kills it at timeouts.params_done): launch around it
    ("a machine benchmarking for 40 minutes is not counted as capacity on its way: its replacement is launched",
     fleet(2) + [m("vastctl-b", state="params_done", running_for_h=40 / 60)], steady(30, lookahead=120), MARKET,
     [("launch", 2)]),
    ("a benchmark 40 minutes long and the fleet covers what is wanted without it: destroyed (it only bills)",
     fleet(3) + [m("vastctl-l", state="params_done", running_for_h=40 / 60)], steady(30, lookahead=120), MARKET,
     [("destroy", "vastctl-l")]),
    ("a late benchmark whose replacement boots and covers what is wanted: destroyed",
     fleet(2) + [m("vastctl-l", state="params_done", running_for_h=40 / 60),
                 m("vastctl-r", state="params_done", running_for_h=5 / 60)], steady(30, lookahead=120), MARKET,
     [("destroy", "vastctl-l")]),
    ("a late benchmark while demand is unknown: kept (nothing is released on no evidence)",
     fleet(3) + [m("vastctl-l", state="params_done", running_for_h=40 / 60)],
     steady(30, lookahead=120)[:-1] + [sample(0, ok=False)], MARKET, []),
    ("a machine benchmarking for 10 minutes is on its way: no second launch for it",
     fleet(2) + [m("vastctl-b", state="params_done", running_for_h=10 / 60)], steady(30, lookahead=120), MARKET, []),
    # resume or rent: a stopped machine clearly dearer per proof than an offer is not resumed
    ("a stopped machine as cheap per proof as the offers: resumed before anything is rented",
     fleet(2) + [stopped("vastctl-s", dph=0.45)], steady(30, lookahead=120), MARKET,
     [("start", "vastctl-s")]),
    ("a stopped machine agent.replace_factor × dearer per proof than an offer: the offer is rented instead",
     fleet(2) + [stopped("vastctl-s", dph=0.9)], steady(30, lookahead=120), MARKET, [("launch", 2)]),
    ("a dear stopped machine and no offer: resumed (capacity first)",
     fleet(2) + [stopped("vastctl-s", dph=0.9)], steady(30, lookahead=120), [], [("start", "vastctl-s")]),
]


@pytest.mark.parametrize("name, machines, history, offers, expected", CASES, ids=[c[0] for c in CASES])
def test_sizing(name, machines, history, offers, expected):
    obs = observation(machines, history)
    actions = rules.plan(obs, CONFIG, offers)
    assert [(a.kind, a.offer_id if a.kind == "launch" else a.label) for a in actions] == expected
    assert all(a.actor == "agent" and a.reason for a in actions)


def test_wanted_drains_the_queue_within_the_horizon_and_keeps_up_with_arrivals():
    obs = observation(fleet(1), steady(40, lookahead=90, in_flight=10))
    assert sizing.wanted_capacity(obs, CONFIG) == pytest.approx(50 / 0.5 + 90)  # 100 to drain + 90 arriving
    capped = observation(fleet(1), steady(400, lookahead=300))
    assert sizing.wanted_capacity(capped, CONFIG) == pytest.approx(345)  # target 300 × 1.15


def test_the_release_of_a_late_benchmark_says_why():
    late = m("vastctl-l", state="params_done", running_for_h=40 / 60)
    (action,) = rules.plan(observation(fleet(3) + [late], steady(30, lookahead=120)), CONFIG, MARKET)
    assert action.kind == "destroy" and action.reason == (
        "benchmarking for 40m (a healthy benchmark takes 10-16m; past 25m it is likely stuck), and the fleet covers"
        " the 180 proofs/h wanted without it: released")


def test_a_rounded_down_shortfall_holds_naming_it_and_the_smallest_machine():
    obs = observation(fleet(2), steady(10, lookahead=120))
    assert rules.plan(obs, CONFIG, MARKET) == []
    why = rules.hold_reason(obs, CONFIG, MARKET)
    assert why.startswith("work for the fleet (10 queued, 120 PoRep coming): capacity 120 + 0 booting is 20 short"
                          " of 140 wanted"), why
    assert "under 50% of the smallest machine to hand (60/h): rounded down" in why
    assert sizing.rounded_down(obs, CONFIG, valuation.rank_offers(MARKET, obs, CONFIG)) == 60.0
    grown = observation(fleet(2), steady(15, lookahead=120))  # a growing queue raises wanted past half a machine
    assert sizing.rounded_down(grown, CONFIG, valuation.rank_offers(MARKET, grown, CONFIG)) is None


def test_unknown_demand_is_sized_to_the_newest_good_sample_and_says_so():
    history = steady(30, lookahead=100)[:-1] + [sample(0, ok=False)]
    obs = observation(fleet(1), history)
    assert sizing.wanted_capacity(obs, CONFIG) == pytest.approx(30 / 0.5 + 100)
    launch = rules.plan(obs, CONFIG, MARKET)[0]
    assert launch.reason.startswith("demand unknown (held to its newest good sample, 1m old: 30 queued, 0 in flight,"
                                    " 100 coming): capacity 60 of 160 proofs/h wanted"), launch.reason
    never = observation(fleet(1), [sample(0, ok=False)])
    assert sizing.wanted_capacity(never, CONFIG) == pytest.approx(345)  # never known: the ceiling
    assert rules.plan(never, CONFIG, MARKET)[0].reason.startswith(
        "demand unknown, never known (sized as if work were queued): capacity 60 of 345 proofs/h wanted (target")


def test_the_observation_carries_the_newest_good_demand_sample_whatever_its_age(tmp_path):
    from vastctl.facts import demand as demand_module
    from vastctl.observe import observe
    from vastctl.state import db

    config = config_module.from_mapping({})
    config.db = str(tmp_path / "state.db")
    conn = db.connect(config.db_path, now=NOW, create=True)
    assert observe(conn, config, now=NOW).last_known_demand is None
    demand_module.report(conn, 7, 40.0, now=NOW - timedelta(hours=5), lookahead=3, in_flight=2)
    demand_module.report(conn, 9, 40.0, now=NOW - timedelta(hours=3), lookahead=4)
    for age in (2, 1, 0):
        demand_module.record(conn, source="command", now=NOW - timedelta(hours=age), error="timed out after 20s")
    obs = observe(conn, config, now=NOW)
    assert not obs.demand.known
    last = obs.last_known_demand
    assert last is not None and (last["at"], last["queued"], last["lookahead"]) == (NOW - timedelta(hours=3), 9, 4)
    assert obs.to_prompt()["last_known_demand"] == {"at": "2031-03-03T09:00:00Z", "queued": 9, "in_flight": None,
                                                    "lookahead": 4, "proofs_per_hour": 40.0}  # the model sees it
    demand_module.report(conn, 1, 40.0, now=NOW)
    assert "last_known_demand" not in observe(conn, config, now=NOW).to_prompt()  # known again: the demand says it
    conn.close()


def test_an_offer_on_a_host_we_benchmarked_is_expected_to_prove_what_it_proved():
    """A slow host of a fast model (a weak CPU, shared RAM) benchmarked at 30/h is ranked at 30/h when offered
    again, not at its model's 60/h: the dearer offer on an unknown host is cheaper per expected proof."""
    obs = observation(fleet(1), steady(30, lookahead=60))
    assert [(offer.id, rate) for offer, rate in valuation.rank_offers(MARKET, obs, CONFIG)] == [(2, 60.0), (1, 60.0)]
    obs.host_rates = {20: 30.0}
    assert [(offer.id, rate) for offer, rate in valuation.rank_offers(MARKET, obs, CONFIG)] == [(1, 60.0), (2, 30.0)]


def test_the_observation_carries_the_newest_bench_rate_of_each_host(tmp_path):
    from vastctl.observe import observe
    from vastctl.state import db, lifecycle
    from vastctl.state.lifecycle import State

    config = config_module.from_mapping({})
    config.db = str(tmp_path / "state.db")
    conn = db.connect(config.db_path, now=NOW, create=True)
    for age, label, machine_id, rate in ((3, "vastctl-a", 77, 80.0), (2, "vastctl-b", 77, 31.0),
                                         (1, "vastctl-c", 88, 75.0), (0, "vastctl-d", 99, None)):
        lifecycle.create(conn, uuid=f"u-{label}", label=label, state=State.LAUNCHING, reason="t", source="operator",
                         now=NOW - timedelta(hours=age), fields={"gpu_name": "RTX 4090", "machine_id": machine_id})
        conn.execute("UPDATE instances SET bench_rate = ? WHERE label = ?", (rate, label))
    assert observe(conn, config, now=NOW).host_rates == {77: 31.0, 88: 75.0}
    conn.close()


def test_a_source_silent_on_lookahead_keeps_up_with_the_rate_it_reports():
    demand = Demand(queued=10, proofs_per_hour=70.0, at=NOW, age_s=0, source="command", known=True)
    obs = Observation(now=NOW, settings=SETTINGS, demand=demand, machines=[], capacity=0, pending_capacity=0,
                      spend_per_hour=0, events=[], last_actions=[])
    assert sizing.wanted_capacity(obs, CONFIG) == pytest.approx(20 + 70)


def test_the_release_reason_names_what_is_kept_and_why():
    (action,) = rules.plan(observation(fleet(6), steady(20, lookahead=120)), CONFIG, MARKET)
    assert action.kind == "stop"
    assert "the rest (300 proofs/h) covers the 160 wanted over the last 30m with 20% to spare" in action.reason


def test_releases_per_step_are_bounded():
    two = config_module.from_mapping({"agent": {"scale_down_after": "30m", "max_releases_per_step": 2},
                                      "demand": {"lookahead_window": "1h"}})
    actions = rules.plan(observation(fleet(10), steady(5, lookahead=60)), two, MARKET)
    assert [a.kind for a in actions] == ["stop", "stop"]


def test_hysteresis_holds_over_an_alternating_queue_step_by_step():
    """Replaying an alternating queue minute by minute, applying each plan: the fleet grows once and never thrashes."""
    machines = fleet(2)
    history: list[dict] = []
    kinds = []
    for minute in range(90):
        queued = 10 if minute % 2 else 150
        history = [dict(s, at=s["at"] - timedelta(minutes=1)) for s in history if s["at"] > NOW - timedelta(minutes=31)]
        history.append(sample(queued, 120))
        actions = rules.plan(observation(machines, history), CONFIG, MARKET)
        for action in actions:
            kinds.append(action.kind)
            if action.kind == "launch":
                machines.append(m(f"vastctl-n{len(machines)}", dph=action.dph))
            else:
                machines = [x for x in machines if x["label"] != action.label]
    assert "stop" not in kinds and "destroy" not in kinds
    assert 1 <= kinds.count("launch") <= 4


def test_stopped_past_what_a_fresh_boot_costs_is_destroyed():
    old = dict(m("vastctl-s", state="stopped", dph=0.5, running_for_h=10.0), billed_per_hour=0.03)
    young = dict(m("vastctl-t", state="stopped", dph=0.5, running_for_h=5.0), billed_per_hour=0.03)
    actions = rules.plan(observation([old, young] + fleet(4), steady(20, lookahead=120)), CONFIG, MARKET)
    # 10 h × $0.03 = $0.30 ≥ 0.5 h × $0.50 of a new boot; 5 h × $0.03 = $0.15 is not
    assert [(a.kind, a.label) for a in actions][:1] == [("destroy", "vastctl-s")]
    assert "vastctl-t" not in [a.label for a in actions]


@pytest.mark.parametrize("seed", range(40))
def test_releases_never_drop_running_capacity_below_what_is_wanted(seed):
    rng = random.Random(seed)
    machines = [m(f"vastctl-{i}", rate=rng.choice((40.0, 60.0, 90.0)), dph=rng.uniform(0.2, 1.0),
                  state=rng.choice(("running", "running", "running", "params_done")),
                  running_for_h=rng.uniform(0, 5)) for i in range(rng.randint(1, 12))]
    history = [sample(rng.randint(0, 150), rng.randint(0, 300), minutes_ago=age) for age in range(30, -1, -1)]
    obs = observation(machines, history)
    actions = rules.plan(obs, CONFIG, MARKET)
    released = {a.label for a in actions if a.kind in ("stop", "destroy")}
    state = {x["label"]: x["state"] for x in machines}
    left = sum(x["expected_rate"] for x in machines if x["state"] == "running" and x["label"] not in released)
    if any(state[label] == "running" for label in released):
        assert left >= sizing.wanted_capacity(obs, CONFIG) - 1e-9
        assert left >= sizing.held_capacity(obs, CONFIG) - 1e-9
    for label in (label for label in released if state[label] != "running"):  # a late benchmark, given up on
        assert sizing.late(next(x for x in machines if x["label"] == label), NOW)
        assert sizing.counted_capacity(obs) >= sizing.wanted_capacity(obs, CONFIG) - 1e-9  # covered without it


def test_one_fresh_report_is_no_evidence_over_the_window_so_nothing_is_released():
    """The incident as the CLI meets it: a first report of 59 queued, the fleet far over a low target."""
    machines = fleet(3)
    obs = observation(machines, [sample(59, None, minutes_ago=0)], target_proofs_per_hour=20.0)
    assert sizing.held_capacity(obs, CONFIG) is None
    assert rules.plan(obs, CONFIG, MARKET) == []
    covered = observation(machines, steady(59, lookahead=None), target_proofs_per_hour=20.0)
    assert [a.kind for a in rules.plan(covered, CONFIG, MARKET)] == ["stop"]  # 15 min of it: spare capacity goes


def test_the_observation_carries_the_demand_of_the_window_and_the_sample_in_force_at_its_start(tmp_path):
    from vastctl.facts import demand as demand_module
    from vastctl.observe import observe
    from vastctl.state import db

    config = config_module.from_mapping({"agent": {"scale_down_after": "30m"}})
    config.db = str(tmp_path / "state.db")
    conn = db.connect(config.db_path, now=NOW, create=True)
    for age, queued in ((90, 1), (45, 2), (31, 3), (20, 4), (0, 5)):
        demand_module.report(conn, queued, None, now=NOW - timedelta(minutes=age), lookahead=queued * 10)
    history = observe(conn, config, now=NOW).demand_history
    assert [(s["queued"], s["lookahead"]) for s in history] == [(3, 30), (4, 40), (5, 50)]
    assert history[0]["at"] == NOW - timedelta(minutes=31) and all(s["ok"] for s in history)
    conn.close()


# --- outbid machines: waited for, rebid or released as the costs say --------------------------------


def outbid_m(label, bid, paused_min, ask=0.5, **kw):
    """An interruptible machine vast stopped for a higher bid `paused_min` ago while its row is running."""
    machine = m(label, dph=bid, **kw)
    machine.update(bid=bid, ask_dph=ask, vast_status="stopped",
                   outbid_since=(NOW - timedelta(minutes=paused_min)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return machine


OUTBID_CASES = [
    # name, bid, paused minutes, its offer's on-demand price, max_dph, expected (kind, new bid)
    ("outbid 5 minutes: waited for (no action)", 0.30, 5, 0.5, 1.0, []),
    ("outbid past agent.outbid_wait: the bid rises 25%", 0.30, 12, 0.5, 1.0, [("rebid", 0.375)]),
    ("a rise past its on-demand price is capped there", 0.44, 12, 0.5, 1.0, [("rebid", 0.5)]),
    ("a rise past max_dph is capped there", 0.44, 12, 0.8, 0.46, [("rebid", 0.46)]),
    ("already bidding its cap and still outbid: released", 0.50, 12, 0.5, 1.0, [("destroy", None)]),
    ("already at max_dph and still outbid: released", 0.46, 30, 0.8, 0.46, [("destroy", None)]),
]


@pytest.mark.parametrize("name, bid, paused, ask, max_dph, expected", OUTBID_CASES, ids=[c[0] for c in OUTBID_CASES])
def test_an_outbid_machine_is_waited_for_rebid_or_released(name, bid, paused, ask, max_dph, expected):
    config = config_module.from_mapping({"agent": {"outbid_wait": "10m", "headroom": 0.15, "plan_horizon": "30m",
                                                   "scale_down_after": "30m", "scale_down_margin": 0.2}})
    machines = fleet(3) + [outbid_m("vastctl-z", bid, paused, ask=ask)]
    obs = observation(machines, steady(30, lookahead=100), max_dph=max_dph)
    actions = [a for a in rules.plan(obs, config, []) if a.label == "vastctl-z"]
    assert [(a.kind, a.dph if a.kind == "rebid" else None) for a in actions] == [
        (kind, pytest.approx(bid) if bid is not None else None) for kind, bid in expected]
    assert all(a.reason and a.actor == "agent" for a in actions)
    for action in actions:
        if action.kind == "rebid":
            assert action.dph <= max_dph and action.dph <= ask


def test_an_outbid_machine_is_not_counted_so_the_fleet_grows_around_it():
    machines = fleet(2) + [outbid_m("vastctl-z", 0.3, 5)]
    obs = observation(machines, steady(30, lookahead=100))  # wanted 160: 120 proving, the outbid one not counted
    actions = rules.plan(obs, CONFIG, MARKET)
    assert [(a.kind, a.offer_id) for a in actions] == [("launch", 2)]
    assert outbid.outbid_choice(machines[-1], NOW, 1.0, CONFIG)[0] == "wait"


def test_a_machine_rented_on_demand_that_vast_lists_stopped_is_no_outbid():
    machine = m("vastctl-z")
    machine.update(vast_status="stopped", bid=None)
    assert outbid.outbid_since(machine) is None


def test_a_launch_that_will_bid_picks_the_offer_cheapest_at_its_bid():
    offers = [Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.40, raw={"min_bid": 0.36}),
              Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, raw={"min_bid": 0.20})]
    obs = observation(fleet(2), [sample(60, 60, minutes_ago=20), sample(60, 60)])
    chosen = {}
    for rental in ("on-demand", "interruptible"):
        config = config_module.from_mapping({"agent": {"plan_horizon": "30m"}, "launch": {"rental": rental}})
        chosen[rental] = [a.offer_id for a in rules.plan(obs, config, offers) if a.kind == "launch"][:1]
    assert chosen == {"on-demand": [1], "interruptible": [2]}


def test_calls_the_proof_router_holds_launch_an_empty_fleet_at_once_and_hold_a_fleet_under_them():
    import dataclasses

    empty = steady(0)
    obs = observation([], empty)
    assert rules.plan(obs, CONFIG, MARKET) == []  # nothing waits: nothing rented
    held = dataclasses.replace(obs, demand=dataclasses.replace(obs.demand, held=10))
    assert sizing.wanted_capacity(held, CONFIG) == pytest.approx(10 / 0.5)
    (launch,) = rules.plan(held, CONFIG, MARKET)
    assert launch.kind == "launch"
    assert launch.reason.startswith("work for the fleet (0 queued, 10 held at the proof router, 0 PoRep coming):"
                                    " capacity 0 of 20 proofs/h wanted"), launch.reason
    # a running fleet is not released while calls are held, even when the source says nothing waits
    running = observation(fleet(2), empty)
    running = dataclasses.replace(running, demand=dataclasses.replace(running.demand, empty_since=NOW - timedelta(hours=1)))
    (idle,) = rules.plan(running, CONFIG, MARKET)
    assert idle.reason.startswith("no work queued, in flight or coming for 60m")
    # three held calls: sized to them (one machine kept), never released as idle
    kept = dataclasses.replace(running, demand=dataclasses.replace(running.demand, held=3))
    (spare,) = rules.plan(kept, CONFIG, MARKET)
    assert spare.kind == "stop" and spare.reason.startswith("work for the fleet (0 queued, 3 held at the proof router")
    one = dataclasses.replace(kept, machines=kept.machines[:1], capacity=60.0)
    assert [a for a in rules.plan(one, CONFIG, MARKET) if a.kind in ("stop", "destroy")] == []
    # while demand is unknown, the fleet is sized to the held calls too, when they need more than the last sample
    unknown = observation([], steady(0)[:-1] + [sample(0, ok=False)])
    unknown_held = dataclasses.replace(unknown, demand=dataclasses.replace(unknown.demand, held=30))
    assert sizing.wanted_capacity(unknown_held, CONFIG) == pytest.approx(30 / 0.5)
    assert "30 calls held at the proof router" in rules.plan(unknown_held, CONFIG, MARKET)[0].reason


# --- outbid.py as functions of one machine: since when, and what it gets ---------------------------------------


def paused_row(bid=0.3, minutes=12, ask=0.5, **fields):
    return {"bid": bid, "state": "running", "vast_status": "stopped", "ask_dph": ask,
            "outbid_since": (NOW - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ"), **fields}


OUTBID_WAIT = config_module.from_mapping({"agent": {"outbid_wait": "10m"}})


def test_outbid_since_is_only_for_a_bidding_running_row_vast_stopped():
    assert outbid.outbid_since(paused_row(minutes=12)) == NOW - timedelta(minutes=12)
    seen = paused_row(outbid_since=None, vast_seen_at="2031-03-03T11:00:00Z")  # not stamped yet: since vast said so
    assert outbid.outbid_since(seen) == datetime(2031, 3, 3, 11, 0, tzinfo=timezone.utc)
    assert outbid.outbid_since(paused_row(outbid_since=None)) is None
    assert outbid.outbid_since(paused_row(bid=None)) is None  # on demand
    assert outbid.outbid_since(paused_row(state="stopped")) is None  # we stopped it
    assert outbid.outbid_since(paused_row(vast_status="running")) is None  # running again


def test_an_outbid_machine_waits_then_rebids_by_a_quarter_then_is_released_at_its_cap():
    assert outbid.outbid_choice(paused_row(minutes=5), NOW, 1.0, OUTBID_WAIT) == (
        "wait", None, "outbid for 5m at $0.3/h: waited for (agent.outbid_wait 10m; disk kept)")
    assert outbid.outbid_choice(paused_row(minutes=10), NOW, 1.0, OUTBID_WAIT) == (
        "rebid", 0.375, "outbid for 10m at $0.3/h: bid raised to $0.375/h (cap $0.5/h: max_dph and its on-demand price)")
    assert outbid.outbid_choice(paused_row(bid=0.5, minutes=12), NOW, 1.0, OUTBID_WAIT) == (
        "release", None, "outbid for 12m at $0.5/h, already bidding its cap $0.5/h: released (a fresh machine costs"
                         " 0.5h of boot; waiting on costs the capacity)")


def test_a_rebid_is_capped_by_max_dph_and_the_on_demand_price_and_rises_at_least_a_tenth_of_a_cent():
    choice = outbid.outbid_choice
    assert choice(paused_row(bid=0.45), NOW, 1.0, OUTBID_WAIT)[:2] == ("rebid", 0.5)  # 0.5625 past its ask
    assert choice(paused_row(bid=0.45, ask=0.8), NOW, 0.46, OUTBID_WAIT)[:2] == ("rebid", 0.46)  # past max_dph
    assert choice(paused_row(bid=0.002), NOW, 1.0, OUTBID_WAIT)[:2] == ("rebid", 0.003)  # 0.0025 < +0.001
    assert choice(paused_row(bid=0.12345), NOW, 1.0, OUTBID_WAIT)[:2] == ("rebid", 0.1543)  # rounded to 4 places
    # no ask known (a stored price is a price: validate.price where it entered, migration 23 before): max_dph caps
    assert choice(paused_row(bid=0.8, ask=None), NOW, 0.9, OUTBID_WAIT)[:2] == ("rebid", 0.9)
    assert choice(paused_row(bid=0.8, ask=0.7), NOW, 0.9, OUTBID_WAIT)[0] == "release"  # over its ask already


def test_a_machine_not_outbid_or_dated_later_counts_as_paused_for_no_time():
    not_paused = paused_row(vast_status="running")
    assert outbid.outbid_choice(not_paused, NOW, 1.0, OUTBID_WAIT)[:2] == ("wait", None)
    later = paused_row(minutes=-30)  # a clock ahead of ours
    assert outbid.outbid_choice(later, NOW, 1.0, OUTBID_WAIT)[2].startswith("outbid for 0m at $0.3/h: waited for")
    unpriced = paused_row(bid=None)
    assert outbid.outbid_choice(unpriced, NOW, 1.0, OUTBID_WAIT)[2].startswith("outbid for 0m at $0/h")


# --- sizing's small rules, each as a function ------------------------------------------------------------------


def test_what_one_sample_needs_drains_the_backlog_within_the_horizon_and_keeps_up_with_arrivals():
    # CONFIG: plan_horizon 30m, lookahead_window 1h
    assert sizing.needed({"queued": 30, "in_flight": 10, "lookahead": 12}, CONFIG) == 40 / 0.5 + 12
    assert sizing.needed({"queued": 30, "lookahead": None, "proofs_per_hour": 20.0}, CONFIG) == 60 + 20
    assert sizing.needed({"queued": None, "in_flight": None, "lookahead": 0, "proofs_per_hour": 20.0}, CONFIG) == 0
    no_window = config_module.from_mapping({"agent": {"plan_horizon": "30m"}, "demand": {"lookahead_window": 0}})
    assert sizing.needed({"queued": 0, "lookahead": 12, "proofs_per_hour": 5.0}, no_window) == 5.0


def test_the_horizon_is_plan_horizon_never_past_max_wait_and_at_least_a_minute():
    assert sizing.horizon_hours(CONFIG) == 0.5
    assert sizing.horizon_hours(config_module.from_mapping({"agent": {"plan_horizon": "1h", "max_wait": "20m"}})) == (
        pytest.approx(1 / 3))
    assert sizing.horizon_hours(config_module.from_mapping({"agent": {"plan_horizon": "10s", "max_wait": "45m"}})) == (
        pytest.approx(1 / 60))


def test_the_ceiling_is_the_target_plus_headroom():
    obs = observation([], [sample(0)], target_proofs_per_hour=200.0)
    assert sizing.ceiling(obs, CONFIG) == pytest.approx(230.0)


@pytest.mark.parametrize("fields, dead", [({}, False), ({"vast_missing": 1}, True), ({"vast_status": "exited"}, True),
                                          ({"vast_status": "offline"}, True), ({"vast_status": "unknown"}, True),
                                          ({"vast_status": "stopped"}, True),
                                          ({"vast_status": "stopped", "state": "stopped"}, False),
                                          ({"vast_status": "loading", "state": "params_done"}, False)])
def test_vast_dead_is_listed_dead_missing_or_stopped_under_a_running_row(fields, dead):
    assert sizing.vast_dead({**m("vastctl-a"), **fields}) is dead


def test_a_benchmark_is_late_past_25_minutes_and_then_not_on_its_way():
    booting = {**m("vastctl-a", state="params_done"), "state_since": (NOW - timedelta(minutes=25)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")}
    assert not sizing.late(booting, NOW) and sizing.on_its_way(booting, NOW)
    assert sizing.late(booting, NOW + timedelta(seconds=1)) and not sizing.on_its_way(booting, NOW + timedelta(seconds=1))
    assert not sizing.late({**booting, "state": "launching"}, NOW + timedelta(hours=1))  # only a benchmark is late
    assert not sizing.on_its_way({**booting, "vast_status": "exited"}, NOW)
    assert not sizing.on_its_way(m("vastctl-b"), NOW)  # running: counted, not on its way


def test_time_in_state_is_zero_when_the_row_does_not_say_or_is_ahead_of_the_clock():
    assert sizing.in_state_for({"state_since": "2031-03-03T11:00:00Z"}, NOW) == 3600.0
    assert sizing.in_state_for({"state_since": None}, NOW) == 0.0
    assert sizing.in_state_for({"state_since": "2031-03-03T13:00:00Z"}, NOW) == 0.0


def test_counted_capacity_leaves_out_the_dead_and_the_late():
    late_boot = {**m("vastctl-c", state="params_done", rate=50.0),
                 "state_since": (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    machines = [m("vastctl-a", rate=60.0), {**m("vastctl-b", rate=70.0), "vast_missing": 1},
                {**m("vastctl-d", state="launching", rate=40.0), "state_since": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")},
                late_boot, m("vastctl-e", state="stopped", rate=90.0)]
    assert sizing.counted_capacity(observation(machines, [sample(0)])) == 100.0


def test_resumable_machines_are_stopped_never_resumed_listed_and_best_per_dollar_first():
    cheap, dear = stopped("vastctl-a", 0.3), stopped("vastctl-b", 0.6)
    resumed = {**stopped("vastctl-c", 0.2), "resumes": 1}
    unlisted = {**stopped("vastctl-d", 0.2), "vast_id": None}
    missing = {**stopped("vastctl-e", 0.2), "vast_missing": 1}
    obs = observation([dear, resumed, cheap, unlisted, missing, m("vastctl-f")], [sample(0)])
    assert [x["label"] for x in sizing.resumable(obs)] == ["vastctl-a", "vastctl-b"]


def test_cooled_down_once_the_work_ran_out_scale_down_after_ago():
    import dataclasses

    obs = observation([], [sample(0)])
    for minutes, cooled in ((None, False), (29, False), (30, True), (90, True)):
        since = None if minutes is None else NOW - timedelta(minutes=minutes)
        obs.demand = dataclasses.replace(obs.demand, empty_since=since)
        assert sizing.cooled_down(obs, CONFIG) is cooled, minutes


def test_a_one_second_outbid_wait_rebids_whatever_has_paused_a_second():
    one_second = config_module.from_mapping({"agent": {"outbid_wait": "1s"}})
    assert outbid.outbid_choice(paused_row(minutes=-30), NOW, 1.0, one_second)[0] == "wait"  # dated later: 0 s
    assert outbid.outbid_choice(paused_row(vast_status="running"), NOW, 1.0, one_second)[0] == "wait"  # not paused
    assert outbid.outbid_choice(paused_row(minutes=0), NOW, 1.0, one_second)[0] == "wait"
    assert outbid.outbid_choice(paused_row(minutes=1), NOW, 1.0, one_second)[0] == "rebid"


def test_arrivals_are_the_lookahead_spread_over_its_window_else_the_rate_said_else_none():
    half_hour = config_module.from_mapping({"agent": {"plan_horizon": "30m"}, "demand": {"lookahead_window": "30m"}})
    assert sizing.needed({"queued": 0, "lookahead": 12}, half_hour) == 24.0  # 12 within 30 min: 24/h
    one_second = config_module.from_mapping({"agent": {"plan_horizon": "30m"}, "demand": {"lookahead_window": "1s"}})
    assert sizing.needed({"queued": 0, "lookahead": 1, "proofs_per_hour": 5.0}, one_second) == 3600.0
    assert sizing.needed({"queued": 0}, CONFIG) == 0.0  # no lookahead and no rate said: no arrivals counted


@pytest.mark.parametrize("every, held", [(15, 60.0), (12, 60.0), (16, None)])
def test_a_window_sampled_at_most_every_15_minutes_is_evidence_and_a_longer_gap_is_not(every, held):
    # CONFIG: scale_down_after 30m, demand.stale_after 20m: a gap may be min(20m, 30m / 2) = 15m at most
    history = [sample(30, minutes_ago=minutes) for minutes in range(3 * every, 0, -every)]
    assert sizing.held_capacity(observation(fleet(1), history), CONFIG) == held  # 30 queued in 30m: 60/h


ONE_OFFER = [(MARKET[0], 60.0)]


def rounding(rate, queued, lookahead, in_flight=None, machines=()):
    """rounded_down() for one running machine of `rate` and one sample (CONFIG: 30 min horizon, 1 h window)."""
    obs = observation([m("vastctl-a", rate=rate), *machines], [sample(queued, lookahead, in_flight)])
    return sizing.rounded_down(obs, CONFIG, ONE_OFFER)


@pytest.mark.parametrize("rate, queued, lookahead, in_flight, smallest", [
    (100.0, 10, 95, None, 60.0),  # 20 + 95 = 115 wanted: 15 missing, under half of 60: rounded down
    (100.0, 10, 80, None, None),  # 100 wanted: nothing missing
    (99.5, 10, 80, None, 60.0),  # half a proof an hour missing is still missing
    (0.5, 0, 10, None, 60.0),  # a fleet of half a proof an hour keeps up with no backlog: rounded down too
    (100.0, 10, 50, 20, None),  # 30 waiting over 100/h: more than a quarter hour of work waits, so it is rented
    (100.0, 0, 60, 25, 60.0),  # 25 waiting: exactly a quarter hour, not more
    (100.0, 25, 60, None, 60.0),  # the same queued instead of in flight
])
def test_a_shortfall_under_half_the_smallest_machine_is_rounded_down_while_the_fleet_keeps_up(
        rate, queued, lookahead, in_flight, smallest):
    assert rounding(rate, queued, lookahead, in_flight) == smallest


def test_the_smallest_machine_to_hand_counts_stopped_ones_with_a_rate():
    slow = {**stopped("vastctl-s", 0.1), "expected_rate": 0.5}  # a machine of half a proof an hour to resume
    idle = {**stopped("vastctl-t", 0.1), "expected_rate": 0.0}  # no rate: not a machine to hand
    assert rounding(100.0, 10, 95, machines=[slow]) is None  # 15 missing is not under half of 0.5
    assert rounding(100.0, 10, 95, machines=[idle]) == 60.0


def test_with_no_demand_sample_ever_nothing_counts_as_waiting_so_a_small_fleet_rounds_down_too():
    """No sample was ever good: the fleet is sized to the ceiling (target 20/h × 1.15 = 23/h) and nothing is
    known to wait. One machine of 2/h is 21/h short, under half the smallest offer (60/h): rounded down. Counting
    one proof as waiting would be half an hour of that fleet's work, past a quarter hour, and rent a machine."""
    obs = observation([m("vastctl-a", rate=2.0)], [sample(0, ok=False)], target_proofs_per_hour=20.0)
    assert sizing.sized_to(obs) is None
    assert sizing.rounded_down(obs, CONFIG, ONE_OFFER) == 60.0


def unknown_demand(last, held=0):
    import dataclasses

    obs = observation(fleet(1), [sample(0, ok=False)])
    obs.last_known_demand = last
    obs.demand = dataclasses.replace(obs.demand, held=held)
    return obs


def test_unknown_demand_is_sized_to_the_last_good_sample_and_at_least_the_calls_the_router_holds():
    last = {"at": NOW - timedelta(minutes=10), "ok": True, "queued": 4, "in_flight": None, "lookahead": None,
            "proofs_per_hour": None}
    assert sizing.sized_to(unknown_demand(last)) is last  # nothing held: the sample as it was
    assert sizing.sized_to(unknown_demand(last, held=3))["in_flight"] == 3
    assert sizing.sized_to(unknown_demand({**last, "in_flight": 5}, held=3))["in_flight"] == 5
    assert sizing.sized_to(unknown_demand(None, held=3)) is None


def test_unknown_demand_says_what_its_last_good_sample_held():
    last = {"at": NOW - timedelta(minutes=10), "ok": True, "queued": None, "in_flight": None, "lookahead": None}
    assert sizing.work_reason(unknown_demand(last)) == (
        "demand unknown (held to its newest good sample, 10m old: 0 queued, 0 in flight, 0 coming)")
    full = {**last, "queued": 4, "in_flight": 6, "lookahead": 2}
    assert sizing.work_reason(unknown_demand(full, held=1)) == (
        "demand unknown (held to its newest good sample, 10m old: 4 queued, 6 in flight, 2 coming;"
        " 1 calls held at the proof router)")


def test_known_demand_is_sized_to_as_the_source_said_and_one_proof_is_work():
    import dataclasses

    obs = observation(fleet(1), [sample(1)])
    assert sizing.sized_to(obs) == {"queued": 1, "in_flight": None, "lookahead": 0, "proofs_per_hour": None}
    assert sizing.has_work(obs)
    obs.demand = dataclasses.replace(obs.demand, held=2)
    assert sizing.sized_to(obs)["in_flight"] == 2  # the router's calls count in flight


def test_a_long_outbid_pause_is_said_in_whole_minutes():
    assert outbid.outbid_choice(paused_row(minutes=60), NOW, 1.0, OUTBID_WAIT)[2].startswith("outbid for 60m at $0.3/h")
