"""The vast.ai REST API behind the Provider interface, spoken as the official vastai client speaks it.

What each call asks and how its answer is read: a listing that failed,
stopped half-way or cannot be parsed raises ProviderError; it is never
returned as an empty or partial fleet (a listing read as "no machines" is a
mass kill). The HTTP policy every call goes through (retries, the deadline, the key) is vast_http.py's; the
request bodies and the parsing of instances and offers, vast_mapping.py's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from vastctl.providers.base import (
    CreateRequest,
    Offer,
    OfferGone,
    OfferQuery,
    ProviderError,
    ProviderRejected,
    RemoteInstance,
)
from vastctl.providers.vast_http import DEFAULT_URL, NotFound, VastHttp
from vastctl.providers.vast_mapping import (
    as_integer,
    bid_price,
    create_body,
    instance_facts,
    offer_search_body,
    out_of_range_id,
    out_of_range_note,
    parse_instance,
    parse_offer,
    refuse_unpriced,
)

PAGE_SIZE = 25  # the API's maximum for /api/v1/instances/
MAX_PAGES = 400


def find_api_key(env: Mapping[str, str] | None = None) -> str | None:
    """The key the way the official client finds it: $VAST_API_KEY, else its key files.

    Files, in order: `$XDG_CONFIG_HOME/vastai/vast_api_key` (default
    `~/.config/vastai/vast_api_key`), the legacy `~/.vast_api_key`, and last
    the CLI's 2FA session key `vast_tfa_key` (it expires, so it comes last).
    """
    env = os.environ if env is None else env
    if env.get("VAST_API_KEY", "").strip():
        return env["VAST_API_KEY"].strip()
    home = Path(env.get("HOME") or "~").expanduser()
    config_home = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    for path in (config_home / "vastai" / "vast_api_key", home / ".vast_api_key",
                 config_home / "vastai" / "vast_tfa_key"):
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if key:
            return key
    return None


class VastProvider(VastHttp):
    """vast.ai through `requests`. Construct with `from_env()` or `markets.get_provider(config)`."""

    # The entries the last listing left out, and why (reconcile reports them); each listing sets its own.
    # (No __init__ of its own: VastHttp's keyword arguments are checked where a VastProvider is made.)
    listing_notes: Sequence[str] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> "VastProvider | None":
        """From $VAST_API_URL and the key (see find_api_key); None when no key is configured."""
        env = os.environ if env is None else env
        key = find_api_key(env)
        if key is None:
            return None
        return cls(key, env.get("VAST_API_URL") or DEFAULT_URL, **kwargs)

    def __repr__(self) -> str:  # never the key
        return f"VastProvider({self.base_url!r})"

    # --- the Provider interface ------------------------------------------------------------------

    def list_instances(self) -> list[RemoteInstance]:
        """Every instance of ours, all pages of /api/v1/instances/ (ordered by id), or ProviderError."""
        found: dict[int, RemoteInstance] = {}
        notes: list[str] = []
        self.listing_notes = notes
        token: str | None = None
        seen_tokens: set[str] = set()
        total: object = None
        for _page in range(MAX_PAGES):
            params: dict[str, str | int] = {"select_filters": json.dumps({}), "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                      "limit": PAGE_SIZE}
            if token is not None:
                params["after_token"] = token
            body = self._call("GET", "/api/v1/instances/", params=params)
            rows = body.get("instances")
            if not isinstance(rows, list):
                raise ProviderError("vast listing: the answer has no list of instances; not trusting it")
            for raw in rows:
                if out_of_range_id(raw):
                    notes.append(out_of_range_note(raw))
                    continue
                instance = parse_instance(raw, "vast listing")
                earlier = found.setdefault(instance.id, instance)
                if instance_facts(earlier) != instance_facts(instance):  # which one is true? neither can be acted on
                    raise ProviderError(f"vast listing: names instance {instance.id} twice with different contents;"
                                        " not trusting it")
            total = body.get("total_instances", total)
            cursor = body.get("next_token")
            if cursor in (None, ""):
                break
            if not isinstance(cursor, str) or cursor in seen_tokens:
                raise ProviderError("vast listing: the page cursor repeats or is not a string; not trusting it")
            token = cursor
            seen_tokens.add(token)
        else:
            raise ProviderError(f"vast listing: more than {MAX_PAGES} pages; not trusting it")
        if isinstance(total, int) and not isinstance(total, bool) and len(found) < total:
            raise ProviderError(f"vast listing: got {len(found)} of {total} instances (partial); not trusting it")
        return sorted(found.values(), key=lambda item: item.id)

    def show_instance(self, vast_id: int) -> RemoteInstance | None:
        try:
            body = self._call("GET", f"/api/v0/instances/{int(vast_id)}/", params={"owner": "me"})
        except NotFound:
            return None
        if "instances" not in body:
            raise ProviderError(f"vast show instance {vast_id}: the answer has no `instances`; not trusting it")
        raw = body["instances"]
        if raw is None:
            return None
        if isinstance(raw, list):  # tolerate the list form some versions answered with
            if not raw:
                return None
            raw = raw[0]
        return parse_instance(raw, f"vast show instance {vast_id}")

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        body = self._call("POST", "/api/v0/bundles/", json=offer_search_body(query))
        rows = body.get("offers")
        if not isinstance(rows, list):
            raise ProviderError("vast offer search: the answer has no list of offers; not trusting it")
        offers = [offer for offer in (parse_offer(raw) for raw in rows) if offer is not None]
        if query.offer_id is not None:
            offers = [offer for offer in offers if offer.id == query.offer_id]
            if not offers:
                refuse_unpriced(rows, query.offer_id)
        return sorted(offers, key=lambda offer: offer.dph_total)

    def create_instance(self, request: CreateRequest) -> int:
        path = f"/api/v0/asks/{int(request.offer_id)}/"
        try:
            body = self._call("PUT", path, json=create_body(request), idempotent=False)
        except NotFound as exc:
            raise OfferGone(f"offer {request.offer_id} is no longer available ({exc})") from None
        contract = as_integer(body.get("new_contract"))
        if contract is None or contract < 1:
            # the rental may exist: say "unknown", not "refused"
            raise ProviderError(f"vast create on offer {request.offer_id}: answered without an instance id;"
                                " the outcome is unknown")
        if request.price is not None:
            self._check_bid(contract, request)
        return contract

    def _check_bid(self, vast_id: int, request: CreateRequest) -> None:
        """The create answer does not echo the rental type, and a dropped bid yields an on-demand instance
        (docs/interface.md, "interruptible (bid) rentals"): look at the instance. One listed as not a bid is destroyed and the
        create refused, so nothing bills at a price that was not asked; one not listed yet is taken on trust."""
        remote = self.show_instance(vast_id)
        if remote is None or remote.raw.get("is_bid") is not False:
            return
        try:
            self.destroy_instance(vast_id)
        except ProviderError as exc:
            raise ProviderError(f"vast created instance {vast_id} on demand although a bid of"
                                f" ${request.price:g}/h was asked, and destroying it failed ({exc})") from None
        raise ProviderRejected(f"vast created instance {vast_id} on demand although a bid of ${request.price:g}/h"
                               " was asked; destroyed it")

    def change_bid(self, vast_id: int, price: float) -> None:
        """Raise (or lower) an interruptible instance's bid, as the official CLI's `change bid` does."""
        price = bid_price(price)
        try:
            self._call("PUT", f"/api/v0/instances/bid_price/{int(vast_id)}/",
                       json={"client_id": "me", "price": price})
        except NotFound as exc:
            raise ProviderRejected(f"vast change-bid of instance {vast_id}: no such instance ({exc})") from None

    def destroy_instance(self, vast_id: int) -> None:
        """DELETE; an instance vast no longer has (confirmed by a show) counts as destroyed."""
        try:
            self._call("DELETE", f"/api/v0/instances/{int(vast_id)}/", json={})
            return
        except (NotFound, ProviderRejected) as exc:
            refusal = exc
        remote = self.show_instance(vast_id)
        if remote is None or remote.cur_state == "unloaded":
            return
        raise ProviderRejected(f"vast destroy of instance {vast_id} refused: {refusal}")

    def stop_instance(self, vast_id: int) -> None:
        self._manage(vast_id, {"state": "stopped"}, "stop")

    def start_instance(self, vast_id: int) -> None:
        self._manage(vast_id, {"state": "running"}, "start")

    def _manage(self, vast_id: int, body: dict[str, str], what: str) -> None:
        try:
            self._call("PUT", f"/api/v0/instances/{int(vast_id)}/", json=body)
        except NotFound as exc:
            raise ProviderRejected(f"vast {what} of instance {vast_id}: no such instance ({exc})") from None
