"""What the router takes from a prover's answers, a prover being a hostile peer: each GetStatus answer parsed
alone (one that does not parse or carries absurd counts is left out and logged once) and the sums clamped, so
one prover never fails GetStatus for every caller; and a Prove answer capped at wire.MAX_ANSWER on the path of
calls read whole, so a 200 MiB answer is an error for that prover and never costs the router its size."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from concurrent import futures

import grpc
import pytest
from helpers.curio_client import prove_request
from helpers.serving import query, wait_for

from vastctl import clock
from vastctl import config as config_module
from vastctl.route import server as route_server
from vastctl.route import status, wire
from vastctl.state import db

MiB = 1024 * 1024
UINT64_MAX, UINT32_MAX = 2**64 - 1, 2**32 - 1
GARBAGE = b"\x0a\x64not a GetStatusResponse"  # field 1 claims 100 bytes; 23 follow


def good_status(completed: int = 7, **fields):
    """A daemon's GetStatusResponse: one GPU, a porep queue (pending 1, in progress 2), `completed` proofs."""
    answer = wire.GetStatusResponse(total_proofs_completed=completed, total_proofs_failed=1, uptime_seconds=100,
                                    queues=[wire.QueueStatus(proof_kind="porep", pending=1, in_progress=2)], **fields)
    answer.gpus.add(ordinal=0, name="RTX 4090")
    return answer


class StatusDaemon:
    """A gRPC server whose GetStatus answers `answer`'s bytes as they are (a message or any bytes at all)."""

    def __init__(self, answer: bytes) -> None:
        self.asked = 0

        def get_status(data, context):
            self.asked += 1
            return answer

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "GetStatus": grpc.unary_unary_rpc_method_handler(get_status)})
        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def routed(tmp_path):
    """make(ports) → a router on a state file with a running, joined machine `vastctl-<name>` per (name, port),
    its grpcio server started, every Prove read whole (route.cut_through_mb 129); `.channel` to it."""
    made = []

    def make(ports: dict[str, int], **route):
        path = tmp_path / "state.db"
        conn = db.connect(path, now=clock.SYSTEM.now(), create=True)
        at = clock.to_iso(clock.SYSTEM.now())
        for name, port in ports.items():
            conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                         " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, 60)",
                         (f"u-{name}", f"vastctl-{name}", at, at, port, at))
        conn.commit()
        conn.close()
        config = config_module.from_mapping({"db": str(path), "route": {"refresh": "0.1s", "cut_through_mb": 129,
                                                                         **route}})
        router = route_server.Router(config, probe=lambda port, timeout: False)
        router.start_writer(path)
        server, port = route_server.make_server(router, "127.0.0.1:0")
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 300 * MiB)])
        made.append((router, server, channel))
        wait_for(lambda: len(router.dispatcher.snapshot()["provers"]) == len(ports), "every machine joined")
        router.path, router.channel = path, channel
        return router

    yield make
    for router, server, channel in made:
        channel.close()
        server.stop(0)
        router.stop_writer()


# --- GetStatus ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_get_status_answers_with_the_good_provers_figures_beside_garbage_and_a_2_64_completed_count(routed, caplog):
    caplog.set_level(logging.WARNING, logger="vastctl.route")
    daemons = {"garbage": StatusDaemon(GARBAGE),
               "huge": StatusDaemon(good_status(completed=UINT64_MAX).SerializeToString()),
               "good": StatusDaemon(good_status(completed=7).SerializeToString())}
    try:
        router = routed({name: daemon.port for name, daemon in daemons.items()})
        for _ in range(3):  # every caller, not just the first
            answer = wire.GetStatusResponse.FromString(router.channel.unary_unary(wire.GET_STATUS)(b"", timeout=5))
            assert (answer.total_proofs_completed, answer.total_proofs_failed, answer.uptime_seconds) == (7, 1, 100)
            assert [gpu.name for gpu in answer.gpus] == ["RTX 4090"]
            assert [(q.proof_kind, q.pending, q.in_progress) for q in answer.queues] == [
                ("porep", 1, 2), ("router-held", 0, 0)]
        assert all(daemon.asked == 3 for daemon in daemons.values())
        skipped = sorted(rec.getMessage() for rec in caplog.records if "left out of the sum" in rec.getMessage())
        assert skipped == [  # one line each, not one a call
            f"GetStatus of prover vastctl-garbage left out of the sum: it answered {len(GARBAGE)} bytes that are not a"
            " GetStatusResponse",
            "GetStatus of prover vastctl-huge left out of the sum: it answered absurd counts"
            f" (total_proofs_completed {UINT64_MAX})"]
    finally:
        for daemon in daemons.values():
            daemon.stop()


