"""`vastctl route` beside a direct call: what the router adds to a Prove, and the memory it keeps.

One stand-in cuzk daemon (tests/fakes/cuzk_daemon.py, proving in 0 s) and a real `vastctl route` process in
front of it, the daemon's loopback port as the one joined prover's tunnel end. In one run, interleaved call by
call (so the machine's load falls on both alike):

  small   --small calls of a 1 KiB vanilla proof, direct and through the router: p50/p99 latency of each and
          what the router adds (target: p99 added ≤ 5 ms)
  large   --large calls of 100 MB, direct and through the router: median time of each (target: ≤ 10% added)
  memory  the router's peak RSS over the large calls, then over --burst 100 MB calls sent at once while the
          stand-in holds every proof it took (--burst-hold seconds after all have arrived, so the router keeps
          what it may and the rest wait), beside the documented bound (docs/joining-curio.md): idle RSS +
          max(route.max_held_mb (--max-held-mb), the read reserve) + ~0.25 MiB a call waiting unread

Rerun:
    python bench/route_bench.py                          # 300 small, 10 large, a burst of 8
    python bench/route_bench.py --small 100 --large 3    # a quick run
    python bench/route_bench.py --max-held-mb 2048 --burst 16   # more calls kept at once
    python bench/route_bench.py --router-env GLIBC_TUNABLES=glibc.malloc.hugetlb=1   # the router's malloc tuned
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
DAEMON = ROOT / "tests" / "fakes" / "cuzk_daemon.py"
sys.path.insert(0, str(ROOT / "tests"))

from helpers.curio_client import prove_request  # noqa: E402  (the tests' request builder, as Curio builds a call)

from vastctl.clock import SYSTEM, to_iso  # noqa: E402
from vastctl.route import server as route_server  # noqa: E402
from vastctl.route import wire  # noqa: E402
from vastctl.state import db, lifecycle  # noqa: E402
from vastctl.state.lifecycle import State  # noqa: E402

TARGET_SMALL_P99_ADDED_MS = 5.0
TARGET_LARGE_ADDED = 0.10
LARGE_BYTES = 100_000_000
UNREAD_COST = 256 * 1024  # a call waiting unread: its 64 KiB HTTP/2 window, its thread (docs/joining-curio.md)
OPTIONS = [("grpc.max_send_message_length", wire.CURIO_MAX_MESSAGE),
           ("grpc.max_receive_message_length", wire.CURIO_MAX_MESSAGE), ("grpc.enable_retries", 0)]


STARTED: list[subprocess.Popen] = []  # stopped at exit, however the run ends


@atexit.register
def _stop_started() -> None:
    for proc in STARTED:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait(condition, what: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"error: {what} did not happen: {log.read_text(errors='replace')[-2000:]}")


def rss(pid: int, field: str) -> int:
    """VmHWM (peak) or VmRSS (now) of a process, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024  # type: ignore[union-attr]


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used (its threads together)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_gb(cpu: float, calls: int) -> float:
    """CPU seconds for each GB of request relayed (calls of LARGE_BYTES)."""
    return cpu / (calls * LARGE_BYTES / 1e9)


def reset_peak(pid: int) -> bool:
    """Start a new peak RSS (Linux: clear_refs 5); False when the kernel or our rights do not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def start_stand_in(workdir: Path) -> tuple[subprocess.Popen, int]:
    """The stand-in daemon (64 slots, proving in 0 s) on a free loopback port, once it listens."""
    daemon_port, daemon_log = free_port(), workdir / "daemon.err"
    (workdir / "release").touch()  # proofs finish at once until the burst takes the file away
    daemon = subprocess.Popen([sys.executable, str(DAEMON), "--port", str(daemon_port), "--slots", "64",
                               "--prove-seconds", "0", "--proof-bytes", "1920",
                               "--release-file", str(workdir / "release")],
                              stdout=subprocess.DEVNULL, stderr=daemon_log.open("w"))
    STARTED.append(daemon)
    wait(lambda: "listening" in daemon_log.read_text(), "the stand-in listens", daemon, daemon_log)
    return daemon, daemon_port


def large_calls_beside_direct(ports: dict[str, int], calls: int, request_id: str) -> dict[str, list[float]]:
    """Seconds of each 100 MB call to each of `ports` (name → loopback port), `calls` each, interleaved call
    by call, after one small and one 100 MB call each untimed (connections set up, first allocations made)."""
    stubs = {name: grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS).unary_unary(
                 "/cuzk.v1.ProvingEngine/Prove", request_serializer=None, response_deserializer=None)
             for name, port in ports.items()}
    request = prove_request(request_id, payload_bytes=LARGE_BYTES)
    for stub in stubs.values():
        timed(stub, prove_request(f"{request_id}-small"))
        timed(stub, request)
    times: dict[str, list[float]] = {name: [] for name in stubs}
    for _ in range(calls):
        for name, stub in stubs.items():
            times[name].append(timed(stub, request))
    return times


def print_added(times: dict[str, list[float]], through: str, what: str, rerun: str) -> None:
    """The table of large_calls_beside_direct's times and what `through` adds to `direct`, in words."""
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"100 MB calls, {len(times['direct'])} each way, interleaved:")
    print("| path | median s | min s | max s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {median[name]:.3f} | {min(values):.3f} | {max(values):.3f} |")
    added = median[through] / median["direct"] - 1
    print(f"{what} adds {added:+.1%} (the router's target for 100 MB calls: ≤ {TARGET_LARGE_ADDED:.0%})")
    print(f"rerun: {rerun}")


