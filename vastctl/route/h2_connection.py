"""One HTTP/2 connection's state, as RFC 9113 keeps it: the one core every connection of the router goes through.

The caller's connections to the front end (front.py, the server side), the links to the router's own grpcio
server (grpcio_link.py) and the connections to provers (cut_through.py) are all a `Connection`: the frames read
from the socket are given to `receive`, which checks them against the RFC's MUSTs and keeps the state the
checks need, and returns the event a frame means for the call (headers, data, a reset, a GOAWAY, a window that
opened) or nothing. What breaks the RFC raises `ConnectionFault` (the connection is closed with GOAWAY and the
code) or ends one stream (RST_STREAM, queued in `out`, and a `Reset` event). The socket, the threads and what a
call does are the caller's.

Bounded against a hostile peer: a frame is at most what we advertised (h2.Reader), a header block at most
`max_header_list` bytes and contiguous, DATA at most the windows we gave (FLOW_CONTROL_ERROR past them), at most
`max_streams` streams open at once (REFUSED_STREAM past it, which gRPC clients retry), SETTINGS values in range.

Thread use: `receive` runs in the connection's one reader thread; the send windows are read and taken by other
threads under `cond`, which `receive` notifies whenever a window opens or the connection ends.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import hpack

from vastctl.route import h2

MAX_HEADER_LIST = 16 * 1024  # a gRPC request's or answer's headers are a few hundred bytes
MAX_RESET_KEPT = 1024  # streams we reset whose late frames are ignored (RFC 9113 §5.1 "closed")
_PSEUDO_REQUEST = frozenset({b":method", b":scheme", b":path", b":authority"})
_CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


ConnectionFault = h2.ConnectionFault


# --- the events a frame means ---------------------------------------------------------------------------------

class Headers(NamedTuple):
    stream: int
    fields: list[tuple[bytes, bytes]]
    end: bool
    first: bool  # the stream's first header block (a request or an answer's head), else trailers


class Data(NamedTuple):
    stream: int
    payload: memoryview  # valid until the next read (h2.Reader)
    end: bool
    flow: int  # what the frame counted against the windows (its padding too): given back with `grant`


class Reset(NamedTuple):
    stream: int
    code: int
    by_us: bool  # a stream error we found (RST_STREAM queued in `out`), else the peer reset it


class GoAway(NamedTuple):
    last_stream: int
    code: int


class WindowOpened(NamedTuple):
    stream: int  # 0: the connection's
    increment: int


class Settings(NamedTuple):
    """The peer's SETTINGS, checked: write `out` (their acknowledgement) first, then `apply_settings`, so no
    frame using them goes out before the peer knows they are in force."""
    values: dict[int, int]


class Pong(NamedTuple):
    """The peer acknowledged our PING (a graceful stop waits for it before its last GOAWAY)."""
    payload: bytes


@dataclass
class _Stream:
    send_window: int
    recv_window: int
    remote_open: bool = True  # the peer may still send on it
    local_open: bool = True  # we may still send on it
    heads: int = 0  # header blocks received


class Connection:
    """An HTTP/2 connection's state from one end: `server` (the peer opens odd streams) or client (we open them).

    `window`: the receive window we give each stream at first (what a call may send before it is read);
    the connection's own receive window is opened to `connection_window` at once."""

    def __init__(self, *, server: bool, max_frame: int = h2.DEFAULT_FRAME, window: int = h2.DEFAULT_WINDOW,
                 connection_window: int = h2.DEFAULT_WINDOW, max_streams: int = 100,
                 max_header_list: int = MAX_HEADER_LIST, cond: threading.Condition | None = None) -> None:
        self.server = server
        self.max_frame_in, self.initial_recv, self.max_streams = max_frame, window, max_streams
        self.max_header_list = max_header_list
        self.connection_window = connection_window
        self.recv_window = h2.DEFAULT_WINDOW  # until our WINDOW_UPDATE in `preface` goes out
        self.cond = cond or threading.Condition()  # an RLock's: receive holds it while it calls its parts
        self.send_window = h2.DEFAULT_WINDOW
        self.initial_send = h2.DEFAULT_WINDOW
        self.max_frame_out = h2.DEFAULT_FRAME
        self.streams: dict[int, _Stream] = {}
        self.highest_remote = 0  # the highest stream id the peer opened
        self.processed = 0  # the highest stream id handed to the call side (GOAWAY's last stream)
        self.next_local = 1
        self.reset_by_us: dict[int, None] = {}  # in order, at most MAX_RESET_KEPT
        self.refusing = False  # a graceful stop began: new streams get REFUSED_STREAM
        self.goaway_received: int | None = None
        self.closed = False
        self.out: list[bytes] = []  # frames the state machine owes the peer (acks, resets): the caller sends them
        self.decoder = hpack.Decoder(max_header_list_size=max_header_list)
        self.encoder = hpack.Encoder()
        self._block: bytearray | None = None
        self._block_stream = self._block_flags = 0
        self._self_dependent = False
        self._pending_settings: list[list[tuple[int, int]]] = []

    # --- what we send first -------------------------------------------------------------------------------

    def preface(self) -> list[bytes]:
        """Our connection preface (the client's magic first) and SETTINGS, and the connection window opened."""
        values = {"max_frame_size": self.max_frame_in, "initial_window_size": self.initial_recv,
                  "max_header_list_size": self.max_header_list}
        if self.server:
            values["max_concurrent_streams"] = self.max_streams
        else:
            values["enable_push"] = 0
        frames = [] if self.server else [h2.PREFACE]
        frames.append(h2.settings(**values))
        if self.connection_window > h2.DEFAULT_WINDOW:
            frames.append(h2.window_update(0, self.connection_window - h2.DEFAULT_WINDOW))
            self.recv_window = self.connection_window
        return frames

    # --- frames in ----------------------------------------------------------------------------------------

    def receive(self, frame: h2.Frame) -> Any:
        """The event `frame` means, or None; raises ConnectionFault where the RFC says the connection ends."""
        with self.cond:
            return self._receive(frame)

    def receive_all(self, frames: list[h2.Frame]) -> list[Any]:
        """The events of one read's frames, in order (None left out), the state taken once for all of them. A
        ConnectionFault raised part way leaves the events before it unreturned: the connection ends anyway."""
        events = []
        with self.cond:
            for frame in frames:
                # DATA first and directly: a large call is thousands of 16 KiB frames
                event = self._data(frame[1], frame[2], frame[3]) if frame[0] == h2.DATA and self._block is None \
                    else self._receive(frame)
                if event is not None:
                    events.append(event)
        return events

    def _receive(self, frame: h2.Frame) -> Any:
        kind, flags, stream, payload = frame
        if self._block is not None and (kind != h2.CONTINUATION or stream != self._block_stream):
            raise ConnectionFault(h2.PROTOCOL_ERROR, "a frame inside another stream's header block")
        if kind == h2.DATA:
            return self._data(flags, stream, payload)
        if kind == h2.HEADERS:
            return self._headers(flags, stream, payload)
        if kind == h2.CONTINUATION:
            return self._continuation(flags, stream, payload)
        if kind == h2.SETTINGS:
            return self._settings(flags, stream, payload)
        if kind == h2.WINDOW_UPDATE:
            return self._window_update(stream, payload)
        if kind == h2.PING:
            if stream:
                raise ConnectionFault(h2.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionFault(h2.FRAME_SIZE_ERROR, f"a {len(payload)}-byte PING")
            if not flags & h2.ACK:
                self.out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
                return None
            return Pong(bytes(payload))
        if kind == h2.RST_STREAM:
            return self._rst_stream(stream, payload)
        if kind == h2.PRIORITY:
            if not stream:
                raise ConnectionFault(h2.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                return self._stream_error(stream, h2.FRAME_SIZE_ERROR)
            if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream:
                return self._stream_error(stream, h2.PROTOCOL_ERROR)
            return None
        if kind == h2.GOAWAY:
            return self._goaway(stream, payload)
        if kind == h2.PUSH_PROMISE:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "PUSH_PROMISE (push is not enabled)")
        return None  # an extension frame: ignored (RFC 9113 §4.1)

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> Any:
        if not stream_id:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self.recv_window:
            raise ConnectionFault(h2.FLOW_CONTROL_ERROR,
                                  f"{size} bytes of DATA past the connection's window ({self.recv_window} left)")
        self.recv_window -= size
        body = h2.data_payload(flags, payload) if flags & h2.PADDED else payload
        stream = self.streams.get(stream_id)
        if stream is None:
            self._closed_or_idle(stream_id, "DATA")
            self._give_back(size)  # what a closed stream was sent still counted against the connection
            return None
        if not stream.remote_open:
            self._give_back(size)
            return self._stream_error(stream_id, h2.STREAM_CLOSED)
        if size > stream.recv_window:
            raise ConnectionFault(h2.FLOW_CONTROL_ERROR,
                                  f"{size} bytes of DATA past stream {stream_id}'s window ({stream.recv_window} left)")
        stream.recv_window -= size
        end = bool(flags & h2.END_STREAM)
        if end:
            self._remote_closed(stream_id, stream)
        return Data(stream_id, body, end, size)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> Any:
        if not stream_id:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = h2.header_block(flags, payload)
        at = 1 if flags & h2.PADDED else 0
        self._self_dependent = bool(flags & h2.PRIORITY_FLAG) and \
            int.from_bytes(payload[at:at + 4], "big") & 0x7FFFFFFF == stream_id
        if flags & h2.END_HEADERS:
            return self._field_block(stream_id, flags, bytes(block))
        if len(block) > self.max_header_list:
            raise ConnectionFault(h2.ENHANCE_YOUR_CALM, "a header block over MAX_HEADER_LIST_SIZE")
        self._block, self._block_stream, self._block_flags = bytearray(block), stream_id, flags
        return None

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> Any:
        if self._block is None:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "CONTINUATION without a header block")
        self._block += payload
        if len(self._block) > self.max_header_list:
            raise ConnectionFault(h2.ENHANCE_YOUR_CALM, "a header block over MAX_HEADER_LIST_SIZE")
        if not flags & h2.END_HEADERS:
            return None
        block, self._block = bytes(self._block), None
        return self._field_block(stream_id, self._block_flags, block)

    def _field_block(self, stream_id: int, flags: int, block: bytes) -> Any:
        """A whole header block: decoded always (the HPACK table is the connection's), then judged."""
        try:
            fields = [(bytes(name), bytes(value)) for name, value in self.decoder.decode(block, raw=True)]
        except hpack.OversizedHeaderListError:
            raise ConnectionFault(h2.ENHANCE_YOUR_CALM, "a header list over MAX_HEADER_LIST_SIZE") from None
        except (hpack.HPACKError, ValueError, IndexError) as exc:
            raise ConnectionFault(h2.COMPRESSION_ERROR, f"a header block HPACK cannot decode: {exc}") from None
        end = bool(flags & h2.END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is None:
            return self._new_stream(stream_id, flags, fields, end)
        if not stream.remote_open:
            return self._stream_error(stream_id, h2.STREAM_CLOSED)
        first = stream.heads == 0
        stream.heads += 1
        if self._self_dependent:
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)
        if not first and not end:  # trailers end the stream (RFC 9113 §8.1)
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)
        if self.server and _malformed(fields, request=first):
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)
        if end:
            self._remote_closed(stream_id, stream)
        return Headers(stream_id, fields, end, first)

    def _new_stream(self, stream_id: int, flags: int, fields: list[tuple[bytes, bytes]], end: bool) -> Any:
        if stream_id % 2 == 0:
            raise ConnectionFault(h2.PROTOCOL_ERROR, f"HEADERS on an even stream ({stream_id})")
        if not self.server:
            if stream_id < self.next_local:
                return None  # a late answer on a stream we reset or finished
            raise ConnectionFault(h2.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which we never opened")
        if stream_id <= self.highest_remote:
            if stream_id in self.reset_by_us:
                return None
            raise ConnectionFault(h2.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, already used")
        self.highest_remote = stream_id
        if self._self_dependent:  # a stream that depends on itself (RFC 9113 §5.3.1)
            return self._refuse_new(stream_id, h2.PROTOCOL_ERROR)
        open_now = sum(1 for s in self.streams.values() if s.remote_open or s.local_open)
        if self.refusing or open_now >= self.max_streams:
            return self._refuse_new(stream_id, h2.REFUSED_STREAM)
        if _malformed(fields, request=True):
            return self._refuse_new(stream_id, h2.PROTOCOL_ERROR)
        with self.cond:
            stream = self.streams[stream_id] = _Stream(send_window=self.initial_send, recv_window=self.initial_recv,
                                                       heads=1)
        self.processed = stream_id
        if end:
            self._remote_closed(stream_id, stream)
        return Headers(stream_id, fields, end, True)

    def _refuse_new(self, stream_id: int, code: int) -> Reset:
        self._note_reset(stream_id)
        self.out.append(h2.rst_stream(stream_id, code))
        return Reset(stream_id, code, True)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> Any:
        if stream_id:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise ConnectionFault(h2.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return None
        if len(payload) % 6:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR, "a SETTINGS frame whose length is not a multiple of 6")
        values = [struct.unpack(">HI", payload[at:at + 6]) for at in range(0, len(payload), 6)]
        for key, value in values:
            if key == h2.ENABLE_PUSH and value > 1:
                raise ConnectionFault(h2.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            if key == h2.INITIAL_WINDOW_SIZE and value > h2.LARGEST_WINDOW:
                raise ConnectionFault(h2.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
            if key == h2.MAX_FRAME_SIZE and not h2.DEFAULT_FRAME <= value <= h2.LARGEST_FRAME:
                raise ConnectionFault(h2.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
        self._pending_settings.append(values)
        self.out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
        return Settings(dict(values))

    def apply_settings(self) -> None:
        """Put the peer's SETTINGS in force for what we send (after their acknowledgement went out)."""
        with self.cond:
            for values in self._pending_settings:
                for key, value in values:  # in order: the last of a repeated setting wins
                    if key == h2.INITIAL_WINDOW_SIZE:
                        change, self.initial_send = value - self.initial_send, value
                        for stream in self.streams.values():
                            stream.send_window += change
                            if stream.send_window > h2.LARGEST_WINDOW:
                                raise ConnectionFault(h2.FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
                    elif key == h2.MAX_FRAME_SIZE:
                        self.max_frame_out = value
            self._pending_settings = []
            self.cond.notify_all()

    def _window_update(self, stream_id: int, payload: bytes) -> Any:
        if len(payload) != 4:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR, f"a {len(payload)}-byte WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise ConnectionFault(h2.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            with self.cond:
                self.send_window += increment
                if self.send_window > h2.LARGEST_WINDOW:
                    raise ConnectionFault(h2.FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
                self.cond.notify_all()
            return WindowOpened(0, increment)
        stream = self.streams.get(stream_id)
        if stream is None:
            self._closed_or_idle(stream_id, "WINDOW_UPDATE")
            return None
        if not increment:
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)
        with self.cond:
            stream.send_window += increment
            overflow = stream.send_window > h2.LARGEST_WINDOW
            self.cond.notify_all()
        if overflow:
            return self._stream_error(stream_id, h2.FLOW_CONTROL_ERROR)
        return WindowOpened(stream_id, increment)

    def _rst_stream(self, stream_id: int, payload: bytes) -> Any:
        if not stream_id:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR, f"a {len(payload)}-byte RST_STREAM")
        if stream_id not in self.streams:
            self._closed_or_idle(stream_id, "RST_STREAM")
            return None
        self._forget(stream_id)
        return Reset(stream_id, int.from_bytes(payload, "big"), False)

    def _goaway(self, stream_id: int, payload: bytes) -> Any:
        if stream_id:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR, f"a {len(payload)}-byte GOAWAY")
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        code = int.from_bytes(payload[4:8], "big")
        self.goaway_received = last if self.goaway_received is None else min(last, self.goaway_received)
        return GoAway(last, code)

    def unprocessed(self) -> list[int]:
        """Our streams above the peer's GOAWAY: never processed there, so safe to send elsewhere."""
        if self.goaway_received is None or self.server:
            return []
        return [stream_id for stream_id in self.streams if stream_id > self.goaway_received]

    # --- the state the checks keep ------------------------------------------------------------------------

    def _closed_or_idle(self, stream_id: int, what: str) -> None:
        """A frame on a stream not open now: ignored on one that was (RFC 9113 §5.1 "closed"), a connection
        error on one never opened. Only odd streams are ever opened: the client's, and push is off."""
        if stream_id % 2 == 0:
            idle = True
        elif self.server:
            idle = stream_id > self.highest_remote
        else:
            idle = stream_id >= self.next_local
        if idle:
            raise ConnectionFault(h2.PROTOCOL_ERROR, f"{what} on stream {stream_id}, which is idle")

    def _stream_error(self, stream_id: int, code: int) -> Reset:
        self._forget(stream_id)
        self._note_reset(stream_id)
        self.out.append(h2.rst_stream(stream_id, code))
        return Reset(stream_id, code, True)

    def _note_reset(self, stream_id: int) -> None:
        self.reset_by_us[stream_id] = None
        if len(self.reset_by_us) > MAX_RESET_KEPT:
            del self.reset_by_us[next(iter(self.reset_by_us))]

    def _remote_closed(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            self._forget(stream_id)

    def _forget(self, stream_id: int) -> None:
        with self.cond:
            self.streams.pop(stream_id, None)
            self.cond.notify_all()

    def _give_back(self, size: int) -> None:
        if size:
            self.out.append(self._grant(0, size))

    # --- what the call side does --------------------------------------------------------------------------

    def open_stream(self) -> int:
        """A new stream of ours (client side); its id."""
        with self.cond:
            stream_id, self.next_local = self.next_local, self.next_local + 2
            self.streams[stream_id] = _Stream(send_window=self.initial_send, recv_window=self.initial_recv)
        return stream_id

    def grant(self, stream_id: int, size: int) -> bytes:
        """WINDOW_UPDATE letting the peer send `size` more bytes (0: on the connection); our windows follow."""
        with self.cond:
            return self._grant(stream_id, size)

    def _grant(self, stream_id: int, size: int) -> bytes:
        if stream_id:
            stream = self.streams.get(stream_id)
            if stream is None:
                return b""
            size = min(size, h2.LARGEST_WINDOW - stream.recv_window)
            stream.recv_window += size
        else:
            size = min(size, h2.LARGEST_WINDOW - self.recv_window)
            self.recv_window += size
        return h2.window_update(stream_id, size) if size > 0 else b""

    def take(self, stream_id: int, wanted: int, *, frames: bool = False) -> int:
        """Take up to `wanted` bytes of both send windows (inside `cond`), at most the peer's frame size unless
        `frames` (then the caller cuts them into frames of `max_frame_out`); 0 when a window is shut (wait on
        `cond`), -1 when the stream or the connection is gone."""
        stream = self.streams.get(stream_id)
        if stream is None or self.closed or not stream.local_open:
            return -1
        size = min(wanted, self.send_window, stream.send_window, wanted if frames else self.max_frame_out)
        if size <= 0:
            return 0
        self.send_window -= size
        stream.send_window -= size
        return size

    def sent_end(self, stream_id: int) -> None:
        """We ended our side of the stream (END_STREAM sent)."""
        with self.cond:
            stream = self.streams.get(stream_id)
            if stream is not None:
                stream.local_open = False
                if not stream.remote_open:
                    self._forget(stream_id)

    def reset(self, stream_id: int, code: int) -> bytes:
        """RST_STREAM from us: the stream is closed, its late frames ignored."""
        with self.cond:
            self._forget(stream_id)
            self._note_reset(stream_id)
        return h2.rst_stream(stream_id, code)

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self.streams

    def end(self) -> None:
        """The connection is over: every waiter wakes and finds it so."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def take_out(self) -> list[bytes]:
        with self.cond:
            out, self.out = self.out, []
        return out

    def set_initial_window(self, value: int) -> None:
        """We advertise a new SETTINGS_INITIAL_WINDOW_SIZE: the streams' receive windows move with it."""
        with self.cond:
            change, self.initial_recv = value - self.initial_recv, value
            for stream in self.streams.values():
                stream.recv_window += change


def _malformed(fields: list[tuple[bytes, bytes]], *, request: bool) -> bool:
    """A request's or trailers' fields the RFC calls malformed (RFC 9113 §8.2, §8.3): a stream error."""
    seen: set[bytes] = set()
    regular = False
    for name, value in fields:
        if name != name.lower() or not name:
            return True
        if name.startswith(b":"):
            if regular or not request or name not in _PSEUDO_REQUEST or name in seen:
                return True
            seen.add(name)
        else:
            regular = True
            if name in _CONNECTION_FIELDS or (name == b"te" and value != b"trailers"):
                return True
    if request:
        method = dict(fields).get(b":method")
        if method is None or (method != b"CONNECT" and not {b":scheme", b":path"} <= seen):
            return True
        if dict(fields).get(b":path") == b"":
            return True
    return False
