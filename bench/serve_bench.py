"""`vastctl serve` under load: sustained heartbeats per second and p50/p99 latency.

50 concurrent clients (one keep-alive HTTP connection each, one machine each)
send heartbeats with a rising cumulative proof counter to a real `vastctl
serve` on 127.0.0.1 for a minute. Pass: zero errors, zero lost heartbeats (every
machine's proofs_done in the file equals the number of heartbeats it sent)
and at least 500 reports/s.

With --slow N, N hostile connections are held open beside the clients for the
whole run: each sends the start of a request and then one byte every
--slow-every seconds, never finishing; when serve cuts one off (its
--request-timeout) it is opened again at once, as an attacker would. Pass then
needs at least 1,000 reports/s and a p99 under 100 ms.

Rerun:
    python bench/serve_bench.py                   # 60 s, 50 clients
    python bench/serve_bench.py --seconds 10      # a quick run
    python bench/serve_bench.py --slow 500        # beside 500 trickling connections
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TARGET_RPS = 500
TARGET_RPS_WITH_SLOW = 1000
TARGET_P99_WITH_SLOW = 0.100  # seconds


def start_server(workdir: Path, threads: int | None, access_log: bool) -> tuple[subprocess.Popen, int, dict]:
    config = workdir / "config.yaml"
    config.write_text("fleet:\n  min_bench_rate: 1\n")
    env = {**os.environ, "VASTCTL_DB": str(workdir / "vastctl.db"), "VASTCTL_CONFIG": str(config),
           "HOME": str(workdir)}
    for name in ("VASTCTL_SERVER", "VASTCTL_TOKEN"):
        env.pop(name, None)
    subprocess.run([sys.executable, "-m", "vastctl", "init"], env=env, check=True, capture_output=True)
    log = workdir / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vastctl", "serve", "--port", "0", *(["--threads", str(threads)] if threads else []),
         "--access-log" if access_log else "--no-access-log"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = re.search(r"serving on http://127\.0\.0\.1:(\d+)", log.read_text())
        if match:
            return proc, int(match.group(1)), env
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"serve did not start: {log.read_text()}")


def token_for(env: dict, uuid: str) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from vastctl.state import tokens

    return tokens.machine_token(tokens.read_secret(Path(env["VASTCTL_DB"] + ".secret")), uuid)


class Client(threading.Thread):
    """One machine: its own connection, its own uuid, heartbeats until the stop time."""

    def __init__(self, port: int, uuid: str, token: str, stop_at: float):
        super().__init__(daemon=True)
        self.port, self.uuid, self.stop_at = port, uuid, stop_at
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.sent = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []

    def post(self, conn: http.client.HTTPConnection, report: str, body: dict) -> int:
        conn.request("POST", f"/v1/instances/{self.uuid}/{report}", json.dumps(body), self.headers)
        response = conn.getresponse()
        response.read()
        return response.status

    def setup(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        steps = [("register", {"label": f"bench-{self.uuid}"}), ("params-done", {}), ("bench-report", {"rate": 100}),
                 ("running", {})]
        for report, body in steps:
            status = self.post(conn, report, body)
            if status != 200:
                self.errors.append(f"{report}: {status}")
        conn.close()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while time.monotonic() < self.stop_at:
            started = time.perf_counter()
            try:
                status = self.post(conn, "heartbeat", {"proofs_done": self.sent + 1})
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(f"heartbeat: {exc!r}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                continue
            self.latencies.append(time.perf_counter() - started)
            if status == 200:
                self.sent += 1
            else:
                self.errors.append(f"heartbeat: {status}")
        conn.close()


class Trickler(threading.Thread):
    """Holds `count` connections open, each sending one more header byte every `every` seconds and never finishing."""

    REQUEST_START = b"POST /v1/instances/nobody/heartbeat HTTP/1.1\r\nHost: x\r\nX-Slow: "

    def __init__(self, port: int, count: int, every: float):
        super().__init__(daemon=True)
        self.port, self.count, self.every = port, count, every
        self.sockets: list[socket.socket] = []
        self.stopping = threading.Event()
        self.reopened = 0
        self.failed_opens = 0

    def open_one(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            sock.sendall(self.REQUEST_START)
            return sock
        except OSError:
            self.failed_opens += 1
            return None

    def open_all(self) -> None:
        self.sockets = [sock for sock in (self.open_one() for _ in range(self.count)) if sock is not None]

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            for index, sock in enumerate(self.sockets):
                try:
                    sock.send(b"a")
                except OSError:  # cut off by serve: open another in its place
                    sock.close()
                    fresh = self.open_one()
                    if fresh is not None:
                        self.sockets[index] = fresh
                        self.reopened += 1

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=30)
        for sock in self.sockets:
            sock.close()


def cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU time so far (Linux /proc), or None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="serve --threads (default: serve's own)")
    parser.add_argument("--no-access-log", dest="access_log", action="store_false",
                        help="serve --no-access-log (default: log every request to a file, as in production)")
    parser.add_argument("--slow", type=int, default=0, help="hostile trickling connections held open beside the clients")
    parser.add_argument("--slow-every", type=float, default=2.0, help="seconds between a slow connection's bytes")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        workdir = Path(tmp)
        proc, port, env = start_server(workdir, args.threads, args.access_log)
        try:
            uuids = [f"bench-{i:03d}" for i in range(args.clients)]
            clients = [Client(port, uuid, token_for(env, uuid), 0.0) for uuid in uuids]
            for client in clients:
                client.setup()
            trickler = Trickler(port, args.slow, args.slow_every)
            if args.slow:
                trickler.open_all()
                trickler.start()
                time.sleep(args.slow_every * 1.5)  # every slow connection accepted and trickling
            started = time.monotonic()
            cpu_before = cpu_seconds(proc.pid)
            for client in clients:
                client.stop_at = started + args.seconds
                client.start()
            for client in clients:
                client.join()
            elapsed = time.monotonic() - started
            cpu_after = cpu_seconds(proc.pid)
            trickler.stop()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        conn = sqlite3.connect(env["VASTCTL_DB"])
        in_file = dict(conn.execute("SELECT uuid, proofs_done FROM instances"))
        conn.close()

    sent = sum(c.sent for c in clients)
    errors = [e for c in clients for e in c.errors]
    lost = sum(1 for c in clients if in_file.get(c.uuid) != c.sent)
    latencies = [x for c in clients for x in c.latencies]
    rate = sent / elapsed
    log = "on" if args.access_log else "off"
    threads = f"--threads {args.threads}" if args.threads else "default threads"
    print(f"clients {args.clients}, serve {threads}, access log {log}, {elapsed:.1f}s on 127.0.0.1 ({os.cpu_count()} cores)")
    print(f"heartbeats sent and answered 200: {sent}")
    target_rps = TARGET_RPS_WITH_SLOW if args.slow else TARGET_RPS
    print(f"sustained: {rate:.0f} reports/s (target ≥ {target_rps})")
    print(f"latency p50 {percentile(latencies, 0.50) * 1000:.1f} ms, p99 {percentile(latencies, 0.99) * 1000:.1f} ms,"
          f" mean {statistics.fmean(latencies) * 1000:.1f} ms")
    if cpu_before is not None and cpu_after is not None and sent:
        print(f"serve CPU: {(cpu_after - cpu_before) * 1e6 / sent:.0f} µs per report"
              f" ({(cpu_after - cpu_before) / elapsed:.2f} cores)")
    print(f"errors: {len(errors)}{' e.g. ' + errors[0] if errors else ''}")
    print(f"machines whose proofs_done in the file differs from heartbeats sent: {lost}")
    p99 = percentile(latencies, 0.99)
    if args.slow:
        print(f"slow connections held: {len(trickler.sockets)} of {args.slow} (a byte each every {args.slow_every:g} s),"
              f" cut off by serve and reopened: {trickler.reopened}, failed opens: {trickler.failed_opens}")
        print(f"p99 beside them: {p99 * 1000:.1f} ms (target < {TARGET_P99_WITH_SLOW * 1000:.0f} ms)")
    flags = ((f" --threads {args.threads}" if args.threads else "") + ("" if args.access_log else " --no-access-log")
             + (f" --slow {args.slow} --slow-every {args.slow_every:g}" if args.slow else ""))
    print(f"rerun: python bench/serve_bench.py --seconds {args.seconds:g} --clients {args.clients}{flags}")
    slow_ok = not args.slow or (p99 < TARGET_P99_WITH_SLOW and len(trickler.sockets) == args.slow)
    return 0 if not errors and not lost and rate >= target_rps and slow_ok else 1


if __name__ == "__main__":
    sys.exit(main())
