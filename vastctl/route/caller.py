"""One caller's HTTP/2 connection to the front end (front.py accepts it): each call is one stream.

A large Prove (route.cut_through_mb, decided from its 5-byte gRPC prefix and first fields, server.Router.cuts)
is served here: its message goes to the prover as it arrives (cut_through.py), held, placed, resent and recorded
by the same Router code as every other call. Every other stream (small Proves, GetStatus, the rest) is passed
frame by frame to the router's grpcio server (grpcio_link.py).

Every frame goes through the connection's h2_connection.Connection first, which holds the caller to RFC 9113.
Flow control is what keeps a waiting call free: a stream gets the default 64 KiB window until the router has room
for its message (a large Prove's window is then opened to its whole size; a passed-on stream's is topped up by
what grpcio took), so a call no prover can take yet costs at most 64 KiB here, and DATA past a window ends the
connection (FLOW_CONTROL_ERROR) instead of being kept.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import grpc

from vastctl.clock import Clock
from vastctl.route import h2, wire
from vastctl.route import h2_connection as core
from vastctl.route.cut_through import Incoming
from vastctl.route.grpcio_link import GrpcioLink
from vastctl.route.server import Router

log = logging.getLogger("vastctl.route")

HEAD_BYTES = 4096  # a Prove's id and kind are within its first bytes (wire.prove_header_start)
FRAME_IN = 1 << 20  # the largest frame a caller may send (fewer frames to parse than HTTP/2's 16 KiB)
MESSAGE_LIMIT = 4000  # characters of a status message sent back
MAX_STREAMS = 256  # calls open at once on one connection (gRPC clients queue the rest themselves)
WRITE_STALL_S = 30.0  # a caller that takes none of our bytes this long has its connection closed
WINDOW_STALL_S = 120.0  # a caller that opens no window for an answer this long has that call reset
PREFACE_S = 10.0  # a connection that does not start HTTP/2 within this is closed
READ_SMALL = 256 * 1024  # what one read may take while no large call arrives on the connection (h2.READ while one does)
DRAIN_PING = b"vastctl\x00"  # the PING of a graceful stop: its answer says the first GOAWAY was read


class Site(Protocol):
    """What a connection needs of the front end that accepted it."""
    router: Router
    internal_port: int

    def call_started(self, thread: threading.Thread) -> None: ...

    def call_ended(self, thread: threading.Thread) -> None: ...

    def stream_ended(self) -> None: ...

    def forget(self, connection: CallerConnection) -> None: ...


class Aborted(Exception):
    """The router ended the call with this status (Router code calls context.abort)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """server.CallContext for a call served here: its deadline from grpc-timeout, active while its caller is."""

    def __init__(self, incoming: Incoming, timeout: float | None, clock: Clock) -> None:
        self.incoming, self.clock = incoming, clock
        self.deadline = None if timeout is None else clock.monotonic() + timeout

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)

    def is_active(self) -> bool:
        return self.incoming.gone is None

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock.monotonic()


@dataclass
class _Stream:
    id: int
    fields: list[tuple[bytes, bytes]]
    mode: str  # pending (a Prove not decided yet), passed (to grpcio), arriving (served here)
    prelude: bytearray = field(default_factory=bytearray)
    incoming: Incoming | None = None


