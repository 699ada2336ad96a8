"""The playground's stand-in cuzk daemons: one process serving every simulated machine's tunnel port.

    python -m vastctl.providers.sim_daemon <state file>.sim-daemons

sim_join.py writes the file and starts this process. Each machine the file says is up gets a gRPC server on
127.0.0.1:its port (never any other address), speaking cuzk.v1.ProvingEngine's Prove and GetStatus with cuzk's
messages (docs/joining-curio.md): a Prove waits for one of the machine's slots (pending), proves for its proof
time (in progress: slots × 3600 / its true rate, in wall seconds), and answers COMPLETED with a proof in gRPC
OK; a call without `submit` or of an unknown kind is INVALID_ARGUMENT, as cuzk's. GetStatus counts its queues,
its proofs and its uptime, and each machine's completed count is kept in `<file>.proofs` (sim_join.proofs_path),
rewritten at each proof it completes: its heartbeats count it, as a real machine's count its daemon's proofs.
A machine no longer up has its server stopped at once, its calls in progress cut off as a dead machine's are.
The file is read every POLL_S; the process exits once it names no machine up (or is gone, or the state file
is), and holds `<file>.lock` while it lives, so that a second one started meanwhile exits at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from vastctl import atomicfile
from vastctl.clock import SYSTEM
from vastctl.providers.sim_join import SUFFIX, Daemon, proofs_path, read

POLL_S = 0.2
RETRY_S = 5.0  # a port something else holds is tried again this often
PROOF_BYTES = 1920 * 10  # a 32 GiB PoRep C2 proof: 10 partitions of 1920 bytes
MAX_MESSAGE = 128 * 1024 * 1024  # cuzk's tonic server takes at most this much in one call
SERVICE = "cuzk.v1.ProvingEngine"
KINDS = {1: "porep", 2: "snap", 3: "window_post", 4: "winning_post"}  # ProofKind → the name its queues go by
COMPLETED = 1  # AwaitProofResponse.Status

# cuzk's proving.proto, the fields these two calls use, with cuzk's numbers (enums as their varint type)
_FIELDS: dict[str, list[tuple[str, int, str, bool]]] = {
    "SubmitProofRequest": [("request_id", 1, "string", False), ("proof_kind", 2, "int32", False)],
    "ProveRequest": [("submit", 1, "SubmitProofRequest", False)],
    "AwaitProofResponse": [
        ("job_id", 1, "string", False), ("status", 2, "int32", False), ("proof", 3, "bytes", False),
        ("error_message", 4, "string", False), ("queue_wait_ms", 10, "uint64", False),
        ("srs_load_ms", 11, "uint64", False), ("synthesis_ms", 12, "uint64", False),
        ("gpu_compute_ms", 13, "uint64", False), ("total_ms", 14, "uint64", False)],
    "ProveResponse": [("result", 1, "AwaitProofResponse", False)],
    "GetStatusRequest": [],
    "GPUStatus": [("ordinal", 1, "uint32", False), ("name", 2, "string", False), ("vram_total_bytes", 3, "uint64", False),
                  ("vram_free_bytes", 4, "uint64", False)],
    "QueueStatus": [("proof_kind", 1, "string", False), ("pending", 2, "uint32", False), ("in_progress", 3, "uint32", False)],
    "GetStatusResponse": [
        ("gpus", 1, "GPUStatus", True), ("queues", 3, "QueueStatus", True), ("total_proofs_completed", 4, "uint64", False),
        ("total_proofs_failed", 5, "uint64", False), ("uptime_seconds", 6, "uint64", False)],
}
_T = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _T.TYPE_STRING, "bytes": _T.TYPE_BYTES, "uint64": _T.TYPE_UINT64, "uint32": _T.TYPE_UINT32,
            "int32": _T.TYPE_INT32}


def _messages() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="vastctl/providers/sim_daemon.proto", package="cuzk.v1",
                                               syntax="proto3")
    for name, fields in _FIELDS.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number,
                                      label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL)
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            else:
                field.type, field.type_name = _T.TYPE_MESSAGE, f".cuzk.v1.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"cuzk.v1.{name}")) for name in _FIELDS}


M = _messages()


def proof_for(request_id: str) -> bytes:
    """The stand-in's proof of a call: bytes derived from its request id (no proof system runs here)."""
    seed = hashlib.sha256(request_id.encode()).digest()
    return (seed * (PROOF_BYTES // len(seed) + 1))[:PROOF_BYTES]


class Tally:
    """Each served machine's completed count, written to `<file>.proofs` whenever one changes (by this process
    alone, atomically): what sim_join reads for the machine's heartbeat."""

    def __init__(self, path: Path):
        self.path = proofs_path(path)
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def set(self, vast_id: str, completed: int) -> None:
        with self.lock:
            self.counts[vast_id] = completed
            self._write()

    def drop(self, vast_id: str) -> None:
        with self.lock:
            if self.counts.pop(vast_id, None) is not None:
                self._write()

    def remove(self) -> None:
        with self.lock:
            self.counts = {}
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass

    def _write(self) -> None:
        """Never raises: a count not written fails no proof (its heartbeat counts the last one written)."""
        try:
            atomicfile.write(self.path, json.dumps(self.counts, sort_keys=True) + "\n", mode=0o600)
        except OSError:
            pass


class Machine:
    """One machine's daemon: its slots, queues and counters, served on 127.0.0.1:its port."""

    def __init__(self, daemon: Daemon, vast_id: str = "", tally: Tally | None = None):
        self.daemon = daemon
        self.vast_id, self.tally = vast_id, tally
        self.slots = threading.Semaphore(daemon["slots"])
        self.lock = threading.Lock()
        self.gone = threading.Event()  # the machine stopped proving: calls in progress end unanswered
        self.pending: dict[str, int] = {}
        self.in_progress: dict[str, int] = {}
        self.completed = self.calls = 0
        self.started = SYSTEM.monotonic()
        handlers = {
            "Prove": grpc.unary_unary_rpc_method_handler(self.prove, request_deserializer=M["ProveRequest"].FromString,
                                                         response_serializer=M["ProveResponse"].SerializeToString),
            "GetStatus": grpc.unary_unary_rpc_method_handler(
                self.status, request_deserializer=M["GetStatusRequest"].FromString,
                response_serializer=M["GetStatusResponse"].SerializeToString),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max(16, 4 * daemon["slots"])),
                                  handlers=[grpc.method_handlers_generic_handler(SERVICE, handlers)],
                                  options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                           ("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.so_reuseport", 0)])
        self.bound = self.server.add_insecure_port(f"127.0.0.1:{daemon['port']}") != 0
        if self.bound:
            self.server.start()

    def stop(self) -> None:
        self.gone.set()
        if self.bound:
            self.server.stop(grace=None)

    def _count(self, queue: dict[str, int], kind: str, by: int) -> None:
        with self.lock:
            queue[kind] = queue.get(kind, 0) + by

    def prove(self, request: Any, context: grpc.ServicerContext) -> Any:
        arrived = SYSTEM.monotonic()
        if not request.HasField("submit"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing submit field")
        kind = KINDS.get(request.submit.proof_kind, "")
        if not kind:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported proof kind: {request.submit.proof_kind}")
        with self.lock:
            self.calls += 1
            job = f"sim-{self.daemon['label']}-{self.calls}"
        self._count(self.pending, kind, 1)
        with self.slots:  # cuzk proves on for a caller gone: the slot stays busy for the proof's time
            self._count(self.pending, kind, -1)
            self._count(self.in_progress, kind, 1)
            began = SYSTEM.monotonic()
            try:
                if self.gone.wait(self.daemon["proof_s"]):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the machine stopped")
            finally:
                self._count(self.in_progress, kind, -1)
        done = SYSTEM.monotonic()
        with self.lock:
            self.completed += 1
            completed = self.completed
        if self.tally is not None and not self.gone.is_set():  # counted before it answers (the heartbeat after has it)
            self.tally.set(self.vast_id, completed)
        proving_ms = round((done - began) * 1000)
        return M["ProveResponse"](result=M["AwaitProofResponse"](
            job_id=job, status=COMPLETED, proof=proof_for(request.submit.request_id),
            queue_wait_ms=round((began - arrived) * 1000), srs_load_ms=0, synthesis_ms=round(proving_ms * 0.4),
            gpu_compute_ms=proving_ms - round(proving_ms * 0.4), total_ms=round((done - arrived) * 1000)))

    def status(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            answer = M["GetStatusResponse"](total_proofs_completed=self.completed, total_proofs_failed=0,
                                            uptime_seconds=int(SYSTEM.monotonic() - self.started))
            for kind in sorted(set(self.pending) | set(self.in_progress)):
                answer.queues.add(proof_kind=kind, pending=self.pending.get(kind, 0),
                                  in_progress=self.in_progress.get(kind, 0))
        answer.gpus.add(ordinal=0, name=self.daemon["gpu_name"], vram_total_bytes=32 << 30, vram_free_bytes=8 << 30)
        return answer


def serve(path: Path) -> int:
    """Serve the up machines of the file at `path` until none is; 0, or 3 when another process serves it."""
    lock = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 3
    served: dict[str, Machine] = {}  # vast id → its machine's daemon
    tally = Tally(path)
    retry: dict[str, float] = {}  # vast id → when a port found taken is tried again
    state_file = Path(str(path).removesuffix(SUFFIX))
    try:
        while True:
            wanted = {vast_id: d for vast_id, d in read(path)["machines"].items() if d.get("up")}
            if not state_file.exists():  # the state file itself was removed: its market, machines and all
                wanted = {}
            for vast_id in list(served):
                if vast_id not in wanted or wanted[vast_id]["port"] != served[vast_id].daemon["port"]:
                    served.pop(vast_id).stop()
                    tally.drop(vast_id)  # its daemon is gone: the next one counts from nothing
            if not wanted:
                return 0
            for vast_id, daemon in wanted.items():
                if vast_id in served and not served[vast_id].bound and SYSTEM.monotonic() >= retry.get(vast_id, 0.0):
                    served.pop(vast_id).stop()  # its port was taken: tried again every RETRY_S
                if vast_id not in served:
                    served[vast_id] = Machine(daemon, vast_id, tally)
                    tally.set(vast_id, 0)
                    retry[vast_id] = SYSTEM.monotonic() + RETRY_S
                    said = "cuzk stand-in on" if served[vast_id].bound else "cannot listen on"
                    print(f"{daemon['label']}: {said} 127.0.0.1:{daemon['port']}", flush=True)
            SYSTEM.sleep(POLL_S)
    finally:
        for machine in served.values():
            machine.stop()
        tally.remove()  # before the lock goes: a process started next writes its own
        os.close(lock)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m vastctl.providers.sim_daemon STATE_FILE.sim-daemons", file=sys.stderr)
        return 2
    return serve(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
