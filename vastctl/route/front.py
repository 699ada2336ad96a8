"""The router's front end: the HTTP/2 connections Curio holds to route.listen.

Each call is one stream. A large Prove (route.cut_through_mb, decided from its 5-byte gRPC prefix and first
fields, server.Router.cuts) is served here: its message goes to the prover as it arrives (cut_through.py), held,
placed, resent and recorded by the same Router code as every other call. Every other stream (small Proves,
GetStatus, the rest) is passed frame by frame to the router's grpcio server on a loopback port, one connection
there per Curio connection, so what grpcio already does for them is unchanged.

Flow control is what keeps a waiting call free: a stream gets the default 64 KiB window until the router has
room for its message (a large Prove's window is then opened to its whole size; a passed-on stream's is topped
up by what grpcio took), so a call no prover can take yet costs at most 64 KiB here.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
import hpack

from vastctl.clock import Clock
from vastctl.route import h2, wire
from vastctl.route.cut_through import Incoming
from vastctl.route.grpcio_link import GrpcioLink
from vastctl.route.server import Router

log = logging.getLogger("vastctl.route")

HEAD_BYTES = 4096  # a Prove's id and kind are within its first bytes (wire.prove_header_start)
FRAME_IN = 1 << 20  # the largest frame a caller may send (fewer frames to parse than HTTP/2's 16 KiB)
MESSAGE_LIMIT = 4000  # characters of a status message sent back


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
    send_window: int = h2.DEFAULT_WINDOW  # what the caller lets us send on it


class Front:
    """The listening socket and every connection accepted on it."""

    def __init__(self, router: Router, listen: socket.socket, internal_port: int) -> None:
        self.router, self.listen, self.internal_port = router, listen, internal_port
        self.stopping = False
        self.connections: set[_Connection] = set()
        self.calls: set[threading.Thread] = set()
        self.lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="route-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listen.accept()
            except OSError:
                return  # the listener closed: stopping
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(self, sock)
            with self.lock:
                self.connections.add(connection)
            threading.Thread(target=connection.run, name="route-caller", daemon=True).start()

    def stop(self) -> None:
        """Take no new call: new connections are refused, new streams answered UNAVAILABLE."""
        self.stopping = True
        try:
            self.listen.close()
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for the calls served here to be answered."""
        with self.lock:
            calls = list(self.calls)
        for call in calls:
            call.join(timeout=timeout)

    def close(self) -> None:
        with self.lock:
            connections = list(self.connections)
        for connection in connections:
            connection.close()


