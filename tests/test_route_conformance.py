"""The router's front end against RFC 9113 and a hostile caller, over a real socket: `vastctl route` in its own
process on a config file (so /proc/<pid>/status's VmRSS is the router's alone), spoken to in raw HTTP/2 frames
built here (header blocks by `hpack`), its verdict read back from the wire: a GOAWAY and its code (a connection
error), an RST_STREAM and its code (a stream error), or a PING answered after the frames under test (accepted).

Each test names the RFC 9113 section whose MUST it checks, or the break from a hostile caller it repeats. The
raw peer and the router process are helpers/raw_h2.py's.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import threading
import time
from concurrent import futures

import hpack
import pytest
from helpers.raw_h2 import (
    CANCEL,
    CODE_NAMES,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    PROVE,
    REFUSED_STREAM,
    STREAM_CLOSED,
    Closed,
    MiB,
    Peer,
    RouterProcess,
    Verdict,
    frame,
    good_status,
    grpc_message,
    length_field,
    ping,
    prove_message,
    prove_start,
    request_fields,
    settings,
    varint,
    window_update,
)

pytestmark = pytest.mark.slow  # a router process on loopback


@pytest.fixture(scope="module")
def shared_router(tmp_path_factory):
    """One router for the tests that each break only their own connection; max_held_mb 1 and cut_through_mb 1:
    a large Prove has no room and waits unread, its stream window never opened."""
    router = RouterProcess(tmp_path_factory.mktemp("shared-router"), max_held_mb=1, cut_through_mb=1)
    yield router
    router.stop()


@pytest.fixture
def router(shared_router):
    """The shared router, checked after each test: still serving, no traceback in its log meanwhile."""
    since = len(shared_router.log())
    yield shared_router
    assert shared_router.alive(), shared_router.log()
    good_status(shared_router.port)
    assert not shared_router.tracebacks(since), shared_router.tracebacks(since)[0]


@pytest.fixture
def own_router(tmp_path):
    """A router of the test's own (its memory measured alone, or its limits set): `own_router(**route)`."""
    made: list[RouterProcess] = []

    def make(nofile: int | None = None, **route) -> RouterProcess:
        made.append(RouterProcess(tmp_path / f"router-{len(made)}", nofile=nofile, **route))
        return made[-1]

    yield make
    for each in made:
        each.stop()


@pytest.fixture
def peer(router):
    made: list[Peer] = []

    def make(**kwargs) -> Peer:
        made.append(Peer(router.port, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()


class StandInProver:
    """A gRPC server speaking cuzk.v1.ProvingEngine on loopback: each Prove answered at once, completed."""

    def __init__(self):
        import grpc

        def prove(data, context):
            proof = length_field(3, b"proof")
            return length_field(1, length_field(1, b"job") + varint(2 << 3) + varint(1) + proof)  # ProveResponse{result}

        handler = grpc.method_handlers_generic_handler("cuzk.v1.ProvingEngine", {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(lambda data, context: b"")})
        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(0)


def expect(verdict: Verdict, kind: str, *codes: int, what: str) -> None:
    names = "/".join(CODE_NAMES[c] for c in codes)
    assert verdict.kind == kind and (not codes or verdict.code in codes), (
        f"{what}: expected {kind} {names}, the router's verdict: {verdict}")


# --- RFC 9113's MUST checks, one connection each ----------------------------------------------------------------


def test_its_settings_advertise_max_concurrent_streams_and_max_header_list_size(peer):
    """§5.1.2, §6.5.2, §10.5.1: the limits a caller is held to are told to it, so a good caller never passes them."""
    caller = peer()
    advertised = caller.server_settings
    assert MAX_CONCURRENT_STREAMS in advertised and MAX_HEADER_LIST_SIZE in advertised, (
        f"the router's SETTINGS: {advertised}")
    assert 1 <= advertised[MAX_CONCURRENT_STREAMS] <= 10_000
    assert 1024 <= advertised[MAX_HEADER_LIST_SIZE] <= 16 * MiB


def test_a_ping_inside_a_header_block_is_a_connection_error_protocol_error(peer):
    """§4.3, §6.10: a header block is contiguous: any other frame inside it is a PROTOCOL_ERROR connection error."""
    caller = peer()
    caller.send(caller.headers(1, flags=0), ping(b"inblock!"))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what="a PING between HEADERS and its CONTINUATION")


def test_a_window_update_of_0_on_the_connection_is_a_connection_error_protocol_error(peer):
    """§6.9: an increment of 0 on stream 0 MUST be a connection error of type PROTOCOL_ERROR."""
    caller = peer()
    caller.send(window_update(0, 0))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what="WINDOW_UPDATE 0 on the connection")


