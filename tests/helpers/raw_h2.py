"""A raw HTTP/2 peer for black-box tests of `vastctl route`'s front end, and the router as a process of its own:
frames built byte by byte (nothing of the router's own frame code), so what the router answers is read as a
peer would read it (a GOAWAY and its code, an RST_STREAM and its code, or accepted: a PING after the frames
is answered). tests/test_route_conformance.py, test_route_h2_oracle.py and test_route_frame_fuzz.py use it."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hpack
import yaml

from helpers.serving import under_file_limit, wait_for

MiB = 1 << 20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# SETTINGS identifiers (RFC 9113 §6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    1, 2, 3, 4, 5, 6)
# error codes (RFC 9113 §7)
(NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR,
 REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM) = range(12)
CODE_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 4: "SETTINGS_TIMEOUT",
              5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR",
              10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
LARGEST_WINDOW = (1 << 31) - 1
SERVICE = "/cuzk.v1.ProvingEngine"
GET_STATUS = f"{SERVICE}/GetStatus"
PROVE = f"{SERVICE}/Prove"


# --- frames ---------------------------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in pairs))


def ping(opaque: bytes = b"\0" * 8, flags: int = 0) -> bytes:
    return frame(PING, flags, 0, opaque)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def request_fields(path: str = GET_STATUS, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    """A gRPC request's header fields, as Curio's client sends them."""
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def grpc_message(message: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(message)) + message


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def prove_start(request_id: str, size: int, kind: int = 1) -> tuple[bytes, int]:
    """The first bytes of a cuzk ProveRequest of about `size` bytes (its proof bytes left out) and the length of
    the whole gRPC message they start, prefix included: ProveRequest{submit: SubmitProofRequest{request_id,
    proof_kind, vanilla_proof}}, encoded by hand."""
    head = length_field(1, request_id.encode()) + varint(2 << 3) + varint(kind)
    proof_len = size
    inner_len = len(head) + len(varint(10 << 3 | 2)) + len(varint(proof_len)) + proof_len
    start = (varint(1 << 3 | 2) + varint(inner_len) + head + varint(10 << 3 | 2) + varint(proof_len))
    length = len(varint(1 << 3 | 2)) + len(varint(inner_len)) + inner_len
    return b"\0" + struct.pack(">I", length) + start, 5 + length


def prove_message(request_id: str, size: int, kind: int = 1) -> bytes:
    """A whole ProveRequest gRPC message (prefix included) with `size` proof bytes."""
    start, total = prove_start(request_id, size, kind)
    return start + bytes(total - len(start))


# --- a raw HTTP/2 caller --------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the router made of the frames under test: `accepted` (the PING sent after them was answered and
    nothing reset), `stream` (an RST_STREAM other than NO_ERROR/CANCEL came first: `code`, on `stream`),
    `connection` (a GOAWAY: `code`, `last_stream`), `closed` (the connection ended without a GOAWAY) or
    `silent` (nothing of the above before the deadline)."""
    kind: str
    code: int | None = None
    stream: int | None = None
    last_stream: int | None = None
    resets: dict[int, int] = field(default_factory=dict)

    def __str__(self) -> str:
        name = CODE_NAMES.get(self.code, str(self.code)) if self.code is not None else ""
        where = f" on stream {self.stream}" if self.stream is not None else ""
        last = f" (last stream {self.last_stream})" if self.last_stream is not None else ""
        return f"{self.kind} {name}{where}{last}".strip()


class Closed(Exception):
    """The router closed the connection (or reset it)."""


