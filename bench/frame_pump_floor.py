"""What forwarding a 100 MB Prove frame by frame costs in Python: a minimal HTTP/2 frame pump beside a direct call.

`vastctl route` is store-and-forward (grpcio hands a handler whole messages): +54–82% on a 100 MB call against
a ≤ 10% target (bench/README.md, "Proof router"). bench/relay_floor.py measures the bytes alone through a Python
relay. This measures the next floor up: a pump that speaks HTTP/2 to both sides, as a cut-through router would,
with one prover behind it. Each client connection gets its own connection to the stand-in daemon
(tests/fakes/cuzk_daemon.py); every DATA frame is sent on as it arrives, under the stand-in's flow-control
windows, with its stream id rewritten; header blocks are decoded and encoded again with `hpack` (each connection
has its own HPACK table); the client's windows are opened once and replenished every 4 MiB; one `recv_into` of
up to 4 MiB is parsed whole and its frames go out in one `sendall`. It holds nothing, resends nothing and
chooses no prover: what the router's rules would add to it is not measured here.

A probe, not a design: no reader waits for a window (frames queue per stream, drained as windows open), so
pings are answered at once; a forwarder built for use would also bound what it queues.

Needs `hpack` (not a vastctl dependency): `pip install hpack`.

Rerun:
    python bench/frame_pump_floor.py
    python bench/frame_pump_floor.py --calls 10
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

# the stand-in and the interleaved 100 MB calls, as route_bench makes them
sys.path.insert(0, str(Path(__file__).resolve().parent))
from route_bench import large_calls_beside_direct, print_added, start_stand_in

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
INITIAL_WINDOW_SIZE = 0x4
LARGEST_WINDOW = (1 << 31) - 1
OUR_STREAM_WINDOW = (1 << 24) - 1
REPLENISH = 4 << 20  # the client's windows are topped up once this much was sent on
READ = 4 << 20


def header(length: int, kind: int, flags: int, stream: int) -> bytes:
    return struct.pack(">I", length)[1:] + bytes((kind, flags)) + struct.pack(">I", stream)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return header(len(payload), kind, flags, stream) + payload


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


class Frames:
    """The complete frames of what one `recv_into` added to a socket's buffer: (kind, flags, stream, payload)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.start, self.end = sock, bytearray(2 * READ), 0, 0

    def read(self) -> list[tuple[int, int, int, Any]] | None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end > len(self.buffer) - READ:  # keep room for a whole read after the partial frame
            left = self.end - self.start
            self.buffer[:left] = self.buffer[self.start:self.end]
            self.start, self.end = 0, left
        count = self.sock.recv_into(memoryview(self.buffer)[self.end:self.end + READ])
        if not count:
            return None
        self.end += count
        frames, buffer, view = [], self.buffer, memoryview(self.buffer)
        while self.end - self.start >= 9:
            at = self.start
            length = (buffer[at] << 16) | (buffer[at + 1] << 8) | buffer[at + 2]
            if self.end - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5:at + 9], "big") & 0x7FFFFFFF
            payload = view[at + 9:at + 9 + length]  # sent on before the next read overwrites it
            frames.append((kind, flags, stream, payload if kind == DATA else bytes(payload)))
            self.start = at + 9 + length
        return frames


