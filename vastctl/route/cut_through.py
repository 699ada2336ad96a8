"""A Prove sent to its prover over the router's own HTTP/2 client: a large one while it still arrives from
Curio, and kept whole for a resend.

Read whole before it is sent, a large call would cross the router twice, one crossing after the other
(bench/README.md, "Proof router"). Here its bytes go to the prover as they come, under the prover's HTTP/2 flow
control, and are copied once into the call's own buffer, so a call the prover dropped can be sent again, from
the start, to another prover. A small call, read whole by grpcio, goes the same way from its bytes.

`Incoming` is the call's message as the front end (caller.py) receives it; `send` is one attempt at one prover,
over a connection of its own (one per call, so each answer is judged alone: one message, to the whole
request), which returns what came back as an outcome server.Router reads (health.py).
"""

from __future__ import annotations

import mmap
import socket
import threading
from typing import Any, Callable

import grpc

from vastctl.clock import Clock
from vastctl.route import h2, wire
from vastctl.route import h2_connection as core
from vastctl.route.buffers import Buffers

BATCH = 4 << 20  # at most this much is sent in one sendmsg
OUR_WINDOW = wire.MAX_ANSWER + 64 * 1024  # all a prover may send back: one answer, never granted more
ANSWER_READ = 64 * 1024  # a prover's connection brings an answer of a few KB and window updates
WRITE_STALL_S = 30.0  # a prover that takes none of our acknowledgements this long has its connection fail
_CODES = {code.value[0]: code for code in grpc.StatusCode}
DROPPED_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)  # as server.DROPPED, CANCELLED too


class Incoming:
    """One Prove's message (without its 5-byte prefix) as it arrives. Until `open` it is not read: only what
    the caller's first window let through is kept. `grant` opens the caller's stream window by n bytes."""

    def __init__(self, length: int, grant: Callable[[int], None], buffers: Buffers,
                 in_use: Callable[[], int]) -> None:
        self.length = length
        self.cond = threading.Condition()
        self.received = 0
        self.data: mmap.mmap | bytearray | bytes | None = None
        self.prelude = bytearray()
        self.gone: str | None = None  # why the caller's message will not come whole: the call is abandoned
        self._grant = grant
        self._buffers, self._in_use = buffers, in_use

    @classmethod
    def whole(cls, message: bytes, buffers: Buffers) -> Incoming:
        """A message read whole already (a small call grpcio read): sent from its bytes as they are."""
        incoming = cls(len(message), grant=lambda _: None, buffers=buffers, in_use=lambda: 0)
        incoming.data, incoming.received = message, len(message)
        return incoming

    def add(self, payloads: list[Any], end: bool) -> None:
        """What one read of the caller's connection brought of this message (one wake-up of its sender)."""
        with self.cond:
            for payload in payloads:
                size = len(payload)
                if self.gone is not None:
                    break
                if self.received + size > self.length:
                    self.gone = "the caller sent more than its one message"
                elif self.data is None:
                    self.prelude += payload
                else:
                    assert not isinstance(self.data, bytes)  # a message read whole has nothing more to add
                    self.data[self.received:self.received + size] = payload
                self.received += size
            if end and self.gone is None and self.received < self.length:
                self.gone = f"the caller ended its message after {self.received} of its {self.length} bytes"
            self.cond.notify_all()

    def open(self) -> None:
        """The router has room for the message: keep it whole, and let the rest of it come."""
        with self.cond:
            if self.data is not None:
                return
            # a kept buffer, or anonymous memory zeroed by the kernel as it is first written (buffers.py):
            # bytearray(n) would zero all of it first, while the call waits to be sent (bench/README.md, "Fifth step")
            self.data = self._buffers.take(self.length, in_use=self._in_use()) if self.length else bytearray()
            self.data[:len(self.prelude)] = self.prelude
            self.prelude = bytearray()
            wanted = self.length + h2.MESSAGE_PREFIX - h2.DEFAULT_WINDOW
        if wanted > 0:
            self._grant(wanted)

    def cancel(self, why: str) -> None:
        with self.cond:
            if self.gone is None:
                self.gone = why
            self.cond.notify_all()

    def release(self) -> None:
        """The call is over: its bytes are given back now, not when a collector finds them."""
        with self.cond:
            data, self.data, self.prelude = self.data, None, bytearray()
        if isinstance(data, mmap.mmap):
            self._buffers.give(data, in_use=self._in_use())

    @property
    def complete(self) -> bool:
        return self.data is not None and self.received == self.length


