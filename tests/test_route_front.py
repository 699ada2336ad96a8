"""route.front in this process: a real gRPC client on the front end, the router's grpcio server behind it, real
gRPC servers (and, where a daemon must break HTTP/2 mid-call, a raw socket) standing in for cuzk daemons, and
what only the front end does: a large Prove sent on as it arrives, kept whole for a resend, held unread at
64 KiB, answered within the caller's windows; the rest passed to grpcio frame by frame."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import hpack
import pytest
from helpers.route_daemon import Daemon
from helpers.serving import query, wait_for

from vastctl import clock
from vastctl import config as config_module
from vastctl.route import front as route_front
from vastctl.route import h2, wire
from vastctl.route import listener as route_listener
from vastctl.route import server as route_server
from vastctl.state import db

pytestmark = pytest.mark.slow  # gRPC servers on loopback

MiB = 1024 * 1024


class Site:
    """A state file, a router (refreshing every 0.1 s), its grpcio server, its front end, a client channel."""

    def __init__(self, tmp_path, **route):
        self.path = tmp_path / "state.db"
        self.conn = db.connect(self.path, now=clock.SYSTEM.now(), create=True)
        config = config_module.from_mapping({"db": str(self.path), "launch": {"bench_concurrency": 2},
                                             "route": {"refresh": "0.1s", "max_held": 5, **route}})
        self.router = route_server.Router(config, probe=lambda port, timeout: False)
        self.router.start_writer(self.path)
        self.server, internal = route_server.make_server(self.router, "127.0.0.1:0")
        self.server.start()
        self.internal = internal
        self.listening = route_listener.bind("127.0.0.1:0")  # held here as systemd holds it: fronts come and go
        self.fronts: list[route_front.Front] = []
        self.front = self.new_front()
        self.port = self.listening.getsockname()[1]
        self.channel = self.new_channel()
        self.daemons: list[Daemon] = []

    def new_front(self):
        front = route_front.Front(self.router, self.listening.dup(), self.internal)
        front.start()
        self.fronts.append(front)
        return front

    def new_channel(self):
        """A channel on a connection of its own: grpcio otherwise shares one connection among channels of the same
        target and options, and a call on a "new" channel could go out on a connection the router is draining."""
        return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[
            ("grpc.max_send_message_length", 300 * MiB), ("grpc.max_receive_message_length", 300 * MiB),
            ("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)])

    def join(self, port, name, rate=60.0):
        at = clock.to_iso(clock.SYSTEM.now())
        self.conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                          " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                          (f"u-{name}", name, at, at, port, at, rate))
        self.conn.commit()
        wait_for(lambda: any(p["label"] == name for p in self.router.dispatcher.snapshot()["provers"]),
                 f"{name} joined")

    def daemon(self, name, **knobs):
        daemon = Daemon(**knobs)
        self.daemons.append(daemon)
        return daemon

    def calls(self):
        return query(self.path, "SELECT request_id, label, result, attempt, size_bytes, detail FROM proof_calls"
                                " ORDER BY id")

    def stop(self):
        self.channel.close()
        for front in self.fronts:
            front.stop()
            front.close()
        self.listening.close()
        self.server.stop(0)
        self.router.stop_writer()
        for daemon in self.daemons:
            daemon.stop()
        self.conn.close()


@pytest.fixture
def site(tmp_path):
    made: list[Site] = []

    def make(**route):
        made.append(Site(tmp_path, **route))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def request_of(request_id, size, kind=wire.POREP_SEAL_COMMIT):
    return wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id=request_id, proof_kind=kind, vanilla_proof=bytes(range(256)) * (size // 256))).SerializeToString()


def arriving(site):
    """The calls the front end serves now, as (stream, Incoming)."""
    return [(stream, stream.incoming) for connection in list(site.front.connections)
            for stream in list(connection.streams.values()) if stream.incoming is not None]


def test_a_large_call_with_no_room_waits_with_only_its_first_window_read_and_every_call_completes_whole(site):
    """route.max_held_mb 10: a 6 MiB call is read and held (no prover yet), the next waits unread, 64 KiB of it
    in; a prover joins and both complete, byte for byte."""
    routed = site(cut_through_mb=1, max_held_mb=10)
    prove = routed.channel.unary_unary(wire.PROVE)
    first, second = request_of("read-held", 6 * MiB), request_of("unread", 6 * MiB)
    futures = [prove.future(first, timeout=30)]
    wait_for(lambda: [i for _, i in arriving(routed) if i.complete], "the first call read whole")
    futures.append(prove.future(second, timeout=30))
    wait_for(lambda: routed.router.dispatcher.snapshot()["unread"] == 1, "the second waits unread")
    time.sleep(0.3)  # the caller would send more now if it were let
    (waiting,) = [i for _, i in arriving(routed) if not i.complete]
    assert waiting.received <= h2.DEFAULT_WINDOW - h2.MESSAGE_PREFIX and waiting.data is None
    assert routed.router.dispatcher.snapshot()["held"] == 2
    daemon = routed.daemon("a")
    routed.join(daemon.port, "vastctl-a")
    answers = [wire.ProveResponse.FromString(f.result(timeout=30)).result for f in futures]
    assert [(a.status, a.proof) for a in answers] == [(wire.STATUS_COMPLETED, b"proof:read-held"),
                                                      (wire.STATUS_COMPLETED, b"proof:unread")]
    assert daemon.requests == [first, second]  # byte for byte, in arrival order
    rows = wait_for(lambda: len(routed.calls()) == 2 and routed.calls(), "the calls recorded")
    assert [(r["label"], r["result"], r["size_bytes"]) for r in rows] == [
        ("vastctl-a", "completed", len(first)), ("vastctl-a", "completed", len(second))]


class HalfwayDaemon:
    """A daemon that takes a call's first `take` bytes over HTTP/2 and then dies: the connection reset, no answer."""

    def __init__(self, take):
        self.take = take
        self.listen = socket.create_server(("127.0.0.1", 0))
        self.port = self.listen.getsockname()[1]
        self.taken: list[int] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.listen.accept()
            except OSError:
                return
            sock.sendall(h2.settings(initial_window_size=h2.LARGEST_WINDOW)
                         + h2.window_update(0, h2.LARGEST_WINDOW - h2.DEFAULT_WINDOW))
            got = 0
            while got < self.take:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            self.taken.append(got)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()  # a reset, as a daemon killed mid-call

    def stop(self):
        self.listen.close()


