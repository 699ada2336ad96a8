"""Interruptible rentals: what a launch bids, and which launches bid (launch.rental).

An interruptible machine costs its bid instead of the on-demand price, and
vast pauses it (stopped, disk kept, storage billed) whenever another renter
bids more for its host (docs/workload.md "vast.ai"). The bid is the
offer's `min_bid` plus launch.bid_margin, never above max_dph nor the offer's
on-demand price. `mixed` bids for launch.interruptible_share of the live
fleet, so part of it can never be paused.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from vastctl import validate
from vastctl.config import Config
from vastctl.providers.base import Offer

RENTALS = ("on-demand", "interruptible", "mixed")


def bid_for_offer(offer: Offer, max_dph: float, margin: float = 0.1) -> float | None:
    """The bid for an interruptible rental of `offer`: its min_bid plus `margin`, never above max_dph (nor the
    offer's on-demand price). None when the offer names no usable min_bid (vast's numbers are hostile: a
    missing, non-finite, zero or negative one) or the floor itself is past max_dph."""
    floor = validate.price(offer.raw.get("min_bid")) if isinstance(offer.raw, Mapping) else None
    if floor is None:
        return None
    ceiling_dph = min(float(max_dph), float(offer.dph_total))
    if floor > ceiling_dph:
        return None
    return round(min(float(floor) * (1 + margin), ceiling_dph), 4)


def wants_bid(config: Config, live: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the next launch rents interruptible: always for `interruptible`, never for `on-demand`; for
    `mixed` when the live fleet with this machine would still have at most launch.interruptible_share bidding
    (the first machine of a fleet is on demand)."""
    rental = config.launch.rental
    if rental == "interruptible":
        return True
    if rental != "mixed":
        return False
    rows = list(live)
    bidding = sum(1 for row in rows if row.get("bid") is not None)
    return bidding + 1 <= config.launch.interruptible_share * (len(rows) + 1) + 1e-9


def launch_bid(config: Config, offer: Offer, max_dph: float, live: Iterable[Mapping[str, Any]]) -> float | None:
    """The bid this launch sends, or None (on demand: the rental asks none, or the offer names no usable
    min_bid within max_dph, when renting on demand is the fallback)."""
    if not wants_bid(config, live):
        return None
    return bid_for_offer(offer, max_dph, config.launch.bid_margin)
