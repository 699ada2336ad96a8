"""A deadline bounds the whole exchange, not each read: vast and the Messages API trickling one byte every
0.2 s (never silent long enough for a read timeout) are cut off at the deadline, against real loopback servers."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timezone

import pytest
from helpers.fake_anthropic import fleet_observation, message, text

from vastctl.agent import llm
from vastctl.agent import step as step_module
from vastctl.clock import SYSTEM, Clock
from vastctl.config import from_mapping
from vastctl.providers.base import CreateRequest, DeadlinePassed, ProviderError
from vastctl.providers.vast import VastProvider

pytestmark = pytest.mark.slow  # real servers on loopback, bounded real waits

BYTE_EVERY_S = 0.2
TRICKLE_FOR_S = 12.0  # the server gives up after this, so a client without a whole-exchange deadline ends too
STEP_DEADLINE_S = 20  # agent.deadline on FastClock: 4 s real, well inside the trickle


class Trickler:
    """A loopback HTTP/1.1 server that answers every request 200 with `payload`, one byte every BYTE_EVERY_S;
    with `headers_too` the status line and headers trickle as well. It stops after TRICKLE_FOR_S."""

    def __init__(self, payload: bytes, *, headers_too: bool = False):
        self.payload, self.headers_too = payload, headers_too
        self.requests = 0
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests += 1
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(self.payload)}"
                        "\r\nConnection: close\r\n\r\n").encode()
                started = time.monotonic()
                if not self.headers_too:
                    conn.sendall(head)
                    head = b""
                for byte in head + self.payload:
                    if self.stopping.is_set() or time.monotonic() - started > TRICKLE_FOR_S:
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(BYTE_EVERY_S)
            except OSError:
                return

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.listener.close()


@pytest.fixture
def trickle():
    servers: list[Trickler] = []

    def start(payload: dict, **options) -> Trickler:
        server = Trickler(json.dumps(payload).encode() + b" " * 200, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


LISTING = {"success": True, "instances": [], "next_token": None}


def timed(call):
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


TRICKLED = pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers-and-body"])


@TRICKLED
def test_a_trickled_vast_listing_ends_at_the_deadline(trickle, headers_too):
    server = trickle(LISTING, headers_too=headers_too)
    vast = VastProvider("k" * 20, server.url, clock=SYSTEM, deadline=SYSTEM.monotonic() + 1.0)
    took, raised = timed(vast.list_instances)
    assert isinstance(raised, DeadlinePassed), raised
    assert "deadline" in str(raised) and took < 2.5
    assert server.requests == 1  # abandoned, not retried past the deadline


@TRICKLED
def test_a_trickled_answer_to_a_create_is_an_unknown_outcome_at_the_deadline(trickle, headers_too):
    server = trickle({"success": True, "new_contract": 4242}, headers_too=headers_too)
    vast = VastProvider("k" * 20, server.url, clock=SYSTEM, deadline=SYSTEM.monotonic() + 1.0)
    request = CreateRequest(offer_id=77, image="img", disk_gb=10, label="vastctl-x", onstart="", env={})
    took, raised = timed(lambda: vast.create_instance(request))
    assert isinstance(raised, ProviderError) and not isinstance(raised, DeadlinePassed), raised
    assert "outcome is unknown" in str(raised) and took < 2.5 and server.requests == 1


@TRICKLED
def test_reconcile_ends_by_its_deadline_against_a_trickled_listing(trickle, ready, cli, monkeypatch, tmp_path,
                                                                   headers_too):
    server = trickle(LISTING, headers_too=headers_too)
    config = tmp_path / "config.yaml"
    config.write_text("reconcile:\n  deadline: 1s\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    monkeypatch.setenv("VAST_API_KEY", "k" * 20)
    monkeypatch.setenv("VAST_API_URL", server.url)
    started = time.monotonic()
    result = cli("reconcile")
    took = time.monotonic() - started
    assert result.code == 1 and took < 3.0, (took, result.err)
    assert result.err.startswith("error: ") and len(result.err.splitlines()) == 1 and "deadline" in result.err


class FastClock(Clock):
    """The injected clock, running 5× real time: an agent.deadline of 20 s is 4 s, within the trickle's 12 s, and
    leaves 3 s for the step to build its client before a round's 5 s (1 s real) must remain."""

    SPEED = 5.0

    def __init__(self):
        self.origin = time.monotonic()
        self.start = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)

    def monotonic(self) -> float:
        return (time.monotonic() - self.origin) * self.SPEED

    def now(self) -> datetime:
        from datetime import timedelta
        return self.start + timedelta(seconds=self.monotonic())

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.SPEED)


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers-and-body"])
def test_a_trickling_model_ends_the_step_at_agent_deadline(trickle, conn, headers_too):
    import anthropic  # noqa: F401 - imported before the clock starts: its second of import is not what is timed

    server = trickle(message(text("all good")), headers_too=headers_too)
    clock = FastClock()
    config = from_mapping({"agent": {"deadline": f"{STEP_DEADLINE_S}s"}})
    env = {"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": server.url}
    started = time.monotonic()
    result = llm.run(conn, config, observation=fleet_observation(), suggestion=[], step_id=1, clock=clock, env=env,
                     execute=lambda name, tool_input: llm.ToolOutcome(True, "done"))
    took = time.monotonic() - started
    assert result.stop_reason == "error" and "timeout" in (result.error or "").lower(), result
    assert result.rounds == 0 and took < STEP_DEADLINE_S / FastClock.SPEED + 1.5 < TRICKLE_FOR_S, took
    assert server.requests == 1  # no retry: too little time was left for one