class _Attempt:
    """One HTTP/2 connection to a prover carrying this one call; its reader runs in a thread. The prover is held
    to RFC 9113 by the connection core and to gRPC's unary answer: one message of at most wire.MAX_ANSWER."""

    def __init__(self, sock: socket.socket, incoming: Incoming, deadline: float, clock: Clock) -> None:
        self.sock, self.incoming, self.cond = sock, incoming, incoming.cond
        self.deadline, self.clock = deadline, clock
        self.core = core.Connection(server=False, window=OUR_WINDOW, connection_window=OUR_WINDOW, cond=incoming.cond)
        self.stream = self.core.open_stream()
        self.send_lock = threading.Lock()
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.answer = bytearray()
        self.done = False  # the prover ended its answer
        self.sent_all = False  # the whole request went out
        self.failed: str | None = None  # the connection or the stream ended before the answer did
        self.unprocessed = False  # the prover said it never took the call (GOAWAY below it, REFUSED_STREAM)
        self.heard = False  # a frame came from the prover: an HTTP/2 peer was there (not a tunnel's dead end)

    def write(self, buffers: list[Any], timeout: float | None = None) -> None:
        with self.send_lock:
            h2.send_buffers(self.sock, buffers, timeout=timeout, give_up=self._given_up)

    def _given_up(self) -> bool:
        return self.failed is not None or self.incoming.gone is not None or self.clock.monotonic() >= self.deadline

    def read_loop(self) -> None:
        reader = h2.Reader(self.sock, read_size=ANSWER_READ)
        try:
            while (frames := reader.read()) is not None:
                self.heard = True
                for event in self.core.receive_all(frames):
                    self._take(event)
                out = self.core.take_out()
                if out:  # not for nothing: the upload may hold send_lock, writing
                    self.write(out, timeout=WRITE_STALL_S)
        except h2.ConnectionFault as fault:
            self._fail(f"the daemon broke HTTP/2 (error {fault.code}): {fault}"[:300])
        except OSError:
            pass
        self._fail("the connection closed before the daemon answered")

    def _take(self, event: Any) -> None:
        if isinstance(event, core.Settings):
            # acknowledged before the upload may use them: a larger frame sent ahead of the ACK is one the
            # daemon still refuses (FRAME_SIZE_ERROR)
            out = self.core.take_out()
            if out:
                self.write(out, timeout=WRITE_STALL_S)
            self.core.apply_settings()
        elif isinstance(event, core.Headers) and event.stream == self.stream:
            with self.cond:
                if self.headers is None:
                    self.headers = event.fields
                else:
                    self.trailers = event.fields
                self.done = self.done or event.end
                self.cond.notify_all()
        elif isinstance(event, core.Data) and event.stream == self.stream:
            if len(self.answer) + len(event.payload) > wire.MAX_ANSWER + h2.MESSAGE_PREFIX:
                raise h2.ConnectionFault(h2.CANCEL, f"an answer over {wire.MAX_ANSWER} bytes")
            self.answer += event.payload
            if event.end:
                with self.cond:
                    self.done = True
                    self.cond.notify_all()
        elif isinstance(event, core.Reset) and event.stream == self.stream:
            self.unprocessed = event.code == h2.REFUSED_STREAM
            self._fail(f"the daemon reset the call (HTTP/2 error {event.code})")
        elif isinstance(event, core.GoAway) and self.core.unprocessed():
            self.unprocessed = True
            self._fail("the daemon closed the connection before taking the call (GOAWAY)")

    def _fail(self, why: str) -> None:
        with self.cond:
            if not self.done and self.failed is None:
                self.failed = why
            self.cond.notify_all()


def send(endpoint: str, incoming: Incoming, *, path: str, timeout: float, clock: Clock,
         track: Callable[[socket.socket | None], None]) -> tuple[str, Any]:
    """(outcome, what came back), as server.Router._send: completed (the answer's message bytes), error ((code,
    details) the daemon chose), dropped (why), unreached (why: nothing reached the prover, so nothing counts
    against it as a dropped call), expired (a message), abandoned (why: the caller went away, or its message
    broke off). Every wait, to send as to read, ends by the call's deadline. `track` is given the connection
    while it is open, so a prover that leaves the joined set has its calls taken back (the connection shut)."""
    host, _, port = endpoint.rpartition(":")
    deadline = clock.monotonic() + timeout
    try:
        sock = socket.create_connection((host, int(port)), timeout=max(0.1, min(timeout, 10.0)))
    except OSError as exc:
        return "unreached", f"UNAVAILABLE could not connect: {exc}"[:300]
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    h2.bound_sends(sock)
    track(sock)
    attempt = _Attempt(sock, incoming, deadline, clock)
    try:
        fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                  (b":authority", endpoint.encode()), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                  (b"grpc-timeout", h2.timeout_header(timeout)), (b"grpc-accept-encoding", b"identity"),
                  (b"user-agent", b"vastctl-route")]
        try:
            attempt.write(attempt.core.preface() + [
                h2.frame(h2.HEADERS, h2.END_HEADERS, attempt.stream, attempt.core.encoder.encode(fields))],
                timeout=max(0.001, deadline - clock.monotonic()))
        except OSError as exc:
            return "unreached", f"UNAVAILABLE the connection failed before the call was sent: {exc}"[:300]
        threading.Thread(target=attempt.read_loop, name="route-prover-reader", daemon=True).start()
        outcome = _upload(attempt, deadline, clock)
        if outcome is None:
            outcome = _await_answer(attempt, deadline, clock)
        if outcome[0] in ("expired", "abandoned"):
            try:
                attempt.write([attempt.core.reset(attempt.stream, h2.CANCEL)], timeout=0.1)
            except OSError:
                pass
        return outcome
    finally:
        track(None)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def _stopped(attempt: _Attempt, deadline: float, clock: Clock) -> tuple[str, Any] | None:
    """Why this attempt ends before its answer, if it does (inside attempt.cond)."""
    if attempt.failed is not None:
        # closed before a frame came back: no daemon had the call (sshd accepts on a tunnel whose far end is
        # gone, then closes); or the daemon said it never took it
        unreached = attempt.unprocessed or not attempt.heard
        return ("unreached" if unreached else "dropped"), f"UNAVAILABLE {attempt.failed}"
    if attempt.incoming.gone is not None:
        return "abandoned", attempt.incoming.gone
    if clock.monotonic() >= deadline:
        return "expired", "the call's deadline passed while the prover had it"
    return None


