"""`vastctl serve`: the HTTP endpoint rented machines report to.

A small WSGI app maps each request onto reports.LocalReports, the same
functions the local commands call, so a report over HTTP behaves exactly like
one typed on the manager: same validation, same idempotence, one event per
real change. waitress serves it: its event loop reads each request in full
before a worker thread sees it, so slow clients hold no worker, and it caps
header and body sizes before anything is buffered. transport.py holds
what serve changes in waitress (double framing refused, the request deadline,
an epoll event loop); wsgi.py how a request is read (bodies, tokens, methods),
shared with the dashboard.

Decisions the contract leaves open:
- Order of checks: route (404/405), token (401/403), a killed machine (409),
  body (413/400), then the lifecycle (404 unknown uuid, 409 refused). A
  rejected request changes nothing.
- A token that is not the path uuid's is 403 when it belongs to another known
  instance and 401 otherwise, told apart through tokens.Keyring's index (one
  lookup, whatever the fleet's size).
- A killed or destroyed machine's token is refused with 409 for every request
  (the contract's "refused by the lifecycle": exit 3, give up), except a
  repeat of the bench report that killed it, which gets its answer again.
- Error bodies name body fields (`the "rate" field`), never CLI flags: a
  refusal that names its field (validate.Invalid) is worded here for the
  body (in_api_terms), the uuid as the one in the path.
- `GET /v1/fleet` with `server.admin_token` empty is refused (403) whatever
  the request carries: the fleet view is never open. `?all=1` adds killed rows.
- Bodies over 64 KiB get a JSON 413 from the app; bodies over 1 MiB are
  refused by waitress before they are read (its 413 body is plain text).
- A request framed two ways (Content-Length and Transfer-Encoding, or an
  HTTP/1.0 Transfer-Encoding) is refused by the parser (400, plain text) and
  its connection closed, so nothing sent after it is read as a request.
- A request must arrive in full within `request_timeout` of its first byte
  (a connection trickling a byte at a time is closed), a connection that sends
  nothing for `timeout` is closed, and at most `connection_limit` are open.
- `POST /v1/instances/UUID/log` (`{"name": …, "text": …}`) keeps the tail of
  one of the machine's boot logs (machine_logs: escaped, cut, never run);
  a killed machine may still push until vast confirms its destroy, since its
  logs are what say why it failed.
- `GET /v1/instances/UUID/onstart` answers the boot script a launch pinned by
  its sha256 when it was too long for vast's onstart field (onstart.loader),
  with the same token and killed-machine checks as a report.
- The access log is method, path, status and duration: never headers, query
  strings or bodies, so no token reaches a log.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast
from urllib.parse import parse_qs, unquote

from waitress.adjustments import Adjustments  # only `serve` imports this module: other commands never load waitress
from waitress.server import MultiSocketServer
from waitress.task import ThreadedTaskDispatcher

from vastctl import validate
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.errors import BadInput, BenchFailed, GuardRefused, Refused, Unavailable, UnknownInstance
from vastctl.facts.json_value import JSON
from vastctl.machine import onstart
from vastctl.machine.answers import Answer, Stated
from vastctl.machine.reports import LocalReports
from vastctl.serving import webhooks, wsgi
from vastctl.serving.admin_token_source import admin_token_source
from vastctl.serving.wsgi import HTTPError
from vastctl.state import db, instances, lifecycle, signin, tokens
from vastctl.transport import DeadlineServer
from vastctl.upstream import cut
from vastctl.views import fleet

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

MAX_BODY = 64 * 1024  # the contract's limit: a JSON 413 above it
WAITRESS_MAX_BODY = 1024 * 1024  # waitress refuses larger bodies before reading them
MAX_HEADERS = 16 * 1024
ERROR_CHARS = 500  # an error body's message is cut to this
DEFAULT_PORT = 8080
DEFAULT_THREADS = 1  # every report writes the one SQLite file: more workers only queue on its lock
DEFAULT_TIMEOUT = 30.0  # seconds a connection may sit without sending a byte before it is closed
DEFAULT_REQUEST_TIMEOUT = 10.0  # seconds a request may take to arrive in full, from its first byte
DEFAULT_CONNECTION_LIMIT = 1000  # open connections; past it new ones wait in the listen backlog
REPORTS = ("register", "params-done", "bench-report", "running", "heartbeat")

FieldKind = Literal["text", "int", "number", "bool", "stages", "reason"]

# Body fields each report accepts: name → (kind, minimum). Unknown fields are a 400, so a typo is never ignored.
_FIELDS: dict[str, dict[str, tuple[FieldKind, int]]] = {
    "register": {"label": ("text", 0), "vast_id": ("int", 0), "gpu_name": ("text", 0), "num_gpus": ("int", 1)},
    "params-done": {},
    "bench-report": {"rate": ("number", 0), "failed": ("bool", 0), "reason": ("reason", 0)},
    "running": {"stages": ("stages", 0)},
    "heartbeat": {"proofs_done": ("int", 0)},
}


class ReportFields(TypedDict, total=False):
    """A report's body as _fields() checked it against _FIELDS: a field absent or null is left out."""

    label: str
    vast_id: int
    gpu_name: str
    num_gpus: int
    rate: float
    failed: bool
    reason: str
    stages: dict[str, float]
    proofs_done: int


