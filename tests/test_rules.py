"""The rules policy, table-driven over observations: no mocks, no file, no market."""

from __future__ import annotations

import pytest
from helpers.rules_observations import CONFIG, MARKET, UNKNOWN, m, observation, offer, queued

from vastctl import config as config_module
from vastctl.agent import rules, valuation
from vastctl.providers.base import Offer

CASES = [
    # name, machines, demand, offers, settings, expected (kind, label or offer id)
    ("unknown demand: sized as if work were queued, nothing released",
     [m("vastctl-a")], UNKNOWN, MARKET, {}, [("launch", 2)]),
    ("unknown demand with the fleet already sized: hold",
     [m("vastctl-a"), m("vastctl-b")], UNKNOWN, MARKET, {}, []),
    ("the incident: 59 queued, fleet over target, never scaled down",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c", rate=20, dph=0.9)], queued(59), MARKET, {}, []),
    ("59 queued and the target fell, no demand history over agent.scale_down_after: the fleet holds",
     [m("vastctl-a"), m("vastctl-b", dph=0.6), m("vastctl-c", dph=0.7), m("vastctl-d")], queued(59), MARKET,
     {"target_proofs_per_hour": 50.0}, []),
    ("unknown demand with capacity to spare: hold, whatever the target says",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c")], UNKNOWN, MARKET, {}, []),
    ("queue empty past the cooldown while a machine boots: no trimming on a guessed rate, one machine a step",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c", state="params_done")], queued(0, empty_for_min=61), MARKET, {},
     [("stop", "vastctl-a")]),
    ("queue empty past the cooldown: stop what the target no longer needs, worst per dollar first",
     [m("vastctl-a"), m("vastctl-b", dph=0.6), m("vastctl-c", dph=0.7), m("vastctl-d")],
     queued(0, empty_for_min=61), MARKET, {"target_proofs_per_hour": 50.0},
     [("stop", "vastctl-c"), ("stop", "vastctl-b"), ("stop", "vastctl-a")]),
    ("every machine dead at vast with work queued: replace them all",
     [m("vastctl-a", status="exited"), m("vastctl-b", status="offline"), m("vastctl-c", missing=2)],
     queued(59), MARKET, {}, [("launch", 2), ("launch", 1)]),
    ("price spike: every offer over max_dph, hold",
     [m("vastctl-a")], queued(59), [offer(5, dph=2.5), offer(6, "RTX 5090", dph=3.1)], {}, []),
    ("price spike: the cheaper model per proof wins, the rest on the offer cheapest per hour that covers it",
     [], queued(59), [offer(5, dph=0.9), offer(6, "RTX 5090", dph=0.95)], {}, [("launch", 6), ("launch", 5)]),
    ("less than a machine missing: the offer cheapest per hour that covers it, not the cheapest per proof",
     [m("vastctl-a")], queued(59), [offer(5, dph=0.9), offer(6, "RTX 5090", dph=0.95)], {}, [("launch", 5)]),
    ("less than a machine missing, no cheaper offer per hour covers it: the cheapest per proof",
     [m("vastctl-a")], queued(59), [offer(5, dph=0.96), offer(6, "RTX 5090", dph=0.95)], {}, [("launch", 6)]),
    ("pending launches cover the target: no second launch",
     [m("vastctl-a", state="launching"), m("vastctl-b", state="params_done")], queued(12), MARKET, {}, []),
    ("pending launches cover part of it: launch the rest only",
     [m("vastctl-a", state="registered")], queued(40), MARKET, {}, [("launch", 2)]),
    ("empty queue past the cooldown: stop the least proofs per dollar",
     [m("vastctl-a"), m("vastctl-b", rate=50, dph=0.9), m("vastctl-c")], queued(0, empty_for_min=61), MARKET, {},
     [("stop", "vastctl-b")]),
    ("empty queue before the cooldown: hold",
     [m("vastctl-a"), m("vastctl-b", rate=50, dph=0.9)], queued(0, empty_for_min=59), MARKET, {}, []),
    ("empty queue, cooldown not known (no run of empty samples): hold",
     [m("vastctl-a")], queued(0), MARKET, {}, []),
    ("a stopped machine is resumed once before anything is rented",
     [m("vastctl-a"), m("vastctl-s", state="stopped", status="exited")], queued(40), MARKET, {},
     [("start", "vastctl-s")]),
    ("a machine stopped again after its resume is replaced",
     [m("vastctl-a"), m("vastctl-s", state="stopped", resumes=1)], queued(40), MARKET, {},
     [("destroy", "vastctl-s"), ("launch", 2)]),
    ("target 0: nothing to size to",
     [], queued(40), MARKET, {"target_proofs_per_hour": 0.0}, []),
    ("max_instances bounds the plan",
     [m("vastctl-a", state="launching", rate=10)], queued(40), MARKET, {"max_instances": 2}, [("launch", 2)]),
    ("max_hourly_spend bounds the plan",
     [], queued(40), MARKET, {"max_hourly_spend": 0.8}, [("launch", 2)]),
    # in flight: claimed tasks wait at a daemon, they are work for the fleet
    ("nothing queued, work in flight, fleet under target: grow",
     [m("vastctl-a")], queued(0, in_flight=60, lookahead=0), MARKET, {}, [("launch", 2)]),
    ("nothing queued, work in flight, an old empty run: never shrink under claimed work",
     [m("vastctl-a"), m("vastctl-b", rate=50, dph=0.9), m("vastctl-c")],
     queued(0, empty_for_min=120, in_flight=3, lookahead=0), MARKET, {"target_proofs_per_hour": 50.0}, []),
    # look-ahead: PoRep tasks about to be created; a machine launched now is booted when they arrive
    ("nothing queued or in flight, PoRep coming: start machines before the tasks exist",
     [], queued(0, in_flight=0, lookahead=150), MARKET, {}, [("launch", 2), ("launch", 1)]),
    ("PoRep coming, a stopped machine: resume it first",
     [m("vastctl-s", state="stopped", status="exited")], queued(0, in_flight=0, lookahead=100), MARKET, {},
     [("start", "vastctl-s"), ("launch", 2)]),
    ("PoRep coming past the cooldown of an old empty run: hold, not stop",
     [m("vastctl-a"), m("vastctl-b", rate=50, dph=0.9)], queued(0, empty_for_min=90, in_flight=0, lookahead=2),
     MARKET, {"target_proofs_per_hour": 50.0}, []),
    ("every count zero past the cooldown: stop the least proofs per dollar",
     [m("vastctl-a"), m("vastctl-b", rate=50, dph=0.9), m("vastctl-c")],
     queued(0, empty_for_min=61, in_flight=0, lookahead=0), MARKET, {}, [("stop", "vastctl-b")]),
    ("the incident with work in flight too: 59 queued, 10 claimed, fleet over target, nothing released",
     [m("vastctl-a"), m("vastctl-b"), m("vastctl-c", rate=20, dph=0.9)], queued(59, in_flight=10, lookahead=4),
     MARKET, {}, []),
]


@pytest.mark.parametrize("name, machines, demand, offers, settings, expected", CASES, ids=[c[0] for c in CASES])
def test_plan(name, machines, demand, offers, settings, expected):
    actions = rules.plan(observation(machines, demand, **settings), CONFIG, offers)
    assert [(a.kind, a.offer_id if a.kind == "launch" else a.label) for a in actions] == expected
    assert all(a.actor == "agent" and a.reason for a in actions)


def test_launch_reasons_and_prices():
    (first, second) = rules.plan(observation([], queued(40)), CONFIG, MARKET)
    assert (first.offer_id, first.gpu_name, first.dph) == (2, "RTX 4090", 0.40)
    assert "capacity 0 of 115 proofs/h" in first.reason and "60 proofs/h expected" in first.reason
    assert second.offer_id == 1


def test_offers_are_ranked_per_expected_proof_with_host_ram_counted():
    small_host = Offer(id=7, machine_id=70, gpu_name="RTX 4090", num_gpus=1, dph_total=0.40, cpu_ram_gb=128)
    big_host = Offer(id=8, machine_id=80, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, cpu_ram_gb=512)
    unseen = Offer(id=9, machine_id=90, gpu_name="RTX 5070 Ti", num_gpus=1, dph_total=0.46, cpu_ram_gb=512)
    config = config_module.from_mapping({"fleet": {"gpus": ["RTX 4090", "RTX 5070 Ti"]}})
    ranked = valuation.rank_offers([small_host, big_host, unseen], observation([], queued(5)), config)
    # 128 GiB bounds a 4090 to ~24/h whatever it benchmarks elsewhere; a model never benchmarked gets its published rate
    assert [(offer.id, rate) for offer, rate in ranked] == [(9, 95.0), (8, 60.0), (7, 24.0)]


def test_one_offer_per_host_machine():
    twins = [offer(1, dph=0.3, machine_id=77), offer(2, dph=0.31, machine_id=77), offer(3, dph=0.5)]
    assert [a.offer_id for a in rules.plan(observation([], queued(40)), CONFIG, twins)] == [1, 3]


def test_no_more_actions_than_the_step_allows():
    small = config_module.from_mapping({"agent": {"max_actions_per_step": 1}})
    many = [offer(i, dph=0.4 + i / 100) for i in range(1, 9)]
    assert len(rules.plan(observation([], queued(5), target_proofs_per_hour=400.0), small, many)) == 1


def test_needs_offers_to_grow_also_with_a_stopped_machine_to_resume():
    """A stopped machine is resumed only when no offer is clearly cheaper per proof: growing looks at offers."""
    stopped = [m("vastctl-a"), m("vastctl-s", state="stopped")]
    assert rules.needs_offers(observation(stopped, queued(40)), CONFIG)
    assert rules.needs_offers(observation([m("vastctl-a")], queued(40)), CONFIG)
    assert not rules.needs_offers(observation(stopped + [m("vastctl-b")], queued(40)), CONFIG)
    assert not rules.needs_offers(observation([m("vastctl-a")], queued(0, empty_for_min=5)), CONFIG)


def test_the_reason_names_the_work_in_flight_and_coming():
    (first, *_) = rules.plan(observation([], queued(0, in_flight=40, lookahead=100)), CONFIG, MARKET)
    assert first.reason.startswith("work for the fleet (0 queued, 40 in flight, 100 PoRep coming): capacity 0 of 115")
    (only_queued, *_) = rules.plan(observation([], queued(40)), CONFIG, MARKET)
    assert only_queued.reason.startswith("queued work: capacity 0 of 115")


@pytest.mark.parametrize("demand, wanted", [
    (queued(0, empty_for_min=5, in_flight=40), True),
    (queued(0, empty_for_min=5, lookahead=100), True),
    (queued(0, empty_for_min=5, in_flight=0, lookahead=0), False),
    (queued(0, empty_for_min=5), False),  # a source that reports only queued
])
def test_needs_offers_counts_work_in_flight_and_coming(demand, wanted):
    assert rules.needs_offers(observation([m("vastctl-a")], demand), CONFIG) is wanted


# --- valuation: what a machine or an offer is worth, as functions of the observation -----------------------


INF = float("inf")


def test_a_machines_proofs_per_dollar_and_dollars_per_proof():
    assert valuation.per_dollar({"expected_rate": 60.0, "dph": 0.3}) == pytest.approx(200.0)
    assert valuation.per_dollar({"expected_rate": 60.0, "dph": 0}) == INF == valuation.per_dollar({"expected_rate": 1})
    assert valuation.per_dollar({"expected_rate": 60.0, "dph": -0.1}) == INF
    assert valuation.per_proof({"expected_rate": 60.0, "dph": 0.3}) == pytest.approx(0.005)
    assert valuation.per_proof({"expected_rate": 0, "dph": 0.3}) == INF == valuation.per_proof({"expected_rate": None})
    assert valuation.per_proof({"expected_rate": -5.0, "dph": 0.3}) == INF
    assert valuation.per_proof({"expected_rate": 60.0}) == 0.0


@pytest.mark.parametrize("ram, rate", [(None, INF), (0, INF), (-8, INF), (64, 12.0), (128, 24.0), (192, 46.0),
                                       (256, 68.0), (320, 76.0), (384, 84.0), (448, 89.5), (512, 95.0), (2048, 95.0)])
def test_host_ram_bounds_the_rate_interpolated_between_the_measured_points(ram, rate):
    assert valuation.ram_rate(ram) == pytest.approx(rate)


def test_an_offer_proves_what_its_host_proved_else_its_models_rate_capped_by_its_ram():
    obs = observation([], queued(5))
    obs.host_rates = {70: 33.0}
    config = config_module.from_mapping({"fleet": {"default_rate": 41.0}})

    def rate(gpu, machine_id=None, ram=None):
        return valuation.offer_rate(Offer(id=1, machine_id=machine_id, gpu_name=gpu, num_gpus=1, dph_total=0.4,
                                          cpu_ram_gb=ram), obs, config)
    assert rate("RTX 4090", machine_id=70, ram=1024) == 33.0  # the host's own benchmark, whatever its model
    assert rate("RTX 4090", machine_id=80) == 60.0  # the model's benchmarks (observation.model_rates)
    assert rate("RTX 4090") == 60.0  # no machine id: the model's
    assert rate("RTX 5070 Ti") == 95.0  # never benchmarked: the published figure
    assert rate("GTX 1080") == 41.0  # neither: fleet.default_rate
    assert rate("RTX 5090", ram=256) == 68.0  # 100/h of GPU on a host whose RAM allows 68


def test_a_launch_pays_its_bid_only_when_the_rental_bids():
    obs = observation([], queued(5), max_dph=1.0)
    priced = Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, raw={"min_bid": 0.2})
    unpriced = Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45)
    bidding = config_module.from_mapping({"launch": {"rental": "interruptible", "bid_margin": 0.5}})
    assert valuation.launch_price(priced, obs, bidding) == 0.3
    assert valuation.launch_terms(priced, obs, bidding) == "a bid of $0.3/h ($0.45/h on demand)"
    assert valuation.launch_price(unpriced, obs, bidding) == 0.45 and valuation.launch_terms(unpriced, obs, bidding) == "$0.45/h"
    assert valuation.launch_price(priced, obs, CONFIG) == 0.45 and valuation.launch_terms(priced, obs, CONFIG) == "$0.45/h"
    capped = observation([], queued(5), max_dph=0.25)  # the bid never passes max_dph
    assert valuation.launch_price(priced, capped, bidding) == 0.25