def test_a_window_update_of_0_on_a_stream_is_a_stream_error_protocol_error_and_the_connection_serves_on(peer):
    """§6.9: an increment of 0 on a stream MUST be a stream error of type PROTOCOL_ERROR: that stream is reset,
    the connection's other calls go on."""
    caller = peer()
    caller.send(caller.headers(1), window_update(1, 0))
    verdict = caller.verdict()
    expect(verdict, "stream", PROTOCOL_ERROR, what="WINDOW_UPDATE 0 on an open stream")
    assert verdict.stream == 1
    assert caller.call(3) == b"0", "the connection no longer serves after a stream error"


def test_an_initial_window_size_of_2_31_is_a_connection_error_flow_control_error(peer):
    """§6.5.2: SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1 MUST be a connection error of type FLOW_CONTROL_ERROR."""
    caller = peer()
    caller.send(settings((INITIAL_WINDOW_SIZE, 1 << 31)))
    expect(caller.verdict(), "connection", FLOW_CONTROL_ERROR, what="SETTINGS_INITIAL_WINDOW_SIZE 2^31")


@pytest.mark.parametrize("value", [0, 100, DEFAULT_FRAME - 1, 1 << 24])
def test_a_max_frame_size_outside_2_14_to_2_24_minus_1_is_a_connection_error_protocol_error(peer, value):
    """§6.5.2: SETTINGS_MAX_FRAME_SIZE outside [2^14, 2^24-1] MUST be a connection error of type PROTOCOL_ERROR."""
    caller = peer()
    caller.send(settings((MAX_FRAME_SIZE, value)))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what=f"SETTINGS_MAX_FRAME_SIZE {value}")


@pytest.mark.parametrize("value", [DEFAULT_FRAME, (1 << 24) - 1])
def test_a_max_frame_size_at_either_end_of_its_range_is_accepted_and_calls_go_on(peer, value):
    caller = peer()
    caller.send(settings((MAX_FRAME_SIZE, value)))
    expect(caller.verdict(), "accepted", what=f"SETTINGS_MAX_FRAME_SIZE {value}")
    assert caller.call(1) == b"0"


def test_data_on_stream_0_is_a_connection_error_protocol_error(peer):
    """§6.1: DATA whose stream identifier is 0 MUST be a connection error of type PROTOCOL_ERROR."""
    caller = peer()
    caller.send(frame(DATA, 0, 0, b"\0\0\0\0\0"))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what="DATA on stream 0")


def test_headers_on_an_even_stream_id_is_a_connection_error_protocol_error(peer):
    """§5.1.1: a client's streams are odd; an unexpected stream identifier MUST be a PROTOCOL_ERROR connection
    error."""
    caller = peer()
    caller.send(caller.headers(2, flags=END_HEADERS | END_STREAM))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what="HEADERS on stream 2")


def test_headers_on_a_lower_never_used_stream_id_is_a_connection_error_protocol_error(peer):
    """§5.1.1: a new stream's identifier MUST be greater than every one the caller opened: stream 3 after 5 (3,
    never used, is closed by 5) is a PROTOCOL_ERROR connection error."""
    caller = peer()
    assert caller.call(5) == b"0"
    caller.send(caller.headers(3), frame(DATA, END_STREAM, 3, grpc_message(b"")))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, what="HEADERS on stream 3 after stream 5")


