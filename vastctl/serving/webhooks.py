"""vast's notification webhooks: verify a delivery, record it once, and wake the safety net soon after.

A delivery (docs/http-api.md, "vast's webhook deliveries") says that something
happened to one of the account's instances (offline, outbid, error detected,
…) in human prose, with no instance id. It is a prompt to look, never the
truth about an instance: what follows it is an ordinary reconcile pass, which
reads vast's own listing, and an agent step, each under the lease cron's
runs take, so never two of one kind at once.

Decisions:
- Checks, in order: size (413), the secret file exists (404: webhooks are
  off), signature over `<X-Vast-Timestamp>.<raw body>` under any secret in
  the file (401), the timestamp within `server.webhook_tolerance` of now
  either way (401: stale or from the future), headers and body (400), then
  the event id. A refused delivery changes nothing and wakes nothing.
- A delivery whose `X-Vast-Event-Id` was accepted before, or whose signed
  part (timestamp and body) was, is answered 200 `{"duplicate": true}` and
  changes nothing: delivery is at-least-once, a retry of an accepted delivery
  is not an error, and a 4xx would read as a permanent failure to vast. The
  id header is not signed, so a captured delivery replayed within the window
  under a fresh id is caught by what is signed; replayed later, it fails the
  timestamp check.
- The secret file is re-read when it changes; one emptied or broken by hand
  (to cut a leaked secret) accepts nothing (503, the log says why) until it
  holds a good secret again: never the old secrets.
- Numbers in headers are ASCII digits only (`²` is not a digit here).
- One event a delivery: kind `webhook`, source `vast`, code the
  `notif_type` slug, reason the slug, subject and message; all of it vast's
  text, so escaped, masked and cut (upstream.clip).
- Wakes are coalesced and rate-limited: deliveries that arrive while a wake
  is running or within `server.webhook_min_interval` of the last one's start
  are served by one more wake. A wake is one reconcile pass, a second one
  later only when the first saw a live machine listed dead or missing (the
  rules kill only when two listings agree and vast's word has held for
  `reconcile.confirm_after` without a heartbeat), then one agent step
  (`--if-events`: the delivery's event is its news). The second listing
  comes `server.webhook_confirm_after` or `reconcile.confirm_after` later,
  whichever is longer: sooner, it could not confirm a kill.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from vastctl import atomicfile, markets, upstream
from vastctl import clock as clocks
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.errors import BadInput, VastctlError
from vastctl.serving import wsgi
from vastctl.state import db, instances, tokens
from vastctl.state.db import transaction
from vastctl.state.lifecycle import record_event

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from vastctl.providers.base import Provider

PATH = "/v1/vast/webhook"
MAX_BODY = 16 * 1024  # vast's bodies are a few hundred bytes
MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 256
MAX_EVENT_ID_CHARS = 128
SLUG_CHARS = 40
REASON_CHARS = 500
LOGGED_EVENT_IDS = 10  # a wake's log line names this many of the deliveries it served, then counts the rest
DELIVERIES_KEPT = timedelta(days=30)  # vast's retries are long over by then; older deliveries are stale anyway
LEASE_RETRIES = 3  # a cron pass holding the lease: try again this many times…
LEASE_RETRY_S = 2.0  # …this far apart, so the pass after the delivery still happens

wake_log = logging.getLogger("vastctl.serve.wake")


class Rejected(wsgi.HTTPError):
    """A delivery refused with an HTTP status; nothing was recorded."""


# --- the secret file -------------------------------------------------------------------------------------

NO_SECRET_FIX = ("store the secret vast showed when the webhook was created with"
                 " `vastctl webhook-secret --add` (it reads the secret from stdin)")


def read_secrets(path: Path) -> list[bytes]:
    """Every secret in the file, newest first; a `# …` comment after a secret is ignored."""
    found = []
    for number, secret, _ in tokens.secret_lines(path, f"no webhook secret at {path}: {NO_SECRET_FIX}"):
        check_secret(secret, f"the webhook secret on line {number} of {path}")
        found.append(secret.encode())
    if not found:
        raise BadInput(f"the webhook secret file {path} holds no secret: {NO_SECRET_FIX}")
    return found


def check_secret(secret: str, what: str = "the webhook secret") -> str:
    if not (MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS) or not secret.isascii() or not secret.isprintable() \
            or any(ch.isspace() or ch == "#" for ch in secret):
        raise BadInput(f"{what} must be {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} printable ASCII characters without"
                       " spaces or '#': paste the secret vast showed for the webhook, on one line")
    return secret


def add_secret(path: Path, secret: str, *, now: datetime) -> int:
    """Put `secret` first (vast's newest); the others keep verifying until retired. Returns how many there are."""
    check_secret(secret)
    lines = path.read_text().splitlines() if path.exists() else []
    kept = [line for line in lines if line.partition("#")[0].strip() not in ("", secret)]
    _write(path, [f"{secret}  # added {clocks.to_iso(now)}", *kept])
    return len(kept) + 1


def retire_old(path: Path) -> int:
    """Keep only the newest secret; returns how many went."""
    lines = [line for line in path.read_text().splitlines() if line.partition("#")[0].strip()]
    if len(lines) > 1:
        _write(path, lines[:1])
    return max(0, len(lines) - 1)


def _write(path: Path, lines: list[str]) -> None:
    """Replace the file in one step, mode 600 (a crash leaves the old file or the new one)."""
    atomicfile.write(path, "".join(line + "\n" for line in lines), mode=0o600)


class Secrets:
    """The file's secrets, re-read when it changes (one stat a delivery), so a rotation needs no restart.

    None while the file is missing: webhooks are off. A file that became broken fails closed: `current()` raises
    Rejected(503) until the file holds a good secret again (the old secrets are not kept), and the log hears why.
    """

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int, int] | None = None  # the file's mtime, size, inode and ctime at the last read
        self._secrets: list[bytes] | None = None
        self._broken: str | None = None

    def current(self) -> list[bytes] | None:
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_ctime_ns)
        except OSError:
            return None
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._secrets, self._broken = read_secrets(self.path), None
                except (BadInput, OSError, UnicodeError) as exc:
                    self._secrets, self._broken = None, upstream.clip(str(exc), 300)
                    wake_log.error("accepting no webhook delivery until the secret file is fixed: %s", exc)
                self._stamp = stamp
            if self._broken is not None:
                raise Rejected(503, f"the webhook secret file is broken, so no delivery is accepted: {self._broken}")
            return self._secrets


