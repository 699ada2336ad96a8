"""The dashboard behind `vastctl serve`, through the WSGI app: sign-in, cookies, headers, escaping, actions, refusals."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta, timezone
from html import unescape

import pytest
import responses
from helpers.dashboard import ADMIN, HOST, XSS, Browser, add_step, make_app, register, run_machine
from helpers.stand_in_market import Market

from vastctl import clock
from vastctl import config as config_module
from vastctl.agent import step
from vastctl.errors import GuardRefused
from vastctl.facts import demand
from vastctl.machine.reports import LocalReports
from vastctl.serving import dashboard, server
from vastctl.state import db, lifecycle, settings
from vastctl.views import overview


def rows(app) -> dict[str, dict]:
    return {row["label"]: dict(row) for row in app.connection().execute("SELECT * FROM instances")}


def events(app) -> list[dict]:
    return [dict(row) for row in app.connection().execute("SELECT * FROM events ORDER BY id")]


def empty_queue(app):
    """Demand says nothing is queued, so the guard lets the last machine go."""
    demand.report(app.connection(), 0, None, now=clock.SYSTEM.now())


# --- signing in ---------------------------------------------------------------------------------------


def test_without_a_session_the_page_is_the_sign_in_form(browser, app):
    register(app, "u1", "vastctl-secret-row")
    answer = browser.get("/")
    assert answer.status == 200
    assert 'action="/login"' in answer.text and 'type="password" name="token"' in answer.text
    assert "vastctl-secret-row" not in answer.text
    assert browser.get("/dashboard/live").status == 401


def test_the_token_in_a_url_signs_nobody_in(browser):
    assert browser.get(f"/?token={ADMIN}").text.count('action="/login"') == 1
    assert browser.get(f"/login?token={ADMIN}").status == 405
    assert browser.jar == {}


def test_a_wrong_token_is_refused_without_a_cookie(browser):
    answer = browser.post("/login", {"token": ADMIN + "x"})
    assert answer.status == 401 and "wrong token" in answer.text
    assert answer.cookies() == [] and browser.get("/").text.count('action="/login"') == 1


def test_sign_in_sets_a_strict_http_only_cookie(browser, app):
    register(app, "u1", "vastctl-one")
    cookie = browser.sign_in().cookies()[0]
    assert cookie.startswith("vastctl-session=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain http on loopback: a Secure cookie would never come back
    assert ADMIN not in cookie
    assert "vastctl-one" in browser.get("/").text


def test_over_tls_the_cookie_is_secure_and_host_only(app):
    browser = Browser(app, scheme="https")
    cookie = browser.sign_in().cookies()[0]
    assert cookie.startswith("__Host-vastctl-session=") and "; Secure" in cookie
    assert 'action="/dashboard/kill"' in browser.get("/").text


def test_forwarded_proto_counts_only_from_the_trusted_proxy(db_path):
    forwarded = {"HTTP_X_FORWARDED_PROTO": "https", "HTTP_ORIGIN": f"https://{HOST}"}
    untrusted = Browser(make_app(db_path))
    assert "Secure" not in untrusted.post("/login", {"token": ADMIN}, headers=forwarded).cookies()[0]
    trusted = Browser(make_app(db_path, trusted_proxy="10.1.2.3, 127.0.0.1"))
    assert "; Secure" in trusted.post("/login", {"token": ADMIN}, headers=forwarded).cookies()[0]
    assert 'action="/dashboard/kill"' in trusted.get("/", headers=forwarded).text


def test_an_expired_or_forged_session_is_signed_out(app):
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    virtual = clock.VirtualClock(start)
    web = dashboard.Web(app.config, app.keyring.secrets()[0], app.connection, clock=virtual)
    environ = {"REQUEST_METHOD": "POST", "wsgi.input": io.BytesIO(f"token={ADMIN}".encode()),
               "CONTENT_LENGTH": str(len(f"token={ADMIN}")), "HTTP_HOST": HOST}
    _, headers, _ = web.handle(environ, "POST", "/login")
    value = dict(headers)["Set-Cookie"].split(";")[0].split("=", 1)[1]
    assert web.session({"HTTP_COOKIE": f"vastctl-session={value}"}) is not None
    sid, expires, mac = value.split(".")
    assert web.session({"HTTP_COOKIE": f"vastctl-session={sid}.{int(expires) + 9999}.{mac}"}) is None
    virtual.advance(dashboard.SESSION_S + 1)
    assert web.session({"HTTP_COOKIE": f"vastctl-session={value}"}) is None


def test_changing_the_admin_token_signs_everyone_out(db_path, browser):
    browser.sign_in()
    other = Browser(make_app(db_path), jar=browser.jar)
    assert 'action="/dashboard/kill"' in other.get("/").text
    other.app.config.server.admin_token = "a-new-admin-token-0123456789"
    rotated = Browser(server.App(other.app.config, other.app.keyring, clock=clock.SYSTEM), jar=browser.jar)
    assert rotated.get("/").text.count('action="/login"') == 1


def test_without_an_admin_token_the_dashboard_is_disabled(db_path):
    browser = Browser(make_app(db_path, admin_token=""))
    answer = browser.get("/")
    assert answer.status == 403 and "server.admin_token" in answer.text
    assert browser.post("/login", {"token": ""}).status == 403


def test_sign_out_forgets_the_session(signed_in):
    token = signed_in.form_token()
    answer = signed_in.post("/logout", {"csrf": token})
    assert answer.status == 303 and "Max-Age=0" in answer.cookies()[0]
    assert signed_in.get("/").text.count('action="/login"') == 1


# --- headers, static files, routing ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/static/dashboard.js", "/static/dashboard.css", "/dashboard/live"])
def test_protective_headers_on_every_answer(signed_in, path):
    answer = signed_in.get(path)
    assert answer.status == 200
    csp = answer.header("Content-Security-Policy")
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert answer.header("X-Frame-Options") == "DENY"
    assert answer.header("X-Content-Type-Options") == "nosniff"
    assert answer.header("Referrer-Policy") == "same-origin"


def test_static_files_come_from_the_package(browser):
    js = browser.get("/static/dashboard.js")
    assert js.header("Content-Type").startswith("text/javascript") and "fetch(" in js.text
    assert browser.get("/static/dashboard.css").header("Content-Type").startswith("text/css")
    assert browser.get("/static/../server.py").status == 404
    assert browser.get("/static/nothing.js").status == 404


def test_the_page_has_no_inline_script_or_style(signed_in, app):
    register(app, "u1", "vastctl-one", gpu_name="RTX 4090")
    page = signed_in.get("/").text
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/dashboard.js" defer>']
    assert " style=" not in page and "<style" not in page and " on" + "click=" not in page


def test_machine_reports_and_post_root_still_reach_the_machine_api(app, browser):
    answer = browser.post("/", same_origin=False)
    assert answer.status == 404 and "no such endpoint" in json.loads(answer.text)["error"]
    assert browser.get("/healthz").text == '{"ok": true}'
    assert browser.post("/dashboard/settings", same_origin=True).status == 401
    assert browser.get("/dashboard/kill").status == 405


# --- what the page shows ------------------------------------------------------------------------------


def test_values_from_machines_and_vast_are_shown_as_text(signed_in, app):
    conn = app.connection()
    register(app, "u-xss", XSS, gpu_name='RTX "4090"<script>alert(2)</script>', vast_id=77)
    with db.transaction(conn):
        lifecycle.update_fields(conn, "u-xss", {"vast_status": "running", "vast_status_msg": "<b>oci</b> & 'fail'"})
    register(app, "u-killed", "vastctl-gone")
    lifecycle.kill(conn, "u-killed", f"operator: {XSS}", source="operator", code="operator", now=clock.SYSTEM.now())
    for body in (signed_in.get("/").text, signed_in.get("/dashboard/live").text):
        assert XSS not in body and "<script>alert" not in body and "<b>oci" not in body
        assert "&lt;img src=x onerror=alert(1)&gt;" in body
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in body and "&lt;b&gt;oci&lt;/b&gt; &amp; &#x27;fail&#x27;" in body


def test_the_page_shows_fleet_summary_and_events(signed_in, app):
    conn = app.connection()
    run_machine(app, "u1", "vastctl-run", 55, 11)
    register(app, "u2", "vastctl-boot", gpu_name="RTX 4090", vast_id=12)
    with db.transaction(conn):
        conn.execute("UPDATE instances SET dph = 0.4 WHERE uuid = 'u1'")
        conn.execute("UPDATE instances SET dph = 0.3, vast_status = 'exited' WHERE uuid = 'u2'")
    settings.set_value(conn, app.config, "target_proofs_per_hour", 200, now=clock.SYSTEM.now())
    page = signed_in.get("/").text
    assert re.search(r'id="capacity">55</span> / <span id="target">200<', page)
    assert "+55 proofs/h on the way" in page  # u2 counts at its model's measured rate
    assert "$0.70</span>/h" in page
    assert "registered here but vast says exited" in page and 'class="disagree"' in page
    assert "target_proofs_per_hour 0 → 200" in page
    assert "no demand samples kept" in page and "no agent step has run yet" in page


def test_agent_steps_show_what_it_saw_did_was_refused_and_cost(signed_in, app):
    """A step as agent-step writes it (the rules policy against a stand-in market): a launch, and a destroy of a
    machine without our label prefix that the guard refuses."""
    conn = app.connection()
    register(app, "u1", "vastctl-run", gpu_name="RTX 4090", vast_id=11)
    reports = LocalReports(conn, app.config, now=clock.SYSTEM.now())
    reports.params_done("u1")
    reports.bench_report("u1", 55)
    reports.running("u1")
    now = clock.SYSTEM.now()
    lifecycle.create(conn, uuid="u9", label=XSS, state="launching", reason="launch", source="operator",
                     now=now - timedelta(hours=2), fields={"dph": 0.2, "gpu_name": "RTX 4090", "vast_id": 99})
    for state in ("stopped", "launching", "stopped"):  # resumed once, stopped again: the rules replace it
        lifecycle.transition(conn, "u9", state, state, "operator", now=now - timedelta(hours=1))
    settings.set_value(conn, app.config, "target_proofs_per_hour", 80, now=now)
    demand.report(conn, 60, None, now=now)  # drained within 40 min: 90/h wanted (under target × 1.15 = 92), 35 short
    config = config_module.from_mapping({
        "server": {"admin_token": ADMIN, "url": "https://manager.example"},
        "launch": {"vastctl_source": "vastctl", "install": "./install-provers.sh"}})
    config.db = app.config.db
    result = step.run_step(conn, Market(), config, clock=clock.SYSTEM, policy="rules")
    assert [(a["kind"], a["offer_id"]) for a in result.actions] == [("launch", 1)]
    assert [(r["kind"], r["limit"]) for r in result.refused] == [("destroy", "label_prefix")]

    page = signed_in.get("/").text
    (row,) = page.split('id="steps"')[1].split("<tbody>")[1].split("</tr>")[:1]
    cells = [unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
    assert cells[1:3] == ["rules", "ok"]
    # the stopped machine still bills its disk; with no disk price listed, its whole price counts
    assert cells[3] == "capacity 55 / 80 · +0 on the way · $0.20/h · 60 queued · 1 running, 1 stopped · 9 new events"
    assert re.fullmatch(r"launch RTX 4090: queued work: capacity 55 of 90 .+ → launched vastctl-\S+ \(instance 9001\)", cells[4])
    assert cells[5].startswith(f"destroy {XSS} [label_prefix]: {XSS} does not carry our label prefix")
    assert XSS not in page and "destroy &lt;img src=x onerror=alert(1)&gt; [label_prefix]" in page
    assert cells[6:] == ["", "0 in · 0 out", "$0.0000"]


def test_agent_step_tokens_and_cost_are_shown(signed_in, app):
    add_step(app.connection(), clock.SYSTEM.now(), outcome="error", observation="{not json", input_tokens=5100,
             output_tokens=230, cache_read_tokens=4000, cost=0.0123, errors=json.dumps(["llm: HTTP 529"]))
    steps = signed_in.get("/").text.split('id="steps"')[1]
    assert "5100 in · 230 out · 4000 cached" in steps and "$0.0123" in steps
    assert "{not json" in steps and "llm: HTTP 529" in steps


def test_the_chart_replays_the_last_day(app):
    conn, cfg = app.connection(), app.config
    now = datetime(2026, 11, 2, 12, tzinfo=timezone.utc)
    hour = timedelta(hours=1)
    lifecycle.create(conn, uuid="u1", label="vastctl-a", state="launching", reason="launch", source="operator",
                     now=now - 30 * hour, fields={"dph": 0.5, "gpu_name": "RTX 4090"})
    lifecycle.transition(conn, "u1", "registered", "registered", "instance", now=now - 10 * hour)
    with db.transaction(conn):
        lifecycle.update_fields(conn, "u1", {"bench_rate": 50})
    lifecycle.transition(conn, "u1", "params_done", "p", "instance", now=now - 9 * hour)
    lifecycle.transition(conn, "u1", "bench_done", "b", "instance", now=now - 8 * hour)
    lifecycle.transition(conn, "u1", "running", "r", "instance", now=now - 6 * hour)
    lifecycle.kill(conn, "u1", "operator: test", source="operator", code="operator", now=now - 2 * hour)
    settings.set_value(conn, cfg, "target_proofs_per_hour", 300, now=now - 5 * hour)
    conn.execute("INSERT INTO demand_samples (at, queued, proofs_per_hour, source, ok) VALUES (?, 7, 100, 'report', 1)",
                 (clock.to_iso(now - 4 * hour),))
    conn.execute("INSERT INTO vast_listings (at, ok, error) VALUES (?, 0, 'HTTP 502')", (clock.to_iso(now - 3 * hour),))
    chart = overview.history(conn, cfg, now, capacity=0.0, spend=0.0, target=300.0, model_rates={})
    assert chart["capacity"] == [(now - 24 * hour, 0.0), (now - 6 * hour, 50.0), (now - 2 * hour, 0.0)]
    assert chart["spend"] == [(now - 24 * hour, 0.5), (now - 2 * hour, 0.0)]  # launched before the window
    assert chart["target"] == [(now - 24 * hour, 0.0), (now - 5 * hour, 300.0)]
    assert chart["queue"] == [(now - 4 * hour, 7.0)]
    assert chart["reconcile_failures"] == [now - 3 * hour]
    # the target's history is the event's fields: a reason reworded (or forged in text) changes nothing
    conn.execute("UPDATE events SET reason = 'target_proofs_per_hour 999 → 1' WHERE kind = 'setting'")
    assert overview.history(conn, cfg, now, capacity=0.0, spend=0.0, target=300.0, model_rates={})["target"] == \
        chart["target"]


# --- actions: the same library calls as the CLI, the same events and refusals ------------------------


def test_set_a_setting_records_the_cli_event(signed_in, app):
    assert signed_in.act("/dashboard/settings", {"key": "target_proofs_per_hour", "value": "400"}) == \
        "target_proofs_per_hour = 400"
    assert settings.get(app.connection(), app.config, "target_proofs_per_hour") == 400
    event = events(app)[-1]
    assert (event["kind"], event["source"], event["reason"]) == ("setting", "operator", "target_proofs_per_hour 0 → 400")
    assert json.loads(event["data"]) == {"key": "target_proofs_per_hour", "new": 400, "old": 0}
    assert signed_in.act("/dashboard/settings", {"key": "target_proofs_per_hour", "value": "400"}).endswith(
        "(unchanged)")
    assert len(events(app)) == 1


@pytest.mark.parametrize("key, value, says", [
    ("max_instances", "2.5", "max_instances must be a whole number from 0 to 10000"),
    ("max_dph", "-1", "max_dph must be a number above 0 and at most 1000"),
    ("no_such_key", "1", "unknown setting 'no_such_key'"),
])
def test_bad_settings_are_refused_with_the_cli_message(signed_in, app, key, value, says):
    message = signed_in.act("/dashboard/settings", {"key": key, "value": value})
    assert message.startswith(f"error: {says}")
    assert events(app) == [] and app.connection().execute("SELECT count(*) FROM settings").fetchone()[0] == 0


def test_a_note_is_the_notify_event(signed_in, app):
    message = signed_in.act("/dashboard/note", {"text": "  Curio maintenance 02:00 UTC "})
    event = events(app)[-1]
    assert message == f"note {event['id']} left for the agent"
    assert (event["kind"], event["source"], event["reason"]) == ("note", "operator", "Curio maintenance 02:00 UTC")
    assert signed_in.act("/dashboard/note", {"text": "   "}).startswith("error: the note is empty")


def test_kill_without_a_vast_instance_is_the_cli_kill(signed_in, app):
    register(app, "u1", "vastctl-one")
    empty_queue(app)
    assert signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": " GPU errors "}) == "vastctl-one killed"
    row = rows(app)["vastctl-one"]
    assert (row["state"], row["kill_code"], row["kill_reason"]) == ("killed", "operator", "operator: GPU errors")
    assert row["destroyed_at"] is not None
    assert "vastctl-one" not in signed_in.get("/dashboard/live").text.split('id="events"')[0]
    assert signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "again"}).startswith(
        "error: instance vastctl-one is killed")


def test_kill_destroys_at_vast_with_the_configured_key(signed_in, app, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", "k-dash")
    monkeypatch.setenv("VAST_API_URL", "https://vast.test")
    register(app, "u1", "vastctl-one", vast_id=4242)
    empty_queue(app)
    with responses.RequestsMock() as mocked:
        mocked.get("https://vast.test/api/v0/instances/4242/", json={"instances": {"id": 4242, "label": "vastctl-one"}})
        mocked.delete("https://vast.test/api/v0/instances/4242/", json={"success": True})
        message = signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "stuck"})
        assert mocked.calls[-1].request.headers["Authorization"] == "Bearer k-dash"
    assert message == "vastctl-one killed; vast instance 4242 destroyed"
    audit = app.connection().execute("SELECT actor, kind, ok FROM actions").fetchall()
    assert [tuple(a) for a in audit] == [("operator", "destroy", 1)]


def test_kill_without_a_vast_key_changes_nothing(signed_in, app):
    register(app, "u1", "vastctl-one", vast_id=4242)
    empty_queue(app)
    before = events(app)
    assert signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "x"}).startswith(
        "error: no vast.ai API key")
    assert rows(app)["vastctl-one"]["state"] == "registered" and events(app) == before


@pytest.mark.parametrize("form, says", [
    ({"instance": "vastctl-nobody", "reason": "x"}, "error: no instance labelled or with uuid 'vastctl-nobody'"),
    ({"instance": "vastctl-one", "reason": "  "}, "error: give a reason for the event log"),
    ({"instance": "", "reason": "x"}, "error: name the machine to kill"),
])
def test_bad_kills_are_refused(signed_in, app, form, says):
    register(app, "u1", "vastctl-one")
    assert signed_in.act("/dashboard/kill", form).startswith(says)
    assert rows(app)["vastctl-one"]["state"] == "registered"


def test_a_guard_refusal_is_shown_as_a_message(signed_in, app, monkeypatch):
    register(app, "u1", "vastctl-one")

    def refuse(*args, **kwargs):
        raise GuardRefused("killing vastctl-one would leave no machine running while work is queued")

    monkeypatch.setattr("vastctl.operations.kill", refuse)
    message = signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "x"})
    assert message == "error: killing vastctl-one would leave no machine running while work is queued"
    assert rows(app)["vastctl-one"]["state"] == "registered"


def proving(app, uuid: str, label: str, **fields) -> None:
    register(app, uuid, label, **fields)
    reports = LocalReports(app.connection(), app.config, now=clock.SYSTEM.now())
    reports.params_done(uuid)
    reports.bench_report(uuid, 55)
    reports.running(uuid)
    reports.heartbeat(uuid, 0)


def override_form(page: str) -> dict[str, str]:
    """The hidden fields of the page's second kill step, and whether its confirm box is required."""
    form = re.search(r'<form method="post" action="/dashboard/kill" id="kill-override"[^>]*>(.*?)</form>', page)
    assert form, "no second step on the page"
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1)))
    assert re.search(r'<input type="checkbox" name="confirm" value="yes" required>', form.group(1))
    return {name: unescape(value) for name, value in fields.items()}