def test_ranking_leaves_out_disallowed_dear_and_rateless_offers_and_breaks_ties_by_price_then_id():
    obs = observation([], queued(5), max_dph=0.6)
    config = config_module.from_mapping({"fleet": {"gpus": ["RTX 4090", "RTX 5090", "GTX 1080"], "default_rate": 0}})
    offers = [Offer(id=1, machine_id=None, gpu_name="RTX 4090", num_gpus=1, dph_total=0.3),
              Offer(id=2, machine_id=None, gpu_name="RTX 4090", num_gpus=1, dph_total=0.3),  # no host id: not a twin
              Offer(id=3, machine_id=30, gpu_name="RTX 4090", num_gpus=1, dph_total=0.61),  # past max_dph
              Offer(id=4, machine_id=40, gpu_name="RTX 4090", num_gpus=1, dph_total=0.6),  # at max_dph: allowed
              Offer(id=5, machine_id=50, gpu_name="RTX 3090", num_gpus=1, dph_total=0.1),  # not in fleet.gpus
              Offer(id=6, machine_id=60, gpu_name="GTX 1080", num_gpus=1, dph_total=0.1),  # no rate at all
              Offer(id=7, machine_id=70, gpu_name="RTX 5090", num_gpus=1, dph_total=0.5)]  # 0.005/proof, as 1 and 2
    ranked = valuation.rank_offers(offers, obs, config)
    assert [(offer.id, rate) for offer, rate in ranked] == [(1, 60.0), (2, 60.0), (7, 100.0), (4, 60.0)]
    everything = config_module.from_mapping({"fleet": {"gpus": []}})  # no list: every model allowed
    assert 5 in [offer.id for offer, _ in valuation.rank_offers(offers, obs, everything)]


