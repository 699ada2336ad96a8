"""vast's webhook deliveries at the app (in process): signature, freshness, dedup, the one event, what wakes.

The real `vastctl serve` with a fake vast behind it is tests/test_webhooks_serve.py.
"""

from __future__ import annotations

import io
import json
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import clock
from vastctl import config as config_module
from vastctl.clock import VirtualClock
from vastctl.serving import webhooks
from vastctl.serving.server import App
from vastctl.state import tokens

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
SECRET = "whsec_test_0123456789abcdef0123"
OLD_SECRET = "whsec_old_fedcba9876543210fedcba"


class RecordingWaker:
    def __init__(self):
        self.woken: list[str] = []

    def wake(self, event_id: str) -> None:
        self.woken.append(event_id)


@pytest.fixture
def app(conn, config):
    tokens.ensure_secret(config.secret_path)
    webhooks.add_secret(config.webhook_secret_path, SECRET, now=NOW)
    waker = RecordingWaker()
    the_app = App(config, tokens.Keyring(config.secret_path), clock=VirtualClock(NOW), waker=waker)
    the_app.waker = waker
    return the_app


def body_of(event_id="evt-1", notif_type="offline", subject="Instance offline",
            message="Your instance 5001 on machine 9001 went offline", **extra) -> bytes:
    value = {"event_id": event_id, "user_id": 123, "notif_type": notif_type, "subject": subject, "message": message,
             "timestamp": NOW.timestamp(), **extra}
    return json.dumps(value).encode()


def deliver(app, body: bytes, *, secret=SECRET, timestamp=None, event_id="evt-1", method="POST",
            path=webhooks.PATH, signature=None, headers=None, length=None):
    timestamp = str(int(NOW.timestamp())) if timestamp is None else timestamp
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_LENGTH": str(len(body) if length is None else length), "wsgi.input": io.BytesIO(body),
        "HTTP_X_VAST_EVENT_ID": event_id, "HTTP_X_VAST_DELIVERY_ATTEMPT": "1", "HTTP_X_VAST_TIMESTAMP": timestamp,
        "HTTP_X_VAST_SIGNATURE_256": signature or webhooks.signature(secret.encode(), timestamp.encode(), body),
    }
    environ.update(headers or {})
    answer = {}

    def start_response(status, response_headers):
        answer["status"] = int(status.split()[0])

    payload = b"".join(app(environ, start_response))
    return answer["status"], json.loads(payload)


def recorded(conn):
    events = [dict(row) for row in conn.execute("SELECT * FROM events WHERE source = 'vast' ORDER BY id")]
    deliveries = [dict(row) for row in conn.execute("SELECT * FROM webhook_deliveries")]
    return events, deliveries


def test_a_signed_delivery_is_one_event_and_wakes_the_safety_net(app, conn):
    status, answer = deliver(app, body_of())
    assert (status, answer) == (200, {"ok": True, "duplicate": False, "event_id": "evt-1"})
    (event,), (delivery,) = recorded(conn)
    assert (event["kind"], event["source"], event["code"], event["uuid"]) == ("webhook", "vast", "offline", None)
    assert event["reason"] == "offline: Instance offline: Your instance 5001 on machine 9001 went offline"
    assert (delivery["event_id"], delivery["notif_type"], delivery["attempt"], delivery["event"]) == (
        "evt-1", "offline", 1, event["id"])
    assert app.waker.woken == ["evt-1"]
    assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 0  # prose names no row to change


def test_the_same_event_three_times_is_one_event_and_one_wake(app, conn):
    answers = [deliver(app, body_of(), headers={"HTTP_X_VAST_DELIVERY_ATTEMPT": str(n)}) for n in (1, 2, 3)]
    assert [a[0] for a in answers] == [200, 200, 200]
    assert [a[1]["duplicate"] for a in answers] == [False, True, True]
    events, deliveries = recorded(conn)
    assert len(events) == 1 and len(deliveries) == 1 and deliveries[0]["attempt"] == 1
    assert app.waker.woken == ["evt-1"]


