"""A fuzzer on the router's frame reader, over a real socket to `vastctl route` in its own process, and on the
pure functions that read a prover's answer, in this process.

Over the socket, hypothesis makes three kinds of bytes, each batch sent on connections of its own: raw bytes
after the preface, frames with random headers and payloads, and valid frames mutated (bytes overwritten,
inserted, cut). After each batch: the router process is alive, a good GetStatus on a fresh connection comes
back OK, and no traceback reached its log (no exception escaped); after each property its RSS is within
32 MiB of what it was before the first (memory stays bounded).

In this process: what parses a prover's answer (the one gRPC message of a unary answer, a Prove answer's
status and timings, a GetStatus answer judged and summed) and what reads a caller's Prove header, given any
bytes, returns or raises only its own documented error. Each part is skipped where the function does not exist.
"""

from __future__ import annotations

import importlib
import socket
import struct
import time

import hpack
import pytest
from helpers.raw_h2 import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    MiB,
    Peer,
    RouterProcess,
    frame,
    good_status,
    grpc_message,
    request_fields,
    varint,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # a router process on loopback

FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])  # `served`: checked once a test
PURE = settings(max_examples=300, deadline=None, derandomize=True, database=None)
MEMORY_SLACK = 32 * MiB


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    router = RouterProcess(tmp_path_factory.mktemp("fuzz-router"), cut_through_mb=1, max_held_mb=64)
    good_status(router.port)
    router.baseline = router.rss()
    yield router
    router.stop()


@pytest.fixture
def served(router):
    """`served(batch)`: each byte string of the batch on its own connection, then the invariants."""

    def run(batch: list[bytes]) -> None:
        since = len(router.log())
        for data in batch:
            _send_and_close(router.port, data)
        assert router.alive(), f"the router exited:\n{router.log()[-3000:]}"
        good_status(router.port, timeout=10)
        assert not router.tracebacks(since), f"an exception escaped:\n{router.tracebacks(since)[0]}"
        assert router.rss() - router.baseline <= MEMORY_SLACK, (
            f"RSS {router.baseline / MiB:.0f} -> {router.rss() / MiB:.0f} MiB since the fuzzing began")

    return run


def _send_and_close(port: int, data: bytes) -> None:
    """Send `data`, end our side, and read whatever comes until the router closes (at most 2 s): the router has
    then read all of it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return  # the router closed already
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not sock.recv(1 << 16):
                    return
            except socket.timeout:
                return
            except OSError:
                return


# --- the bytes ---------------------------------------------------------------------------------------------------

def valid_frames() -> list[bytes]:
    block = hpack.Encoder().encode(request_fields())  # a fresh encoder: no index into a table the router lacks
    return [
        frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)),
        frame(HEADERS, END_HEADERS, 1, block),
        frame(DATA, END_STREAM, 1, grpc_message(b"")),
        frame(HEADERS, 0, 3, block[:10]), frame(CONTINUATION, END_HEADERS, 3, block[10:]),
        frame(DATA, 0, 3, grpc_message(b"")[:3]), frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 1000)),
        frame(PRIORITY, 0, 3, struct.pack(">IB", 0, 7)), frame(RST_STREAM, 0, 3, struct.pack(">I", 8)),
        frame(PING, 0, 0, b"12345678"), frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)),
        frame(HEADERS, END_HEADERS | END_STREAM, 5, block),
    ]


VALID = b"".join(valid_frames())
edits = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, len(VALID)),
                           st.binary(min_size=1, max_size=8)), min_size=1, max_size=6)


def edited(edit_list) -> bytes:
    data = bytearray(VALID)
    for how, at, value in edit_list:
        at %= len(data) + 1
        if how == "set":
            data[at:at + len(value)] = value
        elif how == "insert":
            data[at:at] = value
        else:
            del data[at:at + len(value)]
    return bytes(data)


random_frame = st.builds(
    lambda length, kind, flags, stream, payload, lie: (
        struct.pack(">I", (length if lie else len(payload)) & 0xFFFFFF)[1:] + bytes((kind, flags))
        + struct.pack(">I", stream) + payload),
    st.integers(0, 1 << 24), st.integers(0, 255), st.integers(0, 255),
    st.one_of(st.integers(0, 9), st.integers(0, (1 << 32) - 1)), st.binary(max_size=300), st.booleans())
preamble = st.sampled_from([b"", frame(SETTINGS, 0, 0), frame(SETTINGS, 0, 0) + frame(SETTINGS, 1, 0)])


@FUZZ
@given(batch=st.lists(st.binary(min_size=1, max_size=4096), min_size=1, max_size=3))
def test_raw_bytes_after_the_preface_neither_crash_nor_stop_the_router(served, batch):
    served([PREFACE + data for data in batch])


@FUZZ
@given(batch=st.lists(st.tuples(preamble, st.lists(random_frame, min_size=1, max_size=8)), min_size=1, max_size=3))
def test_frames_with_random_headers_neither_crash_nor_stop_the_router(served, batch):
    served([PREFACE + start + b"".join(frames) for start, frames in batch])


@FUZZ
@given(batch=st.lists(edits, min_size=1, max_size=3))
def test_mutated_valid_frames_neither_crash_nor_stop_the_router(served, batch):
    served([PREFACE + edited(edit_list) for edit_list in batch])


def test_the_valid_frames_the_mutations_start_from_are_served(router):
    """The fuzzer's starting point is itself a good connection: its GetStatus on stream 1 is answered OK."""
    caller = Peer(router.port, handshake=False)
    try:
        caller.send(PREFACE + VALID)
        deadline = time.monotonic() + 10
        while 1 not in caller.ended:
            assert caller.next_frame(deadline) is not None, "no answer on stream 1"
        assert dict(caller.ended[1]).get(b"grpc-status") == b"0", caller.ended[1]
    finally:
        caller.close()