def test_headers_on_a_reused_closed_stream_id_is_a_connection_error(peer):
    """§5.1.1 (an identifier not greater than every opened one: PROTOCOL_ERROR) and §5.1 (a frame on a stream
    closed by END_STREAM: STREAM_CLOSED): stream 1 again, after calls on 1 and 3 completed, is either."""
    caller = peer()
    assert caller.call(1) == b"0" and caller.call(3) == b"0"
    caller.send(caller.headers(1), frame(DATA, END_STREAM, 1, grpc_message(b"")))
    expect(caller.verdict(), "connection", PROTOCOL_ERROR, STREAM_CLOSED, what="HEADERS on stream 1 reused")


def test_a_3_byte_ping_is_a_connection_error_frame_size_error(peer):
    """§6.7: a PING whose length is not 8 MUST be a connection error of type FRAME_SIZE_ERROR."""
    caller = peer()
    caller.send(frame(PING, 0, 0, b"abc"))
    expect(caller.verdict(), "connection", FRAME_SIZE_ERROR, what="a 3-byte PING")


def test_an_hpack_error_is_a_connection_error_compression_error(peer):
    """§4.3: a field block that cannot be decoded MUST be a connection error of type COMPRESSION_ERROR (index 0,
    then an index past both tables)."""
    caller = peer()
    caller.send(frame(HEADERS, END_HEADERS, 1, b"\x80"))
    expect(caller.verdict(), "connection", COMPRESSION_ERROR, what="HPACK index 0")
    caller = peer()
    caller.send(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"))
    expect(caller.verdict(), "connection", COMPRESSION_ERROR, what="an HPACK index past both tables")


def _send_data(caller: Peer, stream: int, body: bytes, *, end: bool = False) -> None:
    size = DEFAULT_FRAME  # always allowed (§4.2), whatever MAX_FRAME_SIZE the router gives
    chunks = [body[at:at + size] for at in range(0, len(body), size)] or [b""]
    caller.send(*(frame(DATA, END_STREAM if end and n == len(chunks) - 1 else 0, stream, chunk)
                  for n, chunk in enumerate(chunks)))


def test_data_past_a_streams_window_is_a_flow_control_error(router, peer):
    """§6.9.1, §5.2: DATA past the window the router gave a stream is a FLOW_CONTROL_ERROR (stream or connection
    error), never buffered. The break: one connection took the router's RSS 49 -> 264 MiB past its windows. A small
    Prove is held first (no prover), so the router (route.max_held_mb 1) has no room for a 64 MiB one, which waits
    unread, its window not opened; its caller sends 64 KiB past that window. Every WINDOW_UPDATE the router sent
    for the stream counts as credit: the bytes sent pass the credit by 64 KiB each round, in at most 4 rounds."""
    caller = peer()
    held = prove_message("held-first", 20_000)
    caller.send(caller.headers(1, request_fields(PROVE, ("grpc-timeout", "30S"))), frame(DATA, END_STREAM, 1, held))
    router.wait(lambda: (router.status().get("held") or 0) >= 1, "the first call held")
    window = caller.server_settings.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
    start, _ = prove_start("past-the-window", 64 * MiB)
    caller.send(caller.headers(3, request_fields(PROVE, ("grpc-timeout", "30S"))))
    sent = 0
    for _ in range(4):
        more = window + caller.stream_credit.get(3, 0) - sent + 64 * 1024
        assert sent + more <= 8 * MiB, f"the router opened the unread call's window by {caller.stream_credit[3]}"
        _send_data(caller, 3, (start + bytes(more))[:more] if sent == 0 else bytes(more))
        sent += more
        verdict = caller.verdict()
        if verdict.kind != "accepted" or sent > window + caller.stream_credit.get(3, 0):
            break
    assert verdict.kind in ("stream", "connection") and verdict.code == FLOW_CONTROL_ERROR, (
        f"{sent} bytes on a stream given {window} + {caller.stream_credit.get(3, 0)}: expected a FLOW_CONTROL_ERROR,"
        f" the router's verdict: {verdict}")
    assert verdict.kind == "connection" or verdict.stream == 3


def test_data_past_the_connection_window_is_a_connection_error_flow_control_error(peer):
    """§6.9.1: DATA past the connection's window is a FLOW_CONTROL_ERROR connection error. Streams each filled
    within their own window (Proves with no room, waiting unread) together pass the connection's. Where the
    connection window is larger than every stream window the router allows put together, or the router opened it
    again as the bytes came, the streams' windows are what bound the connection: nothing to pass."""
    caller = peer()
    window = caller.server_settings.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
    credit = caller.connection_credit
    streams = caller.server_settings.get(MAX_CONCURRENT_STREAMS, 100)
    needed = -(-(credit + 1) // window)
    if needed > min(streams, 200):
        pytest.skip(f"the connection window ({credit} bytes) is more than {min(streams, 200)} streams of {window}")
    sent, stream = 0, 1
    for n in range(needed):
        stream = 2 * n + 1
        size = min(window, credit + 1 - sent)
        start, _ = prove_start(f"connection-window-{n}", 64 * MiB)
        caller.send(caller.headers(stream, request_fields(PROVE, ("grpc-timeout", "30S"))))
        _send_data(caller, stream, (start + bytes(size))[:size])
        sent += size
    verdict = caller.verdict()
    if verdict.kind == "accepted" and sent <= caller.connection_credit:
        pytest.skip(f"the router opened the connection window again as the bytes came ({caller.connection_credit})")
    expect(verdict, "connection", FLOW_CONTROL_ERROR, what=f"{sent} bytes on a connection given {credit}")


def test_streams_past_max_concurrent_streams_are_refused_and_the_first_ones_go_on(peer):
    """§5.1.2: a HEADERS that passes the advertised SETTINGS_MAX_CONCURRENT_STREAMS MUST be a stream error of
    type PROTOCOL_ERROR or REFUSED_STREAM (a gRPC client retries REFUSED_STREAM by itself). With none advertised,
    1,000 are opened: the break was 3,000 concurrent streams on one connection slowing every caller."""
    caller = peer()
    limit = caller.server_settings.get(MAX_CONCURRENT_STREAMS, 1000)
    assert limit <= 10_000, f"MAX_CONCURRENT_STREAMS {limit}"
    opened = [2 * n + 1 for n in range(limit + 1)]
    caller.send(*(caller.headers(stream) for stream in opened))  # each left open: no END_STREAM
    verdict = caller.verdict(timeout=15)
    expect(verdict, "stream", REFUSED_STREAM, PROTOCOL_ERROR, what=f"{limit + 1} streams open at once")
    assert verdict.stream == opened[-1], f"the stream refused was {verdict.stream}, not the one past the limit"
    assert [s for s, c in verdict.resets.items() if s != opened[-1] and c not in (NO_ERROR, CANCEL)] == []


def test_a_connection_error_sends_goaway_with_the_last_stream_it_processed(peer):
    """§6.8, §5.4.1: the GOAWAY of a connection error carries the highest stream the router acted on (3, whose
    call it answered; not 0, which would tell the caller streams 1 and 3 were never processed and may be sent
    again)."""
    caller = peer()
    assert caller.call(1) == b"0" and caller.call(3) == b"0"
    caller.send(frame(CONTINUATION, END_HEADERS, 5, b""))  # §6.10: a CONTINUATION with no HEADERS before it
    verdict = caller.verdict()
    expect(verdict, "connection", PROTOCOL_ERROR, what="a CONTINUATION with no HEADERS before it")
    assert verdict.last_stream == 3, f"GOAWAY's last stream is {verdict.last_stream}, the last processed 3"


def test_a_graceful_stop_sends_goaway_no_error_to_a_connected_caller(own_router):
    """§6.8: on SIGTERM the router tells each caller with GOAWAY NO_ERROR to open a new connection for its next
    call, instead of closing under it: one GOAWAY, or first one with 2^31-1 and then one with the last stream
    it took (the RFC's graceful shutdown); the last stream it names is not below the call it answered."""
    router = own_router()
    caller = Peer(router.port)
    try:
        assert caller.call(1) == b"0"
        router.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        try:
            while caller.next_frame(deadline) is not None:
                pass
        except Closed:
            pass
        assert caller.goaways, "the connection ended without a GOAWAY" if caller.closed else "no GOAWAY in 15 s"
        assert all(code == NO_ERROR for _, code in caller.goaways), f"GOAWAYs (last stream, code) {caller.goaways}"
        lasts = [last for last, _ in caller.goaways]
        assert lasts == sorted(lasts, reverse=True) and lasts[-1] >= 1, f"GOAWAYs (last stream, code) {caller.goaways}"
    finally:
        caller.close()


# --- a hostile caller: the router's resources stay bounded, it keeps serving ------------------------------------


class Sampler:
    """The router's peak RSS, sampled every 20 ms on a thread while an attack runs."""

    def __init__(self, router: RouterProcess):
        self.router, self.peak, self.done = router, router.rss(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(0.02):
            try:
                self.peak = max(self.peak, self.router.rss())
            except (OSError, AssertionError):
                return

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def _flood(port: int, cap: int, stop: threading.Event) -> list[tuple[str, int]]:
    """Connections that each send HEADERS then CONTINUATION frames without END_HEADERS until the router closes
    them (or `cap` bytes): (how each ended, bytes sent) per connection."""
    fragment = hpack.Encoder().encode([("x-flood", "a" * 1000)])
    payload = (fragment * (DEFAULT_FRAME // len(fragment) + 1))[:DEFAULT_FRAME]
    chunk = frame(CONTINUATION, 0, 1, payload) * 64  # 1 MiB
    ends = []
    while not stop.is_set() and len(ends) < 50:
        caller = Peer(port)
        caller.sock.settimeout(5)
        sent, how = 0, "not closed"
        try:
            caller.sock.sendall(frame(HEADERS, 0, 1, caller.encoder.encode(request_fields())))
            while sent < cap:
                caller.sock.sendall(chunk)
                sent += len(chunk)
        except socket.timeout:
            how = "stalled"  # the router neither read on nor closed
        except OSError:
            how = "closed"
            try:  # its GOAWAY, when the reset that followed it left it readable
                while caller.goaway is None and caller.next_frame(time.monotonic() + 1) is not None:
                    pass
            except Closed:
                pass
            if caller.goaway is not None:
                how = f"closed with GOAWAY {CODE_NAMES.get(caller.goaway[1], caller.goaway[1])}"
        finally:
            caller.close()
        ends.append((how, sent))
        if not how.startswith("closed"):
            break
    return ends


def test_a_continuation_flood_is_closed_soon_memory_stays_flat_and_other_callers_stay_fast(own_router):
    """The break: HEADERS then endless CONTINUATION frames grew a header block without limit (four connections: RSS
    854 MiB, a good GetStatus 3.7 ms -> 1 s). Four connections flood at once, each reconnecting when closed: each
    is closed with a GOAWAY and an error code before 24 MiB past the advertised MAX_HEADER_LIST_SIZE, the RSS grows by
    a few MiB at most, and ten GetStatus calls on other connections meanwhile stay fast."""
    router = own_router()
    limit = Peer(router.port).server_settings.get(MAX_HEADER_LIST_SIZE, 1 * MiB)
    cap = limit + 24 * MiB
    good_status(router.port)
    baseline = router.rss()
    sampler = Sampler(router)
    stop = threading.Event()
    latencies = []
    with futures.ThreadPoolExecutor(4) as pool:
        floods = [pool.submit(_flood, router.port, cap, stop) for _ in range(4)]
        deadline = time.monotonic() + 30
        while len(latencies) < 10 and time.monotonic() < deadline:  # the floods go on meanwhile
            latencies.append(good_status(router.port, timeout=10))
        stop.set()
        ends = [end for f in floods for end in f.result()]
    peak = sampler.stop()
    assert all(how.startswith("closed with GOAWAY") and not how.endswith("NO_ERROR") for how, _ in ends), (
        f"flood connections (how each ended, bytes sent): {ends}")
    assert peak - baseline <= 10 * MiB, f"RSS {baseline / MiB:.0f} -> {peak / MiB:.0f} MiB under the flood"
    assert latencies and statistics.median(latencies) <= 0.25, f"GetStatus under the flood: {latencies}"
    assert not router.tracebacks(), router.tracebacks()[0]


def test_idle_connections_past_the_file_limit_do_not_end_the_accept_loop(own_router):
    """The break: ~1,000 idle connections used up the file descriptors, accept() failed with EMFILE and the accept
    loop ended: the router answered nothing ever again. Here the router runs with ulimit -n 256 and 1,000
    connections are opened (none sends a byte); once they close, a new call is answered."""
    router = own_router(nofile=256)
    good_status(router.port)
    import selectors
    selector = selectors.DefaultSelector()
    idle = []
    try:
        for _ in range(1000):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", router.port))
            selector.register(sock, selectors.EVENT_WRITE)
            idle.append(sock)
        connected: set[socket.socket] = set()
        fds = [len(os.listdir(f"/proc/{router.proc.pid}/fd"))]
        deadline = time.monotonic() + 20
        # until the router holds all it will: at its file limit, or the number it holds unchanged for 1 s
        while time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.05):
                connected.add(key.fileobj)
                selector.unregister(key.fileobj)
            fds.append(len(os.listdir(f"/proc/{router.proc.pid}/fd")))
            if len(connected) > 256 and (fds[-1] >= 256 - 8 or len(set(fds[-20:])) == 1 and len(fds) > 20):
                break
        assert len(connected) > 256, f"only {len(connected)} of the 1,000 connections were taken"
    finally:
        selector.close()
        for sock in idle:
            sock.close()
    assert router.alive(), router.log()
    good_status(router.port, timeout=30)
    assert not router.tracebacks(), router.tracebacks()[0]


def test_sixty_connections_that_each_send_a_24_mib_burst_keep_no_mib_sized_buffers(own_router):
    """The break: 60 connections that each sent one 24 MiB burst kept 9 MiB read buffers each (RSS 604 MiB with no
    call). The burst is 16 KiB frames of an unknown type (§5.5: ignored and discarded); once each connection's PING
    after it is answered, the router's RSS is within 1 MiB a connection of what it was before they opened."""
    router = own_router()
    good_status(router.port)
    before = router.rss()
    callers = [Peer(router.port) for _ in range(60)]
    burst = frame(0xFA, 0, 0, bytes(DEFAULT_FRAME)) * (24 * MiB // (DEFAULT_FRAME + 9))
    try:
        with futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda caller: caller.send(burst), callers))
            list(pool.map(lambda caller: caller.barrier(30), callers))
        after = router.rss()
        assert after - before <= 60 * MiB, (
            f"RSS {before / MiB:.0f} -> {after / MiB:.0f} MiB with 60 connections idle after their bursts")
        good_status(router.port)
    finally:
        for caller in callers:
            caller.close()
    assert not router.tracebacks(), router.tracebacks()[0]


def test_max_frame_size_0_is_refused_and_never_answered_with_endless_empty_data(own_router):
    """The break: SETTINGS_MAX_FRAME_SIZE=0 made the answer loop send empty DATA frames forever (733,407 in 6 s).
    A caller sends it, then a Prove served by a prover: the SETTINGS is a PROTOCOL_ERROR connection error (§6.5.2),
    and no empty DATA frame comes back."""
    router = own_router(cut_through_mb=0)
    prover = StandInProver()
    try:
        router.join(prover.port)
        caller = Peer(router.port, handshake=False)
        caller.send(PREFACE + settings((MAX_FRAME_SIZE, 0)), caller.headers(1, request_fields(PROVE)))
        message = prove_message("frame-size-0", 4096)
        caller.send(frame(DATA, END_STREAM, 1, message))
        deadline = time.monotonic() + 5
        empty = 0
        try:
            while caller.goaway is None and (got := caller.next_frame(deadline)) is not None:
                kind, flags, _, payload = got
                empty += kind == DATA and not payload and not flags & END_STREAM
        except Closed:
            pass
        caller.close()
        assert empty <= 1, f"{empty} empty DATA frames in 5 s"
        assert caller.goaway is not None and caller.goaway[1] == PROTOCOL_ERROR, (
            f"SETTINGS_MAX_FRAME_SIZE 0: GOAWAY {caller.goaway}, connection closed: {caller.closed}")
    finally:
        prover.stop()
    good_status(router.port)
