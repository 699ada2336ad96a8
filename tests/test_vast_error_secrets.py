"""The API key echoed back in any field of a vast error body reaches nothing: not stderr, not the events, the
actions, the vast_listings, `fleet --all`, the agent's next prompt nor the dashboard. A loopback fake of vast
answers every call with an error carrying the key."""

from __future__ import annotations

import json
import sqlite3
from http.server import ThreadingHTTPServer

import pytest
from helpers.serving import JsonHandler, on_a_thread

from vastctl import clock
from vastctl import config as config_module
from vastctl.observe import observe
from vastctl.serving import dashboard, dashboard_page
from vastctl.state import db

pytestmark = pytest.mark.slow  # a real HTTP server on loopback

KEY = "f3c9a1b2d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5061728394a5b6c7d8e9"

BODIES = {
    "error": {"success": False, "error": f"bad_key_{KEY}", "msg": "invalid request"},
    "error alone": {"success": False, "error": f"key {KEY} is not valid"},
    "msg": {"success": False, "error": "bad_request", "msg": f"Invalid key {KEY}"},
    "message": {"success": False, "message": f"unauthorised: {KEY}"},
    "detail": {"detail": f"Authentication failed for key {KEY}"},
    "other field": {"success": False, "error": "bad_request", "reason": f"you sent {KEY}"},
    "nested": {"success": False, "error": {"code": "bad", "key": KEY}},
    "in a list": [f"{KEY}", "denied"],
}


class FakeVast(ThreadingHTTPServer):
    def __init__(self, status: int, body):
        super().__init__(("127.0.0.1", 0), Handler)
        self.status, self.body = status, body
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JsonHandler):
    server: FakeVast

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(f"{self.command} {self.path}")
        self.send_json(self.server.status, self.server.body)

    do_GET = do_PUT = do_POST = do_DELETE = _answer


@pytest.fixture(params=[400, 200], ids=["400", "200-success-false"])
def status(request):
    return request.param


@pytest.fixture(params=list(BODIES))
def vast(request, status):
    body = BODIES[request.param]
    if status == 200 and not (isinstance(body, dict) and body.get("success") is False):
        pytest.skip("a 200 without success false is an answer, not an error body")
    with on_a_thread(FakeVast(status, body)) as server:
        yield server


@pytest.fixture
def ready(cli, tmp_path, monkeypatch, vast):
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n  admin_token: admin-token-0123456789abcdef\n"
                      "fleet:\n  max_instances: 4\n  max_dph: 1.0\n  max_hourly_spend: 5\n"
                      "launch:\n  image: ghcr.io/x/cuzk:1\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("VAST_API_URL", vast.url)
    assert cli("init").code == 0


def dump(db_path, table):
    with sqlite3.connect(db_path) as raw:
        return json.dumps(raw.execute(f"SELECT * FROM {table}").fetchall(), default=str)


def test_the_key_in_a_vast_error_reaches_nothing(ready, cli, vast, db_path):
    for uuid, label, vast_id in (("u-a", "vastctl-a", 4001), ("u-b", "vastctl-b", 4002)):
        for args in (["register", "--uuid", uuid, "--label", label], ["params-done", "--uuid", uuid],
                     ["bench-report", "--uuid", uuid, "--rate", "70"], ["running", "--uuid", uuid]):
            assert cli(*args).code == 0, args
        with sqlite3.connect(db_path) as raw:
            raw.execute("UPDATE instances SET vast_id = ? WHERE uuid = ?", (vast_id, uuid))
    assert cli("demand", "report", "--queued", "0").code == 0
    said = []
    for args in (["reconcile"], ["stop", "vastctl-a"], ["kill", "vastctl-b", "--reason", "bad GPU"],
                 ["launch", "--gpu", "RTX 4090"], ["offers"], ["reconcile", "--json"],
                 ["fleet", "--all"], ["fleet", "--all", "--json"], ["events", "--json"]):
        result = cli(*args)
        said.append((args, result.code, result.out, result.err))
    assert vast.seen, "vast was never asked"
    failed = [(args, code) for args, code, _, _ in said if code != 0]
    assert {args[0] for args, _ in failed} >= {"reconcile", "stop", "kill", "launch", "offers"}, said
    assert all("error: " in err for args, code, _, err in said if code != 0), said

    conn = db.connect(db_path, now=clock.SYSTEM.now())
    config = config_module.load()
    now = clock.SYSTEM.now()
    prompt = json.dumps(observe(conn, config, now=now, events_since=0).to_prompt(), default=str)
    page = dashboard_page.dashboard_page(dashboard.page_data(conn, config, now), csrf="t")
    places = {
        "cli output": json.dumps(said), "events": dump(db_path, "events"), "actions": dump(db_path, "actions"),
        "instances": dump(db_path, "instances"), "vast_listings": dump(db_path, "vast_listings"),
        "the agent's prompt": prompt, "the dashboard": page,
    }
    for place, text in places.items():
        assert KEY not in text and KEY[:12] not in text and KEY[-12:] not in text, place