def _upload(attempt: _Attempt, deadline: float, clock: Clock) -> tuple[str, Any] | None:
    """Send the message as it arrives, under the prover's windows; None once it is all sent (or answered)."""
    incoming, prefix = attempt.incoming, h2.message_prefix(attempt.incoming.length)
    connection, stream = attempt.core, attempt.stream
    total = h2.MESSAGE_PREFIX + incoming.length
    position = 0
    while position < total:
        frames: list[Any] = []
        with attempt.cond:
            while True:
                if attempt.done:
                    return None  # answered before it had it all: the answer decides (_outcome)
                stopped = _stopped(attempt, deadline, clock)
                if stopped is not None:
                    return stopped
                available = h2.MESSAGE_PREFIX + incoming.received - position
                if available > 0:
                    size = connection.take(stream, min(available, BATCH), frames=True)
                    if size < 0:
                        attempt._fail("the daemon closed the stream while the call was sent")
                        continue
                    if size > 0:
                        break
                attempt.cond.wait(timeout=max(0.0, min(1.0, deadline - clock.monotonic())))
            assert incoming.data is not None  # opened before the router placed it
            data = memoryview(incoming.data)
            end = position + size
            while position < end:  # cut into the peer's frame size
                length = min(end - position, connection.max_frame_out)
                last = position + length == total
                frames.append(h2.header(length, h2.DATA, h2.END_STREAM if last else 0, stream))
                if position < h2.MESSAGE_PREFIX:
                    head = min(length, h2.MESSAGE_PREFIX - position)
                    frames.append(prefix[position:position + head])
                    frames.append(data[0:length - head])
                else:
                    frames.append(data[position - h2.MESSAGE_PREFIX:position - h2.MESSAGE_PREFIX + length])
                position += length
        try:  # outside the lock: the reader keeps taking window updates while this waits on the socket
            attempt.write(frames, timeout=max(0.001, deadline - clock.monotonic()))
            if position == total:
                connection.sent_end(stream)
                attempt.sent_all = True
        except OSError as exc:
            attempt._fail(f"the connection failed while the call was sent: {exc}"[:300])
        finally:
            del frames, data
    return None


def _await_answer(attempt: _Attempt, deadline: float, clock: Clock) -> tuple[str, Any]:
    with attempt.cond:
        while not attempt.done:
            stopped = _stopped(attempt, deadline, clock)
            if stopped is not None:
                return stopped
            attempt.cond.wait(timeout=max(0.0, min(1.0, deadline - clock.monotonic())))
    return _outcome(attempt)


def _outcome(attempt: _Attempt) -> tuple[str, Any]:
    """What the prover's answer says: its grpc-status decides, as a gRPC client would; an OK answer must be one
    message, to the whole request."""
    head = dict(attempt.headers or [])
    tail = dict(attempt.trailers or []) if attempt.trailers is not None else head  # trailers-only: in the head
    status = tail.get(b"grpc-status")
    if status is None or not status.isdigit():
        return "dropped", f"the daemon answered HTTP {head.get(b':status', b'?').decode('ascii', 'replace')} without a gRPC status"
    code = _CODES.get(int(status), grpc.StatusCode.UNKNOWN)
    details = h2.read_status_message(tail.get(b"grpc-message", b""))
    if code == grpc.StatusCode.OK:
        if not attempt.sent_all:
            return "dropped", "the prover answered OK before the whole request reached it: not a proof of it"
        try:
            return "completed", h2.one_message(bytes(attempt.answer))
        except ValueError as exc:
            return "dropped", f"the prover's answer is not one gRPC message: {exc}"
    if code in DROPPED_CODES:
        return "dropped", f"{code.name} {details}"[:300]
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "expired", "the call's deadline passed while the prover had it"
    return "error", (code, details)
