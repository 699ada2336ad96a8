"""`vastctl serve` under hostile connections: trickling clients, the request deadline, the connection limit.

Each test runs its own serve: the attack holds hundreds of sockets, which must
not leak into the other server tests. Speed figures are in bench/serve_bench.py;
the bounds here are generous on purpose (a loaded 2-core machine).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from helpers.serving import Manager, run_vastctl, under_file_limit

pytestmark = pytest.mark.slow  # real serve processes, slow clients on loopback

TRICKLERS = 500


def post(manager, uuid, report, body=None, *, timeout=10.0):
    return requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", data=json.dumps(body or {}),
                         headers={"Authorization": f"Bearer {manager.token(uuid)}"}, timeout=timeout)


def walk_to_running(manager, uuid):
    for report, body in (("register", {"label": f"vastctl-{uuid}"}), ("params-done", None),
                         ("bench-report", {"rate": 50}), ("running", None)):
        assert post(manager, uuid, report, body).status_code == 200, report


def open_half_sent(manager, count):
    """`count` connections that sent the start of a request and no end of headers."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", manager.port), timeout=10)
        sock.sendall(b"POST /v1/instances/anyone/heartbeat HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sockets.append(sock)
    return sockets


class Trickle(threading.Thread):
    """Sends one more header byte on every socket every `every` seconds (each byte is fresh activity)."""

    def __init__(self, sockets, every):
        super().__init__(daemon=True)
        self.sockets, self.every = sockets, every
        self.stopping = threading.Event()
        self.closed_after: dict[int, float] = {}

    def run(self):
        started = time.monotonic()
        while not self.stopping.is_set():
            for index, sock in enumerate(self.sockets):
                if index in self.closed_after:
                    continue
                try:
                    sock.send(b"a")
                except OSError:
                    self.closed_after[index] = time.monotonic() - started
            self.stopping.wait(self.every)

    def stop(self):
        self.stopping.set()
        self.join(timeout=10)
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "manager")
    yield m
    assert m.stop() == 0


def test_a_report_gets_through_while_500_connections_trickle(manager):
    """The attack: hundreds of connections each sending a byte now and then, never finishing a request."""
    manager.start()
    walk_to_running(manager, "legit")
    trickle = Trickle(open_half_sent(manager, TRICKLERS), every=1.0)
    trickle.start()
    try:
        time.sleep(1.5)  # every trickler has been accepted and has sent more since
        for n in range(1, 6):
            started = time.monotonic()
            response = post(manager, "legit", "heartbeat", {"proofs_done": n}, timeout=15)
            assert response.status_code == 200
            assert time.monotonic() - started < 3.0  # generous: the bench measures it (p99 well under a second)
    finally:
        trickle.stop()
    assert manager.rows()["legit"]["proofs_done"] == 5
    assert "anyone" not in manager.rows()


def test_a_trickling_request_is_cut_off_at_the_request_timeout(manager):
    """A byte every 0.2 s keeps a connection active, but its request must arrive in full within --request-timeout."""
    manager.start(0, "--request-timeout", "2", "--timeout", "30")
    trickle = Trickle(open_half_sent(manager, 3), every=0.2)
    trickle.start()
    deadline = time.monotonic() + 15
    while len(trickle.closed_after) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    trickle.stop()
    assert len(trickle.closed_after) == 3, "a trickling connection outlived --request-timeout 2 (and --timeout 30)"
    assert all(1.5 < after < 6 for after in trickle.closed_after.values()), trickle.closed_after
    assert manager.rows() == {}


def test_a_slow_but_finished_request_and_keep_alive_are_not_cut_off(manager):
    """The deadline counts from a request's first byte: a keep-alive connection idle between requests survives it."""
    manager.start(0, "--request-timeout", "2", "--timeout", "30")
    walk_to_running(manager, "patient")
    token = manager.token("patient")
    with socket.create_connection(("127.0.0.1", manager.port), timeout=10) as sock:
        for n in (1, 2):
            if n == 2:
                time.sleep(3)  # idle past --request-timeout on the same connection: not a request in progress
            body = json.dumps({"proofs_done": n}).encode()
            request = (f"POST /v1/instances/patient/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            sock.sendall(request[:20])
            time.sleep(0.5)  # the rest half a second later, inside the deadline
            sock.sendall(request[20:])
            assert one_response(sock).startswith(b"HTTP/1.1 200")
    assert manager.rows()["patient"]["proofs_done"] == 2


def one_response(sock: socket.socket) -> bytes:
    """One whole HTTP response off a keep-alive connection: its head, then Content-Length bytes of body (they
    may arrive in separate segments; what is left would be read as the next response's start)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        assert chunk, f"the connection closed mid-response: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, f"the connection closed mid-body: {received!r}"
        body += chunk
    assert len(body) == length, (head, body)
    return head + b"\r\n\r\n" + body


def test_connection_limit_is_configurable(manager):
    """With --connection-limit 10, ten held connections hold off the eleventh until they go."""
    manager.start(0, "--connection-limit", "10", "--request-timeout", "60")
    walk_to_running(manager, "queued")
    held = open_half_sent(manager, 10)
    try:
        time.sleep(0.5)
        with pytest.raises(requests.exceptions.ReadTimeout):
            post(manager, "queued", "heartbeat", {"proofs_done": 1}, timeout=1.5)
    finally:
        for sock in held:
            sock.close()
    assert post(manager, "queued", "heartbeat", {"proofs_done": 2}).status_code == 200
    assert manager.rows()["queued"]["proofs_done"] == 2


def test_bad_limits_are_exit_2(tmp_path):
    m = Manager(tmp_path / "bad")
    for flag, value in (("--connection-limit", "0"), ("--request-timeout", "0")):
        result = run_vastctl("serve", "--port", "0", flag, value, env=m.env)
        assert result.returncode == 2, (flag, result.stderr)
        assert flag in result.stderr


def test_connection_limit_beyond_the_open_file_limit_is_exit_2(tmp_path):
    m = Manager(tmp_path / "few-files")
    result = subprocess.run(under_file_limit(256, 1024, [sys.executable, "-m", "vastctl", "serve", "--port", "0",
                                                         "--connection-limit", "5000"]),
                            env=m.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --connection-limit needs about 5064 open files")
    assert "LimitNOFILE" in result.stderr and len(result.stderr.splitlines()) == 1


def test_serve_raises_a_low_soft_file_limit_to_fit_its_connections(tmp_path):
    """systemd starts services with a soft limit of 1024 files: serve lifts it to the hard limit it needs."""
    m = Manager(tmp_path / "lifted")
    proc = subprocess.Popen(under_file_limit(256, 4096, [sys.executable, "-m", "vastctl", "serve", "--port", "0",
                                                         "--connection-limit", "600"]),
                            env=m.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        said = [proc.stderr.readline()]
        while said[-1] and "serving on" not in said[-1]:
            said.append(proc.stderr.readline())
        assert "serving on" in said[-1], (proc.poll(), "".join(said))  # what serve said before it exited
        soft = next(row.split()[3] for row in open(f"/proc/{proc.pid}/limits") if row.startswith("Max open files"))
        assert int(soft) == 664
    finally:
        proc.terminate()
        proc.wait(timeout=20)
