"""Remote mode of the instance reports: HTTP to `vastctl serve` instead of the state file.

Boot scripts report while the manager may be restarting, so an unreachable
manager, a 5xx or a 429 is retried with capped, jittered exponential backoff
for VASTCTL_RETRY_FOR (default 5m): a report made during a restart lands when
the manager is back. Retrying is safe because every report is idempotent on
the manager (the same report twice makes one event). The values arrive checked
where they entered, the command line (lifecycle.py says where each value is checked), so a bad one is exit 2
without a request; the uuid is quoted into the URL. Answers map onto the
contract's exit codes through the typed errors; the token travels only in the
Authorization header and never appears in a message, nor does a user or
password in VASTCTL_SERVER (such a URL is refused: requests would send them as
Basic auth in place of the token).

With VASTCTL_CONTACT_FILE set, every HTTP answer the manager gives (any
status, a 5xx or a 409 included, each retry's too) writes the moment into that
file as whole epoch seconds; a connection that fails or times out writes
nothing. The boot script's dead-man switch reads it: a manager that answers at
all is alive, and only one that has not answered for launch.orphan_after is gone.

The manager's error bodies speak in the HTTP API's terms (`the "rate" field`);
they are shown here in the CLI's (`--rate`), so a remote report fails with the
same line a local one would.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, cast
from urllib.parse import quote, urlsplit

from vastctl import validate
from vastctl.clock import Clock
from vastctl.config import parse_duration
from vastctl.errors import BadInput, BenchFailed, Refused, Unavailable, UnknownInstance
from vastctl.facts.json_value import JSON
from vastctl.machine.answers import Answer
from vastctl.machine.reports import FIELD_FLAGS

if TYPE_CHECKING:
    import requests

DEFAULT_RETRY_FOR = 5 * 60.0
FIRST_DELAY = 0.5
MAX_DELAY = 30.0
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0


class RemoteReports:
    """The `Reports` protocol over HTTP, with retries for an unreachable or failing manager."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        clock: Clock,
        retry_for: float = DEFAULT_RETRY_FOR,
        session: requests.Session | None = None,
        jitter: Callable[[], float] = random.random,
        on_retry: Callable[[str, float, float], None] | None = None,
        contact_file: str | None = None,
    ):
        self.server = _check_server(server)
        self.token = _check_token(token)
        self.retry_for = retry_for
        if session is None:
            import requests  # only remote mode pays for it

            session = requests.Session()
        self.session = session
        self.clock = clock  # the backoff's sleeps and its VASTCTL_RETRY_FOR window
        self.jitter = jitter
        self.on_retry = on_retry
        self.contact_file = contact_file  # where each answer is noted for the dead-man switch (module docstring)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, clock: Clock, **kwargs: Any) -> RemoteReports:
        """VASTCTL_SERVER, VASTCTL_TOKEN and VASTCTL_RETRY_FOR, each checked with a message naming it."""
        token = env.get("VASTCTL_TOKEN") or ""
        if not token:
            raise BadInput("VASTCTL_TOKEN is not set: remote mode (VASTCTL_SERVER) needs this machine's token"
                           " (`vastctl token --uuid U` on the manager)")
        retry_text = env.get("VASTCTL_RETRY_FOR") or ""
        retry_for = parse_duration(retry_text, "VASTCTL_RETRY_FOR") if retry_text else DEFAULT_RETRY_FOR
        kwargs.setdefault("contact_file", env.get("VASTCTL_CONTACT_FILE") or None)
        return cls(env.get("VASTCTL_SERVER") or "", token, clock=clock, retry_for=retry_for, **kwargs)

    # --- the five reports (bench-report as a rate, or as a failure) ---------------------------------------------------------------------

    def register(self, uuid: str, *, label: str | None = None, vast_id: int | None = None, gpu_name: str | None = None,
                 num_gpus: int | None = None) -> Answer:
        body = {k: v for k, v in {"label": label, "vast_id": vast_id, "gpu_name": gpu_name,
                                  "num_gpus": num_gpus}.items() if v is not None}
        return self._report(uuid, "register", body)

    def params_done(self, uuid: str) -> Answer:
        return self._report(uuid, "params-done", {})

    def bench_report(self, uuid: str, rate: float) -> Answer:
        answer = self._report(uuid, "bench-report", {"rate": rate})
        if answer.get("passed") is False:
            reason = answer.get("reason")
            error = BenchFailed(reason if isinstance(reason, str) else
                                f"instance {uuid}: bench rate below the gate; it is being killed, do not prove")
            error.row = answer
            raise error
        return answer

    def bench_failed(self, uuid: str, reason: str | None = None) -> NoReturn:
        body: dict[str, JSON] = {"failed": True} if reason is None else {"failed": True, "reason": reason}
        answer = self._report(uuid, "bench-report", body)
        reason = answer.get("reason")
        error = BenchFailed(reason if isinstance(reason, str) else
                            f"instance {uuid}: the bench failed; it is being killed, do not prove")
        error.row = answer
        raise error

    def running(self, uuid: str, stages: Mapping[str, float] | None = None) -> Answer:
        return self._report(uuid, "running", {} if stages is None else {"stages": dict(stages)})

    def heartbeat(self, uuid: str, proofs_done: int | None = None) -> Answer:
        body = {} if proofs_done is None else {"proofs_done": proofs_done}
        return self._report(uuid, "heartbeat", body)

    def log_push(self, uuid: str, name: str, text: str) -> Answer:
        return self._report(uuid, "log", {"name": name, "text": text})

    # --- HTTP ----------------------------------------------------------------------------------

    def _report(self, uuid: str, report: str, body: Mapping[str, JSON]) -> Answer:
        url = f"{self.server}/v1/instances/{quote(uuid, safe='')}/{report}"
        response = self._post_with_retries(url, body)
        return _answer(response, self.server, uuid)

    def _post_with_retries(self, url: str, body: Mapping[str, JSON]) -> requests.Response:
        import requests

        deadline = self.clock.monotonic() + self.retry_for
        delay = FIRST_DELAY
        while True:
            try:
                response = self.session.post(
                    url, json=body, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT), allow_redirects=False,
                    headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
                )
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                problem = _describe(exc)
            except requests.RequestException as exc:
                raise BadInput(f"cannot call the manager at {self.server}: {_describe(exc)}; check VASTCTL_SERVER") from None
            else:
                self._note_contact()
                if response.status_code < 500 and response.status_code != 429:
                    return response
                problem = f"HTTP {response.status_code}{_error_suffix(response)}"
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                waited = f" for {_human(self.retry_for)}" if self.retry_for > 0 else ""
                raise Unavailable(f"the manager at {self.server} did not take the report{waited} ({problem}):"
                                  " retry later (VASTCTL_RETRY_FOR sets how long to keep trying)")
            wait = min(delay * (0.5 + self.jitter() / 2), remaining)
            if self.on_retry is not None:
                self.on_retry(problem, wait, remaining)
            self.clock.sleep(wait)
            delay = min(delay * 2, MAX_DELAY)

    def _note_contact(self) -> None:
        """The manager answered: write when, atomically (the switch never reads half a number).

        Best effort: a full or read-only disk must not turn a delivered report into a failed one."""
        if not self.contact_file:
            return
        part = f"{self.contact_file}.{os.getpid()}.part"  # the switch's last try may race the heartbeat loop
        try:
            with open(part, "w", encoding="ascii") as out:
                out.write(f"{int(self.clock.now().timestamp())}\n")
            os.replace(part, self.contact_file)
        except OSError:
            pass


