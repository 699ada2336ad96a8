"""The operator's pages on `vastctl serve`: the dashboard at `/`, its actions, its static files, `/metrics`.

server.App hands a request here when `owns()` says so; every other path
stays with the machines' API. Routes:

  GET  /                    the dashboard, or the sign-in form without a session
  POST /login               the admin token in a form field → a session cookie (never in a URL)
  POST /logout              end the session: forgotten by the browser and refused by the server
  GET  /dashboard/live      the live part of the page, as HTML, for /static/dashboard.js to swap in
  POST /dashboard/settings  settings.set_value — as `vastctl settings set`
  POST /dashboard/kill      operations.operator_kill — as `vastctl kill` (same reason prefix, code, provider);
                            with force=1 and the confirm box ticked, as `vastctl kill --force`
  POST /dashboard/note      fleet.notify — as `vastctl notify`
  GET  /static/NAME         dashboard.js and dashboard.css (package data)
  GET  /metrics             Prometheus text; bearer server.admin_token or server.metrics_token; its refusals and
                            errors are {"error": …} JSON like the machines' API (a scraper is not a browser)

Sessions are signed, not stored: the cookie holds a random id and an expiry
under an HMAC keyed by the token secret and the admin token, so a restart
keeps operators signed in and changing server.admin_token signs everyone out.
Signing out records the session id in the state file (signin.end_session),
so a copy of the cookie taken before is refused from then on. Wrong tokens
are throttled per client and overall (signin.Throttle: 429 with Retry-After),
and serve does not start with a weak admin token (signin.weakness).
The cookie is HttpOnly, SameSite=Strict, and Secure (named `__Host-…`) when
the request came over TLS: wsgi.url_scheme, or X-Forwarded-Proto from the
address in server.trusted_proxy only.

Every POST must look same-origin (Sec-Fetch-Site, when sent, is
`same-origin`; Origin, when sent, names this host) and, once signed in, carry
the session's form token (an HMAC of the session id) in a hidden field. A
refused request changes nothing. An action's outcome, or the typed error that
refused it (GuardRefused, BadInput, Refused, Unavailable), comes back as a
one-line message on the page after a redirect, so a reload never repeats it.
A kill the guard refused under a rule --force passes comes back with a second
step: a form repeating the kill with force=1 and a confirm box to tick (no
script: the policy forbids inline script), recorded as forced like the CLI's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from http import HTTPStatus
from importlib import resources
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from vastctl import clock as clock_module
from vastctl import guard, markets, operations
from vastctl.config import Config
from vastctl.errors import BadInput, GuardRefused, VastctlError
from vastctl.facts import cost, machine_logs
from vastctl.observe import Observation
from vastctl.serving import dashboard_page as page
from vastctl.serving import wsgi
from vastctl.serving.admin_token_source import admin_token_source
from vastctl.serving.dashboard_data import Flash, Idle, Override, PageData
from vastctl.serving.wsgi import HTTPError
from vastctl.state import settings, signin
from vastctl.upstream import cut
from vastctl.views import fleet, overview

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from vastctl.serving.server import App

SESSION_S = 12 * 3600
FLASH_S = 60
FLASH_BYTES = 2400  # the flash's JSON in UTF-8: base64'd and signed, one cookie stays under 4 KiB
MAX_FORM = 64 * 1024
CONFIRMED = "yes"  # the value of the ticked confirm box of a forced kill
ROUTES = frozenset({"/login", "/logout", "/metrics", "/dashboard/live", "/dashboard/settings", "/dashboard/kill",
                    "/dashboard/note"})
STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = [
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
                                " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),  # no-referrer would make browsers send `Origin: null` on our own forms
    ("Cross-Origin-Opener-Policy", "same-origin"),
]
HTML = "text/html; charset=utf-8"


def owns(method: str, path: str) -> bool:
    """Whether a request is for these pages (POST / stays a 404 of the machines' API)."""
    return (path == "/" and method in ("GET", "HEAD")) or path in ROUTES or path.startswith("/static/")


def serve(app: App, environ: WSGIEnvironment, start_response: StartResponse, method: str, path: str) -> list[bytes]:
    """The WSGI answer for a request `owns()` accepted; logged like every other request of serve."""
    started = app.clock.monotonic()
    web = Web(app.config, app.keyring.secrets()[0], app.connection, clock=app.clock,  # the signing secret (tokens.Keyring)
              throttle=app.sign_ins)
    api = path == "/metrics"  # a scraper, not a browser: its errors are JSON like the machines' API
    try:
        status, headers, body = web.handle(environ, method, path)
    except wsgi.MethodNotAllowed as exc:
        status, headers, body = _error(405, exc.message, api=api, title="Wrong method")
        headers.extend(exc.headers)
    except (BadInput, HTTPError) as exc:
        status, headers, body = _error(exc.status if isinstance(exc, HTTPError) else 400, f"error: {exc}", api=api)
        if isinstance(exc, HTTPError):
            headers.extend(exc.headers)  # a 503's Retry-After: a scraper or a browser retries like a boot script
    except Exception:  # noqa: BLE001 - one bad request must never take the server down
        wsgi.log_unexpected(method, path)
        status, headers, body = _error(500, "internal error: see the manager's log", api=api)
    headers = [*headers, *SECURITY_HEADERS, ("Content-Length", str(len(body)))]
    if not any(name == "Cache-Control" for name, _ in headers):
        headers.append(("Cache-Control", "no-store"))
    start_response(f"{status} {HTTPStatus(status).phrase}", headers)
    wsgi.log_request(environ, method, path, status, app.clock.monotonic() - started)
    return [b"" if method == "HEAD" else body]


Response = tuple[int, list[tuple[str, str]], bytes]


class Web:
    """One request's view of the operator pages: config, token secret, the state file, the clock."""

    def __init__(self, config: Config, secret: bytes, connect: Callable[[], sqlite3.Connection], *,
                 clock: clock_module.Clock, throttle: signin.Throttle | None = None):
        self.config = config
        self.connect = connect
        self.clock = clock
        self.throttle = throttle if throttle is not None else signin.Throttle(clock)
        self.admin_token = config.server.admin_token
        self.token_source = admin_token_source(config)  # named on the sign-in page: where the operator finds it
        self.key = hmac.new(secret, b"vastctl dashboard\0" + self.admin_token.encode(), hashlib.sha256).digest()

    def handle(self, environ: WSGIEnvironment, method: str, path: str) -> Response:
        if path.startswith("/static/"):
            wsgi.allow(method, "GET", head=True)
            return self.static(path.removeprefix("/static/"))
        if path == "/metrics":
            wsgi.allow(method, "GET", head=True)
            return self.metrics(environ)
        if not self.admin_token:
            return _html(403, page.message_page(
                "Dashboard disabled", "set server.admin_token in the manager's config and restart serve"))
        if path == "/":
            return self.home(environ)
        if path == "/dashboard/live":
            wsgi.allow(method, "GET", head=True)
            sid = self.session(environ)
            if sid is None:
                return 401, [("Content-Type", "text/plain; charset=utf-8")], b"signed out: reload to sign in"
            return _html(200, page.live_fragment(self.data()))
        wsgi.allow(method, "POST")
        refused = _cross_site(environ)
        if refused:
            return _html(403, page.message_page("Refused", refused))
        if path == "/login":
            return self.login(environ)
        sid = self.session(environ)
        if sid is None:
            return _html(401, self.sign_in_page("your session ended: sign in again"))
        form = wsgi.read_form(environ, MAX_FORM)
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.form_token(sid).encode()):
            return _html(403, page.message_page("Refused", "this form did not come from your dashboard session:"
                                                           " reload the dashboard and try again"))
        if path == "/logout":
            signin.end_session(self.connect(), sid, expires=self.session_expiry(environ), now=self.clock.now())
            return 303, [("Location", "/"), ("Set-Cookie", self.cookie(environ, SESSION, "", 0))], b""
        flash: Flash
        try:
            flash = {"kind": "ok", "text": self.act(path, form)}
        except VastctlError as exc:
            flash = {"kind": "error", "text": f"error: {exc}"}
            override = _override(path, form, exc)
            if override:
                flash["override"] = override
        return 303, [("Location", "/"), ("Set-Cookie", self.cookie(environ, FLASH, self.sign_flash(flash), FLASH_S))], b""

    # --- pages ------------------------------------------------------------------------------------

    def home(self, environ: WSGIEnvironment) -> Response:
        sid = self.session(environ)
        if sid is None:
            return _html(200, self.sign_in_page())
        flash = self.read_flash(environ)
        headers = [("Content-Type", HTML)]
        if flash is not None:
            headers.append(("Set-Cookie", self.cookie(environ, FLASH, "", 0)))
        past = self.clock.moment if isinstance(self.clock, clock_module.StillClock) else None
        return 200, headers, page.dashboard_page(self.data(), csrf=self.form_token(sid), flash=flash, past=past).encode()

    def data(self) -> PageData:
        return page_data(self.connect(), self.config, self.clock.now())

    def static(self, name: str) -> Response:
        if name not in STATIC:
            return 404, [("Content-Type", "text/plain; charset=utf-8")], b"no such file"
        body = resources.files("vastctl.serving").joinpath("static", name).read_bytes()
        return 200, [("Content-Type", STATIC[name]), ("Cache-Control", "no-cache")], body

    def metrics(self, environ: WSGIEnvironment) -> Response:
        tokens = [t for t in (self.admin_token, self.config.server.metrics_token) if t]
        if not tokens:
            return _json(403, "GET /metrics is disabled: set server.metrics_token (or server.admin_token)")
        given = wsgi.bearer(environ)
        if given is None or not any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens):
            status, headers, body = _json(401, "GET /metrics needs 'Authorization: Bearer <server.metrics_token>'")
            return status, [*headers, *wsgi.CHALLENGE], body
        from vastctl.serving import metrics  # prometheus_client loads only here

        return 200, [("Content-Type", metrics.CONTENT_TYPE)], metrics.render(self.connect(), self.config,
                                                                             self.clock.now())

    # --- sign-in ----------------------------------------------------------------------------------

    def login(self, environ: WSGIEnvironment) -> Response:
        client = self.client(environ)
        wait = self.throttle.wait(client)
        if wait > 0:  # the token is not looked at: a guess during the wait learns nothing
            return self.throttled(wait)
        given = wsgi.read_form(environ, MAX_FORM).get("token", "")
        if not hmac.compare_digest(given.encode(), self.admin_token.encode()):
            wait = self.throttle.failed(client)
            wsgi.access_log.warning("failed dashboard sign-in from %s", wsgi.loggable(client[:100]))
            later = f"; wait {math.ceil(wait)} s before the next try" if wait > 0 else ""
            return _html(401, self.sign_in_page(f"wrong token: use {self.token_source.text}{later}"))
        self.throttle.succeeded(client)
        sid = secrets.token_urlsafe(24)
        expires = int(self.clock.now().timestamp()) + SESSION_S
        value = f"{sid}.{expires}.{self.mac(f'{sid}.{expires}')}"
        return 303, [("Location", "/"), ("Set-Cookie", self.cookie(environ, SESSION, value, SESSION_S))], b""

    def sign_in_page(self, message: str | None = None) -> str:
        return page.sign_in_page(message, where=self.token_source.html)

    def throttled(self, wait: float) -> Response:
        seconds = max(1, math.ceil(wait))
        text = self.sign_in_page(f"too many wrong tokens: wait {seconds} s, then sign in again")
        return 429, [("Content-Type", HTML), ("Retry-After", str(seconds))], text.encode()

    def session(self, environ: WSGIEnvironment) -> str | None:
        """The session id of a valid, unexpired cookie that was not signed out; None otherwise."""
        signed = self.signed_session(environ)
        if signed is None or int(signed[1]) <= self.clock.now().timestamp():
            return None
        return None if signin.session_ended(self.connect(), signed[0]) else signed[0]

    def signed_session(self, environ: WSGIEnvironment) -> tuple[str, str] | None:
        """(session id, expiry) from a cookie this server signed; None for a missing or forged one."""
        value = _cookies(environ).get(_cookie_name(SESSION, self.tls(environ)), "")
        sid, _, rest = value.partition(".")
        expires, _, mac = rest.partition(".")
        if not (sid and expires.isdigit() and len(expires) < 20 and hmac.compare_digest(mac, self.mac(f"{sid}.{expires}"))):
            return None
        return sid, expires

    def session_expiry(self, environ: WSGIEnvironment) -> datetime:
        """When the presented session would have expired (until then its sign-out must be remembered)."""
        signed = self.signed_session(environ)
        return datetime.fromtimestamp(int(signed[1]), timezone.utc) if signed else self.clock.now()

    def form_token(self, sid: str) -> str:
        return self.mac(f"form\0{sid}")

    def mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def sign_flash(self, flash: Flash) -> str:
        payload = base64.urlsafe_b64encode(_fitted(flash).encode()).decode().rstrip("=")
        return f"{payload}.{self.mac('flash' + payload)}"

    def read_flash(self, environ: WSGIEnvironment) -> Flash | None:
        payload, _, mac = _cookies(environ).get(_cookie_name(FLASH, self.tls(environ)), "").partition(".")
        if not payload or not hmac.compare_digest(mac, self.mac("flash" + payload)):
            return None
        try:
            flash = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        return cast(Flash, flash) if isinstance(flash, dict) else None  # signed by us: a Flash sign_flash wrote

    def tls(self, environ: WSGIEnvironment) -> bool:
        """Whether the browser reached us over TLS (directly, or through the configured proxy)."""
        if environ.get("wsgi.url_scheme") == "https":
            return True
        forwarded = environ.get("HTTP_X_FORWARDED_PROTO", "").split(",")[0].strip().lower()
        return self.from_proxy(environ) and forwarded == "https"

    def from_proxy(self, environ: WSGIEnvironment) -> bool:
        trusted = {a.strip() for a in self.config.server.trusted_proxy.split(",") if a.strip()}
        return environ.get("REMOTE_ADDR") in trusted

    def client(self, environ: WSGIEnvironment) -> str:
        """Who signs in, for the throttle: the address the trusted proxy saw (the last X-Forwarded-For hop), else ours."""
        if self.from_proxy(environ):
            forwarded = str(environ.get("HTTP_X_FORWARDED_FOR", "")).split(",")[-1].strip()
            if forwarded:
                return forwarded
        return str(environ.get("REMOTE_ADDR") or "-")

    def cookie(self, environ: WSGIEnvironment, kind: str, value: str, max_age: int) -> str:
        secure = self.tls(environ)
        return (f"{_cookie_name(kind, secure)}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict"
                + ("; Secure" if secure else ""))

    # --- actions: the same library calls as the CLI ----------------------------------------------

    def act(self, path: str, form: dict[str, str]) -> str:
        conn = self.connect()
        if path == "/dashboard/settings":
            key, value = form.get("key", ""), form.get("value", "").strip()
            changed = settings.set_value(conn, self.config, key, value, now=self.clock.now())
            return f"{key} = {settings.parse_value(key, value):g}" + ("" if changed else " (unchanged)")
        if path == "/dashboard/note":
            return f"note {fleet.notify(conn, form.get('text', ''), now=self.clock.now())} left for the agent"
        if path == "/dashboard/kill":
            force = form.get("force") == "1"
            if force and form.get("confirm") != CONFIRMED:
                raise BadInput("a kill past the guard needs its confirm box ticked: tick it and submit again")
            return self.kill(conn, form.get("instance", "").strip(), form.get("reason", "").strip(), force=force)
        raise BadInput(f"no such action {path}")

    def kill(self, conn: sqlite3.Connection, instance: str, reason: str, *, force: bool = False) -> str:
        """`vastctl kill INSTANCE --reason R [--force]`: marked killed with the operator's reason, then destroyed
        at vast."""
        if not instance:
            raise BadInput("name the machine to kill: its label or uuid")
        row, error = operations.operator_kill(
            conn, self.config, instance, reason, force=force, now=self.clock.now(),
            make_provider=lambda config: markets.get_provider(config, clock=self.clock))
        forced = " (forced past the guard)" if row.get("kill_forced") else ""
        if error:
            raise VastctlError(f"{row['label']} is killed{forced} but not yet destroyed at vast ({error});"
                               " reconcile retries")
        destroyed = f"; vast instance {row['vast_id']} destroyed" if row["vast_id"] is not None else ""
        return f"{row['label']} killed{forced}{destroyed}"


