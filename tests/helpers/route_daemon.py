"""A real gRPC server standing in for a cuzk daemon on loopback (cuzk.v1.ProvingEngine), and the answer of a
completed proof."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

from vastctl.route import wire


class Daemon:
    """A gRPC server speaking cuzk.v1.ProvingEngine; `answer(request, context)` decides each Prove."""

    def __init__(self, answer=None, max_message=wire.DAEMON_MAX_MESSAGE):
        self.seen: list[str] = []
        self.requests: list[bytes] = []  # each Prove's bytes as they came
        self.cancelled: list[str] = []  # the calls whose caller (the router) went away while they were held
        self.answer = answer or (lambda request, context: completed(request))
        self.release = threading.Event()
        self.release.set()

        def prove(data, context):
            request = wire.ProveRequest.FromString(data)
            self.seen.append(request.submit.request_id)
            self.requests.append(data)
            deadline = time.monotonic() + 30
            while not self.release.wait(0.05) and time.monotonic() < deadline:
                if not context.is_active():
                    self.cancelled.append(request.submit.request_id)
                    return b""
            answer = self.answer(request, context)
            return answer if isinstance(answer, bytes) else answer.SerializeToString()

        def status(data, context):
            return wire.GetStatusResponse(total_proofs_completed=len(self.seen), queues=[
                wire.QueueStatus(proof_kind="porep", pending=1, in_progress=2)]).SerializeToString()

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(status)})
        self.server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[handler],
                                  options=[("grpc.max_receive_message_length", max_message)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(0)


def completed(request, status=wire.STATUS_COMPLETED, error=""):
    return wire.ProveResponse(result=wire.AwaitProofResponse(
        job_id=request.submit.request_id, status=status, proof=b"proof:" + request.submit.request_id.encode(),
        error_message=error, queue_wait_ms=5, gpu_compute_ms=40, total_ms=50))