def test_a_retry_signed_at_a_later_time_is_still_the_same_event(app, conn):
    assert deliver(app, body_of())[0] == 200
    app.clock.advance(120)
    later = str(int(NOW.timestamp()) + 120)
    assert deliver(app, body_of(), timestamp=later)[1]["duplicate"] is True
    assert len(recorded(conn)[0]) == 1 and app.waker.woken == ["evt-1"]


@pytest.mark.parametrize("name, kwargs, status, says", [
    ("wrong secret", {"secret": "whsec_wrong_000000000000000000"}, 401, "X-Vast-Signature-256"),
    ("no signature", {"signature": " "}, 401, "X-Vast-Signature-256"),
    ("signature of another body", {"signature": webhooks.signature(SECRET.encode(), b"1782907200", b"{}")}, 401,
     "X-Vast-Signature-256"),
    ("stale", {"timestamp": str(int(NOW.timestamp()) - 301)}, 401, "301s old"),
    ("from the future", {"timestamp": str(int(NOW.timestamp()) + 301)}, 401, "in the future"),
    ("not seconds", {"timestamp": "1782907200.5"}, 401, "whole Unix seconds"),
    ("no event id", {"event_id": ""}, 400, "X-Vast-Event-Id"),
    ("event id with a newline", {"event_id": "evt-1\nx"}, 400, "X-Vast-Event-Id"),
    ("another event id than the body's", {"event_id": "evt-2"}, 400, "event_id"),
    ("wrong method", {"method": "PUT"}, 405, "use POST"),
])
def test_a_refused_delivery_changes_nothing_and_wakes_nothing(app, conn, name, kwargs, status, says):
    got, answer = deliver(app, body_of(), **kwargs)
    assert got == status, answer
    assert says in answer["error"]
    assert recorded(conn) == ([], [])
    assert app.waker.woken == []


def test_a_body_over_the_limit_is_413_unread(app, conn):
    big = body_of(message="x" * webhooks.MAX_BODY)
    status, answer = deliver(app, big)
    assert status == 413 and "KiB" in answer["error"]
    assert recorded(conn) == ([], []) and app.waker.woken == []


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"notif_type": 7}', b'{"message": NaN}', b"\xff\xfe"])
def test_a_signed_but_malformed_body_is_400(app, conn, body):
    assert deliver(app, body)[0] == 400
    assert recorded(conn) == ([], []) and app.waker.woken == []


def test_a_replayed_capture_is_refused_once_stale_and_a_duplicate_before(app, conn):
    body = body_of()
    timestamp = str(int(NOW.timestamp()))
    signed = webhooks.signature(SECRET.encode(), timestamp.encode(), body)
    assert deliver(app, body, signature=signed)[0] == 200
    assert deliver(app, body, signature=signed)[1]["duplicate"] is True
    app.clock.advance(301)
    assert deliver(app, body, signature=signed)[0] == 401
    assert len(recorded(conn)[0]) == 1 and app.waker.woken == ["evt-1"]


def test_hostile_text_is_escaped_and_cut(app, conn):
    body = body_of(notif_type="client:off\u202eline\n" + "k" * 100, subject="a\x1b[31mred",
                   message="line one\nline two api_key=abc123def456 " + "m" * 2000)
    assert deliver(app, body)[0] == 200
    (event,), (delivery,) = recorded(conn)
    assert event["code"] == delivery["notif_type"] and len(event["code"]) <= webhooks.SLUG_CHARS
    assert "\u202e" not in event["code"] and "\\u202e" in event["code"] and not event["code"].startswith("client:")
    assert len(event["reason"]) <= webhooks.REASON_CHARS and event["reason"].endswith("…")
    assert "\x1b" not in event["reason"] and "\\x1b" in event["reason"] and "\n" not in event["reason"]
    assert "abc123def456" not in event["reason"]


def test_without_a_secret_file_webhooks_are_off(app, conn, config):
    config.webhook_secret_path.unlink()
    status, answer = deliver(app, body_of())
    assert status == 404 and "vastctl webhook-secret --add" in answer["error"]
    assert recorded(conn) == ([], [])


