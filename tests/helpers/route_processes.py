"""`vastctl route` as systemd runs it, for the restart and grpc-go tests: real router processes on a config file,
the listening socket held by the test as systemd holds jobs/vastctl-route.socket's and passed to each process
as fd 3 (LISTEN_FDS=1, LISTEN_PID its pid), stand-in cuzk daemons (real grpcio servers in this process), and
Curio's own client: a grpc-go program (tests/go_curio_client) built from Debian's packages in GOPATH mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from helpers.serving import query, wait_for
from vastctl import clock
from vastctl.route import handover, wire
from vastctl.state import db

ROOT = Path(__file__).resolve().parents[2]
GO_CLIENT = ROOT / "tests" / "go_curio_client" / "main.go"
PROTO = ROOT / "vastctl" / "route" / "proving.proto"
DEBIAN_GOCODE = "/usr/share/gocode"  # golang-google-grpc-dev and golang-goprotobuf-dev's sources
# how long a router given SIGTERM may take to exit by its own bounds: route.drain_timeout (10 s here), the
# refusals' margin (cli/route.DRAIN_MARGIN_S), the acceptor's join (5 s) and the call writer's (30 s), with slack
ROUTER_EXIT_S = 60.0
SLOTS = 2  # launch.bench_concurrency: what the router lets each prover hold

def socket_activated(fd: int, command: list[str]) -> list[str]:
    """`command` started as systemd starts a socket-activated service, given the socket at `fd` (pass_fds): the
    same first step a router's handover gives its successor."""
    return [sys.executable, "-c", handover.ACTIVATE, str(fd), *command]


def proof_of(request_id: str, size: int = 1920) -> bytes:
    """A stand-in daemon's proof for a call: made from its request id, so a caller given another call's proof
    is caught."""
    seed = hashlib.sha256(request_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def proof_hash(request_id: str) -> str:
    return hashlib.sha256(proof_of(request_id)).hexdigest()


class StandIn:
    """A grpcio server speaking cuzk.v1.ProvingEngine on a loopback port: each Prove answered COMPLETED with
    proof_of(its request id) after `prove_seconds`. While `hold` is clear, a Prove taken waits until it is set
    or its own call is `release`d (the test decides when proofs finish instead of racing a timer); a call whose
    caller went away meanwhile is not answered."""

    def __init__(self, prove_seconds: float = 0.0) -> None:
        self.prove_seconds = prove_seconds
        self.hold = threading.Event()
        self.hold.set()
        self.lock = threading.Condition()
        self.received: list[str] = []
        self.answered: list[str] = []
        self.released: set[str] = set()
        self.in_progress = 0

        def prove(data: bytes, context: grpc.ServicerContext) -> bytes:
            request_id = wire.ProveRequest.FromString(data).submit.request_id
            with self.lock:
                self.received.append(request_id)
                self.in_progress += 1
                self.lock.notify_all()
            try:
                time.sleep(self.prove_seconds)
                while not self.hold.is_set() and request_id not in self.released:
                    if not context.is_active():
                        return b""
                    with self.lock:
                        self.lock.wait(0.05)
                answer = wire.ProveResponse(result=wire.AwaitProofResponse(
                    job_id=request_id, status=wire.STATUS_COMPLETED, proof=proof_of(request_id), total_ms=1))
                with self.lock:
                    self.answered.append(request_id)
                return bytes(answer.SerializeToString())
            finally:
                with self.lock:
                    self.in_progress -= 1
                    self.lock.notify_all()

        def status(data: bytes, context: grpc.ServicerContext) -> bytes:
            with self.lock:
                done = len(self.answered)
            return bytes(wire.GetStatusResponse(total_proofs_completed=done).SerializeToString())

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(status)})
        self.server = grpc.server(futures.ThreadPoolExecutor(32), handlers=[handler],
                                  options=[("grpc.max_receive_message_length", wire.DAEMON_MAX_MESSAGE)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def release(self, request_id: str) -> None:
        """Let this call's proof finish while `hold` keeps the others."""
        with self.lock:
            self.released.add(request_id)
            self.lock.notify_all()

    def stop(self) -> None:
        self.hold.set()
        self.server.stop(0)


class RouterProcess:
    """One `vastctl route` process and its log (stderr)."""

    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc, self.log_path = proc, log

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM, as systemd stops the service."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class RouteHost:
    """The manager host: a state file and a config on disk, the router's listening socket (held here as systemd
    holds vastctl-route.socket's), router processes started on it, and the stand-in daemons joined as machines."""

    def __init__(self, home: Path, **route: object) -> None:
        self.home = home
        self.db_path = home / "manager.db"
        db.connect(self.db_path, create=True, now=clock.SYSTEM.now()).close()
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(4096)
        self.port = self.socket.getsockname()[1]
        raw = {"launch": {"bench_concurrency": SLOTS, "join": "none"},
               "route": {"listen": f"127.0.0.1:{self.port}", "refresh": 0.1, "fail_threshold": 3, "max_retries": 3,
                         "drain_timeout": 10, **route}}
        self.config_path = home / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(raw))
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")},
                    "HOME": str(home), "VASTCTL_DB": str(self.db_path), "VASTCTL_CONFIG": str(self.config_path)}
        self.routers: list[RouterProcess] = []
        self.daemons: list[StandIn] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_router(self, *, activated: bool = True) -> RouterProcess:
        """A router process: given the held socket as systemd gives it (`activated`), or binding route.listen
        itself (then the held socket is closed first, so the port is free for it)."""
        log = self.home / f"route-{len(self.routers) + 1}.log"
        command = [sys.executable, "-m", "vastctl", "route"]
        if activated:
            fd = self.socket.fileno()
            proc = subprocess.Popen(socket_activated(fd, command), pass_fds=(fd,), env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        else:
            self.socket.close()
            proc = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=log.open("w"))
        router = RouterProcess(proc, log)
        self.routers.append(router)
        wait_for(lambda: f"routing on {self.address}" in router.log(), "the router serves", proc=proc, log=log)
        return router

    def daemon(self, name: str, *, rate: float = 50.0, prove_seconds: float = 0.0) -> StandIn:
        """A stand-in daemon, joined as a running machine whose tunnel's end is its port; returns once the
        running router (if any) sends to it."""
        daemon = StandIn(prove_seconds)
        self.daemons.append(daemon)
        at = clock.to_iso(clock.SYSTEM.now())
        conn = db.connect(self.db_path, now=clock.SYSTEM.now())
        try:
            conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                         " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                         (f"uuid-{name}", f"vastctl-{name}", at, at, daemon.port, at, rate))
            conn.commit()
        finally:
            conn.close()
        return daemon

    def status(self) -> dict:
        rows = query(self.db_path, "SELECT * FROM route_status WHERE id = 1")
        return rows[0] if rows else {"held": None, "provers": None, "in_flight": None}

    def wait_provers(self, count: int) -> None:
        wait_for(lambda: self.status()["provers"] == count, f"the router sends to {count} prover(s)")

    def calls(self) -> list[dict]:
        return query(self.db_path, "SELECT * FROM proof_calls ORDER BY id")

    def close(self) -> None:
        for daemon in self.daemons:  # proofs held back come back, so no router's stop waits for them
            daemon.hold.set()
        for router in self.routers:
            router.stop()
        for daemon in self.daemons:
            daemon.stop()
        self.socket.close()