def signature(secret: bytes, timestamp: bytes, body: bytes) -> str:
    """vast's `X-Vast-Signature-256` value for a delivery."""
    return "sha256=" + hmac.new(secret, timestamp + b"." + body, hashlib.sha256).hexdigest()


# --- receiving -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    event_id: str
    notif_type: str
    subject: str
    message: str
    attempt: int | None
    signed: str = ""  # sha256 of what the signature covers: "<X-Vast-Timestamp>.<body>"


class Received(TypedDict):
    """The 200 answer to a delivery: recorded now, or a duplicate of one recorded before."""

    ok: bool
    duplicate: bool
    event_id: str


class Receiver:
    """Checks and records deliveries for the HTTP app, and tells the Waker."""

    def __init__(self, config: Config, *, clock: Clock, waker: "Waker | None" = None):
        self.config = config
        self.clock = clock
        self.waker = waker
        self.secrets = Secrets(config.webhook_secret_path)

    def receive(self, environ: WSGIEnvironment, conn: sqlite3.Connection) -> Received:
        """Answer one delivery (200 body), or raise Rejected having changed nothing."""
        body = wsgi.read_body(environ, MAX_BODY, over_limit=_too_large)
        secrets = self.secrets.current()
        if not secrets:
            raise Rejected(404, f"webhooks are off on this manager: {NO_SECRET_FIX}")
        timestamp = environ.get("HTTP_X_VAST_TIMESTAMP", "").strip()
        sent = environ.get("HTTP_X_VAST_SIGNATURE_256", "").strip().lower().encode("latin-1", "replace")
        expected = [signature(secret, timestamp.encode("latin-1", "replace"), body).encode() for secret in secrets]
        if not any([hmac.compare_digest(sent, one) for one in expected]):  # every secret: same time
            raise Rejected(401, "bad or missing X-Vast-Signature-256: check server.webhook_secret_file holds"
                                " the webhook's current secret (`vastctl webhook-secret --add`)")
        now = self.clock.now()
        self.check_fresh(timestamp, now)
        delivery = dataclasses.replace(parse(environ, body), signed=signed_digest(timestamp, body))
        new = record(conn, delivery, now=now)
        if not new:
            return {"ok": True, "duplicate": True, "event_id": delivery.event_id}
        if self.waker is not None:
            self.waker.wake(delivery.event_id)
        return {"ok": True, "duplicate": False, "event_id": delivery.event_id}

    def check_fresh(self, timestamp: str, now: datetime) -> None:
        if not ascii_digits(timestamp) or len(timestamp) > 12:
            raise Rejected(401, "X-Vast-Timestamp must be whole Unix seconds")
        skew = int(timestamp) - now.timestamp()
        tolerance = self.config.server.webhook_tolerance
        if skew < -tolerance:
            raise Rejected(401, f"X-Vast-Timestamp is {int(-skew)}s old, over server.webhook_tolerance"
                                f" ({tolerance:g}s): a stale or replayed delivery")
        if skew > tolerance:
            raise Rejected(401, f"X-Vast-Timestamp is {int(skew)}s in the future, over server.webhook_tolerance"
                                f" ({tolerance:g}s): check this host's clock")


