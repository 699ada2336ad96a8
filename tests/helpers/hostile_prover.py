"""Stand-in cuzk daemons for the router's tests: a raw-socket HTTP/2 server whose Prove (and GetStatus) answers
break the rules a prover is trusted to keep, chosen per test, and a well-behaved grpcio one beside it.

`HostileProver(prove=..., status=...)` speaks enough HTTP/2 to serve a gRPC client (grpcio's channel, or the
router's own client for a large call): its SETTINGS, PING and WINDOW_UPDATE handling is correct, header blocks
go through hpack, and what it does with a Prove is the misbehaviour asked for:

  good          one proof, as a daemon answers
  stall         opens its windows (and takes the call's HEADERS), then reads nothing more on that connection
  silent        reads the whole call and never answers it
  huge          answers one message of `huge` bytes (a well-formed ProveResponse), within the router's windows
  flood         answers HEADERS without END_HEADERS, then CONTINUATION frames without end
  early_ok      advertises a stream window of 0 and answers OK with a fake proof as soon as the HEADERS come
  two           answers two length-prefixed messages, then OK trailers
  prefix_over   a message whose 5-byte prefix claims more bytes than are sent, then OK trailers
  prefix_under  a message whose prefix claims fewer bytes than are sent, then OK trailers

and with a GetStatus: `good` (its own figures), `garbage` (bytes that are not a GetStatusResponse) or
`max_completed` (total_proofs_completed 2^64-1); its good status says it runs nothing, so a router that frees a
slot only once the daemon's status shows the work gone is not kept waiting.

Every thread it starts ends when `stop()` is called (sockets are polled with a short timeout and every loop
checks the stop flag); the flood and the huge answer are bounded in bytes too.
"""

from __future__ import annotations

import socket
import struct
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import hpack
from hpack import NeverIndexedHeaderTuple

from helpers.raw_h2 import varint
from vastctl.route import wire

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
DEFAULT_WINDOW = 65535
LARGEST_WINDOW = (1 << 31) - 1
FRAME = 16384  # every frame sent is at most HTTP/2's default SETTINGS_MAX_FRAME_SIZE
POLL_S = 0.2  # how often a blocked socket call looks at the stop flag
MiB = 1024 * 1024

PROVE_BEHAVIOURS = ("good", "stall", "silent", "huge", "flood", "early_ok", "two", "prefix_over", "prefix_under")
STATUS_BEHAVIOURS = ("good", "garbage", "max_completed")
MAX_COMPLETED = (1 << 64) - 1
GARBAGE_STATUS = b"\x0a\x64not a GetStatusResponse"  # field 1 claims 100 bytes; 22 follow


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def prefix(length: int) -> bytes:
    """gRPC's 5-byte message prefix: not compressed, `length` bytes follow."""
    return b"\x00" + struct.pack(">I", length)


def proof_answer(request_id: str, proof: bytes) -> bytes:
    """A serialized ProveResponse: the proof completed."""
    return wire.ProveResponse(result=wire.AwaitProofResponse(
        job_id=request_id, status=wire.STATUS_COMPLETED, proof=proof, queue_wait_ms=1, gpu_compute_ms=2,
        total_ms=3)).SerializeToString()


def huge_answer_head(request_id: str, size: int) -> tuple[bytes, int]:
    """The first bytes of a ProveResponse of about `size` bytes whose proof field is its tail, and the proof's
    length: the head followed by that many bytes is a well-formed message (so only its size is wrong)."""
    proof = max(0, size - 64 - len(request_id))
    inner = wire.AwaitProofResponse(job_id=request_id, status=wire.STATUS_COMPLETED).SerializeToString()
    inner += b"\x1a" + varint(proof)  # field 3 (proof), length-delimited
    return b"\x0a" + varint(len(inner) + proof) + inner, proof


