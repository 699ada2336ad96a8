"""What an offer or a machine is worth: the proofs per hour it is expected to make, and what each costs. Pure.

Expected rate: measured, else bench, else the median bench rate seen for the GPU
model, else fleet.default_rate (observe.py). An offer's expected rate is what a
machine of ours last benchmarked on the same host (observation.host_rates: a
slow host of a fast model is not rented again at its model's rate), else its
model's (before any benchmark of it, the published figure, GPU_RATES), capped by what its host RAM allows (RAM_RATES, the cuzk measurements of
docs/workload.md "Host RAM bounds the rate"): a 256 GiB host proves ~68/h whatever its GPU, so offers are ranked
by proofs per dollar with the RAM counted.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from vastctl.bids import bid_for_offer, wants_bid
from vastctl.config import Config
from vastctl.observe import Observation, rate_of_model
from vastctl.providers.base import Offer
from vastctl.providers.host_ram import rate_allowed

BOOT_HOURS = 0.5  # a fresh machine bills ~30 min (image, parameters, benchmark) before its first proof
# proofs/hour host RAM allows (GiB → proofs/h, 32 GiB PoRep with cuzk; docs/workload.md), interpolated between
RAM_RATES = ((128, 24.0), (256, 68.0), (384, 84.0), (512, 95.0))
# proofs/hour a model proves on a host with RAM to spare, before any machine of it has benchmarked (docs/workload.md)
GPU_RATES = {"RTX 3090": 50.0, "RTX 4090": 80.0, "RTX 5070 Ti": 95.0, "RTX 5090": 100.0, "A100 SXM4": 70.0,
             "A100 80GB": 70.0, "H100 SXM": 100.0, "H100 PCIe": 100.0}


def per_dollar(machine: Mapping[str, Any]) -> float:
    dph = float(machine.get("dph") or 0.0)
    return machine["expected_rate"] / dph if dph > 0 else float("inf")


def ram_rate(ram_gb: float | None) -> float:
    """Proofs/hour a host with this much RAM allows (inf when the offer does not say)."""
    if not ram_gb or ram_gb <= 0:
        return float("inf")
    return rate_allowed(RAM_RATES, ram_gb)


def offer_rate(offer: Offer, obs: Observation, config: Config) -> float:
    """What an offer is expected to prove per hour: what a machine of ours last benchmarked on the same host
    (hosts of one model differ: a slow CPU, shared RAM), else its model's rate (benchmarked, else the published
    figure, else fleet.default_rate) capped by what its host RAM allows."""
    if offer.machine_id is not None and offer.machine_id in obs.host_rates:
        return float(obs.host_rates[offer.machine_id])
    default = GPU_RATES.get(offer.gpu_name, config.fleet.default_rate)
    return min(rate_of_model(offer.gpu_name, obs.model_rates, default), ram_rate(offer.cpu_ram_gb))


def launch_price(offer: Offer, obs: Observation, config: Config) -> float:
    """$/h a launch on the offer now pays: its bid when launch.rental has it bid, else the on-demand price."""
    bid = (bid_for_offer(offer, float(obs.settings["max_dph"]), config.launch.bid_margin)
           if wants_bid(config, obs.live()) else None)
    return float(offer.dph_total) if bid is None else bid


def launch_terms(offer: Offer, obs: Observation, config: Config) -> str:
    price = launch_price(offer, obs, config)
    return f"${offer.dph_total:g}/h" if price == offer.dph_total else f"a bid of ${price:g}/h (${offer.dph_total:g}/h on demand)"


def rank_offers(offers: Iterable[Offer], obs: Observation, config: Config) -> list[tuple[Offer, float]]:
    """Allowed offers with their expected rate, cheapest per expected proof first (at the price the next launch
    pays: launch_price), one per host machine."""
    allowed = set(config.fleet.gpus)
    max_dph = float(obs.settings["max_dph"])
    bidding = wants_bid(config, obs.live())
    ranked = []
    seen: set[int] = set()
    for offer in offers:
        if (allowed and offer.gpu_name not in allowed) or offer.dph_total > max_dph:
            continue
        if offer.machine_id is not None:
            if offer.machine_id in seen:
                continue
            seen.add(offer.machine_id)
        rate = offer_rate(offer, obs, config)
        if rate > 0:
            ranked.append((offer, rate))
    def price(offer: Offer) -> float:
        bid = bid_for_offer(offer, max_dph, config.launch.bid_margin) if bidding else None
        return float(offer.dph_total) if bid is None else bid

    return sorted(ranked, key=lambda item: (price(item[0]) / item[1], price(item[0]), item[0].id))


def next_offer(ranked: Sequence[tuple[Offer, float]], missing: float, obs: Observation,
               config: Config) -> tuple[Offer, float, bool]:
    """The next offer to rent for `missing` proofs/hour, and whether it was chosen to cover the rest: the cheapest
    per expected proof (ranked first), unless that one is more than what is missing and an offer cheaper per hour
    covers the rest. A machine bills by the hour whatever it proves, so the last one is chosen by its price (the
    lower bound's whole-machine rule); while it is the dearest per proof, it is the first released."""
    offer, rate = ranked[0]
    if missing >= rate:
        return offer, rate, False
    cheapest = min((item for item in ranked if item[1] >= missing),
                   key=lambda item: (launch_price(item[0], obs, config), item[0].id))
    if launch_price(cheapest[0], obs, config) < launch_price(offer, obs, config) - 1e-9:
        return cheapest[0], cheapest[1], True
    return offer, rate, False


def per_proof(machine: Mapping[str, Any]) -> float:
    """$ per proof the machine costs (inf without a rate)."""
    rate = float(machine["expected_rate"] or 0.0)
    return float(machine.get("dph") or 0.0) / rate if rate > 0 else float("inf")
