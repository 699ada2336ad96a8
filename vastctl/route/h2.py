"""HTTP/2 frames as the router's front end reads and writes them (RFC 9113), and gRPC's few wire conventions on
top of them (the 5-byte message prefix, grpc-timeout, grpc-status and grpc-message).

Only what a cut-through gRPC relay needs: frames are parsed out of a socket's bytes, header blocks are left to
`hpack` (each connection keeps its own tables), and DATA payloads are views into the read buffer, sent on or
copied before the next read reuses it.
"""

from __future__ import annotations

import mmap
import select
import socket
import struct
from typing import Any, Callable, NamedTuple
from urllib.parse import quote, unquote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
MAX_HEADER_LIST_SIZE = 6
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
LARGEST_FRAME = (1 << 24) - 1
LARGEST_WINDOW = (1 << 31) - 1
LAST_STREAM = (1 << 31) - 1
READ = 4 << 20  # one recv_into reads at most this much
SMALL_READ = 64 * 1024  # what an idle connection's read buffer shrinks back to
QUIET_MS = 5000  # ...once nothing came for this long (a burst of large calls comes sooner: a new buffer costs page faults)


class Frame(NamedTuple):
    kind: int
    flags: int
    stream: int
    payload: Any  # memoryview for DATA (valid until the next read), bytes otherwise


class ConnectionFault(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY carrying `code` (RFC 9113 §5.4.1)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def header(length: int, kind: int, flags: int, stream: int) -> bytes:
    return struct.pack(">I", length)[1:] + bytes((kind, flags)) + struct.pack(">I", stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return header(len(payload), kind, flags, stream) + payload


def settings(**values: int) -> bytes:
    ids = {"header_table_size": HEADER_TABLE_SIZE, "enable_push": ENABLE_PUSH,
           "max_concurrent_streams": MAX_CONCURRENT_STREAMS, "initial_window_size": INITIAL_WINDOW_SIZE,
           "max_frame_size": MAX_FRAME_SIZE, "max_header_list_size": MAX_HEADER_LIST_SIZE}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[name], value) for name, value in values.items()))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last_stream: int, code: int = NO_ERROR) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code))


def header_block(flags: int, payload: bytes) -> bytes:
    """A HEADERS frame's block without its padding and priority fields."""
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ConnectionFault(PROTOCOL_ERROR, "HEADERS padding longer than the frame")
        payload = payload[1:len(payload) - payload[0]]
    if flags & PRIORITY_FLAG:
        if len(payload) < 5:
            raise ConnectionFault(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
        return payload[5:]
    return payload


def data_payload(flags: int, payload: memoryview) -> memoryview:
    """A DATA frame's bytes without its padding."""
    if flags & PADDED:
        if not len(payload) or payload[0] >= len(payload):
            raise ConnectionFault(PROTOCOL_ERROR, "DATA padding longer than the frame")
        return payload[1:len(payload) - payload[0]]
    return payload


class Reader:
    """The complete frames of each `recv_into` on one socket; a frame cut by the read waits for the next.

    Its buffer grows while reads fill it (up to `read_size` a read, for a large call's throughput) and shrinks
    back to SMALL_READ when the connection goes quiet, so an idle connection costs little whatever it once
    sent; a grown buffer is mapped memory of its own, given back to the system when dropped (the allocator
    would keep it). A frame over `max_frame` (what we advertised) is a FRAME_SIZE_ERROR before it is read."""

    def __init__(self, sock: socket.socket, *, max_frame: int = DEFAULT_FRAME, read_size: int = READ):
        self.sock, self.max_frame, self.read_size = sock, max_frame, read_size
        self.chunk = min(SMALL_READ, read_size)
        self.buffer: bytearray | mmap.mmap = bytearray(self.chunk)
        self.start = self.end = 0
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def _make_room(self) -> None:
        self.chunk = min(self.chunk, max(self.read_size, SMALL_READ))  # read_size may have been lowered
        left = self.end - self.start
        if left == 0:
            self.start = self.end = 0
            if len(self.buffer) > SMALL_READ and not self._poll.poll(QUIET_MS):  # quiet: give the memory back
                self.chunk = min(SMALL_READ, self.read_size)
                self.buffer = _buffer(self.chunk)
                return
        if len(self.buffer) - self.end >= self.chunk:
            return
        need = left + self.chunk
        if len(self.buffer) >= need:
            self.buffer[:left] = self.buffer[self.start:self.end]
        else:  # a new buffer: DATA views into the old one stay valid until they are dropped
            grown = _buffer(need)
            grown[:left] = self.buffer[self.start:self.end]
            self.buffer = grown
        self.start, self.end = 0, left

    def read(self) -> list[Frame] | None:
        """The next frames, or None at the end of the connection (or its reset, or a socket timeout)."""
        self._make_room()
        try:
            count = self.sock.recv_into(memoryview(self.buffer)[self.end:self.end + self.chunk])
        except OSError:
            return None
        if not count:
            return None
        if count == self.chunk and self.chunk < self.read_size:  # a bulk transfer: read as much as it can
            self.chunk = self.read_size
        self.end += count
        frames, buffer, view = [], self.buffer, memoryview(self.buffer)
        while self.end - self.start >= 9:
            at = self.start
            length = (buffer[at] << 16) | (buffer[at + 1] << 8) | buffer[at + 2]
            if length > self.max_frame:
                raise ConnectionFault(FRAME_SIZE_ERROR, f"a {length}-byte frame, over the {self.max_frame} bytes allowed")
            if self.end - at < 9 + length:
                if 9 + length > self.chunk:  # a frame larger than one read: read enough for all of it
                    self.chunk = min(max(self.chunk, 9 + length), max(self.read_size, 9 + self.max_frame))
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5:at + 9], "big") & 0x7FFFFFFF
            payload = view[at + 9:at + 9 + length]
            # DATA is read in place; a frame of a type HTTP/2 does not define is ignored (§5.5), so not copied
            frames.append(Frame(kind, flags, stream, payload if kind == DATA or kind > CONTINUATION
                                else bytes(payload)))
            self.start = at + 9 + length
        return frames