@pytest.mark.slow
def test_get_status_sums_are_clamped_to_their_fields(routed):
    near = 2**63  # a memory figure two provers may each claim: their sum is past a uint64
    daemons = [StatusDaemon(good_status(pinned_memory_limit_bytes=near, pinned_memory_bytes=near).SerializeToString())
               for _ in range(2)]
    try:
        router = routed({f"p{n}": daemon.port for n, daemon in enumerate(daemons)})
        answer = wire.GetStatusResponse.FromString(router.channel.unary_unary(wire.GET_STATUS)(b"", timeout=5))
        assert (answer.pinned_memory_limit_bytes, answer.pinned_memory_bytes) == (UINT64_MAX, UINT64_MAX)
        assert (answer.total_proofs_completed, len(answer.gpus)) == (14, 2)
    finally:
        for daemon in daemons:
            daemon.stop()


def test_the_sum_clamps_every_count_and_total():
    big = wire.GetStatusResponse(total_proofs_completed=UINT64_MAX, total_proofs_failed=UINT64_MAX,
                                 pinned_memory_bytes=UINT64_MAX, pinned_memory_limit_bytes=UINT64_MAX,
                                 uptime_seconds=UINT64_MAX,
                                 queues=[wire.QueueStatus(proof_kind="porep", pending=UINT32_MAX,
                                                          in_progress=UINT32_MAX)])
    summed = status.summed([big, big, big], held=2**40)
    assert (summed.total_proofs_completed, summed.total_proofs_failed, summed.pinned_memory_bytes,
            summed.pinned_memory_limit_bytes, summed.uptime_seconds) == (UINT64_MAX,) * 5
    assert [(q.proof_kind, q.pending, q.in_progress) for q in summed.queues] == [
        ("porep", UINT32_MAX, UINT32_MAX), ("router-held", UINT32_MAX, 0)]
    assert wire.GetStatusResponse.FromString(summed.SerializeToString()) == summed


@pytest.mark.parametrize("answer,why", [
    (good_status(completed=status.MAX_COUNT + 1), f"total_proofs_completed {status.MAX_COUNT + 1}"),
    (wire.GetStatusResponse(total_proofs_failed=UINT64_MAX), f"total_proofs_failed {UINT64_MAX}"),
    (wire.GetStatusResponse(queues=[wire.QueueStatus(proof_kind="porep", pending=UINT32_MAX)]),
     f"queue 'porep' pending {UINT32_MAX}, in progress 0"),
    (wire.GetStatusResponse(queues=[wire.QueueStatus(proof_kind="x")] * (status.MAX_ENTRIES + 1)), "1025 queues"),
    (good_status(completed=status.MAX_COUNT, pinned_memory_limit_bytes=UINT64_MAX), None),  # large, not absurd
])
def test_absurd_counts_are_named(answer, why):
    assert status.absurd(answer) == why


# --- a Prove answer over wire.MAX_ANSWER ----------------------------------------------------------------------------


HUGE_PROVER = textwrap.dedent("""
    import sys
    from concurrent import futures

    import grpc

    from vastctl.route import wire

    answer = wire.ProveResponse(result=wire.AwaitProofResponse(status=wire.STATUS_COMPLETED,
                                                               proof=b"p" * (200 << 20))).SerializeToString()
    handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
        "Prove": grpc.unary_unary_rpc_method_handler(lambda data, context: answer)})
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler],
                         options=[("grpc.max_receive_message_length", 256 << 20),
                                  ("grpc.max_send_message_length", 256 << 20)])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    sys.stdin.read()  # until the test closes it
""")


def rss() -> int:
    """This process's resident memory, bytes (the router runs in it)."""
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:"))


@pytest.mark.slow
def test_a_provers_200_mib_answer_to_a_2_mib_call_is_a_failure_of_that_prover_and_costs_the_router_no_memory(
        routed):
    """A proof is KBs: an answer over wire.MAX_ANSWER is cut off as it comes (the router gave the prover no
    window for more), never passed on, and counted as that prover's drop (sent to another where there is one)."""
    huge = subprocess.Popen([sys.executable, "-c", HUGE_PROVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(huge.stdout.readline())
        router = routed({"huge": port}, max_retries=0, fail_threshold=100)  # one try each, never ejected
        prove = router.channel.unary_unary(wire.PROVE)
        with pytest.raises(grpc.RpcError):  # the path warmed up: grpc's threads and buffers are there already
            prove(prove_request("warm-up", payload_bytes=2 * MiB), timeout=30)
        wait_for(lambda: len(query(router.path, "SELECT 1 FROM proof_calls")) == 1, "the warm-up call recorded")
        before = rss()
        with pytest.raises(grpc.RpcError) as raised:
            prove(prove_request("huge-answer", payload_bytes=2 * MiB), timeout=30)
        grown = rss() - before
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value
        assert grown < 64 * MiB, f"RSS grew {grown // MiB} MiB on a 200 MiB answer"
        rows = wait_for(lambda: query(router.path, "SELECT label, result, detail FROM proof_calls"
                                      " WHERE request_id = 'huge-answer'"), "the call recorded")
        assert [(row["label"], row["result"]) for row in rows] == [("vastctl-huge", "dropped")], rows
        assert f"an answer over {wire.MAX_ANSWER} bytes" in rows[0]["detail"], rows
    finally:
        huge.stdin.close()
        huge.wait(timeout=30)