def bind(address: str) -> socket.socket:
    """A listening socket on host:port (port 0 picks one); OSError when it cannot be had."""
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class _Connection:
    """One caller's connection: read in its own thread; written by that thread, the passed-on streams' reader
    and each call served here, under one lock (the caller's HPACK table is shared by every header sent)."""

    def __init__(self, front: Front, sock: socket.socket) -> None:
        self.front, self.sock = front, sock
        self.send_lock = threading.Lock()
        self.decoder, self.encoder = hpack.Decoder(), hpack.Encoder()
        self.streams: dict[int, _Stream] = {}
        self.windows = threading.Condition()  # the caller's windows for what we send
        self.send_window = h2.DEFAULT_WINDOW
        self.initial_window = h2.DEFAULT_WINDOW
        self.max_frame_out = h2.DEFAULT_FRAME
        self.internal = GrpcioLink(self)
        self.closed = False
        self.arriving: dict[int, tuple[list[Any], bool]] = {}
        self.backlog: list[tuple[str, int, Any, int]] = []  # grpcio's frames waiting for the caller's window

    # --- writing to the caller -------------------------------------------------------------------------

    def write(self, buffers: list[Any]) -> None:
        with self.send_lock:
            h2.send_buffers(self.sock, buffers)

    def send_headers(self, stream: int, fields: list[tuple[bytes, bytes]], flags: int) -> None:
        with self.send_lock:
            block = self.encoder.encode(fields)
            h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream, block)])

    def relay(self, items: list[tuple[str, int, Any, int]]) -> None:
        """Frames from grpcio to the caller, in the order they came: ("data", stream, bytes, flags), ("headers",
        stream, fields, flags) or ("reset", stream, code, 0). DATA goes within the caller's connection window
        (what does not fit is cut, and waits with everything after it until the caller opens the window,
        `_window_update`); header blocks are encoded as they are sent, so the caller's HPACK table sees them in
        its order."""
        with self.send_lock:
            with self.windows:
                self.backlog.extend(items)
                out: list[Any] = []
                while self.backlog:
                    kind, stream, value, flags = self.backlog[0]
                    if kind == "data":
                        size = min(len(value), max(0, self.send_window))
                        if size < len(value):
                            if size:
                                out += [h2.header(size, h2.DATA, 0, stream), value[:size]]
                                self.backlog[0] = (kind, stream, value[size:], flags)
                                self.send_window -= size
                            break
                        self.send_window -= size
                        out += [h2.header(size, h2.DATA, flags, stream), value]
                    elif kind == "headers":
                        out.append(h2.frame(h2.HEADERS, flags | h2.END_HEADERS, stream, self.encoder.encode(value)))
                    else:
                        out.append(h2.rst_stream(stream, value))
                    self.backlog.pop(0)
            if out:
                h2.send_buffers(self.sock, out)

    def answer(self, stream: _Stream, message: bytes) -> None:
        """A Prove's answer: headers, its one message (under the caller's windows), then grpc-status 0."""
        self.send_headers(stream.id, h2.response_headers(), 0)
        body = memoryview(h2.message_prefix(len(message)) + message)
        while len(body):
            with self.windows:
                while min(self.send_window, stream.send_window) <= 0 and not self.closed:
                    self.windows.wait(timeout=1.0)
                if self.closed:
                    return
                size = min(len(body), self.send_window, stream.send_window, self.max_frame_out)
                self.send_window -= size
                stream.send_window -= size
            self.write([h2.header(size, h2.DATA, 0, stream.id), body[:size]])
            body = body[size:]
        self.send_headers(stream.id, h2.trailers(0), h2.END_STREAM)

    def refuse(self, stream: int, code: grpc.StatusCode, details: str, *, unread: bool) -> None:
        """A trailers-only answer; `unread`: the caller may still be sending, so it is told to stop."""
        fields = h2.response_headers() + h2.trailers(code.value[0], details[:MESSAGE_LIMIT])
        self.send_headers(stream, fields, h2.END_STREAM)
        if unread:
            self.write([h2.rst_stream(stream, h2.NO_ERROR)])

    # --- reading from the caller -----------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except (h2.ProtocolError, hpack.HPACKError) as exc:
            log.warning("closed a caller's connection: %s", exc)
            try:
                self.write([h2.goaway(max(self.streams, default=0), h2.PROTOCOL_ERROR)])
            except OSError:
                pass
        except OSError:
            pass
        finally:
            self.close()

    def _run(self) -> None:
        preface = b""
        while len(preface) < len(h2.PREFACE):
            chunk = self.sock.recv(len(h2.PREFACE) - len(preface))
            if not chunk:
                return
            preface += chunk
        if preface != h2.PREFACE:
            raise h2.ProtocolError("not an HTTP/2 (gRPC) connection")
        self.write([h2.settings(initial_window_size=h2.DEFAULT_WINDOW, max_frame_size=FRAME_IN),
                    h2.window_update(0, h2.LARGEST_WINDOW - h2.DEFAULT_WINDOW)])
        reader = h2.Reader(self.sock, max_frame=FRAME_IN)
        block, block_stream, block_flags = b"", 0, 0
        while (frames := reader.read()) is not None:
            received = 0
            back: list[bytes] = []
            self.arriving = {}  # this read's bytes of each call served here, added at once
            for kind, flags, stream, payload in frames:
                if kind == h2.DATA:
                    received += len(payload)
                    self._data(stream, flags, payload)
                elif kind == h2.HEADERS:
                    block, block_stream, block_flags = h2.header_block(flags, payload), stream, flags
                    if flags & h2.END_HEADERS:
                        self._headers(block_stream, h2.decode(self.decoder, block), block_flags)
                elif kind == h2.CONTINUATION:
                    if stream != block_stream:
                        raise h2.ProtocolError("CONTINUATION of another stream")
                    block += payload
                    if flags & h2.END_HEADERS:
                        self._headers(block_stream, h2.decode(self.decoder, block), block_flags)
                elif kind == h2.RST_STREAM:
                    self._reset(stream, h2.u32(payload))
                elif kind == h2.SETTINGS and not flags & h2.ACK:
                    values = h2.parse_settings(payload)
                    # acknowledged before a frame may use them: the caller holds us to its old ones till then
                    self.write(back + [h2.frame(h2.SETTINGS, h2.ACK, 0)])
                    back = []
                    self._settings(values)
                elif kind == h2.PING and not flags & h2.ACK:
                    back.append(h2.frame(h2.PING, h2.ACK, 0, payload))
                elif kind == h2.WINDOW_UPDATE:
                    self._window_update(stream, h2.u32(payload) & 0x7FFFFFFF)
            for stream_id, (payloads, end) in self.arriving.items():
                arriving = self.streams.get(stream_id)
                if arriving is not None and arriving.incoming is not None:
                    arriving.incoming.add(payloads, end)
            self.internal.after_read()
            if received:
                back.append(h2.window_update(0, received))  # the streams' windows bound what is kept
            if back:
                self.write(back)

    def _headers(self, stream_id: int, fields: list[tuple[bytes, bytes]], flags: int) -> None:
        end = bool(flags & h2.END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the caller (gRPC callers send none): passed on, or ignored
            if stream.mode == "passed":
                self.internal.headers(stream_id, fields, end)
            return
        if self.front.stopping:
            self.refuse(stream_id, grpc.StatusCode.UNAVAILABLE, "vastctl route is stopping: it takes no new calls",
                        unread=not end)
            return
        path = dict(fields).get(b":path")
        stream = self.streams[stream_id] = _Stream(stream_id, fields, "pending" if path == wire.PROVE.encode()
                                                   and not end else "passed")
        stream.send_window = self.initial_window
        if stream.mode == "passed":
            self.internal.open(stream_id, fields, end)

    def _data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream answered and reset: what was on its way is dropped
        end = bool(flags & h2.END_STREAM)
        body = h2.data_payload(flags, payload)
        if stream.mode == "passed":
            self.internal.data(stream_id, body, end)
        elif stream.mode == "arriving":
            payloads, ended = self.arriving.get(stream_id, ([], False))
            payloads.append(body)
            self.arriving[stream_id] = (payloads, ended or end)
        else:
            stream.prelude += body
            self._decide(stream, end)

    def _decide(self, stream: _Stream, end: bool) -> None:
        """A Prove served here or passed on, once its prefix and first fields are in (or its message ended)."""
        prelude = stream.prelude
        if len(prelude) < h2.MESSAGE_PREFIX and not end:
            return
        length = int.from_bytes(prelude[1:5], "big") if len(prelude) >= h2.MESSAGE_PREFIX else 0
        if not end and len(prelude) < h2.MESSAGE_PREFIX + min(length, HEAD_BYTES):
            return
        header = (wire.prove_header_start(memoryview(prelude)[h2.MESSAGE_PREFIX:], length)
                  if len(prelude) >= h2.MESSAGE_PREFIX and prelude[0] == 0 else None)
        if header is None or not self.front.router.cuts(header, length):
            stream.mode = "passed"  # grpcio reads it, and says what is wrong with it if anything is
            self.internal.open(stream.id, stream.fields, False)
            self.internal.data(stream.id, memoryview(bytes(prelude)), end)
            stream.prelude = bytearray()
            return
        stream.mode = "arriving"
        stream_id = stream.id  # not the stream itself: no cycle keeps a finished call's bytes alive
        router = self.front.router
        incoming = stream.incoming = Incoming(length, grant=lambda n: self._grant(stream_id, n),
                                              buffers=router.buffers, in_use=lambda: router.dispatcher.kept_bytes)
        incoming.add([memoryview(prelude)[h2.MESSAGE_PREFIX:]], end)
        stream.prelude = bytearray()
        timeout = h2.grpc_timeout(dict(stream.fields).get(b"grpc-timeout"))
        call = threading.Thread(target=self._serve, args=(stream, header, timeout), name="route-call", daemon=True)
        with self.front.lock:
            self.front.calls.add(call)
        call.start()

    def _serve(self, stream: _Stream, header: wire.ProveHeader, timeout: float | None) -> None:
        assert stream.incoming is not None
        try:
            incoming = stream.incoming
            try:
                message = self.front.router.prove_arriving(incoming, header,
                                                           _Context(incoming, timeout, self.front.router.clock))
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
            pass  # the caller's connection is gone: what the router did is recorded already
        finally:
            stream.incoming.release()
            self.streams.pop(stream.id, None)
            with self.front.lock:
                self.front.calls.discard(threading.current_thread())

    def _grant(self, stream: int, size: int) -> None:
        """Let the caller send `size` more bytes of a stream (the router has room for its message)."""
        try:
            self.write([h2.window_update(stream, min(size, h2.LARGEST_WINDOW - h2.DEFAULT_WINDOW))])
        except OSError:
            pass

    def _reset(self, stream_id: int, code: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if stream.incoming is not None:  # its thread ends the call (abandoned), then forgets the stream
            stream.incoming.cancel("the caller cancelled the call")
            return
        del self.streams[stream_id]
        if stream.mode == "passed":
            self.internal.reset(stream_id, code)

    def _settings(self, values: dict[int, int]) -> None:
        with self.windows:
            if h2.INITIAL_WINDOW_SIZE in values:
                change = values[h2.INITIAL_WINDOW_SIZE] - self.initial_window
                self.initial_window = values[h2.INITIAL_WINDOW_SIZE]
                for stream in list(self.streams.values()):
                    stream.send_window += change
            self.max_frame_out = min(values.get(h2.MAX_FRAME_SIZE, self.max_frame_out), FRAME_IN)
            self.windows.notify_all()
        if h2.INITIAL_WINDOW_SIZE in values:
            self.internal.caller_window(values[h2.INITIAL_WINDOW_SIZE])

    def _window_update(self, stream_id: int, increment: int) -> None:
        with self.windows:
            if stream_id == 0:
                self.send_window += increment
            elif stream_id in self.streams:
                self.streams[stream_id].send_window += increment
            self.windows.notify_all()
            waiting = bool(self.backlog)
        if stream_id == 0 and waiting:
            self.relay([])
        if stream_id and stream_id in self.streams and self.streams[stream_id].mode == "passed":
            self.internal.window_update(stream_id, increment)

    def close(self) -> None:
        with self.windows:
            self.closed = True
            self.windows.notify_all()
        for stream in list(self.streams.values()):
            if stream.incoming is not None:
                stream.incoming.cancel("the caller's connection closed")
        self.internal.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self.front.lock:
            self.front.connections.discard(self)