class Script(str):
    """A body answered as the shell script it is, not as JSON."""


Body = Mapping[str, object] | Script  # a JSON object answered (a report's, the fleet's, an error's), or a script


class App:
    """The WSGI application: routing, auth, JSON in and out, typed errors → status codes.

    `clock` stamps every report and times every request (the system clock from `vastctl serve`).
    """

    def __init__(self, config: Config, keyring: tokens.Keyring, *, clock: Clock, waker: webhooks.Waker | None = None):
        self.config = config
        self.keyring = keyring
        self.clock = clock
        self.webhooks = webhooks.Receiver(config, clock=clock, waker=waker)  # vast's deliveries (webhooks.py)
        self.admin_token = config.server.admin_token.encode()
        self.sign_ins = signin.Throttle(clock)  # the dashboard's failed sign-ins, shared by every request
        self._local = threading.local()  # sqlite3 connections are per thread

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._local.conn = db.connect(self.config.db_path, now=self.clock.now())
            except Exception as exc:  # the manager's problem, not the caller's: 503 so boot scripts retry
                wsgi.access_log.error("cannot open the state file: %s", exc)
                raise HTTPError(503, "the manager cannot open its state file: retry later", [("Retry-After", "5")]) from exc
        return conn

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        started = self.clock.monotonic()
        method = environ.get("REQUEST_METHOD", "GET")
        path = wsgi.raw_path(environ)
        from vastctl.serving import dashboard  # the operator's pages and /metrics live in their own module
        if dashboard.owns(method, path):
            return dashboard.serve(self, environ, start_response, method, path)
        headers: list[tuple[str, str]] = []
        body: Body
        try:
            status, body = self.handle(environ, method, path)
        except HTTPError as exc:
            status, body, headers = exc.status, {"error": cut(exc.message, ERROR_CHARS)}, exc.headers
        except Exception as exc:  # noqa: BLE001 - one bad request must never take the server down
            status, body = _status_of(exc), {"error": cut(in_api_terms(exc), ERROR_CHARS), **refused_field(exc)}
            if status == 503:
                headers = [("Retry-After", "1")]
            elif status == 500:
                wsgi.log_unexpected(method, path)
                body = {"error": "internal error: see the manager's log"}
        if isinstance(body, Script):
            payload, kind = body.encode(), "text/x-shellscript; charset=utf-8"
        else:
            payload, kind = json.dumps(body).encode(), "application/json"
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [("Content-Type", kind), ("Content-Length", str(len(payload))), *headers],
        )
        wsgi.log_request(environ, method, path, status, self.clock.monotonic() - started)
        return [payload]

    def handle(self, environ: WSGIEnvironment, method: str, path: str) -> tuple[int, Body]:
        if path == "/healthz":
            wsgi.allow(method, "GET")
            self.connection().execute("SELECT 1").fetchone()
            return 200, {"ok": True}
        if path == "/v1/fleet":
            wsgi.allow(method, "GET")
            self.check_admin(environ)
            query = parse_qs(environ.get("QUERY_STRING", ""))
            include_killed = query.get("all", ["0"])[-1].lower() in ("1", "true", "yes")
            return 200, fleet.fleet_view(self.connection(), self.config, include_killed=include_killed,
                                          now=self.clock.now())
        if path == webhooks.PATH:
            wsgi.allow(method, "POST")
            return 200, self.webhooks.receive(environ, self.connection())  # its refusals are HTTPErrors
        uuid, report = _report_route(path)
        if report == "onstart":  # the boot script itself, for a machine whose onstart is the loader
            wsgi.allow(method, "GET")
            self.check_machine(environ, uuid)
            self.check_retired(uuid, report)
            return 200, Script(onstart.full_script(self.config.launch.onstart))
        wsgi.allow(method, "POST")
        self.check_machine(environ, uuid)
        self.check_retired(uuid, report)
        validate.text(uuid, "uuid")  # the path uuid, checked once where it enters, as _fields checks the body
        if report == "log":
            name, text = _log_fields(wsgi.read_json(environ, MAX_BODY))
            return 200, LocalReports(self.connection(), self.config, now=self.clock.now()).log_push(uuid, name, text)
        return 200, self.report(report, uuid, _fields(report, wsgi.read_json(environ, MAX_BODY)))

    def report(self, report: str, uuid: str, body: ReportFields) -> Answer | Stated:
        reports = LocalReports(self.connection(), self.config, now=self.clock.now())
        if report == "register":
            return reports.register(uuid, label=body.get("label"), vast_id=body.get("vast_id"),
                                    gpu_name=body.get("gpu_name"), num_gpus=body.get("num_gpus"))
        if report == "params-done":
            return reports.params_done(uuid)
        if report == "bench-report":
            if body.get("failed"):  # the boot could not measure a rate: killed with the machine's reason
                if "rate" in body:
                    raise BadInput('bench-report takes "rate" or "failed": true, not both')
                try:
                    reports.bench_failed(uuid, body.get("reason"))
                except BenchFailed as exc:
                    return {"state": exc.row["state"], "passed": False, "reason": str(exc)}
            if "reason" in body:
                raise BadInput('the "reason" field goes with "failed": true (a measured rate needs no reason)')
            if "rate" not in body:
                raise BadInput('bench-report needs the "rate" field (proofs per hour)')
            try:
                return reports.bench_report(uuid, body["rate"])
            except BenchFailed as exc:  # a below-gate bench is an answer, not an error: the machine must stop
                return {"state": exc.row["state"], "passed": False, "reason": str(exc)}
        if report == "running":
            return reports.running(uuid, body.get("stages"))
        return reports.heartbeat(uuid, body.get("proofs_done"))

    def check_machine(self, environ: WSGIEnvironment, uuid: str) -> None:
        """401 without a token or with one of no known machine; 403 with another machine's token."""
        token = wsgi.bearer(environ)
        if token is None:
            raise HTTPError(401, "missing bearer token: send 'Authorization: Bearer <token>'"
                                 " (the manager prints it with `vastctl token --uuid U`)", wsgi.CHALLENGE)
        if self.keyring.matches(uuid, token):
            return
        if self.keyring.owner(token, self._uuids_after) is not None:
            raise HTTPError(403, f"this token belongs to another machine, not to {uuid}: check the uuid and VASTCTL_TOKEN")
        raise HTTPError(401, "invalid token: use the one `vastctl token --uuid U` prints for this uuid", wsgi.CHALLENGE)

    def _uuids_after(self, rowid: int) -> Iterable[tuple[int, str]]:
        """Rows are never deleted, so rows past the highest rowid seen are the machines new since then."""
        return instances.uuids_after(self.connection(), rowid)

    def check_retired(self, uuid: str, report: str) -> None:
        """409 for every request of a killed or destroyed machine: its token no longer speaks for anything.

        The one answer it still gets is a repeat of the bench report that killed
        it, so a retried report still says "below the gate" (exit 5).
        """
        row = instances.find(self.connection(), uuid)
        if row is None or (row["state"] != lifecycle.State.KILLED and not row["destroyed_at"]):
            return
        if report == "bench-report" and row["kill_code"] == "bench_failed":
            return
        if report == "log" and not row["destroyed_at"]:  # a killed machine's last words: why it failed
            return
        gone = "was destroyed" if row["destroyed_at"] else "was killed"
        raise HTTPError(409, f"instance {row['label']} {gone} ({row['kill_reason'] or 'no reason recorded'}):"
                             " its token is no longer accepted; shut the machine down")

    def check_admin(self, environ: WSGIEnvironment) -> None:
        if not self.admin_token:
            raise HTTPError(403, "GET /v1/fleet is disabled: set server.admin_token in the manager's config and restart serve")
        token = wsgi.bearer(environ)
        if token is None or not hmac.compare_digest(token.encode("latin-1"), self.admin_token):
            raise HTTPError(401, "GET /v1/fleet needs 'Authorization: Bearer <server.admin_token>'", wsgi.CHALLENGE)