SESSION, FLASH = "session", "flash"


def page_data(conn: sqlite3.Connection, config: Config, now: datetime) -> PageData:
    """What the page shows: overview's figures, the cost account and the machines' log tails (the CLI's calls)."""
    data = overview.overview(conn, config, now, steps=page.STEPS_READ)
    warm = [guard.warm(m, config, now) for m in data["observation"].machines]  # read once, for both figures
    router = data["summary"]["router"]  # fleet --json's summary.router, read once by overview
    return {
        **data,
        "cost": cost.account(conn, now=now),  # `vastctl cost`
        "cost_day": cost.account(conn, now=now, since=now - overview.HISTORY),  # `vastctl cost --since 24h`
        "spent_today": data["observation"].spent(),  # `vastctl cost --since` 00:00 UTC: max_daily_spend's
        "warm": sum(warm),
        "agent": {"max_wait_s": config.agent.max_wait, "min_machines": config.agent.min_machines,
                  "interval_s": config.agent.interval},
        "idle": _idle(data["observation"], warm),
        "router": router if router["router_running"] or router["proof_wait_last_day"]["calls"] else None,
        "logs": machine_logs.recent(conn),
    }


def _idle(obs: "Observation", warm: list[bool]) -> Idle:
    """$/h billed by what proves nothing and is not booting (not guard.warm: `warm`, per machine of the
    observation): stopped disks, kept on purpose, and the rest (killed awaiting vast's destroy, dead or missing at
    vast, silent, instances of ours no row stands for)."""
    stopped = lost = 0.0
    for machine, proving in zip(obs.machines, warm):
        if proving:
            continue
        billed = float(machine.get("billed_per_hour") or 0.0)
        if machine["state"] == "stopped":
            stopped += billed
        else:
            lost += billed
    unlisted = obs.spend_per_hour - sum(float(m.get("billed_per_hour") or 0.0) for m in obs.machines)
    return {"stopped": round(stopped, 4), "lost": round(lost + max(0.0, unlisted), 4)}