def test_rotation_any_secret_verifies_and_retiring_drops_the_old(app, conn, config):
    path = config.webhook_secret_path
    assert webhooks.add_secret(path, OLD_SECRET, now=NOW) == 2  # the file now holds OLD first, SECRET second
    assert deliver(app, body_of("evt-a"), event_id="evt-a", secret=SECRET)[0] == 200
    assert deliver(app, body_of("evt-b"), event_id="evt-b", secret=OLD_SECRET)[0] == 200
    assert webhooks.retire_old(path) == 1
    assert deliver(app, body_of("evt-c"), event_id="evt-c", secret=SECRET)[0] == 401
    assert deliver(app, body_of("evt-d"), event_id="evt-d", secret=OLD_SECRET)[0] == 200
    assert [d["event_id"] for d in recorded(conn)[1]] == ["evt-a", "evt-b", "evt-d"]


@pytest.mark.parametrize("broken", ["short\n", "", "# only a comment\n", "\xff\xfe not text\n"])
def test_a_secret_file_broken_by_hand_accepts_nothing_until_fixed(app, conn, config, broken):
    assert deliver(app, body_of("evt-a"), event_id="evt-a")[0] == 200
    config.webhook_secret_path.write_text(broken, encoding="latin-1")  # cutting a leaked secret
    status, answer = deliver(app, body_of("evt-b"), event_id="evt-b")
    assert status == 503 and "secret file is broken" in answer["error"]  # the old secret no longer verifies
    assert [d["event_id"] for d in recorded(conn)[1]] == ["evt-a"]
    config.webhook_secret_path.write_text("whsec_the_new_one_0123456789\n")  # fixed by hand
    assert deliver(app, body_of("evt-c"), event_id="evt-c", secret="whsec_the_new_one_0123456789")[0] == 200
    assert deliver(app, body_of("evt-d"), event_id="evt-d")[0] == 401


def test_a_secret_file_changed_by_hand_is_read_again(app, conn, config):
    assert deliver(app, body_of("evt-a"), event_id="evt-a")[0] == 200
    config.webhook_secret_path.write_text("whsec_replaced_by_hand_012345\n")
    assert deliver(app, body_of("evt-b"), event_id="evt-b")[0] == 401
    assert deliver(app, body_of("evt-c"), event_id="evt-c", secret="whsec_replaced_by_hand_012345")[0] == 200


def test_a_signed_body_replayed_under_a_fresh_event_id_is_a_duplicate(app, conn):
    body = json.dumps({"notif_type": "offline", "subject": "Instance offline", "message": "m"}).encode()
    assert deliver(app, body, event_id="evt-1")[1]["duplicate"] is False
    for fresh in ("evt-2", "evt-3"):  # the id header is not signed: an attacker can change it
        status, answer = deliver(app, body, event_id=fresh)
        assert (status, answer["duplicate"]) == (200, True)
    events, deliveries = recorded(conn)
    assert len(events) == 1 and [d["event_id"] for d in deliveries] == ["evt-1"]
    later = str(int(NOW.timestamp()) + 1)  # vast signing the same text again, a second later: a new delivery
    assert deliver(app, body, event_id="evt-4", timestamp=later)[1]["duplicate"] is False


@pytest.mark.parametrize("header, value, status", [
    # WSGI hands headers over as latin-1: `²` (0xb2) is the digit an HTTP header can carry
    ("HTTP_X_VAST_TIMESTAMP", str(int(NOW.timestamp()))[:-1] + "\u00b2", 401), ("HTTP_X_VAST_TIMESTAMP", "\u00b9", 401),
    ("HTTP_X_VAST_DELIVERY_ATTEMPT", "\u00b2", 200), ("HTTP_X_VAST_DELIVERY_ATTEMPT", "1\u00b3", 200),
])
def test_unicode_digits_in_the_headers_are_refused_or_ignored_never_a_500(app, conn, header, value, status):
    body = body_of()
    timestamp = value if header == "HTTP_X_VAST_TIMESTAMP" else None
    signed = webhooks.signature(SECRET.encode(), timestamp.encode("latin-1"), body) if timestamp else None
    got, answer = deliver(app, body, timestamp=timestamp, signature=signed,
                          headers={header: value} if timestamp is None else None)
    assert got == status, answer
    if status == 401:
        assert "whole Unix seconds" in answer["error"]
    if status == 200:
        assert recorded(conn)[1][0]["attempt"] is None


