"""Request smuggling over raw sockets against a real `vastctl serve`: a request framed two ways is refused.

A request with both Content-Length and Transfer-Encoding: chunked (or an
HTTP/1.0 request with Transfer-Encoding) gets a 400 and its connection is
closed, so the bytes sent after its chunked body never run as a second
request: the heartbeat hidden there does not reach the state file.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from helpers.serving import Manager

pytestmark = pytest.mark.slow

UUID = "u-smuggle"


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("smuggling"), gate=40).start(0, "--timeout", "5")
    yield m
    assert m.stop() == 0


@pytest.fixture(scope="module")
def running(manager):
    """A machine walked to `running` over a clean connection, proofs_done 1."""
    for report, body in (("register", {"label": f"vastctl-{UUID}"}), ("params-done", {}),
                         ("bench-report", {"rate": 50}), ("running", {}), ("heartbeat", {"proofs_done": 1})):
        status, _, _ = exchange(manager, request(manager, report, json.dumps(body).encode()))
        assert status.startswith(b"HTTP/1.1 200"), (report, status)
    return UUID


def request(manager, report: str, body: bytes, *, headers: str = "", version: str = "1.1") -> bytes:
    head = (f"POST /v1/instances/{UUID}/{report} HTTP/{version}\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {manager.token(UUID)}\r\nContent-Type: application/json\r\n")
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + headers + "\r\n").encode() + body


def exchange(manager, data: bytes) -> tuple[bytes, bytes, bool]:
    """Send `data` on one connection; (status line, everything the server sent, whether it closed the connection)."""
    with socket.create_connection(("127.0.0.1", manager.port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        closed = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            received += chunk
            if received.count(b"HTTP/1.") >= 1 and b"\r\n\r\n" in received and _complete(received):
                sock.settimeout(1.0)  # one full answer: wait a moment for a second one or the close
    return received.split(b"\r\n", 1)[0], received, closed


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def proofs_done(manager) -> int:
    return manager.rows()[UUID]["proofs_done"]


def smuggled_heartbeat(manager, proofs: int) -> bytes:
    return request(manager, "heartbeat", json.dumps({"proofs_done": proofs}).encode())


def test_content_length_with_chunked_is_refused_and_the_smuggled_request_never_runs(manager, running):
    hidden = smuggled_heartbeat(manager, 777)
    chunked = b"0\r\n\r\n" + hidden  # a proxy trusting Content-Length sees one request; chunked reading sees two
    outer = request(manager, "heartbeat", chunked,
                    headers=f"Content-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n")
    status, received, closed = exchange(manager, outer)
    assert status.startswith(b"HTTP/1.1 400"), received
    assert received.count(b"HTTP/1.") == 1, received  # one answer: the hidden heartbeat got none
    assert b"Content-Length or Transfer-Encoding, not both" in received
    assert closed
    assert proofs_done(manager) == 1


def test_chunked_before_content_length_and_a_body_in_the_same_packet_is_refused_too(manager, running):
    body = json.dumps({"proofs_done": 5}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    outer = request(manager, "heartbeat", chunked + smuggled_heartbeat(manager, 778),
                    headers=f"Transfer-Encoding: chunked\r\nContent-Length: {len(chunked)}\r\n")
    status, received, closed = exchange(manager, outer)
    assert status.startswith(b"HTTP/1.1 400") and closed, received
    assert proofs_done(manager) == 1  # neither the outer heartbeat nor the hidden one was applied


def test_http_1_0_with_transfer_encoding_is_refused(manager, running):
    hidden = smuggled_heartbeat(manager, 779)
    outer = request(manager, "heartbeat", b"0\r\n\r\n" + hidden, version="1.0",
                    headers="Connection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n")
    status, received, closed = exchange(manager, outer)
    assert status.startswith(b"HTTP/1.0 400") and closed, received
    assert proofs_done(manager) == 1


def test_chunked_alone_and_content_length_alone_still_work(manager, running):
    body = json.dumps({"proofs_done": 2}).encode()
    chunked = request(manager, "heartbeat", f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n",
                      headers="Transfer-Encoding: chunked\r\n")
    status, received, _ = exchange(manager, chunked)
    assert status.startswith(b"HTTP/1.1 200"), received
    assert proofs_done(manager) == 2
    status, received, _ = exchange(manager, smuggled_heartbeat(manager, 3) + smuggled_heartbeat(manager, 4))
    assert received.count(b"HTTP/1.1 200") == 2, received  # plain keep-alive pipelining is untouched
    assert proofs_done(manager) == 4
