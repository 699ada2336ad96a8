#!/usr/bin/env python3
"""A stand-in cuzk daemon for the router's tests and bench: a grpcio server speaking cuzk.v1.ProvingEngine with
the real messages (vastctl/route/wire.py), run as its own process.

    python tests/fakes/cuzk_daemon.py --port P [--slots N] [--prove-seconds S] [--fail-every K]
        [--die-after-accepting K] [--max-message 134217728] [--log FILE] [--proof-bytes N] [--release-file F]

As the real daemon: `Prove` proves (here: sleeps) at most `--slots` proofs at once, the others wait in its
queue (pending); the answer is an AwaitProofResponse COMPLETED with the proof and the daemon's timings, or
FAILED with an error message inside gRPC OK (every K-th call with --fail-every K). It takes at most
--max-message bytes in one call (tonic's 128 MiB): a bigger one is RESOURCE_EXHAUSTED from gRPC itself.
A ProveRequest without `submit` is INVALID_ARGUMENT "missing submit field"; an unknown proof kind is
INVALID_ARGUMENT. GetStatus counts its queues, proofs completed and failed.

Held proofs: with --release-file F a proof that took a slot does not finish (after its --prove-seconds) until
F exists, so a test decides when slots come free instead of racing a timer.

Dying mid-call: with --die-after-accepting K the process ends (os._exit, no answer, no goodbye frame) as soon
as it has logged its K-th Prove; SIGUSR1 ends it the same way at any time (the test sends it while calls are
in progress).

--log FILE gets one line per event, appended and written through at once (a crash loses none):
    received <request_id> kind=<n> size=<bytes> inflight=<calls in this daemon, this one included>
    answered <request_id> status=<completed|failed|invalid>
    cancelled <request_id>   (proved, but the caller had cancelled the call: the answer reached nobody)
so a test can tell which calls a daemon saw, how many it held at once, and that none was answered twice.
The proof of a completed call is `proof_for(request_id, n)`: the client checks it got its own call's proof.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

from vastctl.route import wire

KINDS = {wire.POREP_SEAL_COMMIT: "porep", wire.SNAP_DEALS_UPDATE: "snap", wire.WINDOW_POST_PARTITION: "window_post",
         wire.WINNING_POST: "winning_post"}


def proof_for(request_id: str, size: int = 1920) -> bytes:
    """The stand-in's proof for a call: derived from its request id, so an answer to another call is caught."""
    seed = hashlib.sha256(request_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Daemon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.slots = threading.Semaphore(args.slots)
        self.lock = threading.Lock()
        self.accepted = 0  # Prove calls taken in (valid or not)
        self.inflight = 0
        self.pending: dict[str, int] = {}
        self.in_progress: dict[str, int] = {}
        self.completed = 0
        self.failed = 0
        self.started = time.monotonic()
        self.log_fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.log else None

    def _log(self, line: str) -> None:
        if self.log_fd is not None:
            os.write(self.log_fd, (line + "\n").encode())

    def prove(self, request, context):
        arrived = time.monotonic()
        submit = request.submit
        request_id = submit.request_id or "-"
        with self.lock:
            self.accepted += 1
            self.inflight += 1
            number, inflight = self.accepted, self.inflight
            self._log(f"received {request_id} kind={submit.proof_kind} size={request.ByteSize()} inflight={inflight}")
        try:
            if self.args.die_after_accepting and number >= self.args.die_after_accepting:
                os._exit(3)  # mid-call: this call and every other in progress gets no answer
            if not request.HasField("submit"):
                self._log(f"answered {request_id} status=invalid")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing submit field")
            kind = KINDS.get(submit.proof_kind)
            if kind is None:
                self._log(f"answered {request_id} status=invalid")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported proof kind: {submit.proof_kind}")
            with self.lock:
                self.pending[kind] = self.pending.get(kind, 0) + 1
            with self.slots:
                queued = time.monotonic()
                with self.lock:
                    self.pending[kind] -= 1
                    self.in_progress[kind] = self.in_progress.get(kind, 0) + 1
                try:
                    if self.args.prove_seconds:
                        time.sleep(self.args.prove_seconds)
                    while self.args.release_file and not os.path.exists(self.args.release_file):
                        time.sleep(0.02)
                finally:
                    with self.lock:
                        self.in_progress[kind] -= 1
            done = time.monotonic()
            fail = bool(self.args.fail_every) and number % self.args.fail_every == 0
            result = wire.AwaitProofResponse(
                job_id=f"job-{number}", queue_wait_ms=round((queued - arrived) * 1000), srs_load_ms=0,
                synthesis_ms=round((done - queued) * 400), gpu_compute_ms=round((done - queued) * 600),
                total_ms=round((done - arrived) * 1000))
            if fail:
                result.status = wire.STATUS_FAILED
                result.error_message = f"stand-in: proof {number} failed (--fail-every {self.args.fail_every})"
            else:
                result.status = wire.STATUS_COMPLETED
                result.proof = proof_for(submit.request_id, self.args.proof_bytes)
            with self.lock:
                if fail:
                    self.failed += 1
                else:
                    self.completed += 1
                if context.is_active():
                    self._log(f"answered {request_id} status={'failed' if fail else 'completed'}")
                else:  # the caller cancelled it (or went away): the answer reaches nobody
                    self._log(f"cancelled {request_id}")
            return wire.ProveResponse(result=result)
        finally:
            with self.lock:
                self.inflight -= 1

    def get_status(self, request, context):
        with self.lock:
            kinds = sorted(set(self.pending) | set(self.in_progress))
            answer = wire.GetStatusResponse(total_proofs_completed=self.completed, total_proofs_failed=self.failed,
                                            uptime_seconds=int(time.monotonic() - self.started))
            for kind in kinds:
                answer.queues.add(proof_kind=kind, pending=self.pending.get(kind, 0),
                                  in_progress=self.in_progress.get(kind, 0))
        answer.gpus.add(ordinal=0, name="stand-in GPU", vram_total_bytes=24 << 30, vram_free_bytes=20 << 30)
        return answer


def serve(args: argparse.Namespace) -> None:
    daemon = Daemon(args)
    handlers = {
        "Prove": grpc.unary_unary_rpc_method_handler(
            daemon.prove, request_deserializer=wire.ProveRequest.FromString,
            response_serializer=wire.ProveResponse.SerializeToString),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            daemon.get_status, request_deserializer=wire.GetStatusRequest.FromString,
            response_serializer=wire.GetStatusResponse.SerializeToString),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max(64, 4 * args.slots)),
                         handlers=[grpc.method_handlers_generic_handler(wire.SERVICE, handlers)],
                         options=[("grpc.max_receive_message_length", args.max_message),
                                  ("grpc.max_send_message_length", args.max_message),
                                  ("grpc.so_reuseport", 0)])
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    if not port:
        sys.exit(f"error: cannot listen on 127.0.0.1:{args.port}")
    signal.signal(signal.SIGUSR1, lambda *_: os._exit(3))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    server.start()
    print(f"cuzk stand-in listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    stopping.wait()
    server.stop(grace=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="127.0.0.1 port to listen on (0: pick one)")
    parser.add_argument("--slots", type=int, default=2, help="proofs at once; more calls wait in the queue")
    parser.add_argument("--prove-seconds", type=float, default=0.5, help="one proof's time")
    parser.add_argument("--fail-every", type=int, default=0, help="every K-th call's proof is FAILED (0: none)")
    parser.add_argument("--die-after-accepting", type=int, default=0, help="exit at the K-th Prove, unanswered")
    parser.add_argument("--max-message", type=int, default=wire.DAEMON_MAX_MESSAGE, help="bytes in one call")
    parser.add_argument("--proof-bytes", type=int, default=1920, help="size of a completed call's proof")
    parser.add_argument("--release-file", default="", help="a proof in a slot finishes only once this file exists")
    parser.add_argument("--log", default="", help="file to append one line per received and answered call")
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