def test_the_wake_log_line_names_a_few_deliveries_and_counts_the_rest(caplog):
    ids = [f"evt-{n:04d}" for n in range(1199)]
    with caplog.at_level("INFO", logger="vastctl.serve.wake"):
        webhooks._log_wake(webhooks.WakeResult(ids, passes=1, steps=1))
    (line,) = [record.getMessage() for record in caplog.records]
    assert len(line) < 400 and "evt-0009, … 1189 more" in line and "evt-0010" not in line
    assert line.startswith("webhook wake for 1199 delivery(ies)")


def test_deliveries_older_than_the_retention_are_pruned(conn):
    old = webhooks.Delivery("evt-old", "outbid", "", "", 1)
    assert webhooks.record(conn, old, now=NOW - webhooks.DELIVERIES_KEPT - timedelta(seconds=1))
    assert webhooks.record(conn, webhooks.Delivery("evt-new", "outbid", "", "", 1), now=NOW)
    assert [r[0] for r in conn.execute("SELECT event_id FROM webhook_deliveries")] == ["evt-new"]


# --- the command that stores the secret --------------------------------------------------------------------


@pytest.fixture
def stdin(monkeypatch):
    def feed(text):
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
    return feed


def test_webhook_secret_add_stores_it_mode_600_and_rotates(cli, ready, config, stdin):
    path = config.webhook_secret_path
    stdin(SECRET + "\n")
    done = cli("webhook-secret", "--add")
    assert done.code == 0, done.err
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert webhooks.read_secrets(path) == [SECRET.encode()]
    assert SECRET not in done.out + done.err
    stdin(OLD_SECRET + "\n")
    assert cli("webhook-secret", "--add").code == 0
    assert webhooks.read_secrets(path) == [OLD_SECRET.encode(), SECRET.encode()]
    retired = cli("webhook-secret", "--retire-old")
    assert retired.code == 0 and "retired 1" in retired.err
    assert webhooks.read_secrets(path) == [OLD_SECRET.encode()]


@pytest.mark.parametrize("args, text", [(("--add",), "short\n"), (("--add",), "has space in it 0123456789\n"),
                                        (("--add",), ""), ((), SECRET), (("--add", "--retire-old"), SECRET),
                                        (("--retire-old",), "")])
def test_webhook_secret_bad_input_is_one_error_line_and_writes_nothing(cli, ready, config, stdin, args, text):
    stdin(text)
    done = cli("webhook-secret", *args)
    assert done.code == 2
    assert done.err.startswith("error: ") and done.err.count("\n") == 1, done.err
    assert not config.webhook_secret_path.exists()


def test_config_keys_parse_durations():
    config = config_module.from_mapping({"server": {"webhook_secret_file": "/etc/vastctl/webhook", "webhook_tolerance": "2m",
                                                    "webhook_min_interval": "1s", "webhook_confirm_after": 3}})
    assert str(config.webhook_secret_path) == "/etc/vastctl/webhook"
    assert (config.server.webhook_tolerance, config.server.webhook_min_interval,
            config.server.webhook_confirm_after) == (120.0, 1.0, 3.0)
    with pytest.raises(Exception, match="server.webhook_tolerance"):
        config_module.from_mapping({"server": {"webhook_tolerance": "soon"}})


# --- the wake ---------------------------------------------------------------------------------------------


class CountingWaker(webhooks.Waker):
    """A Waker whose wake only counts, on virtual time: waits advance the clock."""

    def __init__(self, config, clock):
        self.results: list[webhooks.WakeResult] = []
        super().__init__(config, clock=clock, on_done=self.results.append)
        self.waited: list[float] = []

    def _wait(self, seconds):
        self.waited.append(round(max(0.0, seconds), 3))
        self.clock.advance(seconds)
        return self._stopping.is_set()

    def run_wake(self, event_ids):
        self.clock.advance(0.5)  # the wake's own time
        return webhooks.WakeResult(list(event_ids), passes=1, steps=1)