def _status_of(exc: Exception) -> int:
    if isinstance(exc, UnknownInstance):
        return 404
    if isinstance(exc, BadInput):
        return 400
    if isinstance(exc, (Refused, GuardRefused)):
        return 409
    if isinstance(exc, Unavailable):
        return 503
    return 500


def _report_route(path: str) -> tuple[str, str]:
    parts = path.split("/")
    if (len(parts) == 5 and parts[0] == "" and parts[1:3] == ["v1", "instances"]
            and parts[4] in (*REPORTS, "onstart", "log") and parts[3]):
        uuid = unquote(parts[3].encode("latin-1").decode("utf-8", "replace"))
        return uuid, parts[4]
    raise HTTPError(404, f"no such endpoint {wsgi.loggable(path)}: the endpoints are POST /v1/instances/UUID/REPORT"
                         f" (REPORT: {', '.join(REPORTS)}, log), GET /v1/instances/UUID/onstart,"
                         f" POST {webhooks.PATH}, GET /v1/fleet and GET /healthz")


def _fields(report: str, body: dict[str, JSON]) -> ReportFields:
    """Check the body's fields against the report's schema; null means absent. This is where a report's values
    enter over HTTP, and the one place they are checked there (with the rules the command line uses:
    validate.py's, lifecycle.validate_stages); LocalReports and the lifecycle take them as checked."""
    schema = _FIELDS[report]
    for key in body:
        if key not in schema:
            allowed = ", ".join(f'"{name}"' for name in schema) or "none"
            raise BadInput(f"unknown field {json.dumps(cut(key, 60))} for {report} (allowed: {allowed})")
    values: dict[str, object] = {}
    for key, (kind, minimum) in schema.items():
        value: object = body.get(key)
        if value is None:
            continue
        if kind == "int":
            validate.whole(value, key, minimum=minimum)
        elif kind == "number":  # a JSON number: the text "50" a command line may give is refused here
            value = validate.finite(value, key)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise validate.Invalid(key, f"must be true or false, got {validate.ascii_shown(value)}")
        elif kind == "stages":  # {stage: seconds}: where the boot's time went
            value = lifecycle.validate_stages(value)
        else:
            validate.text(value, key, max_len=lifecycle.REASON_CHARS if kind == "reason" else validate.TEXT_CHARS,
                          utf8=True)
        values[key] = value
    return cast(ReportFields, values)  # each key one of the report's, each value checked as its kind