def test_ranking_counts_the_bid_a_launch_would_pay():
    obs = observation([], queued(5), max_dph=1.0)
    bids_low = Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.5, raw={"min_bid": 0.1})
    cheap = Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.3)
    bidding = config_module.from_mapping({"launch": {"rental": "interruptible"}})
    assert [offer.id for offer, _ in valuation.rank_offers([bids_low, cheap], obs, bidding)] == [1, 2]  # 0.11 vs 0.3
    assert [offer.id for offer, _ in valuation.rank_offers([bids_low, cheap], obs, CONFIG)] == [2, 1]


def test_the_next_offer_is_the_cheapest_per_proof_unless_a_cheaper_one_per_hour_covers_the_rest():
    obs = observation([], queued(5))
    fast = Offer(id=1, machine_id=10, gpu_name="RTX 5090", num_gpus=1, dph_total=0.9)  # 0.009/proof
    slow = Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.6)  # 0.01/proof
    same = Offer(id=3, machine_id=30, gpu_name="RTX 4090", num_gpus=1, dph_total=0.9)
    ranked = [(fast, 100.0), (slow, 60.0)]
    assert valuation.next_offer(ranked, 100.0, obs, CONFIG) == (fast, 100.0, False)  # a whole machine missing
    assert valuation.next_offer(ranked, 150.0, obs, CONFIG) == (fast, 100.0, False)
    assert valuation.next_offer(ranked, 50.0, obs, CONFIG) == (slow, 60.0, True)  # 60 covers 50 for less an hour
    assert valuation.next_offer(ranked, 60.0, obs, CONFIG) == (slow, 60.0, True)  # covers it exactly
    assert valuation.next_offer(ranked, 70.0, obs, CONFIG) == (fast, 100.0, False)  # 60 does not cover 70
    assert valuation.next_offer([(fast, 100.0), (same, 60.0)], 50.0, obs, CONFIG) == (fast, 100.0, False)  # no cheaper