def _override(path: str, form: dict[str, str], exc: VastctlError) -> Override | None:
    """The second step offered after a kill the guard refused under a rule an operator may force past."""
    if path != "/dashboard/kill" or not isinstance(exc, GuardRefused) or exc.limit not in guard.FORCEABLE:
        return None
    if form.get("force") == "1":
        return None
    return {"instance": form.get("instance", "").strip(), "reason": form.get("reason", "").strip(),
            "limit": exc.limit}


def _fitted(flash: Flash) -> str:
    """The flash as JSON of at most FLASH_BYTES in UTF-8 (one cookie, base64'd). Its text is cut to fit, never
    the JSON (which would no longer parse); an override too long to carry loses its reason first (the second
    step then asks for it again), and is dropped only when even that cannot fit."""
    text = str(flash.get("text", ""))
    override = flash.get("override")
    candidates = [flash]
    if isinstance(override, dict):
        candidates += [{**flash, "override": {**override, "reason": ""}}, {"kind": flash["kind"], "text": flash["text"]}]
    for candidate in candidates:
        keep = len(text)
        while True:
            data = json.dumps({**candidate, "text": cut(text, keep)}, ensure_ascii=False)
            excess = len(data.encode()) - FLASH_BYTES
            if excess <= 0:
                return data
            if keep <= 120:
                break
            keep = max(120, keep - excess)
    return json.dumps({"kind": flash.get("kind", "error"), "text": cut(text, 120)}, ensure_ascii=False)


