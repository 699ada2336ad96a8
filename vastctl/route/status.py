"""GetStatus for the fleet: each prover's answer judged alone, the ones that pass summed into one.

A prover is a hostile peer: its answer may not parse, or carry counts no daemon reaches. Such an answer is left
out (the router logs it), and every sum is clamped to its field (uint64 totals at 2^64-1, uint32 queue counts at
2^32-1), so one prover never fails GetStatus for every caller (Curio asks it before it hands cuzk a task).
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError

from vastctl.clock import Clock
from vastctl.route import wire

log = logging.getLogger("vastctl.route")

MAX_COUNT = 10**12  # proofs completed or failed: one a millisecond for thirty years
MAX_QUEUED = 1_000_000  # calls pending or in progress in one of a daemon's queues
MAX_ENTRIES = 1024  # GPUs, loaded SRS entries or queues one daemon lists
UINT64_MAX, UINT32_MAX = 2**64 - 1, 2**32 - 1
LOG_EVERY_S = 600.0  # a prover whose GetStatus answers are left out is logged at most once in this long
TOTALS = ("total_proofs_completed", "total_proofs_failed", "pinned_memory_bytes", "pinned_memory_limit_bytes")


def absurd(answer: Any) -> str | None:
    """Why a prover's parsed GetStatusResponse cannot be a daemon's, or None."""
    for name in ("total_proofs_completed", "total_proofs_failed"):
        if getattr(answer, name) > MAX_COUNT:
            return f"{name} {getattr(answer, name)}"
    for name in ("gpus", "loaded_srs", "queues"):
        if len(getattr(answer, name)) > MAX_ENTRIES:
            return f"{len(getattr(answer, name))} {name}"
    for entry in answer.queues:
        if max(entry.pending, entry.in_progress) > MAX_QUEUED:
            return f"queue {entry.proof_kind[:40]!r} pending {entry.pending}, in progress {entry.in_progress}"
    return None


def summed(answers: list[Any], *, held: int) -> Any:
    """The provers' GetStatusResponses as one: GPUs listed, SRS entries once a circuit, queues and totals summed
    (each clamped to its field), the longest uptime; plus the router's held calls as the queue `router-held`."""
    total = wire.GetStatusResponse()
    queues: dict[str, list[int]] = {}
    srs: dict[str, Any] = {}
    sums = dict.fromkeys(TOTALS, 0)
    for answer in answers:
        total.gpus.extend(answer.gpus)
        for entry in answer.loaded_srs:
            srs.setdefault(entry.circuit_id, entry)
        for entry in answer.queues:
            counts = queues.setdefault(entry.proof_kind, [0, 0])
            counts[0] += entry.pending
            counts[1] += entry.in_progress
        for name in TOTALS:
            sums[name] += getattr(answer, name)
        total.uptime_seconds = max(total.uptime_seconds, answer.uptime_seconds)
    for name, value in sums.items():
        setattr(total, name, min(value, UINT64_MAX))
    total.loaded_srs.extend(srs.values())
    for kind, (pending, in_progress) in sorted(queues.items()):
        total.queues.add(proof_kind=kind, pending=min(pending, UINT32_MAX), in_progress=min(in_progress, UINT32_MAX))
    total.queues.add(proof_kind="router-held", pending=min(held, UINT32_MAX), in_progress=0)
    return total


class Statuses:
    """The fleet's GetStatus: each joined prover asked at once (at most `timeout` each), its answer judged alone,
    the ones that pass summed. `channel(uuid, endpoint)` is the router's channel to that prover."""

    def __init__(self, channel: Callable[[str, str], grpc.Channel], *, clock: Clock, timeout: float) -> None:
        self._channel, self._clock, self._timeout = channel, clock, timeout
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}  # prover uuid → when an answer of it left out was last logged

    def answer(self, snapshot: dict[str, Any]) -> bytes:
        """The serialized GetStatusResponse for the dispatcher's `snapshot` (its provers and held calls)."""
        live = [p for p in snapshot["provers"] if not p["gone"]]
        answers = []
        if live:
            with futures.ThreadPoolExecutor(max_workers=min(16, len(live)), thread_name_prefix="route-status") as pool:
                answers = [answer for answer in pool.map(self.of, live) if answer is not None]
        data: bytes = summed(answers, held=snapshot["held"]).SerializeToString()  # protobuf's types are Any
        return data

    def of(self, prover: dict[str, Any]) -> Any | None:
        """One prover's GetStatusResponse (a snapshot's prover), or None: not reached, or left out (`_leave_out`)."""
        try:
            data = self._channel(prover["uuid"], prover["endpoint"]).unary_unary(wire.GET_STATUS)(
                b"", timeout=self._timeout)
        except (grpc.RpcError, ValueError):  # ValueError: its channel closed, the prover left meanwhile
            return None
        try:
            answer = wire.GetStatusResponse.FromString(data)
        except DecodeError:
            self._leave_out(prover, f"{len(data)} bytes that are not a GetStatusResponse")
            return None
        why = absurd(answer)
        if why is not None:
            self._leave_out(prover, f"absurd counts ({why})")
            return None
        return answer

    def _leave_out(self, prover: dict[str, Any], why: str) -> None:
        """One line for an answer left out of the sum, at most one a prover every LOG_EVERY_S (Curio asks every
        few seconds)."""
        now = self._clock.monotonic()
        with self._lock:
            last = self._logged.get(prover["uuid"])
            if last is not None and now - last < LOG_EVERY_S:
                return
            self._logged[prover["uuid"]] = now
        log.warning("GetStatus of prover %s left out of the sum: it answered %s", prover["label"], why)
