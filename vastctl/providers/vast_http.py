"""The HTTP policy toward vast.ai: one session, a timeout on every call, bounded retries, the deadline, strict answers.

One session, a timeout on every call, bounded retries with backoff on 429/502/503/504 and transport errors, the
key only in the `Authorization` header, and strict parsing: an answer that is not a JSON object, or that cannot be
parsed, raises ProviderError. What the calls ask and how their answers map to Offer and RemoteInstance is
vast.py's (the Provider) and vast_mapping.py's.

A create (renting an offer) is retried only when the request surely did not
take effect (a 429, a connect timeout); any other failure of a create is an
unknown outcome and raises plain ProviderError, so the caller keeps its row
and finds the machine by label later instead of renting a second one.

A deadline (`deadline`, on the injected clock) bounds the whole exchange, not
each read: the body is read as it arrives and the clock is checked between
reads, each read waiting no longer than the time left, so an answer sent one
byte a second ends at the deadline like a silent one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TypedDict, cast

import requests
import urllib3

from vastctl import upstream
from vastctl.clock import Clock
from vastctl.providers.base import DeadlinePassed, ProviderError, ProviderRejected

DEFAULT_URL = "https://console.vast.ai"
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


class VastHttp:
    """The calls to vast.ai's API through one `requests` session, with the retry policy and the deadline; the
    base of VastProvider, which says what each call asks."""

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
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT,
                                     "Accept": "application/json"})

    def _call(self, method: str, path: str, *, params: Mapping[str, str | int] | None = None,
              json: object = None, idempotent: bool = True) -> dict[str, object]:
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
        outcome: _Outcome = {}

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
        response: requests.Response = outcome["response"]
        return response

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

    def _answer(self, response: requests.Response, what: str) -> dict[str, object]:
        status = response.status_code
        if 300 <= status < 400:
            raise ProviderError(f"{what}: redirected (HTTP {status}); not following it with the key:"
                                " check VAST_API_URL")
        if status >= 400:
            code, message = self._error_of(response)
            text = self._scrub(message or code or response.reason or "")
            if status in (404, 410) and code in ("no_such_ask", "no_such_instance"):
                raise NotFound(f"HTTP {status} {code}: {text}")
            if status == 401 or code == "auth_error":  # by vast's code; its words ("Invalid user key") are shown
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
                code, message = _error_fields(cast("dict[str, object]", self._masked(body)))  # a dict masks to one
            except RecursionError:  # nested past any real error body: nothing of it is read
                code, message = "", ""
            text = self._scrub(message or code or "no reason given")
            if code in ("no_such_ask", "no_such_instance"):
                raise NotFound(f"{code}: {text}")
            raise ProviderRejected(f"{what}: vast said no ({text})")
        return body

    def _scrub(self, text: object) -> str:
        """Error text as we pass it on: one line, the key masked before it is bounded (upstream.clip)."""
        return upstream.clip(str(text).replace(self._key, upstream.MASK), ERROR_CHARS)

    def _masked(self, value: object) -> object:
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


class _Outcome(TypedDict, total=False):
    """What the worker thread of a call brought back: its answer or what it raised."""

    response: requests.Response
    error: BaseException


class NotFound(ProviderRejected):
    """vast says the ask or instance does not exist (404/410 no_such_*)."""


def _error_fields(body: dict[str, object]) -> tuple[str, str]:
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


class HugeInteger(str):
    """A JSON integer too long to be worth converting: its digits (for the note, and for json.dumps of the raw
    entry); no integer or text field accepts it."""


def _parse_int(digits: str) -> int | HugeInteger:
    """JSON integers as Python ints, except absurdly long ones (Python refuses 4,300+ digits: the whole answer
    would fail to parse for one hostile number)."""
    return HugeInteger(digits) if len(digits.lstrip("-")) > 40 else int(digits)


def _retry_after(response: requests.Response) -> float | None:
    try:
        value = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= MAX_RETRY_AFTER_S else None