def test_a_refused_kill_offers_the_forced_kill_with_a_confirmation(signed_in, app):
    proving(app, "u1", "vastctl-one")
    demand.report(app.connection(), 9, None, now=clock.SYSTEM.now())
    message = signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "GPU <errors>"})
    assert message.startswith("error: kill vastctl-one would leave no machine running") and "last one proving" in message
    answer = signed_in.post("/dashboard/kill", {"csrf": signed_in.form_token(), "instance": "vastctl-one",
                                                "reason": "GPU <errors>"})
    assert answer.status == 303
    page = signed_in.get("/").text
    fields = override_form(page)
    assert {k: v for k, v in fields.items() if k != "csrf"} == {"instance": "vastctl-one", "reason": "GPU <errors>",
                                                                "force": "1"}
    assert "Recorded as forced past the guard (never_scale_to_zero)" in page and "GPU <errors>" not in page
    assert 'id="kill-override"' not in signed_in.get("/").text  # shown once, with its message
    assert rows(app)["vastctl-one"]["state"] == "running"

    unticked = signed_in.act("/dashboard/kill", fields)  # the box not ticked: nothing happens
    assert unticked == "error: a kill past the guard needs its confirm box ticked: tick it and submit again"
    assert rows(app)["vastctl-one"]["state"] == "running"

    done = signed_in.act("/dashboard/kill", {**fields, "csrf": signed_in.form_token(), "confirm": "yes"})
    assert done == "vastctl-one killed (forced past the guard)"
    row = rows(app)["vastctl-one"]
    assert (row["state"], row["kill_code"], row["kill_reason"]) == ("killed", "operator", "operator: GPU <errors> (forced)")
    assert row["kill_forced"] == 1 and json.loads(events(app)[-1]["data"]) == {  # fields, not text
        "forced": True, "reason": "operator: GPU <errors>"}
    audit = [dict(a) for a in app.connection().execute("SELECT actor, kind, ok, result FROM actions ORDER BY id")]
    assert [(a["actor"], a["kind"], a["ok"]) for a in audit] == [("operator", "kill", 0)] * 2 + [("operator", "kill", 1)]
    assert audit[-1]["result"].startswith("forced past the guard (never_scale_to_zero)")


