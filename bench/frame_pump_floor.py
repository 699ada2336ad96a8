"""What forwarding a 100 MB Prove frame by frame costs in Python: a minimal HTTP/2 frame pump beside a direct call.

`vastctl route` is store-and-forward (grpcio hands a handler whole messages): far over a ≤ 10% target on a
100 MB call (bench/README.md, "Proof router", has the figures). bench/relay_floor.py measures the bytes alone
through a Python relay. This measures the next floor up: a pump that speaks HTTP/2 to both sides, as a cut-through router would,
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

# the router's own frame code: its constants, frame builders and the reader that parses each recv_into whole
from vastctl.route.h2 import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LARGEST_WINDOW,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Reader,
    frame,
    header,
    header_block,
    settings,
    window_update,
)

# the stand-in and the interleaved 100 MB calls, as route_bench makes them
sys.path.insert(0, str(Path(__file__).resolve().parent))
from route_bench import large_calls_beside_direct, print_added, start_stand_in

OUR_STREAM_WINDOW = (1 << 24) - 1
REPLENISH = 4 << 20  # the client's windows are topped up once this much was sent on


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
        self.to_upstream(PREFACE + settings(initial_window_size=OUR_STREAM_WINDOW)
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
        self.to_client(settings(initial_window_size=OUR_STREAM_WINDOW) + window_update(0, LARGEST_WINDOW - 65535))
        frames = Reader(self.client)
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
                        fields = self.from_client_headers.decode(header_block(flags, payload), raw=True)
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
        frames = Reader(self.upstream)
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
                    self.settled(payload)
                    back.append(frame(SETTINGS, ACK, 0, b""))
                    opened = True
                elif kind == WINDOW_UPDATE:
                    self.window_opened(stream, payload)
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

    def settled(self, payload: bytes) -> None:
        """The daemon's SETTINGS: a new initial window moves every stream's window by the difference."""
        with self.windows:
            for at in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[at:at + 6])
                if key == INITIAL_WINDOW_SIZE:
                    for upstream in self.stream_windows:
                        self.stream_windows[upstream] += value - self.upstream_initial
                    self.upstream_initial = value

    def window_opened(self, stream: int, payload: bytes) -> None:
        """The daemon's WINDOW_UPDATE, for the connection (stream 0) or one stream."""
        increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
        with self.windows:
            if stream == 0:
                self.upstream_window += increment
            elif stream in self.stream_windows:
                self.stream_windows[stream] += increment


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
