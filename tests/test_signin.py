"""The dashboard's sign-in: wrong guesses slow down (per client and overall), weak tokens stop serve, sign-out is final."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from helpers.dashboard import ADMIN, Browser
from helpers.serving import Manager

from vastctl import clock
from vastctl import config as config_module
from vastctl.serving import server
from vastctl.state import db, signin, tokens

START = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def make_app(db_path, **server_keys) -> server.App:
    config = config_module.from_mapping({"server": {"admin_token": ADMIN, **server_keys}})
    config.db = str(db_path)
    db.connect(config.db_path, create=True, now=START).close()
    tokens.ensure_secret(config.secret_path)
    return server.App(config, tokens.Keyring(config.secret_path), clock=clock.VirtualClock(START))


@pytest.fixture
def app(db_path):
    return make_app(db_path)


def guess(browser: Browser, token: str = "wrong-" + ADMIN):
    return browser.post("/login", {"token": token})


def test_after_the_free_failures_each_wrong_guess_doubles_the_wait(app):
    browser = Browser(app, remote="203.0.113.7")
    for _ in range(signin.FREE_FAILURES):
        assert guess(browser).status == 401
    answer = guess(browser)
    assert answer.status == 401 and "wait 1 s" in answer.text
    waits = []
    for _ in range(4):
        answer = guess(browser)
        assert answer.status == 429 and answer.header("Retry-After") is not None
        waits.append(int(answer.header("Retry-After")))
        app.clock.advance(waits[-1])
        assert guess(browser).status == 401  # the wait is over: looked at again, wrong again
    assert waits == [1, 2, 4, 8]


def test_during_the_wait_even_the_right_token_is_refused_and_not_looked_at(app):
    browser = Browser(app, remote="203.0.113.8")
    for _ in range(signin.FREE_FAILURES + 3):
        guess(browser)
    answer = guess(browser, ADMIN)
    assert answer.status == 429 and answer.cookies() == []
    assert "too many wrong tokens" in answer.text
    app.clock.advance(int(answer.header("Retry-After")))
    assert guess(browser, ADMIN).status == 303  # then the right token signs in, and the count starts afresh
    assert [guess(browser).status for _ in range(signin.FREE_FAILURES)] == [401] * signin.FREE_FAILURES


def test_one_client_waiting_does_not_lock_out_another(app):
    attacker, operator = Browser(app, remote="198.51.100.1"), Browser(app, remote="127.0.0.1")
    for _ in range(signin.FREE_FAILURES + 4):
        guess(attacker)
    assert guess(attacker).status == 429
    assert guess(operator, ADMIN).status == 303


def test_many_addresses_together_are_held_to_the_global_trickle(app):
    statuses = [guess(Browser(app, remote=f"10.0.{i // 250}.{i % 250}")).status for i in range(signin.GLOBAL_BURST + 5)]
    assert statuses[:signin.GLOBAL_BURST] == [401] * signin.GLOBAL_BURST
    assert statuses[signin.GLOBAL_BURST:] == [429] * 5
    app.clock.advance(signin.GLOBAL_EVERY_S)
    assert guess(Browser(app, remote="10.9.9.9")).status == 401  # one more guess per GLOBAL_EVERY_S, whoever sends it
    assert guess(Browser(app, remote="10.9.9.10")).status == 429


def test_a_day_of_guessing_from_ever_new_addresses_gets_a_trickle_looked_at():
    day_clock = clock.VirtualClock(START)
    throttle = signin.Throttle(day_clock)
    looked_at = attempts = 0
    for tick in range(8640):  # 10 s apart, 20 fresh addresses a tick: 172,800 guesses in the day
        day_clock.advance(10)
        for n in range(20):
            attempts += 1
            client = f"2001:db8::{tick}:{n}"
            if throttle.wait(client) == 0:
                looked_at += 1
                throttle.failed(client)
    assert attempts == 172_800
    assert looked_at <= 86_400 / signin.GLOBAL_EVERY_S + signin.GLOBAL_BURST


def test_behind_the_trusted_proxy_clients_are_told_apart_by_x_forwarded_for(db_path):
    app = make_app(db_path, trusted_proxy="127.0.0.1")
    attacker = Browser(app, remote="127.0.0.1")
    for _ in range(signin.FREE_FAILURES + 2):
        attacker.post("/login", {"token": "nope"}, headers={"HTTP_X_FORWARDED_FOR": "198.51.100.9"})
    assert attacker.post("/login", {"token": "nope"}, headers={"HTTP_X_FORWARDED_FOR": "198.51.100.9"}).status == 429
    operator = Browser(app, remote="127.0.0.1")
    assert operator.post("/login", {"token": ADMIN}, headers={"HTTP_X_FORWARDED_FOR": "192.0.2.4"}).status == 303


def test_a_cookie_copied_before_sign_out_no_longer_works(app):
    browser = Browser(app)
    browser.sign_in()
    copied = dict(browser.jar)
    token = browser.form_token()
    assert browser.post("/logout", {"csrf": token}).status == 303
    thief = Browser(app, jar=copied)
    assert thief.get("/").text.count('action="/login"') == 1  # the sign-in form, not the dashboard
    assert thief.get("/dashboard/live").status == 401
    answer = thief.post("/dashboard/note", {"csrf": token, "text": "from a stolen cookie"})
    assert answer.status == 401
    conn = app.connection()
    assert conn.execute("SELECT COUNT(*) FROM events WHERE reason LIKE '%stolen%'").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM dashboard_sign_outs").fetchone()[0] == 1


def test_sign_out_ends_only_that_session_and_survives_a_restart(app, db_path):
    first, second = Browser(app), Browser(app)
    first.sign_in()
    second.sign_in()
    copied = dict(first.jar)
    first.post("/logout", {"csrf": first.form_token()})
    restarted = server.App(app.config, tokens.Keyring(app.config.secret_path), clock=app.clock)
    assert Browser(restarted, jar=copied).get("/").text.count('action="/login"') == 1
    assert 'name="csrf"' in Browser(restarted, jar=dict(second.jar)).get("/").text  # the other operator stays in


def test_expired_sign_outs_are_pruned(app):
    browser = Browser(app)
    browser.sign_in()
    browser.post("/logout", {"csrf": browser.form_token()})
    app.clock.advance(13 * 3600)  # past the first session's expiry
    browser.sign_in()
    browser.post("/logout", {"csrf": browser.form_token()})
    assert app.connection().execute("SELECT COUNT(*) FROM dashboard_sign_outs").fetchone()[0] == 1


@pytest.mark.parametrize("token, says", [
    ("x", "1 characters"),
    ("admin", "5 characters"),
    ("a" * 40, "1 different characters"),
    ("passwordpasswordpassword", "different characters"),
    ("0123456789" * 3, "bits"),
])
def test_weak_tokens_are_named(token, says):
    assert says in signin.weakness(token)


@pytest.mark.parametrize("token", [ADMIN, "admin-token-for-tests-0123456789", "4f9c2a7d1e8b3c6f0a5d9e2b7c4f1a8d"])
def test_strong_tokens_pass(token):
    assert signin.weakness(token) is None


@pytest.mark.slow
@pytest.mark.parametrize("key", ["admin_token", "metrics_token"])
def test_serve_refuses_to_start_with_a_weak_token(tmp_path, key):
    manager = Manager(tmp_path / "weak", admin_token="x" if key == "admin_token" else ADMIN)
    if key == "metrics_token":
        manager.config_path.write_text(manager.config_path.read_text().replace(
            "server:\n", "server:\n  metrics_token: short\n"))
    with pytest.raises(AssertionError, match="serve exited 2") as failed:
        manager.start()
    lines = [line for line in manager.log().splitlines() if line and line != "--- start"]
    assert len(lines) == 1 and lines[0].startswith(f"error: server.{key} is too weak"), lines
    assert "secrets.token_urlsafe(32)" in lines[0] and "Traceback" not in str(failed.value)