def ascii_digits(text: str) -> bool:
    """0-9 only: str.isdigit() also takes `²` and other digits int() refuses."""
    return text.isascii() and text.isdigit()


def _too_large(length: int, limit: int) -> Rejected:
    return Rejected(413, f"body of {length} bytes is over the {limit // 1024} KiB limit for a delivery")


def parse(environ: WSGIEnvironment, body: bytes) -> Delivery:
    """The signed delivery's fields, checked; Rejected(400) for anything malformed."""
    event_id = environ.get("HTTP_X_VAST_EVENT_ID", "").strip()
    if not event_id or len(event_id) > MAX_EVENT_ID_CHARS or not event_id.isascii() or not event_id.isprintable():
        raise Rejected(400, f"X-Vast-Event-Id must be 1 to {MAX_EVENT_ID_CHARS} printable ASCII characters")
    attempt_text = environ.get("HTTP_X_VAST_DELIVERY_ATTEMPT", "").strip()
    attempt = int(attempt_text) if ascii_digits(attempt_text) and len(attempt_text) <= 6 else None
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=wsgi.refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Rejected(400, "the body is not a JSON object in UTF-8") from None
    if not isinstance(value, dict):
        raise Rejected(400, "the body is not a JSON object")
    if value.get("event_id") is not None and value.get("event_id") != event_id:
        raise Rejected(400, "the body's event_id is not the X-Vast-Event-Id header's")
    texts = {}
    for key in ("notif_type", "subject", "message"):
        text = value.get(key)
        if text is not None and not isinstance(text, str):
            raise Rejected(400, f'the "{key}" field must be text')
        texts[key] = text or ""
    slug = upstream.clip(texts["notif_type"].removeprefix("client:"), SLUG_CHARS) or "unknown"
    return Delivery(event_id=event_id, notif_type=slug, subject=texts["subject"], message=texts["message"],
                    attempt=attempt)


def signed_digest(timestamp: str, body: bytes) -> str:
    return hashlib.sha256(timestamp.encode("latin-1", "replace") + b"." + body).hexdigest()


def record(conn: sqlite3.Connection, delivery: Delivery, *, now: datetime) -> bool:
    """The delivery and its one event, in one transaction; False (and nothing written) for a known event id or
    signed content."""
    parts = [delivery.notif_type, delivery.subject, delivery.message]
    reason = upstream.clip(": ".join(part for part in parts if part.strip()), REASON_CHARS)
    with transaction(conn):
        if conn.execute("SELECT 1 FROM webhook_deliveries WHERE event_id = ? OR signed = ?",
                        (delivery.event_id, delivery.signed or None)).fetchone():
            return False
        event = record_event(conn, kind="webhook", source="vast", reason=reason, now=now, code=delivery.notif_type)
        conn.execute("INSERT INTO webhook_deliveries (event_id, received_at, notif_type, attempt, event, signed)"
                     " VALUES (?, ?, ?, ?, ?, ?)",
                     (delivery.event_id, clocks.to_iso(now), delivery.notif_type, delivery.attempt, event,
                      delivery.signed or None))
        conn.execute("DELETE FROM webhook_deliveries WHERE received_at < ?", (clocks.to_iso(now - DELIVERIES_KEPT),))
    return True


# --- waking the safety net -------------------------------------------------------------------------------


@dataclass
class WakeResult:
    """What one wake did: for the log line and the tests."""

    event_ids: list[str]
    passes: int = 0
    steps: int = 0
    errors: list[str] = field(default_factory=list)