def _buffer(size: int) -> bytearray | mmap.mmap:
    return bytearray(size) if size <= SMALL_READ else mmap.mmap(-1, size)


SEND_TICK_S = 1  # a send blocked this long in the kernel comes back to ask whether to go on


def bound_sends(sock: socket.socket) -> None:
    """Make a blocked send on `sock` return after SEND_TICK_S (SO_SNDTIMEO), so send_buffers can give up on a
    peer that stopped reading; the socket stays blocking, so a send that goes through costs one system call."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TICK_S, 0))


def send_buffers(sock: socket.socket, buffers: list[Any], timeout: float | None = None,
                 give_up: Callable[[], bool] | None = None) -> None:
    """Send every buffer, in order, without joining them into one copy first. `timeout` (on a socket given
    bound_sends): the seconds the peer may go without taking a byte (TimeoutError past them), so a peer that
    stops reading holds no one for ever; `give_up` is asked each SEND_TICK_S meanwhile (TimeoutError when it
    says so)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    waited = 0.0
    while views:
        try:
            sent = sock.sendmsg(views[:512])
        except BlockingIOError:  # SO_SNDTIMEO passed with no byte taken
            waited += SEND_TICK_S
            if timeout is not None and waited >= timeout or give_up is not None and give_up():
                raise TimeoutError(f"the peer took nothing for {waited:g}s") from None
            continue
        waited = 0.0
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


# --- gRPC on HTTP/2 ------------------------------------------------------------------------------------------

MESSAGE_PREFIX = 5  # compressed flag (1 byte), length (4 bytes, big-endian)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def one_message(body: bytes) -> bytes:
    """The one uncompressed message of a unary answer's DATA (the 5-byte prefix taken off); ValueError for
    anything else: no message, a compressed one, a prefix whose length is not what came, two messages."""
    if len(body) < MESSAGE_PREFIX:
        raise ValueError(f"{len(body)} bytes, not a gRPC message")
    if body[0] != 0:
        raise ValueError("a compressed message (the router asks for identity)")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - MESSAGE_PREFIX:
        raise ValueError(f"a message whose prefix says {length} bytes where {len(body) - MESSAGE_PREFIX} came")
    return body[MESSAGE_PREFIX:]


def message_prefix(length: int) -> bytes:
    return b"\x00" + struct.pack(">I", length)


def grpc_timeout(value: bytes | None) -> float | None:
    """Seconds a grpc-timeout header gives (e.g. b"1800S", b"5000m"); None when absent or unreadable."""
    if not value or len(value) < 2 or value[-1:] not in _TIMEOUT_UNITS or not value[:-1].isdigit() or len(value) > 9:
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]


def timeout_header(seconds: float) -> bytes:
    """grpc-timeout for `seconds` (at most 8 digits, as the spec allows), in milliseconds when it fits."""
    millis = max(1, int(seconds * 1000))
    return f"{millis}m".encode() if millis < 10**8 else f"{max(1, int(seconds))}S".encode()


def status_message(text: str) -> bytes:
    """grpc-message: percent-encoded UTF-8 (the spec's encoding: printable ASCII but '%' as is)."""
    return quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")


def read_status_message(value: bytes) -> str:
    return unquote(value.decode("ascii", "replace"))


def response_headers() -> list[tuple[bytes, bytes]]:
    return [(b":status", b"200"), (b"content-type", b"application/grpc")]


def trailers(code: int, message: str = "") -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(code).encode())]
    if message:
        fields.append((b"grpc-message", status_message(message)))
    return fields