def start(workdir: Path, max_held_mb: int, refresh: str, router_env: dict[str, str]) -> tuple[subprocess.Popen, subprocess.Popen, int, int]:
    daemon, daemon_port = start_stand_in(workdir)
    router_port = free_port()
    db_path = workdir / "manager.db"
    now = SYSTEM.now()
    conn = db.connect(db_path, create=True, now=now)
    lifecycle.create(conn, uuid="uuid-bench", label="vastctl-bench", state=State.RUNNING, source="operator",
                     reason="bench", now=now, fields={"tunnel_port": daemon_port, "bench_rate": 50.0,
                                                      "joined_at": to_iso(now)})
    conn.close()
    config = workdir / "config.yaml"
    config.write_text(f"launch:\n  bench_concurrency: 64\nroute:\n  listen: 127.0.0.1:{router_port}\n"
                      f"  max_held_mb: {max_held_mb}\n  refresh: {refresh}\n")
    env = {**os.environ, "VASTCTL_DB": str(db_path), "VASTCTL_CONFIG": str(config), "HOME": str(workdir),
           **router_env}
    router_log = workdir / "route.log"
    router = subprocess.Popen([sys.executable, "-m", "vastctl", "route"], env=env, stdout=subprocess.DEVNULL,
                              stderr=router_log.open("w"))
    STARTED.append(router)
    wait(lambda: "provers joined" in router_log.read_text(), "the router sees the stand-in", router, router_log)
    return daemon, router, daemon_port, router_port


def timed(call, request: bytes) -> float:
    started = time.perf_counter()
    answer = wire.ProveResponse.FromString(call(request, timeout=120)).result
    elapsed = time.perf_counter() - started
    assert answer.status == wire.STATUS_COMPLETED, answer
    return elapsed


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]


def interleaved(direct, routed, request: bytes, rounds: int) -> tuple[list[float], list[float]]:
    """Each round one call each way, the order alternating, so drift in the machine's load falls on both."""
    times: dict[str, list[float]] = {"direct": [], "router": []}
    for n in range(rounds):
        pair = [("direct", direct), ("router", routed)]
        for name, call in (pair if n % 2 == 0 else pair[::-1]):
            times[name].append(timed(call, request))
    return times["direct"], times["router"]


