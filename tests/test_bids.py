"""bids.bid_for_offer: an interruptible rental's bid from the offer's min_bid, as a function of the offer alone."""

from __future__ import annotations

import pytest

from vastctl import bids
from vastctl.providers.base import Offer
from vastctl.validate import MIN_DPH


def offer(min_bid=0.2, dph=0.45, raw="auto") -> Offer:
    return Offer(id=1, machine_id=1, gpu_name="RTX 4090", num_gpus=1, dph_total=dph,
                 raw={"min_bid": min_bid} if raw == "auto" else raw)


def test_the_bid_is_the_floor_plus_the_margin_rounded_to_four_places():
    assert bids.bid_for_offer(offer(0.2), 1.0) == 0.22
    assert bids.bid_for_offer(offer(0.2), 1.0, margin=0.5) == 0.3
    assert bids.bid_for_offer(offer(0.11111), 1.0) == 0.1222  # 0.122221
    assert bids.bid_for_offer(offer(1, dph=3.0), 2.0, margin=0) == 1.0  # an integer floor counts as its price


def test_the_bid_never_passes_max_dph_nor_the_on_demand_price():
    assert bids.bid_for_offer(offer(0.28, dph=0.45), 0.3) == 0.3  # 0.308 past max_dph
    assert bids.bid_for_offer(offer(0.24, dph=0.25), 1.0) == 0.25  # 0.264 past the offer's own price
    assert bids.bid_for_offer(offer(0.3, dph=0.45), 0.3) == 0.3  # a floor at max_dph is still a bid
    assert bids.bid_for_offer(offer(0.31, dph=0.45), 0.3) is None  # the floor itself past max_dph
    assert bids.bid_for_offer(offer(0.5, dph=0.45), 1.0) is None  # past the on-demand price


@pytest.mark.parametrize("raw", [{}, {"min_bid": None}, {"min_bid": True}, {"min_bid": "0.2"}, {"min_bid": float("nan")},
                                 {"min_bid": float("inf")}, {"min_bid": 0}, {"min_bid": -0.2}, {"min_bid": 1e-320},
                                 {"min_bid": MIN_DPH / 2}, None, ["min_bid", 0.2]])
def test_an_offer_naming_no_usable_min_bid_gets_no_bid(raw):
    assert bids.bid_for_offer(offer(raw=raw), 1.0) is None


def test_a_floor_at_the_smallest_price_is_a_bid():
    assert bids.bid_for_offer(offer(MIN_DPH), 1.0, margin=0) == MIN_DPH