class CallerConnection:
    """One caller's connection: read in its own thread; written by that thread, grpcio's link reader and each
    call served here, one at a time under `send_lock` (the caller's HPACK table sees header blocks in the order
    they are sent). Lock order: send_lock, then the core's cond."""

    def __init__(self, site: Site, sock: socket.socket, clock: Clock) -> None:
        self.site, self.sock, self.clock = site, sock, clock
        self.core = core.Connection(server=True, max_frame=FRAME_IN, window=h2.DEFAULT_WINDOW,
                                    connection_window=h2.LARGEST_WINDOW, max_streams=MAX_STREAMS)
        self.send_lock = threading.Lock()
        self.lock = threading.Lock()  # self.streams, self.arriving_calls
        self.streams: dict[int, _Stream] = {}
        self.internal = GrpcioLink(self, site.internal_port)
        self.arriving: dict[int, tuple[list[Any], bool]] = {}
        self.backlog: list[tuple[str, int, Any, int]] = []  # grpcio's frames waiting for the caller's windows
        self.arriving_calls = 0  # large calls served here whose message may still be arriving
        self.draining = False
        self.final_goaway = False  # a graceful stop named the last stream taken
        self.last_active = clock.monotonic()

    # --- writing to the caller -------------------------------------------------------------------------

    def write(self, buffers: list[Any]) -> None:
        with self.send_lock:
            h2.send_buffers(self.sock, buffers, timeout=WRITE_STALL_S)

    def send_headers(self, stream: int, fields: list[tuple[bytes, bytes]], flags: int) -> bool:
        """A header block on a stream still open; False when the stream is gone (reset meanwhile)."""
        with self.send_lock:
            if not self.core.is_open(stream):
                return False
            block = self.core.encoder.encode(fields)
            h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream, block)],
                            timeout=WRITE_STALL_S)
            if flags & h2.END_STREAM:
                self.core.sent_end(stream)
        return True

    def grant(self, stream: int, size: int) -> None:
        """Let the caller send `size` more bytes of a stream (grpcio took them, or the router has room)."""
        update = self.core.grant(stream, size)
        if update:
            try:
                self.write([update])
            except OSError:
                pass

    @property
    def initial_window(self) -> int:
        """The caller's window for each answer (its SETTINGS_INITIAL_WINDOW_SIZE)."""
        return self.core.initial_send

    def relay(self, items: list[tuple[str, int, Any, int]]) -> None:
        """Frames from grpcio to the caller, in the order they came: ("data", stream, bytes, flags), ("headers",
        stream, fields, flags) or ("reset", stream, code, 0). DATA goes within the caller's windows (what does
        not fit is cut, and waits with everything after it until the caller opens them); header blocks are
        encoded as they are sent."""
        ended: list[int] = []
        with self.send_lock:
            out: list[Any] = []
            with self.core.cond:
                self.backlog.extend(items)
                while self.backlog:
                    kind, stream, value, flags = self.backlog[0]
                    if kind == "data":
                        size = self.core.take(stream, len(value)) if len(value) else \
                            (0 if self.core.is_open(stream) else -1)
                        if size == 0 and len(value):
                            break  # the caller's window is shut: the rest waits for its WINDOW_UPDATE
                        if size > 0 and size < len(value):
                            out += [h2.header(size, h2.DATA, 0, stream), value[:size]]
                            self.backlog[0] = (kind, stream, value[size:], flags)
                            continue
                        if size >= 0:
                            out += [h2.header(len(value), h2.DATA, flags, stream), value]
                            if flags & h2.END_STREAM:
                                self.core.sent_end(stream)
                                ended.append(stream)
                    elif kind == "headers":
                        if self.core.is_open(stream):
                            out.append(h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream,
                                                self.core.encoder.encode(value)))
                            if flags & h2.END_STREAM:
                                self.core.sent_end(stream)
                                ended.append(stream)
                    elif self.core.is_open(stream):
                        out.append(self.core.reset(stream, value))
                        ended.append(stream)
                    self.backlog.pop(0)
            if out:
                h2.send_buffers(self.sock, out, timeout=WRITE_STALL_S)
        for stream in ended:
            self._finished(stream)

    def answer(self, stream: _Stream, message: bytes) -> None:
        """A Prove's answer: headers, its one message (under the caller's windows), then grpc-status 0."""
        if not self.send_headers(stream.id, h2.response_headers(), 0):
            return
        body = memoryview(h2.message_prefix(len(message)) + message)
        while len(body):
            with self.core.cond:
                while (size := self.core.take(stream.id, len(body))) == 0:
                    if not self.core.cond.wait(timeout=WINDOW_STALL_S):
                        size = -2
                        break
            if size == -2:
                self.write([self.core.reset(stream.id, h2.CANCEL)])
                return
            if size < 0:
                return  # the caller reset the stream or its connection ended
            self.write([h2.header(size, h2.DATA, 0, stream.id), body[:size]])
            body = body[size:]
        self.send_headers(stream.id, h2.trailers(0), h2.END_STREAM)

    def refuse(self, stream: int, code: grpc.StatusCode, details: str, *, unread: bool) -> None:
        """A trailers-only answer; `unread`: the caller may still be sending, so it is told to stop."""
        fields = h2.response_headers() + h2.trailers(code.value[0], details[:MESSAGE_LIMIT])
        if self.send_headers(stream, fields, h2.END_STREAM) and unread:
            self.write([self.core.reset(stream, h2.NO_ERROR)])

    # --- reading from the caller -----------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except h2.ConnectionFault as fault:
            log.warning("closed a caller's connection (HTTP/2 error %d): %s", fault.code, fault)
            try:
                self.write(self.core.take_out() + [h2.goaway(self.core.processed, fault.code)])
            except OSError:
                pass
        except OSError:
            pass
        except Exception as exc:  # noqa: BLE001 - this connection ends; the router and the others go on
            log.error("a caller's connection failed in the router: %r", exc)
        finally:
            self.close()

    def _run(self) -> None:
        self.sock.settimeout(PREFACE_S)
        preface = b""
        while len(preface) < len(h2.PREFACE):
            chunk = self.sock.recv(len(h2.PREFACE) - len(preface))
            if not chunk:
                return
            preface += chunk
            if not h2.PREFACE.startswith(preface):
                raise h2.ConnectionFault(h2.PROTOCOL_ERROR, "not an HTTP/2 (gRPC) connection")
        self.sock.settimeout(None)
        self.write(self.core.preface())
        reader = h2.Reader(self.sock, max_frame=FRAME_IN, read_size=READ_SMALL)
        while (frames := reader.read()) is not None:
            self.last_active = self.clock.monotonic()
            received = 0
            self.arriving = {}  # this read's bytes of each call served here, added at once
            for event in self.core.receive_all(frames):
                if isinstance(event, core.Data):
                    received += event.flow
                    self._data(event.stream, event.payload, event.end)
                elif isinstance(event, core.Headers):
                    self._headers(event)
                elif isinstance(event, core.Reset):
                    self._reset(event.stream)
                elif isinstance(event, core.Settings):
                    self.write(self.core.take_out())  # acknowledged before a frame may use them (never empty)
                    self.core.apply_settings()
                    if h2.INITIAL_WINDOW_SIZE in event.values:
                        self.internal.caller_window(event.values[h2.INITIAL_WINDOW_SIZE])
                    self.relay([])
                elif isinstance(event, core.WindowOpened):
                    if event.stream and self._mode(event.stream) == "passed":
                        self.internal.window_update(event.stream, event.increment)
                    if self.backlog:
                        self.relay([])
                elif isinstance(event, core.Pong) and event.payload == DRAIN_PING and self.draining:
                    # every stream the caller opened before it read our first GOAWAY is in: name the last
                    self.core.refusing = True
                    self.write(self.core.take_out() + [h2.goaway(self.core.processed, h2.NO_ERROR)])
                    self.final_goaway = True  # only once it is sent: a call ending now may close the connection
            for stream_id, (payloads, end) in self.arriving.items():
                arriving = self.streams.get(stream_id)
                if arriving is not None and arriving.incoming is not None:
                    arriving.incoming.add(payloads, end)
            self.arriving = {}
            # large reads only while a large call arrives (its memory was reserved): whatever else a peer sends,
            # its connection reads at most READ_SMALL at a time
            reader.read_size = h2.READ if self.arriving_calls else READ_SMALL
            self.internal.after_read()
            out = self.core.take_out()
            if received:
                out.append(self.core.grant(0, received))  # the streams' windows bound what is kept
            if out:
                self.write(out)
            if self.final_goaway and not self.busy():
                self._end_writing()

    def _mode(self, stream_id: int) -> str | None:
        stream = self.streams.get(stream_id)
        return None if stream is None else stream.mode

    def _headers(self, event: core.Headers) -> None:
        with self.lock:
            stream = self.streams.get(event.stream)
        if not event.first:  # trailers from the caller (gRPC callers send none): passed on, or ignored
            if stream is not None and stream.mode == "passed":
                self.internal.headers(event.stream, event.fields, event.end)
            return
        path = dict(event.fields).get(b":path")
        mode = "pending" if path == wire.PROVE.encode() and not event.end else "passed"
        with self.lock:
            self.streams[event.stream] = _Stream(event.stream, event.fields, mode)
        if mode == "passed":
            self.internal.open(event.stream, event.fields, event.end)

    def _data(self, stream_id: int, body: memoryview, end: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream answered and reset: what was on its way is dropped
        if stream.mode == "passed":
            self.internal.data(stream_id, body, end)
        elif stream.mode == "arriving":
            payloads, ended = self.arriving.get(stream_id, ([], False))
            payloads.append(body)
            self.arriving[stream_id] = (payloads, ended or end)
        else:
            stream.prelude += body  # at most the stream's first window (64 KiB)
            self._decide(stream, end)

    def _decide(self, stream: _Stream, end: bool) -> None:
        """A Prove served here or passed on, once its prefix and first fields are in (or its message ended)."""
        prelude = stream.prelude
        if len(prelude) < h2.MESSAGE_PREFIX and not end:
            return
        length = int.from_bytes(prelude[1:5], "big") if len(prelude) >= h2.MESSAGE_PREFIX else 0
        if not end and len(prelude) < h2.MESSAGE_PREFIX + min(length, HEAD_BYTES):
            return
        router = self.site.router
        header = (wire.prove_header_start(memoryview(prelude)[h2.MESSAGE_PREFIX:], length)
                  if len(prelude) >= h2.MESSAGE_PREFIX and prelude[0] == 0 else None)
        if header is None or not router.cuts(header, length):
            stream.mode = "passed"  # grpcio reads it, and says what is wrong with it if anything is
            self.internal.open(stream.id, stream.fields, False)
            self.internal.data(stream.id, memoryview(bytes(prelude)), end)
            stream.prelude = bytearray()
            return
        stream.mode = "arriving"
        stream_id = stream.id  # not the stream itself: no cycle keeps a finished call's bytes alive
        incoming = stream.incoming = Incoming(length, grant=lambda n: self.grant(stream_id, n),
                                              buffers=router.buffers, in_use=lambda: router.dispatcher.kept_bytes)
        incoming.add([memoryview(prelude)[h2.MESSAGE_PREFIX:]], end)
        stream.prelude = bytearray()
        timeout = h2.grpc_timeout(dict(stream.fields).get(b"grpc-timeout"))
        call = threading.Thread(target=self._serve, args=(stream, header, timeout), name="route-call", daemon=True)
        with self.lock:
            self.arriving_calls += 1
        self.site.call_started(call)
        call.start()

    def _serve(self, stream: _Stream, header: wire.ProveHeader, timeout: float | None) -> None:
        assert stream.incoming is not None
        incoming = stream.incoming
        try:
            try:
                message = self.site.router.prove_arriving(incoming, header, _Context(incoming, timeout, self.clock))
            except Aborted as stop:
                unread = not incoming.complete
                incoming.release()
                self.refuse(stream.id, stop.code, stop.details, unread=unread)
            except Exception as exc:  # the caller gets a status, never a hung call
                log.exception("a call served as it arrived failed in the router")
                unread = not incoming.complete
                incoming.release()
                self.refuse(stream.id, grpc.StatusCode.INTERNAL, f"vastctl route failed: {exc}"[:300], unread=unread)
            else:
                incoming.release()  # before the answer: the caller's next call may take its buffer
                self.answer(stream, message)
        except OSError:
            self._shut()  # the caller stopped taking bytes: its connection ends (what the router did is recorded)
        finally:
            incoming.release()
            with self.lock:
                self.arriving_calls -= 1
            self._finished(stream.id)
            self.site.call_ended(threading.current_thread())

    def _reset(self, stream_id: int) -> None:
        """The caller reset the stream, or it broke a rule that ends only the stream (RST_STREAM sent)."""
        with self.lock:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if stream.incoming is not None:  # its thread ends the call (abandoned), then forgets the stream
                stream.incoming.cancel("the caller cancelled the call")
                return
            del self.streams[stream_id]
        if stream.mode == "passed":
            self.internal.reset(stream_id, h2.CANCEL)
        self.site.stream_ended()

    def _finished(self, stream_id: int) -> None:
        with self.lock:
            self.streams.pop(stream_id, None)
            idle = not self.streams
        self.site.stream_ended()
        if idle and self.final_goaway:
            self._end_writing()

    # --- the connection's end ----------------------------------------------------------------------------

    def busy(self) -> int:
        with self.lock:
            return len(self.streams)

    def drain(self) -> None:
        """A graceful stop (RFC 9113 §6.8, as gRPC servers do it): GOAWAY with the largest stream id and a
        PING. Streams the caller opened before it read that GOAWAY are still taken (a gRPC client sends a call
        again by itself only when it is small, so a large Prove refused would be a failed task); once the PING
        is answered, GOAWAY names the last stream taken and a later one gets REFUSED_STREAM. The calls taken
        finish; the caller opens its next ones on a new connection, which the next router accepts."""
        self.draining = True
        try:
            self.write([h2.goaway(h2.LAST_STREAM, h2.NO_ERROR), h2.frame(h2.PING, 0, 0, DRAIN_PING)])
        except OSError:
            self._shut()

    def evict(self) -> None:
        """Closed to make room for a new connection: it had no call open (GOAWAY: the caller reconnects)."""
        try:
            self.write([h2.goaway(self.core.processed, h2.NO_ERROR)])
        except OSError:
            pass
        self._shut()

    def _end_writing(self) -> None:
        """Drained: FIN after what was sent, and the reader reads on until the caller closes its end."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _shut(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # the reader thread ends, and closes the rest
        except OSError:
            pass

    def close(self) -> None:
        self.core.end()
        with self.lock:
            streams = list(self.streams.values())
        for stream in streams:
            if stream.incoming is not None:
                stream.incoming.cancel("the caller's connection closed")
        self.internal.close()
        self._shut()
        self.sock.close()
        self.site.forget(self)