def test_a_prover_that_dies_halfway_through_a_call_has_it_sent_whole_to_another_from_the_kept_copy(site):
    routed = site(cut_through_mb=1)
    dying = HalfwayDaemon(take=8 * MiB)
    routed.join(dying.port, "vastctl-dying", rate=90)  # the best rate: the call goes there first
    alive = routed.daemon("alive")
    routed.join(alive.port, "vastctl-alive", rate=10)
    request = request_of("half-sent", 30 * MiB)
    answer = wire.ProveResponse.FromString(routed.channel.unary_unary(wire.PROVE)(request, timeout=30)).result
    dying.stop()
    assert (answer.status, answer.proof) == (wire.STATUS_COMPLETED, b"proof:half-sent")
    assert dying.taken and dying.taken[0] >= 8 * MiB and alive.requests == [request]
    rows = wait_for(lambda: len(routed.calls()) >= 2 and routed.calls(), "both attempts recorded")
    assert [(r["label"], r["result"], r["attempt"]) for r in rows] == [
        ("vastctl-dying", "dropped", 1), ("vastctl-alive", "completed", 2)]
    assert rows[0]["detail"].startswith("vastctl-dying: UNAVAILABLE")


def test_a_status_the_daemon_sends_before_it_read_the_call_is_passed_back_and_never_resent(site):
    routed = site(cut_through_mb=1)
    small = routed.daemon("small", max_message=4 * MiB)  # grpcio refuses a larger message: RESOURCE_EXHAUSTED
    routed.join(small.port, "vastctl-small", rate=90)
    other = routed.daemon("other")
    routed.join(other.port, "vastctl-other", rate=10)
    with pytest.raises(grpc.RpcError) as raised:
        routed.channel.unary_unary(wire.PROVE)(request_of("too-big-for-it", 10 * MiB), timeout=30)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    rows = wait_for(lambda: routed.calls() or None, "the call recorded")
    assert [(r["label"], r["result"]) for r in rows] == [("vastctl-small", "error")]
    assert other.seen == [] and small.seen == []


def test_a_caller_that_gives_up_mid_call_is_recorded_and_the_provers_copy_is_cancelled(site):
    routed = site(cut_through_mb=1)
    daemon = routed.daemon("slow")
    daemon.release.clear()  # it holds every proof
    routed.join(daemon.port, "vastctl-slow")
    future = routed.channel.unary_unary(wire.PROVE).future(request_of("given-up", 5 * MiB), timeout=30)
    wait_for(lambda: daemon.seen == ["given-up"], "the prover has the call")
    future.cancel()
    rows = wait_for(lambda: routed.calls() or None, "the call recorded")
    assert [(r["label"], r["result"]) for r in rows] == [("vastctl-slow", "abandoned")]
    wait_for(lambda: daemon.cancelled == ["given-up"], "the prover's call is cancelled")
    daemon.release.set()
    assert routed.router.dispatcher.snapshot()["provers"][0]["streak"] == 0  # not the prover's fault


