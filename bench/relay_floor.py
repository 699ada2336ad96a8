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
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import grpc

# the stand-in, its ports and the call as route_bench makes them; route_bench puts tests/ on the path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import route_bench
from curio_client import prove_request
from route_bench import DAEMON, LARGE_BYTES, OPTIONS, STARTED, free_port, timed, wait

BUFFER = 1 << 20


def relay(listen: socket.socket, target_port: int) -> None:
    """Accept on `listen` and relay each connection's bytes both ways to 127.0.0.1:target_port, untouched."""
    def pump(source: socket.socket, sink: socket.socket) -> None:
        buffer = bytearray(BUFFER)
        view = memoryview(buffer)
        try:
            while count := source.recv_into(buffer):
                sink.sendall(view[:count])
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
        work = Path(tmp)
        daemon_port, log = free_port(), work / "daemon.err"
        (work / "release").touch()
        daemon = subprocess.Popen([sys.executable, str(DAEMON), "--port", str(daemon_port), "--slots", "64",
                                   "--prove-seconds", "0", "--proof-bytes", "1920",
                                   "--release-file", str(work / "release")],
                                  stdout=subprocess.DEVNULL, stderr=log.open("w"))
        STARTED.append(daemon)
        wait(lambda: "listening" in log.read_text(), "the stand-in listens", daemon, log)
        listen = socket.socket()
        listen.bind(("127.0.0.1", 0))
        listen.listen(16)
        relay(listen, daemon_port)
        ports = {"direct": daemon_port, "relay": listen.getsockname()[1]}
        calls = {name: grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS).unary_unary(
                     "/cuzk.v1.ProvingEngine/Prove", request_serializer=None, response_deserializer=None)
                 for name, port in ports.items()}
        request = prove_request("relay-floor", payload_bytes=LARGE_BYTES)
        for call in calls.values():
            timed(call, request)  # warm: the connections, the daemon's first allocation
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.calls):
            for name, call in calls.items():
                times[name].append(timed(call, request))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"100 MB calls, {args.calls} each way, interleaved:")
    print("| path | median s | min s | max s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {median[name]:.3f} | {min(values):.3f} | {max(values):.3f} |")
    added = median["relay"] / median["direct"] - 1
    print(f"a bare Python relay adds {added:+.1%} (the router's target for 100 MB calls: ≤ {route_bench.TARGET_LARGE_ADDED:.0%})")
    print(f"rerun: python bench/relay_floor.py --calls {args.calls}")


if __name__ == "__main__":
    main()