def _log_fields(body: dict[str, JSON]) -> tuple[str, str]:
    """The log push's body: "name" (one of machine_logs.NAMES, checked here) and "text" (any text; made safe when
    kept)."""
    from vastctl.facts import machine_logs

    unknown = [key for key in body if key not in ("name", "text")]
    if unknown:
        raise BadInput(f'unknown field {json.dumps(cut(unknown[0], 60))} for log (allowed: "name", "text")')
    text = body.get("text")
    if not isinstance(text, str):
        raise validate.Invalid("text", f"must be text (the log's tail), got {validate.ascii_shown(text)}")
    return machine_logs.check_name(body.get("name")), text


def in_api_terms(exc: Exception) -> str:
    """An error's message in the HTTP API's terms: a refused field named as the body field it is (the uuid as
    the one in the path); any other message as it was raised."""
    if isinstance(exc, validate.Invalid):
        return exc.worded("the uuid in the path" if exc.field == "uuid" else f'the "{exc.field}" field')
    return str(exc)


def refused_field(exc: Exception) -> dict[str, str]:
    """A refused value's parts, for a client to word in its own terms (the machine's CLI names its flag):
    `field` (the body field, `uuid` for the one in the path), `reason` (what it must be) and `lead` (what comes
    before the field's name); nothing for any other error."""
    if not isinstance(exc, validate.Invalid):
        return {}
    return {"field": exc.field, "reason": cut(exc.reason, ERROR_CHARS), "lead": cut(exc.lead, ERROR_CHARS)}