class Pump:
    """One client connection and its own connection to the daemon, a thread reading each.

    Every DATA frame from the client goes through its stream's queue, drained under the daemon's windows by
    whichever thread holds the windows' lock (the client's reader after each read, the daemon's reader after a
    window update), so frames keep their order and neither reader ever waits for a window: pings and settings
    are answered at once. A frame still queued after a read is copied out of the read buffer. The client's
    windows are topped up by what was sent on, every REPLENISH bytes."""

    def __init__(self, client: socket.socket, upstream: socket.socket, hpack: Any):
        self.client, self.upstream = client, upstream
        self.from_client_headers, self.to_upstream_headers = hpack.Decoder(), hpack.Encoder()
        self.from_upstream_headers, self.to_client_headers = hpack.Decoder(), hpack.Encoder()
        self.windows = threading.Lock()  # the daemon's windows and the queues; taken before the sockets' locks
        self.upstream_window, self.upstream_initial = 65535, 65535
        self.stream_windows: dict[int, int] = {}  # upstream stream → what the daemon lets it send
        self.queued: dict[int, deque[tuple[Any, int, int]]] = {}  # upstream stream → (payload, end, client stream)
        self.upstream_of: dict[int, int] = {}
        self.client_of: dict[int, int] = {}
        self.next_stream = 1
        self.unacked: dict[int, int] = {}  # client stream → bytes sent on since its window was topped up
        self.unacked_total = 0
        self.client_lock, self.upstream_lock = threading.Lock(), threading.Lock()
        self.to_upstream(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW))
                         + window_update(0, LARGEST_WINDOW - 65535))
        threading.Thread(target=self.client_to_upstream, daemon=True).start()
        threading.Thread(target=self.upstream_to_client, daemon=True).start()

    def to_client(self, data: bytes) -> None:
        with self.client_lock:
            self.client.sendall(data)

    def to_upstream(self, data: bytes) -> None:
        with self.upstream_lock:
            self.upstream.sendall(data)

    def drain(self) -> None:
        """Send every queued frame the daemon's windows allow, in order (the caller holds self.windows)."""
        out: list[Any] = []
        for upstream, queue in self.queued.items():
            while queue:
                payload, end, stream = queue[0]
                size = len(payload)
                if min(self.upstream_window, self.stream_windows[upstream]) < size:
                    break
                queue.popleft()
                self.upstream_window -= size
                self.stream_windows[upstream] -= size
                out += (header(size, DATA, end, upstream), payload)
                self.unacked_total += size
                if end:
                    self.unacked.pop(stream, None)
                else:
                    self.unacked[stream] = self.unacked.get(stream, 0) + size
        if out:
            self.to_upstream(b"".join(out))
        if self.unacked_total >= REPLENISH:
            updates = [window_update(0, self.unacked_total)]
            updates += [window_update(stream, size) for stream, size in self.unacked.items() if size]
            self.unacked_total, self.unacked = 0, dict.fromkeys(self.unacked, 0)
            self.to_client(b"".join(updates))

    def client_to_upstream(self) -> None:
        preface = b""
        while len(preface) < len(PREFACE):
            preface += self.client.recv(len(PREFACE) - len(preface))
        self.to_client(frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW))
                       + window_update(0, LARGEST_WINDOW - 65535))
        frames = Frames(self.client)
        while (got := frames.read()) is not None:
            back: list[bytes] = []
            with self.windows:
                for kind, flags, stream, payload in got:
                    if kind == DATA:
                        upstream = self.upstream_of[stream]
                        self.queued[upstream].append((payload, flags & END_STREAM, stream))
                    elif kind == HEADERS:
                        self.drain()  # what came before it goes first
                        upstream, self.next_stream = self.next_stream, self.next_stream + 2
                        self.upstream_of[stream], self.client_of[upstream] = upstream, stream
                        self.stream_windows[upstream], self.queued[upstream] = self.upstream_initial, deque()
                        block = payload[1:len(payload) - payload[0]] if flags & PADDED else payload
                        block = block[5:] if flags & PRIORITY else block
                        fields = self.from_client_headers.decode(block, raw=True)
                        self.to_upstream(frame(HEADERS, flags & (END_STREAM | END_HEADERS), upstream,
                                               self.to_upstream_headers.encode(fields)))
                    elif kind == SETTINGS and not flags & ACK:
                        back.append(frame(SETTINGS, ACK, 0, b""))
                    elif kind == PING and not flags & ACK:
                        back.append(frame(PING, ACK, 0, payload))
                    elif kind == RST_STREAM and stream in self.upstream_of:
                        self.queued[self.upstream_of[stream]].clear()
                        self.to_upstream(frame(RST_STREAM, 0, self.upstream_of[stream], payload))
                self.drain()
                for queue in self.queued.values():  # the read buffer is reused: what waits is copied out of it
                    for at, (payload, end, stream) in enumerate(queue):
                        if isinstance(payload, memoryview):
                            queue[at] = (bytes(payload), end, stream)
            if back:
                self.to_client(b"".join(back))

    def upstream_to_client(self) -> None:
        frames = Frames(self.upstream)
        while (got := frames.read()) is not None:
            out: list[Any] = []
            back: list[bytes] = []
            opened = False
            for kind, flags, stream, payload in got:
                if kind == DATA:
                    out += (header(len(payload), DATA, flags & END_STREAM, self.client_of[stream]), payload)
                    if len(payload):
                        back.append(window_update(0, len(payload)))
                elif kind == HEADERS:
                    fields = self.from_upstream_headers.decode(payload, raw=True)
                    out.append(frame(HEADERS, flags & (END_STREAM | END_HEADERS), self.client_of[stream],
                                     self.to_client_headers.encode(fields)))
                elif kind == SETTINGS and not flags & ACK:
                    with self.windows:
                        for at in range(0, len(payload), 6):
                            key, value = struct.unpack(">HI", payload[at:at + 6])
                            if key == INITIAL_WINDOW_SIZE:
                                for upstream in self.stream_windows:
                                    self.stream_windows[upstream] += value - self.upstream_initial
                                self.upstream_initial = value
                    back.append(frame(SETTINGS, ACK, 0, b""))
                    opened = True
                elif kind == WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                    with self.windows:
                        if stream == 0:
                            self.upstream_window += increment
                        elif stream in self.stream_windows:
                            self.stream_windows[stream] += increment
                    opened = True
                elif kind == PING and not flags & ACK:
                    back.append(frame(PING, ACK, 0, payload))
                elif kind == RST_STREAM and stream in self.client_of:
                    out.append(frame(RST_STREAM, 0, self.client_of[stream], payload))
            if back:
                self.to_upstream(b"".join(back))
            if opened:
                with self.windows:
                    self.drain()
            if out:
                self.to_client(b"".join(out))


def accept(listen: socket.socket, upstream_port: int, hpack: Any) -> None:
    while True:
        client, _ = listen.accept()
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        for end in (client, upstream):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        Pump(client, upstream, hpack)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6, help="100 MB calls each way (after one untimed each)")
    args = parser.parse_args()
    try:
        import hpack  # type: ignore[import-not-found]
    except ImportError:
        sys.exit("error: this bench needs hpack, which vastctl does not install: pip install hpack")
    with tempfile.TemporaryDirectory() as tmp:
        _daemon, daemon_port = start_stand_in(Path(tmp))
        listen = socket.socket()
        listen.bind(("127.0.0.1", 0))
        listen.listen(16)
        threading.Thread(target=accept, args=(listen, daemon_port, hpack), daemon=True).start()
        times = large_calls_beside_direct({"direct": daemon_port, "frame pump": listen.getsockname()[1]}, args.calls,
                                          "frame-pump")
    print_added(times, "frame pump", "a Python HTTP/2 frame pump", f"python bench/frame_pump_floor.py --calls {args.calls}")


if __name__ == "__main__":
    main()