def test_a_mixed_fleet_prices_the_next_launch_at_its_bid_while_the_share_allows():
    mixed = config_module.from_mapping({"launch": {"rental": "mixed", "interruptible_share": 0.5}})
    priced = Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.45, raw={"min_bid": 0.2})
    one_on_demand = observation([m("vastctl-a")], queued(5), max_dph=1.0)  # 1 of 2 would bid: allowed
    assert valuation.launch_price(priced, one_on_demand, mixed) == 0.22
    assert valuation.launch_price(priced, observation([], queued(5), max_dph=1.0), mixed) == 0.45  # the first: on demand


def test_ranking_prices_a_bid_at_the_configured_margin_and_a_mixed_fleet_bids_by_its_share():
    obs = observation([m("vastctl-a")], queued(5), max_dph=1.0)
    bids_low = Offer(id=1, machine_id=10, gpu_name="RTX 4090", num_gpus=1, dph_total=0.5, raw={"min_bid": 0.1})
    cheap = Offer(id=2, machine_id=20, gpu_name="RTX 4090", num_gpus=1, dph_total=0.13)
    wide = config_module.from_mapping({"launch": {"rental": "interruptible", "bid_margin": 0.5}})
    assert [offer.id for offer, _ in valuation.rank_offers([bids_low, cheap], obs, wide)] == [2, 1]  # 0.15 vs 0.13
    mixed = config_module.from_mapping({"launch": {"rental": "mixed", "interruptible_share": 0.5}})
    assert [offer.id for offer, _ in valuation.rank_offers([bids_low, cheap], obs, mixed)] == [1, 2]  # 0.11 vs 0.13


def test_an_offer_of_under_a_proof_an_hour_still_ranks():
    slow = config_module.from_mapping({"fleet": {"default_rate": 0.5, "gpus": []}})
    odd = Offer(id=1, machine_id=10, gpu_name="GTX 1080", num_gpus=1, dph_total=0.1)
    assert [(o.id, rate) for o, rate in valuation.rank_offers([odd], observation([], queued(5)), slow)] == [(1, 0.5)]


def test_under_a_gib_of_ram_or_under_a_proof_an_hour_is_still_counted():
    assert valuation.ram_rate(0.5) == pytest.approx(24.0 * 0.5 / 128) and valuation.ram_rate(1) == pytest.approx(0.1875)
    assert valuation.per_proof({"expected_rate": 0.5, "dph": 0.3}) == pytest.approx(0.6)