# --- in this process: what reads a prover's answer, and a caller's Prove header ------------------------------------


def _function(module: str, name: str):
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        found = None
    if found is None:
        pytest.skip(f"{module}.{name} does not exist here")
    return found


messages = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda flag, length, body: bytes((flag,)) + struct.pack(">I", length) + body,
              st.sampled_from([0, 0, 1, 2]), st.one_of(st.integers(0, 80), st.integers(0, (1 << 32) - 1)),
              st.binary(max_size=80)),
    st.builds(lambda body, extra: grpc_message(body) + extra, st.binary(max_size=80), st.binary(max_size=12)),
)


@PURE
@given(body=messages)
def test_one_message_of_an_answer_is_the_message_or_a_value_error(body):
    one_message = _function("vastctl.route.h2", "one_message")
    try:
        message = one_message(body)
    except ValueError:
        assert not (len(body) >= 5 and body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5), body
        return
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5 and bytes(message) == body[5:]


def _key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


# protobuf-shaped bytes: fields of the answer messages with extreme values, nested, cut or unknown
scalar = st.builds(lambda n, v: _key(n, 0) + varint(v), st.integers(1, 20),
                   st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]))
nested = st.builds(lambda n, body: _key(n, 2) + varint(len(body)) + body, st.integers(1, 4),
                   st.lists(scalar, max_size=4).map(b"".join))
proto_bytes = st.one_of(st.lists(st.one_of(scalar, nested), max_size=8).map(b"".join), st.binary(max_size=64))


@PURE
@given(answer=proto_bytes)
def test_a_prove_answers_status_and_timings_are_read_from_any_bytes(answer):
    timings = _function("vastctl.route.server", "_timings")
    read = timings(answer)
    assert isinstance(read, dict) and "status" in read


@PURE
@given(answers=st.lists(proto_bytes, max_size=4), held=st.integers(0, 2**40))
def test_getstatus_answers_of_any_bytes_are_judged_and_summed_without_an_error(answers, held):
    """A prover's GetStatus answer that does not parse is left out; one that parses is judged (`absurd`); the
    rest are summed with every total and count clamped to its field, and the sum serializes."""
    absurd = _function("vastctl.route.status", "absurd")
    summed = _function("vastctl.route.status", "summed")
    from google.protobuf.message import DecodeError

    from vastctl.route import wire
    parsed = []
    for data in answers:
        try:
            parsed.append(wire.GetStatusResponse.FromString(data))
        except DecodeError:
            continue
    kept = [answer for answer in parsed if absurd(answer) is None]
    total = summed(kept, held=held)
    again = wire.GetStatusResponse.FromString(total.SerializeToString())
    assert again.total_proofs_completed <= 2**64 - 1 and all(q.pending <= 2**32 - 1 for q in again.queues)


@PURE
@given(summed_twice=st.sampled_from([2**64 - 1, 2**63, 2**32]))
def test_two_provers_at_the_largest_counts_sum_without_an_error(summed_twice):
    """The break: a completed count of 2^64-1 failed GetStatus for every caller."""
    summed = _function("vastctl.route.status", "summed")
    from vastctl.route import wire
    answer = wire.GetStatusResponse(total_proofs_completed=summed_twice,
                                    queues=[wire.QueueStatus(proof_kind="porep", pending=2**32 - 1)])
    total = summed([answer, answer], held=2**32 + 5)
    total.SerializeToString()
    assert total.total_proofs_completed == min(2 * summed_twice, 2**64 - 1)


@PURE
@given(start=st.binary(max_size=128), length=st.integers(0, 1 << 28))
def test_a_callers_prove_header_is_read_from_any_first_bytes_without_an_error(start, length):
    prove_header_start = _function("vastctl.route.wire", "prove_header_start")
    header = prove_header_start(start, length)
    assert header is None or isinstance(header.request_id, str)


@PURE
@given(request=st.one_of(proto_bytes, st.binary(max_size=128)))
def test_a_whole_prove_request_is_read_or_refused_as_malformed(request):
    prove_header = _function("vastctl.route.wire", "prove_header")
    from vastctl.route import wire
    try:
        header = prove_header(request)
    except wire.Malformed:
        return
    assert isinstance(header.request_id, str) and isinstance(header.proof_kind, int)