def test_the_agent_step_lease_outlives_the_step_whatever_its_deadline():
    for deadline in ("50s", "20m", "1h"):  # 1h: the longest the config allows
        config = from_mapping({"agent": {"deadline": deadline}})
        assert step_module.lease_ttl(config) >= config.agent.deadline + 60
    assert step_module.lease_ttl(from_mapping({})) == step_module.LEASE_TTL_S


def test_the_reconcile_lease_outlives_a_long_deadline(conn):
    from vastctl import clock as clock_module
    from vastctl import reconcile
    from vastctl.clock import VirtualClock

    virtual = VirtualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    seen = []

    class Listing:
        deadline = None

        def list_instances(self):
            (row,) = conn.execute("SELECT expires_at FROM locks WHERE name = 'reconcile'").fetchall()
            seen.append((clock_module.from_iso(row[0]) - virtual.now()).total_seconds())
            return []

    config = from_mapping({"reconcile": {"deadline": "1h"}})  # the longest the config allows
    reconcile.run_pass(conn, Listing(), config, clock=virtual)
    assert seen and seen[0] >= config.reconcile.deadline + 60


def test_answers_read_to_the_end_keep_their_connection_for_the_next_call():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    peers = set()

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            peers.add(self.client_address)
            body = json.dumps(LISTING).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        vast = VastProvider("k" * 20, f"http://127.0.0.1:{server.server_address[1]}", clock=SYSTEM,
                            deadline=SYSTEM.monotonic() + 30)
        for _ in range(3):
            assert vast.list_instances() == []
    finally:
        server.shutdown()
        server.server_close()
    assert len(peers) == 1  # one connection: streaming the body did not cost a new handshake per call


def test_the_deadline_also_holds_through_an_environment_proxy(monkeypatch):
    import anthropic

    from vastctl.agent import deadline_http

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    http_client = deadline_http.bound(anthropic.DefaultHttpxClient(), lambda: 1.0)
    try:
        mounted = [t for t in http_client._mounts.values() if t is not None]
        assert mounted  # the SDK's client still goes through the operator's proxy
        for transport in [http_client._transport, *mounted]:
            assert isinstance(transport._pool._network_backend, deadline_http.DeadlineBackend)
    finally:
        http_client.close()