class TightCaller:
    """An HTTP/2 caller that lets through only 16 KiB at a time, on its stream or on its whole connection
    (`tight`), and fails the test on any DATA past what it allowed (the FLOW_CONTROL_ERROR a real caller would
    close the connection with). Only once a window is used up does it open it again, so nothing the router
    sent past it can have been allowed by an update on its way."""

    WINDOW = 16384

    def __init__(self, port, tight):
        import hpack
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        # (connection window, stream window) at the start: HTTP/2's 64 KiB for a connection unless opened
        self.limit = {0: h2.DEFAULT_WINDOW, 1: h2.LARGEST_WINDOW} if tight == "connection" else {
            0: h2.LARGEST_WINDOW, 1: self.WINDOW}
        hello = h2.PREFACE + h2.settings(initial_window_size=self.limit[1])
        if tight == "stream":
            hello += h2.window_update(0, h2.LARGEST_WINDOW - h2.DEFAULT_WINDOW)
        self.sock.sendall(hello)

    def prove(self, request: bytes) -> tuple[dict, bytes]:
        fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", wire.PROVE.encode()),
                  (b":authority", b"router"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        self.sock.sendall(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, self.encoder.encode(fields)))
        body, self.sent, self.window = h2.message_prefix(len(request)) + request, 0, h2.DEFAULT_WINDOW
        self.reader = h2.Reader(self.sock, max_frame=h2.DEFAULT_FRAME)
        self.allowed = dict(self.limit)
        self.answer, self.head, self.ended = b"", {}, False
        while not self.ended:
            while self.sent < len(body) and self.window > 0:
                size = min(self.window, h2.DEFAULT_FRAME, len(body) - self.sent)
                end = h2.END_STREAM if self.sent + size == len(body) else 0
                self.sock.sendall(h2.frame(h2.DATA, end, 1, body[self.sent:self.sent + size]))
                self.sent, self.window = self.sent + size, self.window - size
            frames = self.reader.read()
            assert frames is not None, "the router closed the connection"
            self._take(frames)
            used_up = [stream_id for stream_id in (0, 1) if self.allowed[stream_id] == 0]
            if used_up and not self.ended:
                # whatever the router sends now is past the window: wait for it before opening the window again
                time.sleep(0.05)
                self.sock.settimeout(0.05)
                late = self.reader.read()  # None: nothing came
                self.sock.settimeout(30)
                self._take(late or [])
                for stream_id in used_up:
                    self.sock.sendall(h2.window_update(stream_id, self.WINDOW))
                    self.allowed[stream_id] = self.WINDOW
        return self.head, self.answer[h2.MESSAGE_PREFIX:]

    def _take(self, frames):
        for kind, flags, stream, payload in frames:
            if kind == h2.SETTINGS and not flags & h2.ACK:
                self.sock.sendall(h2.frame(h2.SETTINGS, h2.ACK, 0))
            elif kind == h2.WINDOW_UPDATE and stream == 1:
                self.window += int.from_bytes(payload[:4], 'big')
            elif kind == h2.DATA and stream == 1:
                assert len(payload) <= min(self.allowed[0], self.allowed[1]), "DATA past the window the caller gave"
                self.allowed[0] -= len(payload)
                self.allowed[1] -= len(payload)
                self.answer += bytes(payload)
            elif kind == h2.HEADERS and stream == 1:
                self.head.update((bytes(n), bytes(v)) for n, v in self.decoder.decode(h2.header_block(flags, payload), raw=True))
                self.ended = self.ended or bool(flags & h2.END_STREAM)
            elif kind == h2.RST_STREAM and stream == 1:
                raise AssertionError(f"the router reset the call: {int.from_bytes(payload[:4], 'big')}")

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("tight", ["stream", "connection"])
@pytest.mark.parametrize("cut_through_mb", [0, 129])
def test_an_answer_larger_than_the_callers_window_comes_back_within_it_and_whole(site, cut_through_mb, tight):
    """A caller that lets 16 KiB through at a time, on its stream or its connection, gets a 256 KiB answer whole,
    never a byte past its windows: served here (0) or passed on from grpcio (129)."""
    routed = site(cut_through_mb=cut_through_mb)
    proof = bytes(range(256)) * (256 * 1024 // 256)
    daemon = routed.daemon("wordy", answer=lambda request, context: wire.ProveResponse(result=wire.AwaitProofResponse(
        job_id=request.submit.request_id, status=wire.STATUS_COMPLETED, proof=proof)))
    routed.join(daemon.port, "vastctl-wordy")
    caller = TightCaller(routed.port, tight)
    try:
        head, message = caller.prove(request_of("wordy-1", 100 * 1024))
    finally:
        caller.close()
    assert head[b"grpc-status"] == b"0", head
    assert wire.ProveResponse.FromString(message).result.proof == proof
    assert daemon.seen == ["wordy-1"]


def test_once_stopping_a_new_call_waits_for_the_next_front_end_on_the_same_socket_and_a_call_in_flight_finishes(
        site):
    routed = site(cut_through_mb=1)
    daemon = routed.daemon("a")
    daemon.release.clear()
    routed.join(daemon.port, "vastctl-a")
    prove = routed.channel.unary_unary(wire.PROVE)
    in_flight = prove.future(request_of("in-flight", 2 * MiB), timeout=30)
    wait_for(lambda: daemon.seen == ["in-flight"], "the call is on the prover")
    routed.front.stop()
    later = routed.new_channel()  # a new connection: it waits in the socket's backlog, no front end accepts it
    late = [later.unary_unary(wire.PROVE).future(request_of(name, size), timeout=30)
            for name, size in (("late-big", 2 * MiB), ("late-small", 1024))]
    assert not any(call.done() for call in late)
    routed.new_front()
    daemon.release.set()
    assert wire.ProveResponse.FromString(in_flight.result(timeout=30)).result.proof == b"proof:in-flight"
    assert sorted(wire.ProveResponse.FromString(call.result(timeout=30)).result.proof for call in late) == [
        b"proof:late-big", b"proof:late-small"]
    later.close()


def test_a_graceful_stop_takes_what_was_sent_before_its_goaway_was_read_and_refuses_what_comes_after(site):
    """RFC 9113 §6.8 as gRPC servers do it: GOAWAY with 2^31-1 and a PING; a stream opened before the caller
    answered the PING is still taken (it was on its way); the PING's answer brings GOAWAY naming the last stream
    taken, and with nothing left in flight the router closes its side."""
    routed = site()
    with socket.create_connection(("127.0.0.1", routed.port), timeout=10) as raw:
        raw.sendall(h2.PREFACE + h2.settings() + h2.frame(h2.SETTINGS, h2.ACK, 0))
        encoder = hpack.Encoder()
        fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", wire.GET_STATUS.encode()),
                  (b":authority", b"router"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        raw.sendall(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, encoder.encode(fields))
                    + h2.frame(h2.DATA, h2.END_STREAM, 1, h2.message_prefix(0)))
        reader = h2.Reader(raw, max_frame=1 << 20)
        seen = read_until(reader, lambda f: f.kind == h2.HEADERS and f.stream == 1 and f.flags & h2.END_STREAM)
        routed.front.stop()
        seen = read_until(reader, lambda f: f.kind == h2.PING)
        goaway = next(f for f in seen if f.kind == h2.GOAWAY)
        assert int.from_bytes(goaway.payload[:4], "big") == h2.LAST_STREAM
        ping = next(f for f in seen if f.kind == h2.PING)
        raw.sendall(h2.frame(h2.HEADERS, h2.END_HEADERS, 3, encoder.encode(fields))
                    + h2.frame(h2.DATA, h2.END_STREAM, 3, h2.message_prefix(0)))
        seen = read_until(reader, lambda f: f.kind == h2.HEADERS and f.stream == 3 and f.flags & h2.END_STREAM)
        assert not [f for f in seen if f.kind == h2.RST_STREAM]
        raw.sendall(h2.frame(h2.PING, h2.ACK, 0, ping.payload))
        seen = read_until(reader, lambda f: f.kind == h2.GOAWAY)
        last = [f for f in seen if f.kind == h2.GOAWAY][-1]
        assert last.payload[:8] == (3).to_bytes(4, "big") + h2.NO_ERROR.to_bytes(4, "big")
        assert reader.read() is None  # nothing in flight: the router ends its side of the connection


def read_until(reader, done):
    """The frames read until one satisfies `done` (the socket's timeout bounds the wait)."""
    seen = []
    while True:
        frames = reader.read()
        assert frames is not None, f"the connection closed; frames so far: {seen}"
        seen += [h2.Frame(f.kind, f.flags, f.stream, bytes(f.payload)) for f in frames]
        if any(done(f) for f in frames):
            return seen


def test_bytes_that_are_not_http2_close_that_connection_only(site):
    routed = site(cut_through_mb=1)
    daemon = routed.daemon("a")
    routed.join(daemon.port, "vastctl-a")
    with socket.create_connection(("127.0.0.1", routed.port), timeout=5) as stray:
        stray.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        stray.settimeout(5)
        said = b""
        while chunk := stray.recv(100):
            said += chunk
        # an HTTP/2 GOAWAY (PROTOCOL_ERROR), then the connection closes
        assert said[3] == h2.GOAWAY and said[-4:] == h2.PROTOCOL_ERROR.to_bytes(4, "big"), said
    answer = wire.ProveResponse.FromString(routed.channel.unary_unary(wire.PROVE)(request_of("after", 2 * MiB),
                                                                                 timeout=30)).result
    assert answer.proof == b"proof:after"
