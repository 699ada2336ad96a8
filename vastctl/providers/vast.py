"""The vast.ai REST API behind the Provider interface, spoken as the official vastai client speaks it.

This module owns the HTTP policy: one session, a timeout on every call,
bounded retries with backoff on 429/502/503/504 and transport errors, the key
only in the `Authorization` header, and strict parsing. A listing that failed,
stopped half-way or cannot be parsed raises ProviderError; it is never
returned as an empty or partial fleet (a listing read as "no machines" is a
mass kill).

A create (renting an offer) is retried only when the request surely did not
take effect (a 429, a connect timeout); any other failure of a create is an
unknown outcome and raises plain ProviderError, so the caller keeps its row
and finds the machine by label later instead of renting a second one.

A deadline (`deadline`, on the injected clock) bounds the whole exchange, not
each read: the body is read as it arrives and the clock is checked between
reads, each read waiting no longer than the time left, so an answer sent one
byte a second ends at the deadline like a silent one. Numbers from vast are
hostile too: an instance id the state file cannot hold (SQLite's 64-bit
integers) drops that entry from the listing with a note in `listing_notes`,
and any other such number is read as missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Mapping

import requests
import urllib3

from vastctl import upstream
from vastctl.clock import Clock
from vastctl.errors import BadInput
from vastctl.providers.base import (
    CreateRequest,
    DeadlinePassed,
    Offer,
    OfferGone,
    OfferQuery,
    ProviderError,
    ProviderRejected,
    RemoteInstance,
)
from vastctl.validate import MIN_DPH

DEFAULT_URL = "https://console.vast.ai"
PAGE_SIZE = 25  # the API's maximum for /api/v1/instances/
MAX_PAGES = 400
TIMEOUT_S = (10.0, 60.0)  # (connect, read)
ATTEMPTS = 4
BACKOFF_S = 0.5
BACKOFF_FACTOR = 2.0
MAX_RETRY_AFTER_S = 60.0
RETRY_STATUSES = frozenset({429, 502, 503, 504})
USER_AGENT = "vastctl"
ERROR_CHARS = 300  # upstream text kept in an error message
READ_CHUNK_BYTES = 64 * 1024  # one read of an answer's body; the deadline is checked between reads
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # an answer larger than this is not read to the end, nor trusted
MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER: a number from vast past it cannot be stored, compared or acted on
MIN_INTEGER = -(2**63)


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


class VastProvider:
    """vast.ai through `requests`. Construct with `from_env()` or `markets.get_provider(config)`."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float | tuple[float, float] = TIMEOUT_S,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        clock: Clock,
        deadline: float | None = None,
    ):
        if not api_key:
            raise ValueError("an API key is required")
        self._key = api_key
        upstream.remember_secret(api_key)  # masked in every upstream text this process shows or stores
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.clock = clock  # backoff sleeps and the deadline run on it (a VirtualClock in tests and the simulator)
        self.deadline = deadline  # see base.Provider.deadline
        self.listing_notes: list[str] = []  # entries the last listing left out, and why (reconcile reports them)
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT,
                                     "Accept": "application/json"})

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
        self.listing_notes = []
        token: str | None = None
        seen_tokens: set[str] = set()
        total: Any = None
        for _page in range(MAX_PAGES):
            params = {"select_filters": json.dumps({}), "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                      "limit": PAGE_SIZE}
            if token is not None:
                params["after_token"] = token
            body = self._call("GET", "/api/v1/instances/", params=params)
            rows = body.get("instances")
            if not isinstance(rows, list):
                raise ProviderError("vast listing: the answer has no list of instances; not trusting it")
            for raw in rows:
                if _out_of_range_id(raw):
                    self.listing_notes.append(_out_of_range_note(raw))
                    continue
                instance = _instance(raw, "vast listing")
                earlier = found.setdefault(instance.id, instance)
                if _facts(earlier) != _facts(instance):  # which one is true? neither can be acted on
                    raise ProviderError(f"vast listing: names instance {instance.id} twice with different contents;"
                                        " not trusting it")
            total = body.get("total_instances", total)
            token = body.get("next_token")
            if token in (None, ""):
                break
            if not isinstance(token, str) or token in seen_tokens:
                raise ProviderError("vast listing: the page cursor repeats or is not a string; not trusting it")
            seen_tokens.add(token)
        else:
            raise ProviderError(f"vast listing: more than {MAX_PAGES} pages; not trusting it")
        if isinstance(total, int) and not isinstance(total, bool) and len(found) < total:
            raise ProviderError(f"vast listing: got {len(found)} of {total} instances (partial); not trusting it")
        return sorted(found.values(), key=lambda item: item.id)

    def show_instance(self, vast_id: int) -> RemoteInstance | None:
        try:
            body = self._call("GET", f"/api/v0/instances/{int(vast_id)}/", params={"owner": "me"})
        except _NotFound:
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
        return _instance(raw, f"vast show instance {vast_id}")

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        body = self._call("POST", "/api/v0/bundles/", json=offer_search_body(query))
        rows = body.get("offers")
        if not isinstance(rows, list):
            raise ProviderError("vast offer search: the answer has no list of offers; not trusting it")
        offers = [offer for offer in (_offer(raw) for raw in rows) if offer is not None]
        if query.offer_id is not None:
            offers = [offer for offer in offers if offer.id == query.offer_id]
            if not offers:
                _refuse_unpriced(rows, query.offer_id)
        return sorted(offers, key=lambda offer: offer.dph_total)

    def create_instance(self, request: CreateRequest) -> int:
        path = f"/api/v0/asks/{int(request.offer_id)}/"
        try:
            body = self._call("PUT", path, json=create_body(request), idempotent=False)
        except _NotFound as exc:
            raise OfferGone(f"offer {request.offer_id} is no longer available ({exc})") from None
        contract = _integer(body.get("new_contract"))
        if contract is None or contract < 1:
            # the rental may exist: say "unknown", not "refused"
            raise ProviderError(f"vast create on offer {request.offer_id}: answered without an instance id;"
                                " the outcome is unknown")
        if request.price is not None:
            self._check_bid(contract, request)
        return contract

    def _check_bid(self, vast_id: int, request: CreateRequest) -> None:
        """The create answer does not echo the rental type, and a dropped bid yields an on-demand instance
        (vast-api.md "Interruptible"): look at the instance. One listed as not a bid is destroyed and the
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
        except _NotFound as exc:
            raise ProviderRejected(f"vast change-bid of instance {vast_id}: no such instance ({exc})") from None

    def destroy_instance(self, vast_id: int) -> None:
        """DELETE; an instance vast no longer has (confirmed by a show) counts as destroyed."""
        try:
            self._call("DELETE", f"/api/v0/instances/{int(vast_id)}/", json={})
            return
        except (_NotFound, ProviderRejected) as exc:
            refusal = exc
        remote = self.show_instance(vast_id)
        if remote is None or remote.cur_state == "unloaded":
            return
        raise ProviderRejected(f"vast destroy of instance {vast_id} refused: {refusal}")

    def stop_instance(self, vast_id: int) -> None:
        self._manage(vast_id, {"state": "stopped"}, "stop")

    def start_instance(self, vast_id: int) -> None:
        self._manage(vast_id, {"state": "running"}, "start")

    def set_label(self, vast_id: int, label: str) -> None:
        self._manage(vast_id, {"label": label}, "label")

    # --- HTTP policy -----------------------------------------------------------------------------

    def _manage(self, vast_id: int, body: dict[str, Any], what: str) -> None:
        try:
            self._call("PUT", f"/api/v0/instances/{int(vast_id)}/", json=body)
        except _NotFound as exc:
            raise ProviderRejected(f"vast {what} of instance {vast_id}: no such instance ({exc})") from None

    def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              json: Any = None, idempotent: bool = True) -> dict[str, Any]:
        """One API call with the retry policy; the parsed JSON object of a successful answer."""
        what = f"vast {method} {path}"
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts
            timeout = self._timeout_within_deadline(what)
            try:
                response = self._headers_within_deadline(
                    lambda: self.session.request(method, self.base_url + path, params=params, json=json,
                                                 timeout=timeout, allow_redirects=False, stream=True),
                    what, idempotent)
                self._read_within_deadline(response, what, idempotent)
            except requests.ConnectTimeout as exc:  # never connected: nothing was sent
                failure = f"could not connect ({self._scrub(exc)})"
                if last:
                    raise ProviderError(f"{what}: {failure}: retry later") from None
            except (requests.ConnectionError, requests.Timeout) as exc:
                if not idempotent:
                    raise ProviderError(f"{what}: {type(exc).__name__} ({self._scrub(exc)}); the outcome is"
                                        " unknown") from None
                failure = f"unreachable after {attempt} attempts ({type(exc).__name__})"
                if last:
                    raise ProviderError(f"{what}: {failure}: retry later") from None
            except requests.RequestException as exc:
                raise ProviderError(f"{what}: {type(exc).__name__} ({self._scrub(exc)})") from None
            else:
                status = response.status_code
                if status not in RETRY_STATUSES:
                    return self._answer(response, what)
                code, message = self._error_of(response)
                if status == 429 and code == "search_quota_exceeded":
                    reset = self._scrub(response.headers.get("X-RateLimit-Reset", "UTC midnight"))
                    raise ProviderRejected(f"{what}: the daily search quota is used up (resets {reset})")
                retryable = status == 429 or idempotent
                if last or not retryable:
                    text = self._scrub(message or code or response.reason or "")
                    if status == 429:
                        raise ProviderRejected(f"{what}: still rate-limited (429) after {attempt} attempts: {text}")
                    raise ProviderError(f"{what}: HTTP {status} {text}"
                                        + ("; retry later" if idempotent else "; the outcome is unknown"))
                failure = f"HTTP {status} after {attempt} attempts"
                delay = max(delay, _retry_after(response) or 0.0)
            self._sleep_within_deadline(delay, what, failure)
            delay *= BACKOFF_FACTOR
        raise AssertionError("unreachable")  # pragma: no cover

    def _timeout_within_deadline(self, what: str) -> float | tuple[float, float]:
        """The request timeout, shortened so that a hung call ends by the deadline; none is started past it."""
        if self.deadline is None:
            return self.timeout
        left = self.deadline - self.clock.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"{what}: not called: the deadline had passed")
        if isinstance(self.timeout, tuple):
            return tuple(min(part, left) for part in self.timeout)  # type: ignore[return-value]
        return min(self.timeout, left)

    def _headers_within_deadline(self, send: Callable[[], requests.Response], what: str,
                                 idempotent: bool) -> requests.Response:
        """The status line and headers, by the deadline. requests bounds each read, not the wait for the headers,
        so a server trickling them a byte at a time would outlast any deadline: the call runs on a worker thread,
        and at the deadline it is abandoned (the thread ends with its socket's own timeout; the process goes on)."""
        if self.deadline is None:
            return send()
        left = self.deadline - self.clock.monotonic()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["response"] = send()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it was
                outcome["error"] = exc

        worker = threading.Thread(target=run, name="vast-call", daemon=True)
        worker.start()
        worker.join(max(left, 0.0))
        if worker.is_alive():
            if idempotent:
                raise DeadlinePassed(f"{what}: its status line and headers were still arriving at the deadline;"
                                     " abandoned")
            raise ProviderError(f"{what}: its status line and headers were still arriving at the deadline; the"
                                " outcome is unknown")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["response"]

    def _read_within_deadline(self, response: requests.Response, what: str, idempotent: bool) -> None:
        """Read the answer's body as it arrives, each read waiting at most the time left; past the deadline
        the answer is abandoned (DeadlinePassed, or an unknown outcome for a create). The body is then
        the response's content, as if requests had read it."""
        read_timeout = self.timeout[1] if isinstance(self.timeout, tuple) else self.timeout
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                if self.deadline is not None:
                    left = self.deadline - self.clock.monotonic()
                    if left <= 0:
                        if idempotent:
                            raise DeadlinePassed(f"{what}: the answer was still arriving at the deadline"
                                                 f" ({size} bytes read); abandoned")
                        raise ProviderError(f"{what}: the answer was still arriving at the deadline; the outcome"
                                            " is unknown")
                    _set_read_timeout(response, min(read_timeout, left))
                chunk = response.raw.read1(READ_CHUNK_BYTES, decode_content=True)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ProviderError(f"{what}: the answer is larger than {MAX_ANSWER_BYTES} bytes; not trusting it")
        except urllib3.exceptions.ReadTimeoutError as exc:
            response.close()  # an answer abandoned half-way: its connection is dropped, not reused
            raise requests.ReadTimeout(str(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            response.close()
            raise requests.ConnectionError(str(exc)) from None
        except BaseException:
            response.close()
            raise
        response._content = b"".join(chunks)  # what requests' .json() and .text read
        setattr(response, "_content_consumed", True)  # requests' private flag: the body is read
        response.close()  # read to the end: the connection goes back to the session's pool

    def _sleep_within_deadline(self, delay: float, what: str, failure: str) -> None:
        """Back off before a retry, unless the wait (a Retry-After included) would end past the deadline."""
        if self.deadline is not None and self.clock.monotonic() + delay > self.deadline:
            raise DeadlinePassed(f"{what}: {failure}; not retried: waiting {delay:g}s more would pass the deadline")
        self.clock.sleep(delay)

    def _answer(self, response: requests.Response, what: str) -> dict[str, Any]:
        status = response.status_code
        if 300 <= status < 400:
            raise ProviderError(f"{what}: redirected (HTTP {status}); not following it with the key:"
                                " check VAST_API_URL")
        if status >= 400:
            code, message = self._error_of(response)
            text = self._scrub(message or code or response.reason or "")
            if status in (404, 410) and code in ("no_such_ask", "no_such_instance"):
                raise _NotFound(f"HTTP {status} {code}: {text}")
            if status == 401 or (status == 404 and "user key" in text.lower()):
                raise ProviderRejected(f"{what}: vast refused the API key (HTTP {status} {text}):"
                                       " check VAST_API_KEY")
            if status >= 500:
                raise ProviderError(f"{what}: HTTP {status} {text}: retry later")
            raise ProviderRejected(f"{what}: HTTP {status} {code + ': ' if code else ''}{text}")
        try:
            body = response.json(parse_int=_parse_int)
        except ValueError:
            raise ProviderError(f"{what}: the answer is not valid JSON (truncated?); not trusting it") from None
        if not isinstance(body, dict):
            raise ProviderError(f"{what}: the answer is not a JSON object; not trusting it")
        if body.get("success") is False:
            try:
                code, message = _error_fields(self._masked(body))
            except RecursionError:  # nested past any real error body: nothing of it is read
                code, message = "", ""
            text = self._scrub(message or code or "no reason given")
            if code in ("no_such_ask", "no_such_instance"):
                raise _NotFound(f"{code}: {text}")
            raise ProviderRejected(f"{what}: vast said no ({text})")
        return body

    def _scrub(self, text: Any) -> str:
        """Error text as we pass it on: one line, the key masked before it is bounded (upstream.clip)."""
        return upstream.clip(str(text).replace(self._key, upstream.MASK), ERROR_CHARS)

    def _masked(self, value: Any) -> Any:
        """An error body with the key and token-like text masked in every string, keys and nested values too:
        whichever field vast (or a proxy) echoed the request into, no part of it is used unmasked."""
        if isinstance(value, str):
            return upstream.mask(value.replace(self._key, upstream.MASK))
        if isinstance(value, dict):
            return {self._masked(str(k)): self._masked(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._masked(item) for item in value]
        return value

    def _error_of(self, response: requests.Response) -> tuple[str, str]:
        """(error code, message) of a failed answer, every field of its body masked before either is read;
        each is bounded by the caller's _scrub."""
        try:
            body = self._masked(response.json())
        except (ValueError, RecursionError):  # not JSON, or nested past any real error body
            return "", response.text  # whole: cut only after the key is masked (_scrub)
        if not isinstance(body, dict):
            return "", str(body)
        code, message = _error_fields(body)
        return self._scrub(code) if code else "", message


class _NotFound(ProviderRejected):
    """vast says the ask or instance does not exist (404/410 no_such_*)."""


def _error_fields(body: dict[str, Any]) -> tuple[str, str]:
    """The error code and the message of a (masked) error body."""
    return str(body.get("error") or ""), str(body.get("msg") or body.get("message") or body.get("detail") or "")


def _set_read_timeout(response: requests.Response, seconds: float) -> None:
    """The socket's timeout for the next read of this answer (each read may wait at most the time left)."""
    sock = getattr(getattr(response.raw, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.settimeout(max(seconds, 0.001))
        except OSError:
            pass


class _HugeInteger(str):
    """A JSON integer too long to be worth converting: its digits (for the note, and for json.dumps of the raw
    entry); no integer or text field accepts it."""


def _parse_int(digits: str) -> int | _HugeInteger:
    """JSON integers as Python ints, except absurdly long ones (Python refuses 4,300+ digits: the whole answer
    would fail to parse for one hostile number)."""
    return _HugeInteger(digits) if len(digits.lstrip("-")) > 40 else int(digits)


def _retry_after(response: requests.Response) -> float | None:
    try:
        value = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= MAX_RETRY_AFTER_S else None


def offer_search_body(query: OfferQuery) -> dict[str, Any]:
    """The POST /api/v0/bundles/ body: filters as {op: value}, cheapest first."""
    body: dict[str, Any] = {"rentable": {"eq": True}}
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


def bid_price(price: Any) -> float:
    """A bid as vast accepts it: a finite $/h within BID_RANGE, to 4 decimals; BadInput otherwise."""
    low, high = BID_RANGE
    if (isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price)
            or not low <= price <= high):
        raise BadInput(f"a bid must be a number of $/h from {low:g} to {high:g}, got {price!r}")
    return round(float(price), 4)


def create_body(request: CreateRequest) -> dict[str, Any]:
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


def _number(value: Any) -> float | None:
    """A finite JSON number, else None: vast's JSON may carry NaN, Infinity or 1e400, and none of them is a figure."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past float range
        return None
    return number if math.isfinite(number) else None


def _price(value: Any) -> float | None:
    """A $/h vast quotes: finite and at least MIN_DPH, else None. A NaN compares false against every limit, and
    a negative price or one of 1e-320 lowers (or adds nothing to) the spend the guard adds up, so none is a price."""
    number = _number(value)
    return number if number is not None and number >= MIN_DPH else None


def _storage_price(raw: Mapping[str, Any]) -> float | None:
    """$/h the allocated disk bills (all a stopped instance costs): `storage_total_cost`, else dph_total − dph_base."""
    storage = _number(raw.get("storage_total_cost"))
    if storage is None:
        total, base = _price(raw.get("dph_total")), _number(raw.get("dph_base"))
        storage = None if total is None or base is None or base < 0 else total - base
    return storage if storage is not None and storage >= 0 else None


def _integer(value: Any) -> int | None:
    """An integer the state file can hold, else None (vast's numbers are hostile too)."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_INTEGER <= value <= MAX_INTEGER:
        return None
    return value


def _out_of_range_id(raw: Any) -> bool:
    """An entry whose id is an integer past what the state file holds: dropped from the listing, with a note."""
    if not isinstance(raw, dict):
        return False
    value = raw.get("id")
    return isinstance(value, _HugeInteger) or (isinstance(value, int) and not isinstance(value, bool)
                                                and _integer(value) is None)


def _out_of_range_note(raw: dict) -> str:
    digits = str(raw.get("id"))
    shown = digits if len(digits) <= 24 else f"{digits[:12]}…({len(digits)} digits)"
    label = upstream.clip(str(raw.get("label")), 80) if raw.get("label") is not None else "none"
    return (f"vast listing: ignored an instance whose id {shown} is out of range (label {label}): an id past"
            f" {MAX_INTEGER} cannot be stored or acted on; check it at vast")


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and not isinstance(value, _HugeInteger) else None


def _instance(raw: Any, what: str) -> RemoteInstance:
    if not isinstance(raw, dict) or _integer(raw.get("id")) is None:
        raise ProviderError(f"{what}: an instance without an id; not trusting the answer")
    return RemoteInstance(
        id=raw["id"], label=_text(raw.get("label")), actual_status=_text(raw.get("actual_status")),
        intended_status=_text(raw.get("intended_status")), cur_state=_text(raw.get("cur_state")),
        status_msg=_text(raw.get("status_msg")), machine_id=_integer(raw.get("machine_id")),
        gpu_name=_text(raw.get("gpu_name")), num_gpus=_integer(raw.get("num_gpus")),
        dph_total=_price(raw.get("dph_total")), storage_dph=_storage_price(raw),
        start_date=_number(raw.get("start_date")), raw=raw,
    )


def _refuse_unpriced(rows: list, offer_id: int) -> None:
    """The offer asked for by id is listed but without a real price: say so, rather than "not available"."""
    for raw in rows:
        if isinstance(raw, dict) and _integer(raw.get("id")) == offer_id and _price(raw.get("dph_total")) is None:
            shown = upstream.clip(repr(raw.get("dph_total")), 40)
            raise ProviderError(f"vast offer {offer_id}: its price dph_total {shown} is not a finite $/h above 0;"
                                " not renting it")


def _facts(instance: RemoteInstance) -> tuple:
    """What reconcile decides on; the same instance listed twice (a page repeated) agrees on all of it."""
    return dataclasses.astuple(dataclasses.replace(instance, raw={}))


def _offer(raw: Any) -> Offer | None:
    """One offer, or None for a row too incomplete to rent from or without a real price (skipped)."""
    if not isinstance(raw, dict):
        return None
    offer_id, dph = _integer(raw.get("id")), _price(raw.get("dph_total"))
    if offer_id is None or dph is None:
        return None
    ram_mb = _number(raw.get("cpu_ram"))
    return Offer(
        id=offer_id, machine_id=_integer(raw.get("machine_id")), gpu_name=_text(raw.get("gpu_name")) or "?",
        num_gpus=_integer(raw.get("num_gpus")) or 1, dph_total=dph,
        cpu_ram_gb=None if ram_mb is None else ram_mb / 1000, inet_down_mbps=_number(raw.get("inet_down")),
        reliability=_number(raw.get("reliability")), raw=raw,
    )
