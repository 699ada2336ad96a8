"""The streams a caller's connection passes to the router's own grpcio server (front.py decides which): one
connection there per caller's connection, frames relayed both ways."""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any

import hpack

from vastctl.route import h2

if TYPE_CHECKING:
    from vastctl.route.front import _Connection as Connection

log = logging.getLogger("vastctl.route")

FRAME_OUT = 1 << 20  # the largest DATA frame sent on to grpcio, whatever it allows
TOP_UP = 16384  # a passed-on stream's window is topped up once grpcio took this much of it
ANSWER_READ = 1 << 20  # grpcio's connection brings answers: Prove's few KB, GetStatus's


class GrpcioLink:
    """The streams passed to the router's grpcio server: one connection there for this caller's connection,
    frames sent on as they come (each header block decoded and encoded again, each connection having its own
    HPACK tables), DATA queued per stream under grpcio's windows and drained as they open, so neither side's
    reader ever waits for a window. Answers come back in grpcio's reader thread."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()  # grpcio's windows, the queues and the stream maps; taken before send_lock
        self.send_lock = threading.Lock()
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.conn_window = self.initial = h2.DEFAULT_WINDOW
        self.max_frame = h2.DEFAULT_FRAME  # grpcio's: a caller's larger DATA frames are cut to it
        self.windows: dict[int, int] = {}  # our stream id → what grpcio lets us send on it
        self.queued: dict[int, list[tuple[Any, bool]]] = {}
        self.ours: dict[int, int] = {}  # caller's stream → ours
        self.callers: dict[int, int] = {}  # ours → the caller's
        self.taken: dict[int, int] = {}  # caller's stream → bytes grpcio took since its window was topped up
        self.next_stream = 1

    def _connect(self) -> socket.socket:
        if self.sock is None:
            sock = socket.create_connection(("127.0.0.1", self.connection.front.internal_port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
            self._write([h2.PREFACE, h2.settings(enable_push=0, initial_window_size=self.connection.initial_window),
                         h2.window_update(0, h2.LARGEST_WINDOW - h2.DEFAULT_WINDOW)])
            threading.Thread(target=self._read_loop, args=(sock,), name="route-grpcio-reader", daemon=True).start()
        return self.sock

    def _write(self, buffers: list[Any]) -> None:
        assert self.sock is not None
        with self.send_lock:
            h2.send_buffers(self.sock, buffers)

    def open(self, caller: int, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        with self.lock:
            self._connect()
            ours, self.next_stream = self.next_stream, self.next_stream + 2
            self.ours[caller], self.callers[ours] = ours, caller
            self.windows[ours], self.queued[ours] = self.initial, []
            with self.send_lock:
                block = self.encoder.encode(fields)
                assert self.sock is not None
                h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0),
                                                     ours, block)])

    def headers(self, caller: int, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        with self.lock:
            ours = self.ours.get(caller)
            if ours is None:
                return
            self._drain()
            with self.send_lock:
                block = self.encoder.encode(fields)
                assert self.sock is not None
                h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0),
                                                     ours, block)])

    def data(self, caller: int, payload: Any, end: bool) -> None:
        with self.lock:
            ours = self.ours.get(caller)
            if ours is not None:
                self.queued[ours].append((payload, end))

    def after_read(self) -> None:
        """Send what grpcio's windows allow; what must wait is copied out of the read buffer it points into."""
        with self.lock:
            if not self.queued:
                return
            self._drain()
            for queue in self.queued.values():
                for at, (payload, end) in enumerate(queue):
                    if isinstance(payload, memoryview):
                        queue[at] = (bytes(payload), end)

    def _drain(self) -> None:
        """Send every queued frame grpcio's windows allow, in order (inside self.lock)."""
        out: list[Any] = []
        ups: list[bytes] = []
        for ours, queue in self.queued.items():
            caller = self.callers[ours]
            while queue:
                payload, end = queue[0]
                size, room = len(payload), min(self.conn_window, self.windows[ours], self.max_frame)
                if size > room:
                    if room <= 0:
                        break
                    queue[0] = (payload[room:], end)  # what fits now goes; the rest waits
                    payload, end, size = payload[:room], False, room
                else:
                    queue.pop(0)
                self.conn_window -= size
                self.windows[ours] -= size
                out += [h2.header(size, h2.DATA, h2.END_STREAM if end else 0, ours), payload]
                if not end:
                    taken = self.taken[caller] = self.taken.get(caller, 0) + size
                    if taken >= TOP_UP:
                        ups.append(h2.window_update(caller, taken))
                        self.taken[caller] = 0
                else:
                    self.taken.pop(caller, None)
        if out:
            self._write(out)
        if ups:
            self.connection.write(ups)

    def reset(self, caller: int, code: int) -> None:
        with self.lock:
            ours = self.ours.pop(caller, None)
            if ours is None:
                return
            self.queued.pop(ours, None)
            self._write([h2.rst_stream(ours, code)])

    def window_update(self, caller: int, increment: int) -> None:
        """The caller let us send more of a passed-on stream's answer: so may grpcio."""
        with self.lock:
            ours = self.ours.get(caller)
            if ours is not None and self.sock is not None:
                self._write([h2.window_update(ours, increment)])

    def caller_window(self, value: int) -> None:
        """The caller's initial window for answers, passed on (grpcio sends answers within it)."""
        with self.lock:
            if self.sock is not None:
                self._write([h2.settings(initial_window_size=value)])

    def _forget(self, ours: int) -> None:
        caller = self.callers.pop(ours, None)
        self.queued.pop(ours, None)
        self.windows.pop(ours, None)
        if caller is not None:
            self.ours.pop(caller, None)
            self.taken.pop(caller, None)
            self.connection.streams.pop(caller, None)

    def _read_loop(self, sock: socket.socket) -> None:
        reader = h2.Reader(sock, read_size=ANSWER_READ)
        block, block_stream, block_flags = b"", 0, 0
        connection = self.connection
        try:
            while (frames := reader.read()) is not None:
                out: list[tuple[str, int, Any, int]] = []
                back: list[bytes] = []
                opened = False
                for kind, flags, stream, payload in frames:
                    if kind == h2.DATA:
                        caller = self.callers.get(stream)
                        if caller is not None:
                            body = bytes(h2.data_payload(flags, payload))  # it may wait for the caller's window
                            out.append(("data", caller, memoryview(body), flags & h2.END_STREAM))
                        if len(payload):  # the stream's own window is the caller's, passed on (window_update)
                            back.append(h2.window_update(0, len(payload)))
                        if flags & h2.END_STREAM:
                            with self.lock:
                                self._forget(stream)
                    elif kind in (h2.HEADERS, h2.CONTINUATION):
                        if kind == h2.HEADERS:
                            block, block_stream, block_flags = h2.header_block(flags, payload), stream, flags
                        else:
                            block += payload
                        if not flags & h2.END_HEADERS:
                            continue
                        fields = h2.decode(self.decoder, block)
                        caller = self.callers.get(block_stream)
                        if caller is not None:
                            out.append(("headers", caller, fields, block_flags & h2.END_STREAM))
                        if block_flags & h2.END_STREAM:
                            with self.lock:
                                self._forget(block_stream)
                    elif kind == h2.RST_STREAM:
                        caller = self.callers.get(stream)
                        if caller is not None:
                            out.append(("reset", caller, h2.u32(payload), 0))
                        with self.lock:
                            self._forget(stream)
                    elif kind == h2.SETTINGS and not flags & h2.ACK:
                        values = h2.parse_settings(payload)
                        self._write(back + [h2.frame(h2.SETTINGS, h2.ACK, 0)])  # before a frame may use them
                        back = []
                        with self.lock:
                            if h2.INITIAL_WINDOW_SIZE in values:
                                for ours in self.windows:
                                    self.windows[ours] += values[h2.INITIAL_WINDOW_SIZE] - self.initial
                                self.initial = values[h2.INITIAL_WINDOW_SIZE]
                            self.max_frame = min(values.get(h2.MAX_FRAME_SIZE, self.max_frame), FRAME_OUT)
                        opened = True
                    elif kind == h2.WINDOW_UPDATE:
                        increment = h2.u32(payload) & 0x7FFFFFFF
                        with self.lock:
                            if stream == 0:
                                self.conn_window += increment
                            elif stream in self.windows:
                                self.windows[stream] += increment
                        opened = True
                    elif kind == h2.PING and not flags & h2.ACK:
                        back.append(h2.frame(h2.PING, h2.ACK, 0, payload))
                if back:
                    self._write(back)
                if opened:
                    self.after_read()
                if out:
                    connection.relay(out)
        except (h2.ProtocolError, hpack.HPACKError, OSError) as exc:
            log.error("the router's own gRPC server broke a passed-on call: %s", exc)
        with self.lock:  # grpcio went away: every call passed to it ends, as a reset
            callers = list(self.callers.values())
            for ours in list(self.callers):
                self._forget(ours)
        for caller in callers:
            try:
                connection.write([h2.rst_stream(caller, h2.INTERNAL_ERROR)])
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