def burst(routed, status, count: int, release: Path, hold: float, router_pid: int) -> dict[str, object]:
    """`count` 100 MB calls at once through the router, the stand-in holding every proof until all have arrived
    (on the prover or waiting at the router) and `hold` seconds more: how many the prover had at once, how many
    waited at the router, the router's peak RSS and how the calls ended."""
    request = prove_request("bench-burst", payload_bytes=LARGE_BYTES)
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def one(_: int) -> None:
        try:
            timed(routed, request)
            key = "completed"
        except grpc.RpcError as exc:
            key = exc.code().name
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1

    def where() -> tuple[int, int]:
        queues = {q.proof_kind: q for q in wire.GetStatusResponse.FromString(status(b"", timeout=30)).queues}
        return queues["porep"].in_progress if "porep" in queues else 0, queues["router-held"].pending

    release.unlink()
    reset_peak(router_pid)
    with futures.ThreadPoolExecutor(max_workers=count) as pool:
        calls = [pool.submit(one, n) for n in range(count)]
        deadline = time.monotonic() + 120
        while sum(where()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(hold)
        on_prover, waiting = where()
        release.touch()
        for call in calls:
            call.result()
    return {"on_prover": on_prover, "waiting": waiting, "peak": rss(router_pid, "VmHWM"), "outcomes": outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=300, help="small calls each way")
    parser.add_argument("--large", type=int, default=10, help="100 MB calls each way")
    parser.add_argument("--burst", type=int, default=8, help="100 MB calls sent at once through the router")
    parser.add_argument("--max-held-mb", type=int, default=512, help="route.max_held_mb for the run")
    parser.add_argument("--burst-hold", type=float, default=3.0,
                        help="seconds the stand-in holds the burst's proofs once every call has arrived")
    parser.add_argument("--refresh", default="2s", help="route.refresh: how often the router's writer thread runs")
    parser.add_argument("--router-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment for the router process only, e.g. MALLOC_ARENA_MAX=2")
    args = parser.parse_args()
    command = "python bench/route_bench.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="route-bench-") as tmp:
        router_env = dict(item.split("=", 1) for item in args.router_env)
        daemon, router, daemon_port, router_port = start(Path(tmp), args.max_held_mb, args.refresh, router_env)
        try:
            direct_channel = grpc.insecure_channel(f"127.0.0.1:{daemon_port}", options=OPTIONS)
            router_channel = grpc.insecure_channel(f"127.0.0.1:{router_port}", options=OPTIONS)
            direct = direct_channel.unary_unary(wire.PROVE)
            routed = router_channel.unary_unary(wire.PROVE)
            # the bench's own look at where the burst's calls are, on a connection of its own: on the burst's
            # connection it would queue behind the 100 MB messages being written
            status_channel = grpc.insecure_channel(f"127.0.0.1:{router_port}", options=OPTIONS)
            status = status_channel.unary_unary(wire.GET_STATUS)
            small = prove_request("bench-small", payload_bytes=1024)
            interleaved(direct, routed, small, 30)  # warm both paths: connections, threads, caches
            d_small, r_small = interleaved(direct, routed, small, args.small)
            idle_rss = rss(router.pid, "VmRSS")

            large = prove_request("bench-large", payload_bytes=LARGE_BYTES)
            interleaved(direct, routed, large, 1)
            peak_reset = reset_peak(router.pid)
            cpu_before = cpu_seconds(router.pid)
            d_large, r_large = interleaved(direct, routed, large, args.large)
            router_cpu = cpu_seconds(router.pid) - cpu_before
            large_peak = rss(router.pid, "VmHWM")
            del large
            burst_seen = burst(routed, status, args.burst, Path(tmp) / "release", args.burst_hold, router.pid)
        finally:
            _stop_started()

    ms = 1000.0
    print(f"small calls (1 KiB vanilla proof), {args.small} each way, interleaved:")
    print("| path | p50 ms | p99 ms |")
    print("|---|---|---|")
    print(f"| direct | {quantile(d_small, 0.5) * ms:.2f} | {quantile(d_small, 0.99) * ms:.2f} |")
    print(f"| router | {quantile(r_small, 0.5) * ms:.2f} | {quantile(r_small, 0.99) * ms:.2f} |")
    added50 = (quantile(r_small, 0.5) - quantile(d_small, 0.5)) * ms
    added99 = (quantile(r_small, 0.99) - quantile(d_small, 0.99)) * ms
    print(f"| added | {added50:.2f} | {added99:.2f} |  target p99 added ≤ {TARGET_SMALL_P99_ADDED_MS:g} ms:"
          f" {'met' if added99 <= TARGET_SMALL_P99_ADDED_MS else 'MISSED'}")
    print()
    dm, rm = statistics.median(d_large), statistics.median(r_large)
    print(f"100 MB calls, {args.large} each way, interleaved:")
    print("| path | median s | min s | max s |")
    print("|---|---|---|---|")
    print(f"| direct | {dm:.3f} | {min(d_large):.3f} | {max(d_large):.3f} |")
    print(f"| router | {rm:.3f} | {min(r_large):.3f} | {max(r_large):.3f} |")
    print(f"added: {(rm / dm - 1) * 100:+.1f}%  target ≤ {TARGET_LARGE_ADDED * 100:g}%:"
          f" {'met' if rm / dm - 1 <= TARGET_LARGE_ADDED else 'MISSED'}")
    print(f"router CPU: {per_gb(router_cpu, args.large):.2f} s per GB relayed (bench/relay_floor.py prints a bare"
          " relay's)")
    print()
    mb = 1024 * 1024
    budget = max(args.max_held_mb * mb, route_server.READ_RESERVE)
    bound = idle_rss + budget + UNREAD_COST * burst_seen["waiting"]  # type: ignore[operator]
    peak = burst_seen["peak"]
    print(f"router memory: idle {idle_rss / mb:.0f} MiB; peak over the 100 MB calls one at a time"
          f" {large_peak / mb:.0f} MiB{'' if peak_reset else ' (peak not reset: since start)'}")
    print(f"burst of {args.burst} 100 MB calls at once, route.max_held_mb {args.max_held_mb}: {burst_seen['on_prover']}"
          f" on the prover at once, {burst_seen['waiting']} waiting at the router; {burst_seen['outcomes']}")
    print(f"peak {peak / mb:.0f} MiB; bound: idle {idle_rss / mb:.0f} + max(route.max_held_mb {args.max_held_mb},"
          f" read reserve {route_server.READ_RESERVE / mb:.0f}) + 0.25 x {burst_seen['waiting']} waiting ="
          f" {bound / mb:.0f} MiB: {'within' if peak <= bound else 'OVER'}")
    print()
    print(f"machine: {os.cpu_count()} cores, load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at"
          " the end (other work on the machine widens both paths' p99 alike)")
    print(f"rerun: {command.strip()}")


if __name__ == "__main__":
    main()