def test_a_kill_past_a_label_without_our_prefix_is_offered_too(signed_in, app, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", "k-dash")  # the guard refuses before vast is called
    monkeypatch.setenv("VAST_API_URL", "https://vast.test")
    proving(app, "u1", "vastctl-one")
    register(app, "u2", "oldprefix-two", vast_id=4242)
    signed_in.post("/dashboard/kill", {"csrf": signed_in.form_token(), "instance": "oldprefix-two", "reason": "old"})
    page = signed_in.get("/").text
    assert "does not carry our label prefix" in unescape(page)
    assert override_form(page)["instance"] == "oldprefix-two" and "(label_prefix)" in page


def test_no_second_step_for_what_force_cannot_pass(signed_in, app):
    register(app, "u1", "vastctl-one")
    empty_queue(app)
    assert signed_in.act("/dashboard/kill", {"instance": "vastctl-one", "reason": "x"}) == "vastctl-one killed"
    signed_in.post("/dashboard/kill", {"csrf": signed_in.form_token(), "instance": "vastctl-one", "reason": "x"})
    page = signed_in.get("/").text
    assert "is killed" in page and 'id="kill-override"' not in page  # Refused, not the guard


@pytest.mark.parametrize("reason, carried", [("é" * 500, True), ("\U0001f600" * 500, False)], ids=["fits", "too-long"])
def test_a_long_refusal_keeps_its_second_step(signed_in, app, reason, carried):
    label = "vastctl-" + "x" * 240  # as long as a label may be
    proving(app, "u1", label)
    demand.report(app.connection(), 9, None, now=clock.SYSTEM.now())
    answer = signed_in.post("/dashboard/kill", {"csrf": signed_in.form_token(), "instance": label, "reason": reason})
    (cookie,) = answer.cookies()
    assert len(cookie.split(";")[0]) < 4000  # one cookie a browser keeps
    page = signed_in.get("/").text
    assert "never scale to zero" in page
    fields = override_form(page)
    if carried:
        assert fields["reason"] == reason
    else:  # the second step asks for the reason again
        assert "reason" not in fields and '<input name="reason" required maxlength="500"' in page.split("kill-override")[1]


# --- cross-site request forgery ----------------------------------------------------------------------

TARGET = {"key": "target_proofs_per_hour", "value": "999"}


@pytest.mark.parametrize("headers", [
    {"HTTP_ORIGIN": "http://evil.example", "HTTP_SEC_FETCH_SITE": "cross-site"},
    {"HTTP_ORIGIN": "http://127.0.0.1:9999", "HTTP_SEC_FETCH_SITE": "same-site"},  # another port: same site
    {"HTTP_ORIGIN": "null"},
    {"HTTP_SEC_FETCH_SITE": "cross-site"},
    {"HTTP_ORIGIN": "http://127.0.0.1:9999"},
])
def test_cross_site_posts_are_refused(signed_in, app, headers):
    token = signed_in.form_token()
    answer = signed_in.post("/dashboard/settings", {"csrf": token, **TARGET}, headers=headers, same_origin=False)
    assert answer.status == 403 and "another site" in answer.text
    assert events(app) == []


@pytest.mark.parametrize("token", [None, "", "0" * 64])
def test_a_post_without_the_session_form_token_is_refused(signed_in, app, token):
    form = dict(TARGET) if token is None else {"csrf": token, **TARGET}
    answer = signed_in.post("/dashboard/settings", form)
    assert answer.status == 403 and "did not come from your dashboard session" in answer.text
    assert events(app) == []


def test_another_sessions_form_token_is_refused(app, signed_in):
    other = Browser(app)
    other.sign_in()
    answer = signed_in.post("/dashboard/settings", {"csrf": other.form_token(), **TARGET})
    assert answer.status == 403 and events(app) == []


def test_a_cross_site_sign_in_is_refused(browser):
    answer = browser.post("/login", {"token": ADMIN}, headers={"HTTP_ORIGIN": "http://evil.example"},
                          same_origin=False)
    assert answer.status == 403 and answer.cookies() == []

