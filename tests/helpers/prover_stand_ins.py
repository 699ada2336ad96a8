"""Stand-ins for the route tests: a cuzk daemon as it treats calls, and a router on a state file in this process.

CuzkStandIn does what domain.md §7 says cuzk does with a call its caller gave up: the job runs on to its end
(CancelProof is not implemented), and GetStatus counts it in its queue until then. It can stop and come back on
the same port, as a restarted daemon does.
"""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from helpers.serving import query, wait_for
from vastctl import clock
from vastctl import config as config_module
from vastctl.route import front as route_front
from vastctl.route import listener as route_listener
from vastctl.route import server as route_server
from vastctl.route import wire
from vastctl.state import db

MiB = 1024 * 1024


class CuzkStandIn:
    """cuzk.v1.ProvingEngine on 127.0.0.1: each Prove is a job that ends when `gate` is set (set at the start),
    whatever became of its caller; GetStatus's queue `porep` shows the jobs running as in_progress."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.seen: list[str] = []
        self.running = 0
        self.most_running = 0  # the most jobs it ran at once
        self.port = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._alive = threading.Event()
        self.start()

    def start(self) -> None:
        """Listen (again: on the same port as before, as a restarted daemon does)."""
        alive = self._alive = threading.Event()
        alive.set()

        def prove(data: bytes, context: Any) -> bytes:
            request = wire.ProveRequest.FromString(data)
            with self._lock:
                self.seen.append(request.submit.request_id)
                self.running += 1
                self.most_running = max(self.most_running, self.running)
            try:
                while not self.gate.wait(0.02):
                    if not alive.is_set():  # the daemon died: its jobs with it
                        return b""
            finally:
                with self._lock:
                    self.running -= 1
            return wire.ProveResponse(result=wire.AwaitProofResponse(
                job_id=request.submit.request_id, status=wire.STATUS_COMPLETED,
                proof=b"proof:" + request.submit.request_id.encode(), total_ms=1)).SerializeToString()

        def status(data: bytes, context: Any) -> bytes:
            with self._lock:
                running = self.running
            return wire.GetStatusResponse(queues=[wire.QueueStatus(proof_kind="porep", pending=0,
                                                                   in_progress=running)]).SerializeToString()

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(status)})
        self._server = grpc.server(futures.ThreadPoolExecutor(32), handlers=[handler])
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    def stop(self) -> None:
        """Gone at once, with the jobs it ran (a daemon killed or restarting): its port refuses connects. The
        server stops first, so a job ending meanwhile answers no one."""
        if self._server is not None:
            self._server.stop(0).wait(10)
        self._alive.clear()


class RouterOnFile:
    """A state file and a router on it in this process (refreshing every 0.1 s), its front end when calls are sent
    on as they arrive, and a client channel to it. `join` adds a running machine whose tunnel end is a stand-in."""

    def __init__(self, path: Path, *, through: str, route: dict[str, Any], slots: int = 2) -> None:
        self.path = path
        self.conn = db.connect(path, now=clock.SYSTEM.now(), create=True)
        route = {"refresh": "0.1s", "max_held": 10, "cut_through_mb": 0 if through == "as it arrives" else 129, **route}
        config = config_module.from_mapping({"db": str(path), "launch": {"bench_concurrency": slots}, "route": route})
        self.router = route_server.Router(config, probe=lambda port, timeout: False)
        self.router.start_writer(path)
        self.server, port = route_server.make_server(self.router, "127.0.0.1:0")
        self.server.start()
        self.front = None
        if through == "as it arrives":
            self.front = route_front.Front(self.router, route_listener.bind("127.0.0.1:0"), port)
            self.front.start()
            port = self.front.listen.getsockname()[1]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 300 * MiB),
                                                                         ("grpc.max_receive_message_length", 300 * MiB)])

    def join(self, port: int, name: str, rate: float = 60.0) -> None:
        at = clock.to_iso(clock.SYSTEM.now())
        self.conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                          " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                          (f"u-{name}", name, at, at, port, at, rate))
        self.conn.commit()
        wait_for(lambda: any(p["label"] == name for p in self.router.dispatcher.snapshot()["provers"]),
                 f"{name} joined")

    def prover(self, name: str) -> dict[str, Any]:
        (found,) = [p for p in self.router.dispatcher.snapshot()["provers"] if p["label"] == name]
        return found

    def prove(self, request_id: str, timeout: float = 30) -> Any:
        """The call's AwaitProofResponse, or the name of the status it failed with."""
        request = wire.ProveRequest(submit=wire.SubmitProofRequest(
            request_id=request_id, proof_kind=wire.POREP_SEAL_COMMIT, vanilla_proof=b"v" * 100)).SerializeToString()
        try:
            return wire.ProveResponse.FromString(self.channel.unary_unary(wire.PROVE)(request, timeout=timeout)).result
        except grpc.RpcError as exc:
            return exc.code().name

    def calls(self) -> list[dict[str, Any]]:
        return query(self.path, "SELECT request_id, label, result, attempt, detail FROM proof_calls ORDER BY id")

    def close(self) -> None:
        self.channel.close()
        if self.front is not None:
            self.front.stop()
            self.front.close()
        self.server.stop(0)
        self.router.stop_writer()
        self.conn.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