# --- Curio's client, in Go ---------------------------------------------------------------------------------


def build_go_client(workdir: Path) -> Path:
    """tests/go_curio_client built as Debian's packages allow (domain: grpc-go 1.33 in GOPATH mode): the Go
    code of proving.proto generated by protoc and protoc-gen-go into package cuzkpb, then `go build`.
    Skips the calling test when `go` is not installed (.ci/run installs Debian's golang-go and the rest)."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed: the grpc-go client needs Debian's golang-go, golang-google-grpc-dev,"
                    " golang-goprotobuf-dev and protobuf-compiler (.ci/run installs them)")
    gopath = workdir / "gopath"
    generated = gopath / "src" / "cuzkpb"
    program = gopath / "src" / "curioclient"
    generated.mkdir(parents=True)
    program.mkdir(parents=True)
    shutil.copy(GO_CLIENT, program / "main.go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:{DEBIAN_GOCODE}", "GOFLAGS": "", "GOPROXY": "off",
           "GOCACHE": str(workdir / "gocache"), "CGO_ENABLED": "0"}
    steps = [["protoc", f"--go_out=plugins=grpc,M{PROTO.name}=cuzkpb:{generated}", f"-I{PROTO.parent}", PROTO.name],
             ["go", "build", "-o", str(workdir / "curio-client"), "curioclient"]]
    for step in steps:
        done = subprocess.run(step, env=env, cwd=workdir, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stdout}{done.stderr}"
    return workdir / "curio-client"


class GoClient:
    """A run of the grpc-go client: its JSON lines (one a call, as each ends) read from its stdout file."""

    def __init__(self, binary: Path, home: Path, address: str, *, name: str = "curio", workers: int = 1,
                 calls: int = 1, size: int = 1024, timeout: str = "60s", until_stopped: bool = False) -> None:
        self.out = home / f"{name}.jsonl"
        self.err = home / f"{name}.err"
        self.stop_file = home / f"{name}.stop"
        args = [str(binary), "-address", address, "-workers", str(workers), "-size", str(size), "-prefix", name,
                "-timeout", timeout]
        args += ["-calls", "0", "-stop-file", str(self.stop_file)] if until_stopped else ["-calls", str(calls)]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.out.open("w"),
                                     stderr=self.err.open("w"))

    def results(self) -> list[dict]:
        """The calls that ended so far (a line being written is left for the next read)."""
        text = self.out.read_text()
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]

    def wait_for_results(self, count: int, what: str, timeout: float = 60) -> list[dict]:
        return wait_for(lambda: len(found := self.results()) >= count and found, what, timeout=timeout,
                        proc=self.proc, log=self.err)

    def finish(self, timeout: float = 120) -> list[dict]:
        """Ask a client running until stopped to stop; wait for it to exit; every call's line."""
        self.stop_file.touch()
        wait_for(lambda: self.proc.poll() is not None, "the grpc-go client ends its calls", timeout=timeout)
        assert self.proc.returncode == 0, self.err.read_text()
        return self.results()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def assert_every_call_got_its_proof(results: list[dict]) -> None:
    """What Curio saw: every call OK, COMPLETED, with its own call's proof, each request id once."""
    failed = [r for r in results if r["code"] != "OK" or r["status"] != wire.STATUS_COMPLETED]
    assert not failed, f"{len(failed)} of {len(results)} calls failed: {failed[:5]}"
    wrong = [r["id"] for r in results if r["proof_sha256"] != proof_hash(r["id"])]
    assert not wrong, f"calls answered with another call's proof: {wrong[:5]}"
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)), "a request id answered twice"


_BUILT: dict[Path, Path] = {}


def go_client_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grpc-go client, built once a test session (the session's first call builds it)."""
    base = tmp_path_factory.getbasetemp()
    if base not in _BUILT:
        _BUILT[base] = build_go_client(tmp_path_factory.mktemp("go-client"))
    return _BUILT[base]