def status_answer(completed: int, label: str, queue: tuple[int, int] | None = None) -> bytes:
    """A GetStatusResponse with one GPU named for the prover and, when given, a porep queue (pending, in
    progress); without one the daemon says it is running nothing."""
    answer = wire.GetStatusResponse(total_proofs_completed=completed, total_proofs_failed=1, uptime_seconds=100,
                                    pinned_memory_bytes=1 << 20, pinned_memory_limit_bytes=1 << 30)
    answer.gpus.add(ordinal=0, name=f"gpu of {label}", vram_total_bytes=24 << 30)
    if queue is not None:
        answer.queues.add(proof_kind="porep", pending=queue[0], in_progress=queue[1])
    return answer.SerializeToString()


@dataclass
class ProveCall:
    """One Prove stream the hostile prover was sent, as it saw it."""
    connection: int
    stream: int
    received: int = 0  # bytes of the gRPC body (prefix included) read so far
    ended: bool = False  # the caller's END_STREAM came
    reset: bool = False  # the caller reset the stream
    request_id: str | None = None  # once the whole request was read
    received_at_answer: int | None = None  # body bytes read when the answer went out (early_ok)


@dataclass
class _Stream:
    id: int
    path: str
    send_window: int
    body: bytearray = field(default_factory=bytearray)
    call: ProveCall | None = None
    ended: bool = False
    reset: bool = False


class _Closed(Exception):
    """The connection is gone or the prover was stopped."""