def _answer(response: requests.Response, server: str, uuid: str) -> Answer:
    """The manager's answer → a result, or the typed error whose exit code the contract names."""
    status = response.status_code
    if 300 <= status < 400:
        where = without_credentials(response.headers.get("Location", "elsewhere"))
        raise BadInput(f"the manager at {server} redirects to {where}: set VASTCTL_SERVER to the final URL")
    if 200 <= status < 300:
        answer = _json(response)
        if not isinstance(answer, dict) or not isinstance(answer.get("state"), str):
            raise BadInput(f"{server} answered {status} without a report result:"
                           " is VASTCTL_SERVER the manager's `vastctl serve`?")
        return cast(Answer, answer)  # its state checked; the rest read with a check where read (bench_report)
    message = _error_text(response)
    if status == 401:
        raise BadInput(f"the manager refused the token ({message}): set VASTCTL_TOKEN to what"
                       f" `vastctl token --uuid {uuid}` prints")
    if status == 403:
        raise BadInput(f"the manager refused the token for {uuid} ({message}): VASTCTL_TOKEN belongs to"
                       " another machine; check --uuid/VASTCTL_UUID")
    if status == 404:  # the lifecycle's own answers: the same line a local report prints
        raise _refused_value(response, validate.NotFound) or UnknownInstance(message)
    if status == 409:
        raise Refused(message)
    if status == 400:
        raise _refused_value(response, validate.Invalid) or BadInput(message)
    raise BadInput(f"the manager at {server} answered {status}: {message}")