def _cookie_name(kind: str, secure: bool) -> str:
    return f"__Host-vastctl-{kind}" if secure else f"vastctl-{kind}"


def _cookies(environ: WSGIEnvironment) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in environ.get("HTTP_COOKIE", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name not in found:
            found[name] = value
    return found


def _cross_site(environ: WSGIEnvironment) -> str | None:
    """Why a POST is refused as cross-site, or None. Browsers send one or both headers; curl sends neither."""
    why = "refused: this request came from another site; use the dashboard's own forms"
    fetch_site = environ.get("HTTP_SEC_FETCH_SITE")
    if fetch_site is not None and fetch_site != "same-origin":
        return why
    origin = environ.get("HTTP_ORIGIN")
    if origin is not None:
        host = environ.get("HTTP_HOST", "").lower()
        parts = urlsplit(origin)
        if origin == "null" or parts.scheme not in ("http", "https") or parts.netloc.lower() != host:
            return why
    return None


def _html(status: int, text: str) -> Response:
    return status, [("Content-Type", HTML)], text.encode()


def _json(status: int, message: str) -> Response:
    """An error as the machines' API answers one: `{"error": "…"}`."""
    return status, [("Content-Type", "application/json")], json.dumps({"error": message}).encode()


def _error(status: int, message: str, *, api: bool, title: str = "Error") -> Response:
    """A refused or failed request: JSON for /metrics, a page for a browser."""
    if api:
        return _json(status, message)
    return status, [("Content-Type", HTML)], page.message_page(title, message).encode()