class Waker:
    """One background thread of `serve` that runs the safety net soon after a delivery.

    `wake()` only notes the event id and returns, so the delivery's answer
    never waits on vast. The thread takes every noted id at once, waits out
    `server.webhook_min_interval` since the last wake began (on `clock`), and
    runs the wake (class docstring of the module). Its market comes from
    `make_provider(config, clock=clock)`: markets.get_provider unless given,
    looked up at each wake as every command looks it up.
    """

    def __init__(self, config: Config, *, clock: Clock,
                 make_provider: Callable[..., "Provider"] | None = None,
                 on_done: Callable[[WakeResult], None] | None = None):
        self.config = config
        self.clock = clock
        self.make_provider = make_provider
        self.on_done = on_done or _log_wake
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._signal = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_start: float | None = None

    def wake(self, event_id: str) -> None:
        with self._lock:
            self._pending.append(event_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run_forever, name="vastctl-wake", daemon=True)
                self._thread.start()
        self._signal.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop waiting for wakes; a wake under way is given `timeout` to finish (its leases die with the process)."""
        self._stopping.set()
        self._signal.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _wait(self, seconds: float) -> bool:
        """Sleep, or return True at once when serve is stopping."""
        return self._stopping.wait(max(0.0, seconds))

    def _run_forever(self) -> None:
        while not self._stopping.is_set():
            self._signal.wait()
            if self._stopping.is_set():
                return
            if self._last_start is not None:
                if self._wait(self._last_start + self.config.server.webhook_min_interval - self.clock.monotonic()):
                    return
            with self._lock:
                event_ids, self._pending = self._pending, []
                self._signal.clear()
            if not event_ids:
                continue
            self._last_start = self.clock.monotonic()
            try:
                result = self.run_wake(event_ids)
            except Exception as exc:  # noqa: BLE001 - the thread outlives any one wake
                wake_log.exception("webhook wake failed")
                result = WakeResult(event_ids, errors=[str(exc) or type(exc).__name__])
            self.on_done(result)

    def run_wake(self, event_ids: list[str]) -> WakeResult:
        """A reconcile pass (and its confirming pass), then an agent step, on a connection of this thread."""
        from vastctl import reconcile
        from vastctl.agent import step

        result = WakeResult(list(event_ids))
        conn = db.connect(self.config.db_path, now=self.clock.now())
        try:
            try:
                provider = (self.make_provider or markets.get_provider)(self.config, clock=self.clock)
            except VastctlError as exc:
                result.errors.append(f"cannot reach vast: {exc}")
                return result
            def reconcile_pass() -> None:
                reconcile.run_pass(conn, provider, self.config, clock=self.clock)

            def agent_step() -> None:
                step.run_step(conn, provider, self.config, clock=self.clock, if_events=True)

            if self._under_lease(conn, reconcile.LEASE, reconcile_pass, result):
                result.passes += 1
                if needs_confirmation(conn) and not self._wait(confirm_delay(self.config)):
                    if self._under_lease(conn, reconcile.LEASE, reconcile_pass, result):
                        result.passes += 1
            if self._stopping.is_set():
                return result
            if self._under_lease(conn, step.LEASE, agent_step, result):
                result.steps += 1
        finally:
            conn.close()
        return result

    def _under_lease(self, conn: sqlite3.Connection, lease: str, run: Callable[[], object], result: WakeResult) -> bool:
        """Run `run` (which takes `lease` itself); while cron's run holds it, try again a little later."""
        for attempt in range(LEASE_RETRIES + 1):
            try:
                run()
                return True
            except VastctlError as exc:
                busy = conn.execute("SELECT 1 FROM locks WHERE name = ?", (lease,)).fetchone() is not None
                if not busy or attempt == LEASE_RETRIES or self._wait(LEASE_RETRY_S):
                    result.errors.append(f"{lease}: {exc}")
                    return False
        return False  # pragma: no cover


def confirm_delay(config: Config) -> float:
    """How long after its first listing a wake lists again: no sooner than a kill could be confirmed."""
    return max(config.server.webhook_confirm_after, config.reconcile.confirm_after)


def needs_confirmation(conn: sqlite3.Connection) -> bool:
    """A live machine the last listing showed dead or missing: the next listing decides whether it is killed."""
    return instances.awaiting_confirmation(conn)


def _log_wake(result: WakeResult) -> None:
    shown = result.event_ids[:LOGGED_EVENT_IDS]
    ids = ", ".join(upstream.clip(one, MAX_EVENT_ID_CHARS) for one in shown)
    if len(result.event_ids) > len(shown):
        ids += f", … {len(result.event_ids) - len(shown)} more"
    line = (f"webhook wake for {len(result.event_ids)} delivery(ies) ({ids}): {result.passes} reconcile pass(es),"
            f" {result.steps} agent step(s)")
    if result.errors:
        wake_log.warning("%s; %s", line, "; ".join(upstream.clip(error, 300) for error in result.errors))
    else:
        wake_log.info("%s", line)