class Peer:
    """One HTTP/2 connection to the router, driven frame by frame. `handshake` sends the preface and our
    SETTINGS, reads the router's SETTINGS (`server_settings`) and window updates, acknowledges them and waits on a
    PING round trip, so everything after it is read by the router under its own advertised settings."""

    def __init__(self, port: int, *, client_settings: tuple[tuple[int, int], ...] = (), handshake: bool = True,
                 timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.server_settings: dict[int, int] = {}
        self.settings_seen = 0
        self.connection_credit = DEFAULT_WINDOW  # what the router let us send on the connection, all told
        self.stream_credit: dict[int, int] = {}  # what it let us send on each stream beyond its initial window
        self.frames: list[tuple[int, int, int, bytes]] = []  # every frame the router sent
        self.goaway: tuple[int, int] | None = None  # (last stream, code) of the latest GOAWAY
        self.goaways: list[tuple[int, int]] = []
        self.resets: dict[int, int] = {}
        self.errors: list[tuple[str, int, int]] = []  # ("connection" or "stream", code, stream) in the order sent
        self.ended: dict[int, list[tuple[bytes, bytes]]] = {}  # streams the router ended: their last header block
        self.fields: dict[int, list[tuple[bytes, bytes]]] = {}
        self.closed = False
        self.pings = 0
        if handshake:
            self.handshake(client_settings)

    # sending
    def send(self, *frames: bytes) -> bool:
        """False when the router has closed the connection already."""
        try:
            self.sock.sendall(b"".join(frames))
            return True
        except OSError:
            self.closed = True
            return False

    def headers(self, stream: int, fields: list[tuple[str, str]] | None = None, flags: int = END_HEADERS) -> bytes:
        return frame(HEADERS, flags, stream, self.encoder.encode(fields or request_fields()))

    # reading
    def _recv(self, deadline: float) -> bool:
        """One read into the buffer; False at the deadline; raises Closed at the end of the connection."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(min(left, 5.0))
        try:
            chunk = self.sock.recv(1 << 20)
        except socket.timeout:
            return False
        except OSError as exc:
            self.closed = True
            raise Closed() from exc
        if not chunk:
            self.closed = True
            raise Closed()
        self.buffer += chunk
        return True

    def next_frame(self, deadline: float) -> tuple[int, int, int, bytes] | None:
        """The router's next frame (acknowledging its SETTINGS and PINGs), None at the deadline."""
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    kind, flags = self.buffer[3], self.buffer[4]
                    stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
                    payload = bytes(self.buffer[9:9 + length])
                    del self.buffer[:9 + length]
                    self._take(kind, flags, stream, payload)
                    return kind, flags, stream, payload
            if not self._recv(deadline):
                return None

    def _take(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        self.frames.append((kind, flags, stream, payload))
        if kind == SETTINGS and not flags & ACK:
            self.settings_seen += 1
            for at in range(0, len(payload) - len(payload) % 6, 6):
                key, value = struct.unpack(">HI", payload[at:at + 6])
                self.server_settings[key] = value
            self.send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.send(ping(payload, ACK))
        elif kind == WINDOW_UPDATE and len(payload) == 4:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream == 0:
                self.connection_credit += increment
            else:
                self.stream_credit[stream] = self.stream_credit.get(stream, 0) + increment
        elif kind == GOAWAY and len(payload) >= 8:
            last, code = struct.unpack(">II", payload[:8])
            self.goaway = (last & 0x7FFFFFFF, code)
            self.goaways.append(self.goaway)
            self.errors.append(("connection", code, 0))
        elif kind == RST_STREAM and len(payload) == 4:
            code = int.from_bytes(payload, "big")
            self.resets.setdefault(stream, code)
            if code not in (NO_ERROR, CANCEL):
                self.errors.append(("stream", code, stream))
        elif kind in (HEADERS, CONTINUATION):
            block = payload
            if kind == HEADERS:
                if flags & PADDED and payload:
                    block = payload[1:len(payload) - payload[0]]
                if flags & PRIORITY_FLAG:
                    block = block[5:]
            self._block = (getattr(self, "_block", b"") if kind == CONTINUATION else b"") + block
            if flags & END_HEADERS:
                try:
                    decoded = [(bytes(n), bytes(v)) for n, v in self.decoder.decode(self._block, raw=True)]
                except hpack.HPACKError:
                    decoded = []
                self.fields.setdefault(stream, []).extend(decoded)
                self._block = b""
            if flags & END_STREAM:
                self._ending = stream
        if kind in (DATA, HEADERS) and flags & END_STREAM:
            self.ended[stream] = self.fields.get(stream, [])
        if kind == CONTINUATION and flags & END_HEADERS and getattr(self, "_ending", None) == stream:
            self.ended[stream] = self.fields.get(stream, [])
            self._ending = None

    def handshake(self, client_settings: tuple[tuple[int, int], ...] = ()) -> None:
        self.send(PREFACE + settings(*client_settings))
        deadline = time.monotonic() + 10
        while not self.settings_seen:
            if self.next_frame(deadline) is None:
                raise AssertionError("the router sent no SETTINGS within 10 s of the preface")
        assert self.barrier(deadline - time.monotonic()), "the router did not answer a PING after its SETTINGS"

    def barrier(self, timeout: float = 10.0) -> bool:
        """Send a PING and read until its answer: True once the router answered it (it has read every frame sent
        before), False when it closed the connection or stayed silent."""
        self.pings += 1
        token = struct.pack(">Q", 0x5EED0000 + self.pings)
        if not self.send(ping(token)):
            return False
        deadline = time.monotonic() + timeout
        try:
            while (got := self.next_frame(deadline)) is not None:
                kind, flags, _, payload = got
                if kind == PING and flags & ACK and payload == token:
                    return True
        except Closed:
            return False
        return False

    def verdict(self, timeout: float = 5.0, token: bytes | None = None) -> Verdict:
        """The router's answer to what was sent: read to a PING's answer, a GOAWAY, the end, or the deadline.
        `token`: the PING was sent already, with these 8 bytes."""
        answered = False
        if not self.closed:
            if token is None:
                self.pings += 1
                token = struct.pack(">Q", 0x5EED0000 + self.pings)
                self.send(ping(token))
            deadline = time.monotonic() + timeout
            try:
                while self.goaway is None and (got := self.next_frame(deadline)) is not None:
                    kind, flags, _, payload = got
                    if kind == PING and flags & ACK and payload == token:
                        answered = True
                        break
            except Closed:
                pass
        if self.goaway is not None:
            return Verdict("connection", self.goaway[1], last_stream=self.goaway[0], resets=dict(self.resets))
        errors = {stream: code for stream, code in self.resets.items() if code not in (NO_ERROR, CANCEL)}
        if errors:
            stream = min(errors)
            return Verdict("stream", errors[stream], stream=stream, resets=dict(self.resets))
        if answered:
            return Verdict("accepted", resets=dict(self.resets))
        return Verdict("closed" if self.closed else "silent", resets=dict(self.resets))

    def call(self, stream: int, path: str = GET_STATUS, message: bytes = b"", timeout: float = 10.0) -> bytes | None:
        """One unary call on this connection: its grpc-status, None when it got none before the deadline."""
        self.send(self.headers(stream, request_fields(path)), frame(DATA, END_STREAM, stream, grpc_message(message)))
        deadline = time.monotonic() + timeout
        try:
            while stream not in self.ended and stream not in self.resets:
                if self.next_frame(deadline) is None:
                    return None
        except Closed:
            return None
        return dict(self.ended.get(stream, [])).get(b"grpc-status")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def good_status(port: int, timeout: float = 10.0) -> float:
    """A GetStatus on a fresh connection: its time in seconds; AssertionError unless it comes back OK."""
    started = time.monotonic()
    peer = Peer(port, timeout=timeout)
    try:
        status = peer.call(1, timeout=timeout)
    finally:
        peer.close()
    assert status == b"0", f"a good GetStatus on a fresh connection got grpc-status {status!r}"
    return time.monotonic() - started


# --- the router in its own process ----------------------------------------------------------------------------


class RouterProcess:
    """`python -m vastctl route --listen 127.0.0.1:0` on a state file and a config file of its own; `nofile`: its
    RLIMIT_NOFILE (ulimit -n)."""

    def __init__(self, home: Path, *, nofile: int | None = None, **route):
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.db_path = home / "state.db"
        from vastctl.clock import SYSTEM
        from vastctl.state import db
        db.connect(self.db_path, create=True, now=SYSTEM.now()).close()
        raw = {"launch": {"bench_concurrency": 2, "join": "none"},
               "route": {"listen": "127.0.0.1:0", "refresh": 0.2, "drain_timeout": 2, **route}}
        config_path = home / "config.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        env = {**os.environ, "HOME": str(home), "VASTCTL_DB": str(self.db_path), "VASTCTL_CONFIG": str(config_path)}
        self.log_path = home / "route.log"

        command = [sys.executable, "-m", "vastctl", "route", "--listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(command if nofile is None else under_file_limit(nofile, nofile, command), env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.log_path.open("w"))
        found = wait_for(lambda: re.search(r"routing on 127\.0\.0\.1:(\d+)", self.log()), "the router to start",
                         timeout=60, proc=self.proc, log=self.log_path)
        self.port = int(found.group(1))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss(self) -> int:
        """The router's resident memory now, in bytes (VmRSS)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tracebacks(self, since: int = 0) -> list[str]:
        """Each traceback in the router's log (from character `since` on), with what follows it."""
        text = self.log()
        found, at = [], text.find("Traceback", since)
        while at >= 0:
            found.append(text[at:at + 2000])
            at = text.find("Traceback", at + 1)
        return found

    def status(self) -> dict:
        """The router's route_status row (rewritten every route.refresh): held, in_flight, provers..."""
        with sqlite3.connect(self.db_path) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM route_status WHERE id = 1").fetchone()
        return dict(row) if row else {}

    def wait(self, condition, what: str, timeout: float = 15.0):
        """condition()'s first true value (helpers/serving.py's wait_for, failing at once if the router exited)."""
        return wait_for(condition, what, timeout=timeout, proc=self.proc, log=self.log_path)

    def join(self, port: int, name: str = "vastctl-a") -> None:
        """A running machine whose tunnel ends at `port`, joined; returns once the router sends to it."""
        from vastctl import clock
        at = clock.to_iso(clock.SYSTEM.now())
        with sqlite3.connect(self.db_path) as conn:
            conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                         " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, 60.0)", (f"u-{name}", name, at, at, port, at))
        self.wait(lambda: self.status().get("provers"), f"the router takes the prover on port {port}", timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