class _Connection:
    def __init__(self, prover: HostileProver, sock: socket.socket, number: int) -> None:
        self.prover, self.sock, self.number = prover, sock, number
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()  # the windows the peer gives us
        self.send_window = DEFAULT_WINDOW
        self.peer_initial = DEFAULT_WINDOW
        self.streams: dict[int, _Stream] = {}
        self.closed = False
        self.flooding = False
        self.buffer = bytearray()
        self.block: bytearray | None = None  # a header block still waiting for its END_HEADERS
        self.block_stream = 0
        self.block_flags = 0

    # --- sending ------------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """All of `data`, or _Closed; a peer that stops reading blocks this only until the prover stops."""
        view = memoryview(data)
        with self.send_lock:
            while len(view):
                if self.prover.stopped.is_set() or self.closed:
                    raise _Closed()
                try:
                    sent = self.sock.send(view)
                except socket.timeout:
                    continue
                except OSError as exc:
                    self._close()
                    raise _Closed() from exc
                view = view[sent:]

    def reply(self, data: bytes) -> None:
        """What the reader sends back (ACKs, window updates): nothing while a header block is being sent, so the
        flood's block stays contiguous and is refused for its size alone."""
        if not self.flooding:
            self.send(data)

    def headers(self, stream: int, fields: list[tuple[bytes, bytes]], end_stream: bool = False) -> None:
        if self.flooding:  # nothing may come inside the flood's header block
            return
        with self.send_lock:  # the encoder's table must follow the order the blocks are sent in
            block = self.encoder.encode(fields)
        self.send(frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block))

    def data(self, stream: _Stream, payload: bytes, *, respect_windows: bool = True) -> None:
        """DATA frames of at most FRAME bytes, each sent only once the peer's windows let it through."""
        if self.flooding:
            return
        view = memoryview(payload)
        while len(view):
            size = min(len(view), FRAME)
            if respect_windows:
                size = self._take_window(stream, size)
            self.send(frame(DATA, 0, stream.id, bytes(view[:size])))
            view = view[size:]

    def _take_window(self, stream: _Stream, wanted: int) -> int:
        with self.cond:
            while min(self.send_window, stream.send_window) <= 0:
                if self.prover.stopped.is_set() or self.closed or stream.reset:
                    raise _Closed()
                self.cond.wait(POLL_S)
            size = min(wanted, self.send_window, stream.send_window)
            self.send_window -= size
            stream.send_window -= size
            return size

    def answer(self, stream: _Stream, message: bytes | None, *, grpc_status: int = 0) -> None:
        """Response headers, the message (prefixed) and trailers, as a gRPC server answers a unary call."""
        self.headers(stream.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        if message is not None:
            self.data(stream, prefix(len(message)) + message)
        self.trailers(stream, grpc_status)

    def trailers(self, stream: _Stream, grpc_status: int = 0) -> None:
        self.headers(stream.id, [(b"grpc-status", str(grpc_status).encode())], end_stream=True)

    # --- reading ------------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._expect_preface()
            behaviour = self.prover.prove
            hello = frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE,
                                                      0 if behaviour == "early_ok" else LARGEST_WINDOW))
            if behaviour != "early_ok":
                hello += window_update(0, LARGEST_WINDOW - DEFAULT_WINDOW)
            self.send(hello)
            while not self.prover.stopped.is_set():
                self._read_frames()
        except _Closed:
            pass
        finally:
            self._close()

    def _recv(self) -> bytes:
        while True:
            if self.prover.stopped.is_set() or self.closed:
                raise _Closed()
            try:
                chunk = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError as exc:
                raise _Closed() from exc
            if not chunk:
                raise _Closed()
            return chunk

    def _expect_preface(self) -> None:
        while len(self.buffer) < len(PREFACE):
            self.buffer += self._recv()
        if bytes(self.buffer[:len(PREFACE)]) != PREFACE:
            raise _Closed()
        del self.buffer[:len(PREFACE)]

    def _read_frames(self) -> None:
        self.buffer += self._recv()
        replenish: list[bytes] = []
        buffer, at = self.buffer, 0
        try:
            while len(buffer) - at >= 9:
                length = int.from_bytes(buffer[at:at + 3], "big")
                if len(buffer) - at < 9 + length:
                    break
                kind, flags = buffer[at + 3], buffer[at + 4]
                stream = int.from_bytes(buffer[at + 5:at + 9], "big") & 0x7FFFFFFF
                payload = bytes(buffer[at + 9:at + 9 + length])
                at += 9 + length
                if self._frame(kind, flags, stream, payload, replenish) == "stall":
                    if replenish:
                        self.reply(b"".join(replenish))
                    self.prover.stopped.wait()  # reads nothing more: the peer's sends fill the buffers and block
                    raise _Closed()
        finally:
            del buffer[:at]
        if replenish:
            self.reply(b"".join(replenish))

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, replenish: list[bytes]) -> str | None:
        if kind == SETTINGS and not flags & ACK:
            self._settings(payload)
            self.reply(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.reply(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            with self.cond:
                if stream_id == 0:
                    self.send_window += increment
                elif stream_id in self.streams:
                    self.streams[stream_id].send_window += increment
                self.cond.notify_all()
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                with self.cond:
                    stream.reset = True
                    if stream.call is not None:
                        stream.call.reset = True
                    self.cond.notify_all()
        elif kind == HEADERS:
            block = payload
            if flags & PADDED:
                block = block[1:len(block) - block[0]]
            if flags & PRIORITY_FLAG:
                block = block[5:]
            self.block, self.block_stream, self.block_flags = bytearray(block), stream_id, flags
            if flags & END_HEADERS:
                return self._header_block()
        elif kind == CONTINUATION and self.block is not None:
            self.block += payload
            if flags & END_HEADERS:
                return self._header_block()
        elif kind == DATA:
            stream = self.streams.get(stream_id)
            body = payload
            if flags & PADDED and body:
                body = body[1:len(body) - body[0]]
            opening = self.prover.prove != "early_ok" and len(payload) > 0
            if opening:  # the connection's window, whatever the stream
                replenish.append(window_update(0, len(payload)))
            if stream is not None and not stream.ended:
                if len(stream.body) < 64 * MiB:  # the calls tests send are smaller; a larger one is only counted
                    stream.body += body
                if stream.call is not None:
                    stream.call.received += len(body)
                if opening:
                    replenish.append(window_update(stream_id, len(payload)))
                if flags & END_STREAM:
                    self._request_ended(stream)
        return None

    def _settings(self, payload: bytes) -> None:
        for at in range(0, len(payload) - len(payload) % 6, 6):
            ident, value = struct.unpack(">HI", payload[at:at + 6])
            if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                with self.cond:
                    for stream in self.streams.values():
                        stream.send_window += value - self.peer_initial
                    self.peer_initial = value
                    self.cond.notify_all()

    def _header_block(self) -> str | None:
        assert self.block is not None
        fields = {bytes(name): bytes(value) for name, value in self.decoder.decode(bytes(self.block), raw=True)}
        stream_id, flags, self.block = self.block_stream, self.block_flags, None
        if stream_id in self.streams:  # the caller's trailers (gRPC clients send none)
            return None
        with self.cond:
            stream = _Stream(id=stream_id, path=fields.get(b":path", b"").decode("latin-1"),
                             send_window=self.peer_initial)
            self.streams[stream_id] = stream
        if stream.path == wire.PROVE:
            stream.call = ProveCall(connection=self.number, stream=stream_id)
            with self.prover.lock:
                self.prover.calls.append(stream.call)
            if self.prover.prove == "stall":
                return "stall"
            if self.prover.prove == "early_ok":
                stream.call.received_at_answer = stream.call.received
                self.answer(stream, proof_answer("", b"fake-proof: the request never came"))
        if flags & END_STREAM:
            self._request_ended(stream)
        return None

    def _request_ended(self, stream: _Stream) -> None:
        stream.ended = True
        if stream.path == wire.GET_STATUS:
            self._status(stream)
            return
        if stream.path != wire.PROVE:
            self.headers(stream.id, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                     (b"grpc-status", b"12")], end_stream=True)  # UNIMPLEMENTED
            return
        call = stream.call
        assert call is not None
        call.ended = True
        try:
            call.request_id = wire.ProveRequest.FromString(bytes(stream.body[5:])).submit.request_id
        except Exception:  # noqa: BLE001 - a request it cannot read is answered all the same
            call.request_id = ""
        stream.body = bytearray()
        behaviour, request_id = self.prover.prove, call.request_id
        if behaviour == "good":
            self.answer(stream, proof_answer(request_id, b"proof:" + request_id.encode()))
            with self.prover.lock:
                self.prover.completed += 1
        elif behaviour == "two":
            first = proof_answer(request_id, b"hostile-first:" + request_id.encode())
            second = proof_answer(request_id, b"hostile-second:" + request_id.encode())
            self.headers(stream.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            self.data(stream, prefix(len(first)) + first + prefix(len(second)) + second)
            self.trailers(stream)
        elif behaviour in ("prefix_over", "prefix_under"):
            message = proof_answer(request_id, b"hostile-lying:" + request_id.encode() + b"." * 200)
            claimed = len(message) + 100 if behaviour == "prefix_over" else len(message) - 100
            self.headers(stream.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            self.data(stream, prefix(claimed) + message)
            self.trailers(stream)
        elif behaviour in ("huge", "flood"):
            self.prover.start_thread(self._huge if behaviour == "huge" else self._flood, stream, name=behaviour)

    def _status(self, stream: _Stream) -> None:
        kind = self.prover.status
        if kind == "garbage":
            message = GARBAGE_STATUS
        else:
            message = status_answer(MAX_COMPLETED if kind == "max_completed" else self.prover.completed,
                                    self.prover.label)
        self.answer(stream, message)

    def _huge(self, stream: _Stream) -> None:
        head, proof = huge_answer_head(stream.call.request_id if stream.call else "", self.prover.huge)
        filler = bytes(range(256)) * (FRAME // 256)
        try:
            self.headers(stream.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            self.data(stream, prefix(len(head) + proof) + head)
            left = proof
            while left:
                chunk = filler[:min(left, FRAME)]
                self.data(stream, chunk)
                left -= len(chunk)
                with self.prover.lock:
                    self.prover.answer_bytes += len(chunk)
            self.trailers(stream)
            self.prover.huge_ended = "sent whole"
        except _Closed:
            self.prover.huge_ended = "stopped" if self.prover.stopped.is_set() else "closed by the peer"

    def _flood(self, stream: _Stream) -> None:
        """HEADERS with no END_HEADERS, then CONTINUATION frames without end: a valid HPACK block (never-indexed
        literals, so the peer's table is untouched) that only grows."""
        with self.send_lock:
            start = self.encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
        piece = hpack.Encoder().encode([NeverIndexedHeaderTuple(b"x-flood", b"f" * (FRAME - 32))], huffman=False)
        self.flooding = True
        try:
            self.send(frame(HEADERS, 0, stream.id, start))
            while self.prover.flood_bytes < self.prover.flood_cap:
                self.send(frame(CONTINUATION, 0, stream.id, piece))
                with self.prover.lock:
                    self.prover.flood_bytes += len(piece)
            self.prover.flood_ended = "cap"
        except _Closed:
            self.prover.flood_ended = "stopped" if self.prover.stopped.is_set() else "closed by the peer"

    def _close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self.prover.lock:
            self.prover.closed_connections += 1


class HostileProver:
    """A loopback HTTP/2 server standing in for a cuzk daemon that misbehaves as `prove` and `status` say."""

    def __init__(self, prove: str = "good", status: str = "good", *, label: str = "hostile", huge: int = 200 * MiB,
                 flood_cap: int = 256 * MiB) -> None:
        assert prove in PROVE_BEHAVIOURS and status in STATUS_BEHAVIOURS, (prove, status)
        self.prove, self.status, self.label, self.huge, self.flood_cap = prove, status, label, huge, flood_cap
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.calls: list[ProveCall] = []
        self.completed = 0
        self.answer_bytes = 0  # bytes of the huge answer's proof sent
        self.huge_ended: str | None = None
        self.flood_bytes = 0
        self.flood_ended: str | None = None
        self.closed_connections = 0
        self._connections: list[_Connection] = []
        self._threads: list[threading.Thread] = []
        self.listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if prove == "stall":  # a small receive buffer (and TCP window), so a peer's sends block soon
            self.listen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.listen.bind(("127.0.0.1", 0))
        self.listen.listen(64)
        self.listen.settimeout(POLL_S)
        self.port = self.listen.getsockname()[1]
        self.start_thread(self._accept, name="accept")

    def start_thread(self, target, *args, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=f"hostile-{self.label}-{name}", daemon=True)
        with self.lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        number = 0
        while not self.stopped.is_set():
            try:
                sock, _ = self.listen.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(POLL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            number += 1
            connection = _Connection(self, sock, number)
            with self.lock:
                self._connections.append(connection)
            self.start_thread(connection.run, name=f"conn-{number}")

    def prove_calls(self) -> list[ProveCall]:
        with self.lock:
            return list(self.calls)

    def stop(self) -> list[str]:
        """Stop every thread; the names of any still running after a bounded wait (none, normally)."""
        self.stopped.set()
        try:
            self.listen.close()
        except OSError:
            pass
        with self.lock:
            connections, threads = list(self._connections), list(self._threads)
        for connection in connections:
            connection._close()
        for thread in threads:
            thread.join(timeout=5)
        for connection in connections:
            connection.sock.close()
        return [thread.name for thread in threads if thread.is_alive()]


class GoodProver:
    """A well-behaved cuzk daemon: a grpcio server whose Prove answers `good-proof:<request id>`, and whose
    GetStatus gives `completed` proofs, one GPU named for it and a porep queue (pending 1, in progress 2)."""

    def __init__(self, label: str = "good", completed: int = 7) -> None:
        self.label, self.completed = label, completed
        self.seen: list[str] = []
        self.lock = threading.Lock()

        def prove(data, context):
            request_id = wire.ProveRequest.FromString(data).submit.request_id
            with self.lock:
                self.seen.append(request_id)
            return proof_answer(request_id, good_proof(request_id))

        def status(data, context):
            return status_answer(self.completed, self.label, queue=(1, 2))

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(status)})
        self.executor = futures.ThreadPoolExecutor(8, thread_name_prefix=f"good-{label}")
        self.server = grpc.server(self.executor, handlers=[handler],
                                  options=[("grpc.max_receive_message_length", wire.DAEMON_MAX_MESSAGE)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(10)
        self.executor.shutdown(wait=True, cancel_futures=True)


def good_proof(request_id: str) -> bytes:
    return b"good-proof:" + request_id.encode()