def _refused_value(response: requests.Response, kind: type[validate.Invalid]) -> validate.Invalid | None:
    """A 400 (or a 404 for an unknown uuid) naming a refused value by its parts (`field`, `reason`, `lead`:
    serving.server.refused_field) → the same error a local report raises (`kind`: Invalid, or NotFound), so the
    CLI names the field as its flag (`--rate must be …`, `check --uuid`) without reading the manager's wording.
    None when the answer does not carry them."""
    answer = _json(response)
    if not isinstance(answer, dict):
        return None
    field, reason, lead = answer.get("field"), answer.get("reason", ""), answer.get("lead", "")
    if not (isinstance(field, str) and field in FIELD_FLAGS and isinstance(reason, str) and isinstance(lead, str)):
        return None
    return kind(field, reason[:500], lead=lead[:500])


def _json(response: requests.Response) -> JSON:
    try:
        value: JSON = response.json()
        return value
    except ValueError:
        return None


def _error_text(response: requests.Response) -> str:
    error = _error_field(response)
    if error is not None:
        return error[:500]
    return f"HTTP {response.status_code} {response.reason or ''}".strip()


def _error_suffix(response: requests.Response) -> str:
    error = _error_field(response)
    return "" if error is None else f": {error[:200]}"


def _error_field(response: requests.Response) -> str | None:
    """The answer's `error` text; None when the body is no JSON object with one."""
    answer = _json(response)
    error = answer.get("error") if isinstance(answer, dict) else None
    return error if isinstance(error, str) else None


def _describe(exc: Exception) -> str:
    """A short cause without the URL's noise (urllib3 nests the real reason deep inside)."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "Temporary failure in name resolution",
                   "Connection reset", "Remote end closed connection", "certificate verify failed"):
        if marker in text:
            return f"{type(exc).__name__}: {marker}"
    return f"{type(exc).__name__}: {text[:200]}"


def _check_server(server: str) -> str:
    if "@" in server:
        raise BadInput(f"VASTCTL_SERVER must not hold a user or password ({without_credentials(server)}):"
                       " the machine's token is its credential; remove the part up to '@'")
    parts = urlsplit(server.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise BadInput(f"VASTCTL_SERVER must be the manager's URL, like https://manager.example.com, got {server!r}")
    return server.strip().rstrip("/")


def without_credentials(url: str) -> str:
    """The URL with everything between its '//' and its last '@' shown as '…' (never print a password)."""
    scheme, separator, rest = url.strip().partition("//")
    if not separator:
        scheme, rest = "", scheme
    if "@" in rest:
        rest = "…@" + rest.rpartition("@")[2]
    return f"{scheme}{separator}{rest}"


def _check_token(token: str) -> str:
    if not token or len(token) > 1024 or not token.isascii() or not token.isprintable() or " " in token:
        raise BadInput("VASTCTL_TOKEN must be the printable token `vastctl token --uuid U` prints (it is not)")
    return token


def _human(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
