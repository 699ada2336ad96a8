"""A client that behaves as Curio's cuzk client and its task scheduler do with a Prove call (docs/joining-curio.md):

- one channel to `[Cuzk] Address`, plaintext, no keepalive pings, 256 MiB each way;
- a deadline on each Prove (`[Cuzk] ProveTimeout`, 30 min in Curio);
- `[Cuzk] MaxPending`: one counter over every task kind, held while a call is out (a semaphore here);
- a failed call is a failed task: any error status, and a proof answered FAILED inside gRPC OK. The task is
  tried again after its kind's wait, and deleted once it failed MaxFailures times:
      porep   10 failures, the r-th failure waits min(2^r s, 2 min) before the next try (~8 min in all)
      snap    3 failures, no wait
      psprove 20 failures, 10 s × r
  The waits are multiplied by `scale` (tests run the schedule at e.g. 1/100 of its real length; the deadline
  is given separately, in seconds).

Each task's record says what Curio would have seen: attempts, failures (status and message), outcome
(completed / deleted), the proof bytes it got and the request id it sent.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from vastctl.route import wire


@dataclass(frozen=True)
class Schedule:
    max_failures: int
    waits: str  # "porep", "none", "linear10"

    def wait(self, failures: int) -> float:
        """Seconds before the next try after the `failures`-th failure (unscaled)."""
        if self.waits == "porep":
            return float(min(2 ** failures, 120))
        if self.waits == "linear10":
            return 10.0 * failures
        return 0.0

    def total(self) -> float:
        """Seconds from the first failure to the task's deletion (unscaled)."""
        return sum(self.wait(r) for r in range(1, self.max_failures))


SCHEDULES = {"porep": Schedule(10, "porep"), "snap": Schedule(3, "none"), "psprove": Schedule(20, "linear10")}
KIND_OF_TASK = {"porep": wire.POREP_SEAL_COMMIT, "snap": wire.SNAP_DEALS_UPDATE,
                "window_post": wire.WINDOW_POST_PARTITION, "winning_post": wire.WINNING_POST}


@dataclass
class Task:
    request_id: str
    kind: str = "porep"
    payload_bytes: int = 1024
    attempts: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (status code name, message) per failure
    outcome: str | None = None  # completed / deleted (or stopped: the client closed while it waited)
    proof: bytes = b""
    statuses: list[int] = field(default_factory=list)  # AwaitProofResponse.status of each answered call
    done: threading.Event = field(default_factory=threading.Event)


def prove_request(request_id: str, kind: int = wire.POREP_SEAL_COMMIT, payload_bytes: int = 1024,
                  sector_number: int = 1) -> bytes:
    """A serialized ProveRequest as Curio builds one (the vanilla proof is `payload_bytes` of filler)."""
    submit = wire.SubmitProofRequest(request_id=request_id, proof_kind=kind, sector_size=32 << 30,
                                     registered_proof=8, priority=2, sector_number=sector_number, miner_id=1000,
                                     vanilla_proof=b"\x07" * payload_bytes)
    return wire.ProveRequest(submit=submit).SerializeToString()


class CurioClient:
    def __init__(self, address: str, *, max_pending: int = 8, prove_timeout: float = 1800.0,
                 scale: float = 1.0) -> None:
        self.address = address if ":///" in address or address.startswith("unix:") else f"dns:///{address}"
        self.prove_timeout = prove_timeout
        self.scale = scale
        self.pending = threading.BoundedSemaphore(max_pending)
        self.channel = grpc.insecure_channel(self.address, options=[
            ("grpc.max_send_message_length", wire.CURIO_MAX_MESSAGE),
            ("grpc.max_receive_message_length", wire.CURIO_MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 2 ** 31 - 1),  # no keepalive pings, as Curio dials it
            ("grpc.enable_retries", 0)])
        self._prove = self.channel.unary_unary(wire.PROVE)
        self._pool = futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="curio-task")
        self.tasks: list[Task] = []
        self._lock = threading.Lock()
        self.max_out = 0  # the most calls out at once (never above max_pending)
        self._out = 0
        self._closing = threading.Event()

    def call(self, request: bytes, *, timeout: float | None = None) -> tuple[grpc.StatusCode, str, object | None]:
        """One Prove under MaxPending: (status code, message, AwaitProofResponse or None)."""
        with self.pending:
            with self._lock:
                self._out += 1
                self.max_out = max(self.max_out, self._out)
            try:
                answer = self._prove(request, timeout=self.prove_timeout if timeout is None else timeout)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or "", None
            finally:
                with self._lock:
                    self._out -= 1
        return grpc.StatusCode.OK, "", wire.ProveResponse.FromString(answer).result

    def submit(self, request_id: str, kind: str = "porep", payload_bytes: int = 1024) -> Task:
        """Start a task on its own thread (as harmonytask runs one); its record fills in as it goes."""
        task = Task(request_id=request_id, kind=kind, payload_bytes=payload_bytes)
        with self._lock:
            self.tasks.append(task)
        self._pool.submit(self._run, task)
        return task

    def _run(self, task: Task) -> None:
        schedule = SCHEDULES.get(task.kind, SCHEDULES["porep"])
        request = prove_request(task.request_id, KIND_OF_TASK.get(task.kind, wire.POREP_SEAL_COMMIT),
                                task.payload_bytes)
        try:
            while True:
                task.attempts += 1
                code, message, result = self.call(request)
                if result is not None:
                    task.statuses.append(result.status)
                    if result.status == wire.STATUS_COMPLETED:
                        task.proof = result.proof
                        task.outcome = "completed"
                        return
                    task.failures.append(("OK", f"proof status {result.status}: {result.error_message}"))
                else:
                    task.failures.append((code.name, message))
                if len(task.failures) >= schedule.max_failures:
                    task.outcome = "deleted"  # harmonytask deletes it: the sector is stuck
                    return
                self._closing.wait(schedule.wait(len(task.failures)) * self.scale)  # Curio's own wait, scaled
                if self._closing.is_set():
                    task.outcome = task.outcome or "stopped"
                    return
        finally:
            task.done.set()

    def close(self) -> None:
        self._closing.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.channel.close()