def test_wakes_are_coalesced_and_rate_limited(config):
    import threading

    config.server.webhook_min_interval = 10.0
    waker = CountingWaker(config, VirtualClock(NOW))
    waker.wake("a")
    deadline = threading.Event()
    for _ in range(200):
        if waker.results:
            break
        deadline.wait(0.01)
    with waker._lock:  # two more while the thread waits for them
        waker._pending += ["b", "c"]
    waker._signal.set()
    for _ in range(200):
        if len(waker.results) == 2:
            break
        deadline.wait(0.01)
    waker.stop()
    assert [r.event_ids for r in waker.results] == [["a"], ["b", "c"]]
    assert waker.waited == [9.5]  # the second wake began min_interval after the first began


def test_a_wake_confirms_only_when_the_listing_showed_a_live_machine_dead(conn):
    conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES (?, ?, ?, ?, ?)",
                 ("u-1", "vastctl-a", "running", clock.to_iso(NOW), clock.to_iso(NOW)))
    assert not webhooks.needs_confirmation(conn)
    conn.execute("UPDATE instances SET vast_status = 'offline'")
    assert webhooks.needs_confirmation(conn)
    conn.execute("UPDATE instances SET state = 'stopped'")
    assert not webhooks.needs_confirmation(conn)
    conn.execute("UPDATE instances SET state = 'running', vast_status = 'running', vast_missing = 1")
    assert webhooks.needs_confirmation(conn)
    conn.execute("UPDATE instances SET state = 'killed'")
    assert not webhooks.needs_confirmation(conn)



class EmptyMarket:
    """A market with nothing rented; notes who held the reconcile lease whenever it was listed."""

    def __init__(self, db_path):
        self.db_path = db_path
        self.listed_under: list[list[str]] = []

    def list_instances(self):
        import sqlite3

        check = sqlite3.connect(self.db_path)
        try:
            self.listed_under.append([r[0] for r in check.execute("SELECT holder FROM locks WHERE name = 'reconcile'")])
        finally:
            check.close()
        return []

    def search_offers(self, query):
        return []


class LeaseWaker(webhooks.Waker):
    """Waits advance virtual time; `on_wait` runs at each (cron's pass finishing, say)."""

    def __init__(self, config, market, on_wait=lambda: None):
        super().__init__(config, clock=VirtualClock(NOW), make_provider=lambda config, *, clock: market)
        self.on_wait = on_wait
        self.waited: list[float] = []

    def _wait(self, seconds):
        self.waited.append(seconds)
        self.clock.advance(seconds)
        self.on_wait()
        return False


def test_a_wake_waits_for_crons_pass_to_release_the_lease_then_runs_its_own(conn, config, db_path):
    from vastctl.state import locks

    locks.acquire(conn, "reconcile", ttl_s=600, now=NOW, holder="cron-host:4242")  # cron's pass, mid-way
    market = EmptyMarket(db_path)
    waker = LeaseWaker(config, market, on_wait=lambda: locks.release(conn, "reconcile", "cron-host:4242"))
    result = waker.run_wake(["evt-1"])
    assert (result.passes, result.steps, result.errors) == (1, 1, [])
    assert waker.waited == [webhooks.LEASE_RETRY_S]
    (holders,) = market.listed_under  # one listing, made while the wake held the lease, never cron's
    assert len(holders) == 1 and holders[0] != "cron-host:4242"
    assert conn.execute("SELECT count(*) FROM vast_listings").fetchone()[0] == 1


def test_a_wake_never_lists_while_another_pass_holds_the_lease(conn, config, db_path):
    from vastctl.state import locks

    locks.acquire(conn, "reconcile", ttl_s=600, now=NOW, holder="cron-host:4242")
    market = EmptyMarket(db_path)
    waker = LeaseWaker(config, market)
    result = waker.run_wake(["evt-1"])
    assert result.passes == 0 and market.listed_under == []
    assert len(waker.waited) == webhooks.LEASE_RETRIES
    assert "another reconcile is running" in result.errors[0]
    assert result.steps == 1  # the agent step's lease was free
