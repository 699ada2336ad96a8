"""The streams a caller's connection passes to the router's own grpcio server (caller.py decides which): one
connection there per caller's connection, frames relayed both ways, both sides held to RFC 9113 by
h2_connection.Connection."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any, Protocol

from vastctl.route import h2
from vastctl.route import h2_connection as core

log = logging.getLogger("vastctl.route")

TOP_UP = 16384  # a passed-on stream's window is topped up once grpcio took this much of it
ANSWER_READ = 1 << 20  # grpcio's connection brings answers: Prove's few KB, GetStatus's
ANSWER_FRAME = 1 << 20  # the largest frame grpcio may send us


class Caller(Protocol):
    """What the link needs of the caller's connection."""

    @property
    def initial_window(self) -> int: ...

    def relay(self, items: list[tuple[str, int, Any, int]]) -> None: ...

    def grant(self, stream: int, size: int) -> None: ...


class GrpcioLink:
    """The streams passed to the router's grpcio server: one connection there for this caller's connection,
    frames sent on as they come (each header block decoded and encoded again, each connection having its own
    HPACK tables), DATA queued per stream under grpcio's windows and drained as they open, so neither side's
    reader ever waits for a window. Answers come back in grpcio's reader thread. Lock order: `lock`, then
    `send_lock`, then the core's cond."""

    def __init__(self, caller: Caller, port: int) -> None:
        self.caller, self.port = caller, port
        self.sock: socket.socket | None = None
        self.core: core.Connection | None = None
        self.lock = threading.Lock()  # the queues and the stream maps
        self.send_lock = threading.Lock()
        self.queued: dict[int, list[tuple[Any, bool]]] = {}
        self.ours: dict[int, int] = {}  # caller's stream → ours
        self.callers: dict[int, int] = {}  # ours → the caller's
        self.taken: dict[int, int] = {}  # caller's stream → bytes grpcio took since its window was topped up
        self.closed = False

    def _connect(self) -> core.Connection:
        if self.core is None:
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = core.Connection(server=False, max_frame=ANSWER_FRAME, window=self.caller.initial_window,
                                         connection_window=h2.LARGEST_WINDOW)
            self.sock, self.core = sock, connection
            self._write(connection.preface())
            threading.Thread(target=self._read_loop, args=(sock, connection), name="route-grpcio-reader",
                             daemon=True).start()
        return self.core

    def _write(self, buffers: list[Any]) -> None:
        if buffers:
            with self.send_lock:
                if self.sock is not None:  # None once closed (under send_lock too)
                    h2.send_buffers(self.sock, buffers)

    def open(self, caller: int, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        with self.lock:
            if self.closed:
                return
            connection = self._connect()
            with self.send_lock:
                if self.sock is None:
                    return  # closed: the caller's connection is ending
                ours = connection.open_stream()
                self.ours[caller], self.callers[ours] = ours, caller
                self.queued[ours] = []
                block = connection.encoder.encode(fields)
                h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0),
                                                     ours, block)])
                if end:
                    connection.sent_end(ours)

    def headers(self, caller: int, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        with self.lock:
            ours = self.ours.get(caller)
            if ours is None or self.core is None:
                return
            self._drain()
            with self.send_lock:
                if self.sock is None:
                    return
                block = self.core.encoder.encode(fields)
                h2.send_buffers(self.sock, [h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0),
                                                     ours, block)])
                if end:
                    self.core.sent_end(ours)

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
        if self.core is None:
            return
        out: list[Any] = []
        ups: list[tuple[int, int]] = []
        with self.core.cond:
            for ours, queue in self.queued.items():
                caller = self.callers[ours]
                while queue:
                    payload, end = queue[0]
                    size = self.core.take(ours, len(payload)) if len(payload) else \
                        (0 if self.core.is_open(ours) else -1)
                    if size < 0:
                        queue.clear()  # grpcio ended the stream: what the caller still sends is dropped
                        break
                    if len(payload) and size == 0:
                        break
                    if size < len(payload):
                        queue[0] = (payload[size:], end)  # what fits now goes; the rest waits
                        payload, end = payload[:size], False
                    else:
                        queue.pop(0)
                    out += [h2.header(size, h2.DATA, h2.END_STREAM if end else 0, ours), payload]
                    if end:
                        self.core.sent_end(ours)
                        self.taken.pop(caller, None)
                    elif size:
                        taken = self.taken[caller] = self.taken.get(caller, 0) + size
                        if taken >= TOP_UP:
                            ups.append((caller, taken))
                            self.taken[caller] = 0
        if out:
            self._write(out)
        for caller, size in ups:
            self.caller.grant(caller, size)

    def reset(self, caller: int, code: int) -> None:
        with self.lock:
            ours = self.ours.pop(caller, None)
            if ours is None or self.core is None:
                return
            self.callers.pop(ours, None)
            self.queued.pop(ours, None)
            self.taken.pop(caller, None)
            self._write([self.core.reset(ours, code)])

    def window_update(self, caller: int, increment: int) -> None:
        """The caller let us send more of a passed-on stream's answer: so may grpcio."""
        with self.lock:
            ours = self.ours.get(caller)
            if ours is not None and self.core is not None:
                self._write([self.core.grant(ours, increment)])

    def caller_window(self, value: int) -> None:
        """The caller's initial window for answers, passed on (grpcio sends answers within it)."""
        with self.lock:
            if self.core is not None:
                self.core.set_initial_window(value)
                self._write([h2.settings(initial_window_size=value)])

    def _forget(self, ours: int) -> None:
        caller = self.callers.pop(ours, None)
        self.queued.pop(ours, None)
        if caller is not None:
            self.ours.pop(caller, None)
            self.taken.pop(caller, None)

    def _read_loop(self, sock: socket.socket, connection: core.Connection) -> None:
        reader = h2.Reader(sock, max_frame=ANSWER_FRAME, read_size=ANSWER_READ)
        try:
            while (frames := reader.read()) is not None:
                out: list[tuple[str, int, Any, int]] = []
                received = 0
                opened = False
                for frame in frames:
                    event = connection.receive(frame)
                    if isinstance(event, core.Data):
                        received += event.flow
                        caller = self.callers.get(event.stream)
                        if caller is not None:  # copied: it may wait for the caller's window
                            out.append(("data", caller, memoryview(bytes(event.payload)), h2.END_STREAM if event.end
                                        else 0))
                        if event.end:
                            with self.lock:
                                self._forget(event.stream)
                    elif isinstance(event, core.Headers):
                        caller = self.callers.get(event.stream)
                        if caller is not None:
                            out.append(("headers", caller, event.fields, h2.END_STREAM if event.end else 0))
                        if event.end:
                            with self.lock:
                                self._forget(event.stream)
                    elif isinstance(event, core.Reset):
                        caller = self.callers.get(event.stream)
                        if caller is not None:
                            out.append(("reset", caller, event.code, 0))
                        with self.lock:
                            self._forget(event.stream)
                    elif isinstance(event, core.Settings):
                        self._write(connection.take_out())
                        connection.apply_settings()
                        opened = True
                    elif isinstance(event, core.WindowOpened):
                        opened = True
                    elif isinstance(event, core.GoAway):
                        out += [("reset", caller, h2.REFUSED_STREAM, 0) for caller in self._unprocessed(connection)]
                back = connection.take_out()
                if received:
                    back.append(connection.grant(0, received))  # each stream's window is the caller's
                self._write(back)
                if opened:
                    self.after_read()
                if out:
                    self.caller.relay(out)
        except (h2.ConnectionFault, OSError) as exc:
            if self.sock is not None:  # not closed by us
                log.error("the router's own gRPC server broke a passed-on call: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the calls passed on end, as below; the router goes on
            log.error("relaying grpcio's answers failed: %r", exc)
        with self.lock:  # grpcio went away: every call passed to it ends, as a reset
            callers = list(self.callers.values())
            for ours in list(self.callers):
                self._forget(ours)
        if callers:
            try:
                self.caller.relay([("reset", caller, h2.INTERNAL_ERROR, 0) for caller in callers])
            except OSError:
                pass

    def _unprocessed(self, connection: core.Connection) -> list[int]:
        """grpcio's GOAWAY named streams it never took: the caller is told REFUSED_STREAM (gRPC clients send
        those again by themselves)."""
        with self.lock:
            callers = []
            for ours in connection.unprocessed():
                caller = self.callers.get(ours)
                if caller is not None:
                    callers.append(caller)
                    self._forget(ours)
                    connection.reset(ours, h2.NO_ERROR)  # closed here; grpcio forgot it already
            return callers

    def close(self) -> None:
        with self.lock, self.send_lock:
            sock, self.sock, self.closed = self.sock, None, True
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
