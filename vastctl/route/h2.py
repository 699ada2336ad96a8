"""HTTP/2 frames as the router's front end reads and writes them (RFC 9113), and gRPC's few wire conventions on
top of them (the 5-byte message prefix, grpc-timeout, grpc-status and grpc-message).

Only what a cut-through gRPC relay needs: frames are parsed out of a socket's bytes, header blocks are left to
`hpack` (each connection keeps its own tables), and DATA payloads are views into the read buffer, sent on or
copied before the next read reuses it.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x2, 0x3, 0x7, 0x8
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
LARGEST_WINDOW = (1 << 31) - 1
READ = 4 << 20  # one recv_into reads at most this much


class Frame(NamedTuple):
    kind: int
    flags: int
    stream: int
    payload: Any  # memoryview for DATA (valid until the next read), bytes otherwise


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection is closed."""


def header(length: int, kind: int, flags: int, stream: int) -> bytes:
    return struct.pack(">I", length)[1:] + bytes((kind, flags)) + struct.pack(">I", stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return header(len(payload), kind, flags, stream) + payload


def settings(**values: int) -> bytes:
    ids = {"header_table_size": HEADER_TABLE_SIZE, "enable_push": ENABLE_PUSH,
           "max_concurrent_streams": MAX_CONCURRENT_STREAMS, "initial_window_size": INITIAL_WINDOW_SIZE,
           "max_frame_size": MAX_FRAME_SIZE}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[name], value) for name, value in values.items()))


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolError("a SETTINGS frame whose length is not a multiple of 6")
    return dict(struct.unpack(">HI", payload[at:at + 6]) for at in range(0, len(payload), 6))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last_stream: int, code: int = NO_ERROR) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code))


def u32(payload: bytes) -> int:
    if len(payload) < 4:
        raise ProtocolError("a frame too short for its fields")
    return int(struct.unpack(">I", payload[:4])[0])


def decode(decoder: Any, block: bytes) -> list[tuple[bytes, bytes]]:
    """A header block's fields, as bytes (hpack.Decoder keeps the connection's table)."""
    return [(bytes(name), bytes(value)) for name, value in decoder.decode(block, raw=True)]


def header_block(flags: int, payload: bytes) -> bytes:
    """A HEADERS frame's block without its padding and priority fields."""
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ProtocolError("HEADERS padding longer than the frame")
        payload = payload[1:len(payload) - payload[0]]
    return payload[5:] if flags & PRIORITY_FLAG else payload


def data_payload(flags: int, payload: memoryview) -> memoryview:
    """A DATA frame's bytes without its padding."""
    if flags & PADDED:
        if not len(payload) or payload[0] >= len(payload):
            raise ProtocolError("DATA padding longer than the frame")
        return payload[1:len(payload) - payload[0]]
    return payload


class Reader:
    """The complete frames of each `recv_into` on one socket; a frame cut by the read waits for the next."""

    def __init__(self, sock: socket.socket, *, max_frame: int = DEFAULT_FRAME, read_size: int = READ):
        """`read_size`: what one recv_into may take (a connection that brings only answers needs little)."""
        self.sock, self.max_frame, self.read_size = sock, max_frame, read_size
        self.buffer = bytearray(2 * read_size + 9 + max_frame)
        self.start = self.end = 0

    def read(self) -> list[Frame] | None:
        """The next frames, or None at the end of the connection (or its reset)."""
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end > len(self.buffer) - self.read_size:  # keep room for a whole read after the partial frame
            left = self.end - self.start
            self.buffer[:left] = self.buffer[self.start:self.end]
            self.start, self.end = 0, left
        try:
            count = self.sock.recv_into(memoryview(self.buffer)[self.end:self.end + self.read_size])
        except OSError:
            return None
        if not count:
            return None
        self.end += count
        frames, buffer, view = [], self.buffer, memoryview(self.buffer)
        while self.end - self.start >= 9:
            at = self.start
            length = (buffer[at] << 16) | (buffer[at + 1] << 8) | buffer[at + 2]
            if length > self.max_frame:
                raise ProtocolError(f"a {length}-byte frame, over the {self.max_frame} bytes allowed")
            if self.end - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5:at + 9], "big") & 0x7FFFFFFF
            payload = view[at + 9:at + 9 + length]
            frames.append(Frame(kind, flags, stream, payload if kind == DATA else bytes(payload)))
            self.start = at + 9 + length
        return frames


def send_buffers(sock: socket.socket, buffers: list[Any]) -> None:
    """Send every buffer, in order, without joining them into one copy first."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:512])
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
