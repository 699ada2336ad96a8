"""The floor under a cut-through proof router: a bare byte relay in Python beside a direct 100 MB Prove.

`vastctl route` is store-and-forward (grpcio hands a handler whole messages), so a 100 MB call is received
whole before its first byte goes on (bench/README.md, "Proof router"). A router that forwards HTTP/2 frames as
they arrive would cost at least what moving the bytes through a Python process costs. This measures that
floor: one stand-in cuzk daemon (tests/fakes/cuzk_daemon.py), and a TCP relay in this process (a thread each
way, `recv_into` a 1 MiB buffer, `sendall`) in front of it; 100 MB calls go direct and through the relay,
interleaved, and the median of each is printed with what the relay adds. The relay parses nothing: a real
forwarder would add the frames' headers, HPACK and flow control on top.

Rerun:
    python bench/relay_floor.py
    python bench/relay_floor.py --calls 10
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

# the stand-in and the interleaved 100 MB calls, as route_bench makes them
sys.path.insert(0, str(Path(__file__).resolve().parent))
from route_bench import large_calls_beside_direct, per_gb, print_added, start_stand_in

BUFFER = 1 << 20
PUMPED: dict[int, float] = {}  # each pump thread's CPU seconds so far, as it last read them itself


def relay(listen: socket.socket, target_port: int) -> None:
    """Accept on `listen` and relay each connection's bytes both ways to 127.0.0.1:target_port, untouched."""
    def pump(source: socket.socket, sink: socket.socket) -> None:
        buffer = bytearray(BUFFER)
        view = memoryview(buffer)
        me = threading.get_ident()
        try:
            while count := source.recv_into(buffer):
                sink.sendall(view[:count])
                PUMPED[me] = time.thread_time()
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def accept() -> None:
        while True:
            client, _ = listen.accept()
            upstream = socket.create_connection(("127.0.0.1", target_port))
            for end in (client, upstream):
                end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6, help="100 MB calls each way (after one untimed each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _daemon, daemon_port = start_stand_in(Path(tmp))
        listen = socket.socket()
        listen.bind(("127.0.0.1", 0))
        listen.listen(16)
        relay(listen, daemon_port)
        ports = {"direct": daemon_port, "relay": listen.getsockname()[1]}
        times = large_calls_beside_direct(ports, args.calls, "relay-floor")
        cpu = sum(PUMPED.values())
    print_added(times, "relay", "a bare Python relay", f"python bench/relay_floor.py --calls {args.calls}")
    print(f"relay CPU: {per_gb(cpu, args.calls + 1):.2f} s per GB relayed (both pumps, the untimed 100 MB call"
          " counted too)")


if __name__ == "__main__":
    main()
