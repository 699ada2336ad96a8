"""vast.ai's JSON and vastctl's types: the bodies sent (an offer search, a create, a bid) and the answers read back.

Numbers from vast are hostile: an instance id the state file cannot hold (SQLite's 64-bit
integers) drops that entry from the listing with a note in `listing_notes`,
and any other such number is read as missing; a price that is not a finite $/h of at least MIN_DPH is no price.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, TypeGuard

from vastctl import upstream, validate
from vastctl.errors import BadInput
from vastctl.providers.base import CreateRequest, Offer, OfferQuery, ProviderError, RemoteInstance
from vastctl.providers.vast_http import HugeInteger

MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER: a number from vast past it cannot be stored, compared or acted on
MIN_INTEGER = -(2**63)


def offer_search_body(query: OfferQuery) -> dict[str, object]:
    """The POST /api/v0/bundles/ body: filters as {op: value}, cheapest first."""
    body: dict[str, object] = {"rentable": {"eq": True}}
    if query.offer_id is not None:
        body["id"] = {"eq": int(query.offer_id)}
    else:
        body.update({"verified": {"eq": True}, "external": {"eq": False}})
        names = list(query.gpu_names)
        if len(names) == 1:
            body["gpu_name"] = {"eq": names[0]}
        elif names:
            body["gpu_name"] = {"in": names}
        if query.max_dph is not None:
            body["dph_total"] = {"lte": query.max_dph}
        if query.min_cpu_ram_gb:
            body["cpu_ram"] = {"gte": round(query.min_cpu_ram_gb * 1000)}  # GB → MB, as the official CLI does
        if query.min_inet_down_mbps:
            body["inet_down"] = {"gte": query.min_inet_down_mbps}
        if query.min_reliability is not None:
            body["reliability"] = {"gte": query.min_reliability}
    body.update({"order": [["dph_total", "asc"]], "type": "on-demand", "limit": int(query.limit),
                 "allocated_storage": float(query.disk_gb)})
    return body


BID_RANGE = (0.001, 32.0)  # $/h vast accepts as a bid (change-bid's documented range, inside create's)


def bid_price(price: object) -> float:
    """A bid as vast accepts it: a finite $/h within BID_RANGE, to 4 decimals; BadInput otherwise."""
    low, high = BID_RANGE
    number = validate.real(price)
    if number is None or not low <= number <= high:
        raise BadInput(f"a bid must be a number of $/h from {low:g} to {high:g}, got {price!r}")
    return round(number, 4)


def create_body(request: CreateRequest) -> dict[str, object]:
    """The PUT /api/v0/asks/{id}/ body: on demand, or interruptible when the request carries a bid (`price`).

    cancel_unavail is true: an offer that cannot start now (a bid too low to win
    included) must be an error, not a stopped instance that bills storage.
    """
    return {
        "client_id": "me", "image": request.image, "disk": float(request.disk_gb), "label": request.label,
        "onstart": request.onstart, "env": dict(request.env), "runtype": "ssh",
        "price": None if request.price is None else bid_price(request.price),
        "image_login": None, "cancel_unavail": True,
    }


def _storage_price(raw: Mapping[str, object]) -> float | None:
    """$/h the allocated disk bills (all a stopped instance costs): `storage_total_cost`, else dph_total − dph_base."""
    storage = validate.real(raw.get("storage_total_cost"))
    if storage is None:
        total, base = validate.price(raw.get("dph_total")), validate.real(raw.get("dph_base"))
        storage = None if total is None or base is None or base < 0 else total - base
    return storage if storage is not None and storage >= 0 else None


def as_integer(value: object) -> int | None:
    """An integer the state file can hold, else None (vast's numbers are hostile too)."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_INTEGER <= value <= MAX_INTEGER:
        return None
    return value


def gpu_count(value: object) -> int | None:
    """A machine's GPU count: a whole number of at least 1 the file can hold, else None (unknown)."""
    count = as_integer(value)
    return count if count is not None and count >= 1 else None


def out_of_range_id(raw: object) -> TypeGuard[dict[str, object]]:
    """An entry whose id is an integer past what the state file holds: dropped from the listing, with a note."""
    if not isinstance(raw, dict):
        return False
    value = raw.get("id")
    return isinstance(value, HugeInteger) or (isinstance(value, int) and not isinstance(value, bool)
                                                and as_integer(value) is None)


def out_of_range_note(raw: dict[str, object]) -> str:
    digits = str(raw.get("id"))
    shown = digits if len(digits) <= 24 else f"{digits[:12]}…({len(digits)} digits)"
    label = upstream.clip(str(raw.get("label")), 80) if raw.get("label") is not None else "none"
    return (f"vast listing: ignored an instance whose id {shown} is out of range (label {label}): an id past"
            f" {MAX_INTEGER} cannot be stored or acted on; check it at vast")


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and not isinstance(value, HugeInteger) else None


def parse_instance(raw: object, what: str) -> RemoteInstance:
    if not isinstance(raw, dict) or as_integer(raw.get("id")) is None:
        raise ProviderError(f"{what}: an instance without an id; not trusting the answer")
    return RemoteInstance(
        id=raw["id"], label=_text(raw.get("label")), actual_status=_text(raw.get("actual_status")),
        intended_status=_text(raw.get("intended_status")), cur_state=_text(raw.get("cur_state")),
        status_msg=_text(raw.get("status_msg")), machine_id=as_integer(raw.get("machine_id")),
        gpu_name=_text(raw.get("gpu_name")), num_gpus=gpu_count(raw.get("num_gpus")),
        dph_total=validate.price(raw.get("dph_total")), storage_dph=_storage_price(raw),
        start_date=validate.real(raw.get("start_date")), raw=raw,
    )


def refuse_unpriced(rows: list[object], offer_id: int) -> None:
    """The offer asked for by id is listed but without a real price: say so, rather than "not available"."""
    for raw in rows:
        if isinstance(raw, dict) and as_integer(raw.get("id")) == offer_id and validate.price(raw.get("dph_total")) is None:
            shown = upstream.clip(repr(raw.get("dph_total")), 40)
            raise ProviderError(f"vast offer {offer_id}: its price dph_total {shown} is not a finite $/h above 0;"
                                " not renting it")


def instance_facts(instance: RemoteInstance) -> tuple[object, ...]:
    """What reconcile decides on; the same instance listed twice (a page repeated) agrees on all of it."""
    return dataclasses.astuple(dataclasses.replace(instance, raw={}))


def parse_offer(raw: object) -> Offer | None:
    """One offer, or None for a row too incomplete to rent from or without a real price (skipped)."""
    if not isinstance(raw, dict):
        return None
    offer_id, dph = as_integer(raw.get("id")), validate.price(raw.get("dph_total"))
    if offer_id is None or dph is None:
        return None
    ram_mb = validate.real(raw.get("cpu_ram"))
    return Offer(
        id=offer_id, machine_id=as_integer(raw.get("machine_id")), gpu_name=_text(raw.get("gpu_name")) or "?",
        num_gpus=gpu_count(raw.get("num_gpus")) or 1, dph_total=dph,
        cpu_ram_gb=None if ram_mb is None else ram_mb / 1000, inet_down_mbps=validate.real(raw.get("inet_down")),
        reliability=validate.real(raw.get("reliability")), raw=raw,
    )