# --- running it ------------------------------------------------------------------------------------


def make_server(
    config: Config,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    threads: int = DEFAULT_THREADS,
    timeout: float = DEFAULT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    connection_limit: int = DEFAULT_CONNECTION_LIMIT,
    clock: Clock,
    waker: webhooks.Waker | None = None,
) -> DeadlineServer | MultiSocketServer:
    """A waitress server bound and ready for `.run()`; checks the state file and the token secret first.

    `waker` runs the safety net after a webhook delivery; without one, deliveries are recorded only.
    """
    if request_timeout <= 0:
        raise BadInput(f"--request-timeout must be more than 0 seconds, got {request_timeout:g}")
    if connection_limit < 1:
        raise BadInput(f"--connection-limit must be at least 1, got {connection_limit}")
    _refuse_weak_tokens(config)
    _allow_open_files(connection_limit + 64)  # the listeners, SQLite, the log and a margin
    keyring = tokens.Keyring(config.secret_path, on_error=wsgi.access_log.error)
    db.connect(config.db_path, now=clock.now()).close()  # a missing or broken file fails here, not at the first report
    app = App(config, keyring, clock=clock, waker=waker)
    try:
        adj = Adjustments(
            host=host, port=port, threads=threads, ident="vastctl", connection_limit=connection_limit,
            channel_timeout=timeout, cleanup_interval=max(0.5, min(30.0, timeout / 2, request_timeout / 4)),
            asyncore_use_poll=True,  # select() stops at file descriptor 1024; poll has no such ceiling
            max_request_body_size=WAITRESS_MAX_BODY, max_request_header_size=MAX_HEADERS,
            expose_tracebacks=False, log_untrusted_proxy_headers=False,
            # waitress would drop X-Forwarded-Proto from every peer before the dashboard sees it; the
            # dashboard believes it from server.trusted_proxy only (dashboard.Web.tls), and nothing else reads it
            clear_untrusted_proxy_headers=False,
        )
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(adj.threads)
        sockets: dict[int, Any] = {}  # the socket map the servers share: fd → waitress dispatcher
        servers = [DeadlineServer(app, sockets, dispatcher=dispatcher, adj=adj, sockinfo=sockinfo,
                                   request_timeout=request_timeout, clock=clock) for sockinfo in adj.listen]
    except OSError as exc:
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}"
                          " (another serve running? choose --host/--port)") from exc
    except ValueError as exc:
        raise BadInput(f"cannot listen on {host}:{port}: {exc}") from exc
    if len(servers) == 1:
        return servers[0]
    listening = [(s.effective_host, s.effective_port) for s in servers]
    return MultiSocketServer(sockets, adj, listening, dispatcher, servers[-1].log_info)


def _refuse_weak_tokens(config: Config) -> None:
    """serve does not start with an admin or metrics token a guesser could find (empty turns the feature off)."""
    for key in ("admin_token", "metrics_token"):
        token = getattr(config.server, key)
        why = signin.weakness(token) if token else None
        if why:  # named where it came from: VASTCTL_ADMIN_TOKEN beats the config's key
            name = admin_token_source(config).name if key == "admin_token" else f"server.{key}"
            raise BadInput(f"{name} is too weak to guard the dashboard and /metrics ({why}):"
                           f" set a random one, e.g. the output of `{signin.GENERATE}`")


def _allow_open_files(needed: int) -> None:
    """Raise this process's soft open-file limit to `needed` when the hard limit allows (systemd's soft default is 1024)."""
    try:
        import resource
    except ImportError:  # not on Unix: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise BadInput(f"--connection-limit needs about {needed} open files but this process may open {hard}:"
                       " lower --connection-limit or raise the limit (LimitNOFILE= in the systemd unit)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def listen_urls(server: DeadlineServer | MultiSocketServer) -> list[str]:
    """Where the server listens, with the real port when it was asked for port 0."""
    pairs = getattr(server, "effective_listen", None) or [(server.effective_host, server.effective_port)]
    return [f"http://[{h}]:{p}" if ":" in str(h) else f"http://{h}:{p}" for h, p in pairs]
