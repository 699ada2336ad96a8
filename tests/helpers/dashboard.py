"""The dashboard through its WSGI app: a browser that keeps cookies and sends what a same-origin form sends, an app
on a fresh state file, the boot reports that put machines on it, and the `app`, `browser` and `signed_in` fixtures."""

from __future__ import annotations

import io
import re
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html import unescape
from urllib.parse import urlencode

import pytest

from vastctl import clock
from vastctl import config as config_module
from vastctl.machine.reports import LocalReports
from vastctl.serving import server
from vastctl.state import db, tokens

ADMIN = "dashboard-admin-token-0123456789"
HOST = "127.0.0.1:8080"
XSS = "<img src=x onerror=alert(1)>"


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    text: str

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def cookies(self) -> list[str]:
        return [v for k, v in self.headers if k.lower() == "set-cookie"]


@dataclass
class Browser:
    """A cookie jar in front of a WSGI app, sending what a same-origin browser form would send."""

    app: server.App
    scheme: str = "http"
    jar: dict[str, str] = field(default_factory=dict)
    remote: str = "127.0.0.1"

    def request(self, method: str, path: str, form: dict | None = None, *, headers: dict | None = None,
                same_origin: bool = True) -> Answer:
        body = urlencode(form or {}).encode()
        path, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/x-www-form-urlencoded",
            "wsgi.url_scheme": self.scheme, "HTTP_HOST": HOST, "REMOTE_ADDR": self.remote,
        }
        if self.jar:
            environ["HTTP_COOKIE"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        if method == "POST" and same_origin:
            environ.update(HTTP_ORIGIN=f"{self.scheme}://{HOST}", HTTP_SEC_FETCH_SITE="same-origin")
        environ.update(headers or {})
        seen = {}
        chunks = self.app(environ, lambda status, hdrs: seen.update(status=status, headers=hdrs))
        answer = Answer(int(seen["status"].split()[0]), seen["headers"], b"".join(chunks).decode())
        for cookie in answer.cookies():
            name, _, rest = cookie.partition("=")
            value = rest.split(";")[0]
            if "Max-Age=0" in cookie:
                self.jar.pop(name, None)
            else:
                self.jar[name] = value
        return answer

    def get(self, path: str, **kw) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict | None = None, **kw) -> Answer:
        return self.request("POST", path, form, **kw)

    def sign_in(self) -> Answer:
        answer = self.post("/login", {"token": ADMIN})
        assert answer.status == 303, answer.text
        return answer

    def form_token(self) -> str:
        return re.search(r'name="csrf" value="([^"]+)"', self.get("/").text).group(1)

    def act(self, path: str, form: dict) -> str:
        """Submit a dashboard form as the page would; returns the message the page then shows."""
        answer = self.post(path, {"csrf": self.form_token(), **form})
        assert (answer.status, answer.header("Location")) == (303, "/"), answer.text
        page = self.get("/").text
        return unescape(re.search(r'<p class="flash[^"]*"[^>]*>(.*?)</p>', page).group(1))


def make_app(db_path, **server_keys) -> server.App:
    config = config_module.from_mapping({"server": {"admin_token": ADMIN, **server_keys}})
    config.db = str(db_path)
    db.connect(config.db_path, create=True, now=clock.SYSTEM.now()).close()
    tokens.ensure_secret(config.secret_path)
    return server.App(config, tokens.Keyring(config.secret_path), clock=clock.SYSTEM)


@pytest.fixture
def app(db_path):
    return make_app(db_path)


@pytest.fixture
def browser(app):
    return Browser(app)


@pytest.fixture
def signed_in(browser):
    browser.sign_in()
    return browser


def register(app, uuid: str, label: str, **fields):
    """A machine's boot report; a `vast_id` is recorded as a launch records it (a machine's own claim is not)."""
    conn = app.connection()
    reports = LocalReports(conn, app.config, now=clock.SYSTEM.now())
    reports.register(uuid, label=label, gpu_name=fields.get("gpu_name"), num_gpus=fields.get("num_gpus"))
    if fields.get("vast_id") is not None:
        with db.transaction(conn):
            conn.execute("UPDATE instances SET vast_id = ? WHERE uuid = ?", (fields["vast_id"], uuid))


def run_machine(app, uuid: str, label: str, rate: float, vast_id: int) -> None:
    """A machine through its boot reports to running, benched at `rate`."""
    register(app, uuid, label, gpu_name="RTX 4090", vast_id=vast_id)
    reports = LocalReports(app.connection(), app.config, now=clock.SYSTEM.now())
    reports.params_done(uuid)
    reports.bench_report(uuid, rate)
    reports.running(uuid)


def add_step(conn: sqlite3.Connection, at: datetime, **values) -> None:
    """An agent_steps row with the given figures (metrics and the page sum and show them)."""
    row = {"started_at": clock.to_iso(at), "finished_at": clock.to_iso(at + timedelta(seconds=3)),
           "policy": "llm", "outcome": "ok", "observation": "{}", "actions": "[]", "refused": "[]", "errors": "[]",
           "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost": 0.0,
           **values}
    conn.execute(f"INSERT INTO agent_steps ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                 tuple(row.values()))


def section(page: str, ident: str) -> str:
    """The page from the opening tag of its <section id=ident> on."""
    return re.split(f"<section id=\"{ident}\"[^>]*>", page, maxsplit=1)[1]
