"""The router's front end against a differential oracle: the `h2` library's server-side state machine
(python-hyper, `H2Connection(client_side=False)`), written by others from the same RFC.

Hypothesis generates frame sequences: a valid start (the preface, SETTINGS, both acknowledged) and then steps
drawn from valid requests and their mutations: stream ids (next, skipped, even, lower, reused, 0, idle), flags
(END_STREAM, PADDED with good and bad padding, PRIORITY), lengths, SETTINGS values in and out of range, window
increments (0, overflowing), header blocks made with hpack (split over CONTINUATION frames, malformed requests,
undecodable bytes), frames interleaved into header blocks, unknown frame types, and frame headers mutated one
field at a time. Each sequence, ended by a PING, is fed to h2 frame by frame and sent to the router over a
socket; each side's verdict is the first of: a connection error and its code (h2 raises; the router sends
GOAWAY), a stream error and its code (RST_STREAM), or accepted (the final PING answered).

Compared: every verdict, code and stream, wherever RFC 9113 leaves no choice. Not compared, because the RFC
allows either answer (each a `skipped` class below, with its section):
- a stream error where the other side gave a connection error of the same code (§5.4.1: an endpoint MAY treat
  a stream error as a connection error), where the frame is one the RFC lets end only its stream (DATA,
  WINDOW_UPDATE or PRIORITY on an open stream, a malformed request): h2 raises for every error it finds;
- frames on a stream after the caller ended it (END_STREAM) or reset it (§5.1: "half-closed (remote)" answers
  STREAM_CLOSED, but once the router has answered the stream is "closed", where frames are ignored for a while
  or are a connection error, and when the router answers is its own timing; §6.4, §5.4.2: frames on a recently
  reset stream may be ignored);
- a HEADERS reusing an id already used: PROTOCOL_ERROR (§5.1.1) or STREAM_CLOSED (§5.1) — h2 says the latter;
- streams past SETTINGS_MAX_CONCURRENT_STREAMS: REFUSED_STREAM or PROTOCOL_ERROR (§5.1.2), and what counts as
  open depends on whether the router has answered;
- DATA past a window the router may have opened meanwhile (§6.9: when it sends WINDOW_UPDATE is its choice);
- the router's own refusals a valid sequence may meet: REFUSED_STREAM on a stream it did not process (§8.7),
  ENHANCE_YOUR_CALM (§10.5), INTERNAL_ERROR/CANCEL on a stream (a call it ends for its own reasons);
- h2's own limits, which the RFC does not set: more than 64 CONTINUATION frames in a block, its header list
  limit (DenialOfServiceError), its concurrent stream count (TooManyStreamsError);
- a sequence whose last frame is cut (a mutated length): neither side can decide before more bytes come.
- a frame of type 0xa (ALTSVC, RFC 7838): an extension h2 parses, which the router ignores as any unknown type.
Known h2 departures from the RFC, corrected before comparing: an HPACK decoding error is PROTOCOL_ERROR in h2
and COMPRESSION_ERROR in the RFC (§4.3); a SETTINGS ACK with a payload is PROTOCOL_ERROR in h2 and
FRAME_SIZE_ERROR in the RFC (§6.5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import hpack
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import PingReceived
from h2.exceptions import DenialOfServiceError, ProtocolError, TooManyStreamsError
from h2.settings import Settings
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
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    INTERNAL_ERROR,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    MiB,
    Peer,
    RouterProcess,
    frame,
    good_status,
    grpc_message,
    request_fields,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # a router process on loopback

EXAMPLES = 100  # each of the four properties below: ~25 ms a sequence on the router, most of it the connection
ORACLE = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])  # `oracle`: checked once a test
TOKEN = b"oracle!!"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    router = RouterProcess(tmp_path_factory.mktemp("oracle-router"))
    yield router
    router.stop()


@pytest.fixture
def oracle(router):
    """Run one sequence on both sides; after the test the router still serves and logged no traceback."""
    since = len(router.log())
    yield lambda steps, mutation=None: _check(router, steps, mutation)
    assert router.alive(), router.log()
    good_status(router.port)
    assert not router.tracebacks(since), router.tracebacks(since)[0]


# --- the sequences ----------------------------------------------------------------------------------------------

VALID = "valid"
# requests RFC 9113 calls malformed (§8.1.1: a stream error of type PROTOCOL_ERROR)
MALFORMED = {
    "uppercase name": lambda f: f + [("X-Upper", "1")],  # §8.2.1
    "no :path": lambda f: [x for x in f if x[0] != ":path"],  # §8.3.1
    "no :method": lambda f: [x for x in f if x[0] != ":method"],
    "pseudo after regular": lambda f: f[1:] + f[:1],  # §8.3
    "connection header": lambda f: f + [("connection", "keep-alive")],  # §8.2.2
    "te not trailers": lambda f: [x for x in f if x[0] != "te"] + [("te", "gzip")],  # §8.2.2
    "unknown pseudo": lambda f: [(":bogus", "1")] + f,  # §8.3
    "two :path": lambda f: f[:3] + [(":path", "/x")] + f[3:],  # §8.3.1
    "response pseudo": lambda f: [(":status", "200")] + f,  # §8.3
    "empty :path": lambda f: [(k, "" if k == ":path" else v) for k, v in f],  # §8.3.1
}
RAW_BLOCKS = {  # header blocks no HPACK decoder can read (§4.3: COMPRESSION_ERROR)
    "index 0": b"\x80",
    "index past the tables": b"\xff\xff\xff\xff\x0f",
    "cut literal": b"\x40\x0aabc",
    "table size over the limit": b"\x3f\xe1\xff\xff\x0f",
    "size update after a field": b"\x82\x20",
}

ids = st.sampled_from(["next", "next", "next", "skip", "even", "lower", "reuse", "zero"])
on_stream = st.sampled_from(["open", "open", "open", "idle", "zero", "even"])
padding = st.one_of(st.none(), st.integers(0, 20), st.just("bad"))


def headers_step(variants=(VALID,)):
    return st.tuples(st.just("headers"), ids, st.booleans(), st.integers(0, 2), padding, st.booleans(),
                     st.sampled_from(variants))


data_step = st.tuples(st.just("data"), on_stream, st.integers(0, 600), st.booleans(), padding)
window_step = st.tuples(st.just("window_update"), st.sampled_from(["conn", "open", "idle"]),
                        st.sampled_from([0, 1, 100, 65535, (1 << 31) - 1, 1 << 31]), st.sampled_from([4, 4, 4, 3, 5]))
ping_step = st.tuples(st.just("ping"), st.sampled_from([8, 8, 8, 0, 3, 9]), st.sampled_from([0, 0, 1]), st.booleans())
priority_step = st.tuples(st.just("priority"), st.sampled_from(["open", "idle", "zero", "next"]),
                          st.sampled_from([5, 5, 4, 6]))
rst_step = st.tuples(st.just("rst"), st.sampled_from(["open", "idle", "zero"]), st.sampled_from([4, 4, 3]),
                     st.sampled_from([NO_ERROR, CANCEL, PROTOCOL_ERROR]))
# 0xa is ALTSVC (RFC 7838), an extension h2 parses and the router ignores as it does any type it does not know
unknown_step = st.tuples(st.just("unknown"), st.integers(11, 255), st.integers(0, 64), st.sampled_from([0, 1, 3]))
continuation_step = st.tuples(st.just("continuation"), st.sampled_from(["open", "next", "zero"]))
push_step = st.tuples(st.just("push_promise"), st.sampled_from(["open", "next"]))
setting_value = st.one_of(
    st.tuples(st.just(1), st.sampled_from([0, 4096, 1 << 20])),
    st.tuples(st.just(2), st.sampled_from([0, 1, 2])),
    st.tuples(st.just(3), st.sampled_from([0, 1, 100, (1 << 32) - 1])),
    st.tuples(st.just(4), st.sampled_from([0, 1, 65535, (1 << 31) - 1, 1 << 31, (1 << 32) - 1])),
    st.tuples(st.just(5), st.sampled_from([0, 100, 16383, 16384, (1 << 24) - 1, 1 << 24])),
    st.tuples(st.just(6), st.sampled_from([0, 100, 1 << 16, (1 << 32) - 1])),
    st.tuples(st.integers(7, 0xFFFF), st.integers(0, (1 << 32) - 1)),  # unknown: ignored (§6.5.2)
)
settings_step = st.tuples(st.just("settings"), st.lists(setting_value, max_size=4), st.booleans(),
                          st.sampled_from([0, 0, 0, 0, 1, 5]), st.sampled_from([0, 0, 0, 1]))
trailers_step = st.tuples(st.just("trailers"), st.booleans(), st.sampled_from([VALID, "pseudo in trailers"]))
raw_block_step = st.tuples(st.just("raw_block"), st.sampled_from(sorted(RAW_BLOCKS)))

frame_steps = st.one_of(headers_step(), headers_step(), data_step, data_step, window_step, ping_step, priority_step,
                        rst_step, unknown_step, continuation_step, push_step)
settings_steps = st.one_of(settings_step, settings_step, settings_step, headers_step(), data_step, window_step)
header_steps = st.one_of(headers_step((VALID, *sorted(MALFORMED))), headers_step((VALID, *sorted(MALFORMED))),
                         trailers_step, raw_block_step, data_step, ping_step, continuation_step)
valid_steps = st.one_of(headers_step(), st.tuples(st.just("data"), st.just("open"), st.integers(0, 600),
                                                  st.booleans(), st.none()),
                        st.tuples(st.just("window_update"), st.sampled_from(["conn", "open"]), st.just(100),
                                  st.just(4)),
                        st.tuples(st.just("ping"), st.just(8), st.just(0), st.just(False)))
mutations = st.tuples(st.integers(0, 1000), st.sampled_from(["type", "flags", "stream", "length", "payload"]),
                      st.integers(0, (1 << 32) - 1))


@dataclass
class Meta:
    """What the builder knows of one frame it made, for telling which RFC choices apply to it."""
    kind: int
    stream: int
    after_end: bool = False  # on a stream the caller ended or reset before (§5.1: either answer)
    stream_error_ok: bool = False  # the RFC lets this frame's error end only its stream
    reused: bool = False  # a HEADERS on an id used before: PROTOCOL_ERROR or STREAM_CLOSED
    over_limit: bool = False  # more streams open than the router allows
    window: bool = False  # past a window the router may have opened meanwhile


class Builder:
    """Steps into frames, with the stream ids each step's choice means in this sequence."""

    def __init__(self, server: dict[int, int], credit: int):
        self.encoder = hpack.Encoder()
        self.server = server
        self.limit = server.get(MAX_CONCURRENT_STREAMS, 1 << 31)
        self.stream_window = min(server.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW), DEFAULT_WINDOW)
        self.credit = credit
        self.highest, self.opened, self.ended = 0, [], set()
        self.sent: dict[int, int] = {}
        self.total = 0
        self.chunks: list[bytes] = []
        self.metas: list[Meta] = []

    def add(self, data: bytes, meta: Meta) -> None:
        meta.after_end = meta.after_end or (meta.stream in self.ended and meta.kind != PRIORITY)
        self.chunks.append(data)
        self.metas.append(meta)

    def new_id(self, choice: str) -> int:
        top = self.highest
        if choice == "skip":
            return top + 4 if top else 3
        if choice == "even":
            return top + 1 if top % 2 else top + 2
        if choice == "lower":
            free = [s for s in range(1, top, 2) if s not in self.opened]
            return free[0] if free else (self.opened[0] if self.opened else 1)
        if choice == "reuse":
            return self.opened[0] if self.opened else top + 2 if top else 1
        if choice == "zero":
            return 0
        return top + 2 if top else 1

    def on(self, choice: str) -> int:
        live = [s for s in self.opened if s not in self.ended]
        if choice == "open":
            return live[-1] if live else (self.opened[-1] if self.opened else self.highest + 2 if self.highest else 1)
        if choice in ("zero", "conn"):
            return 0
        if choice == "even":
            return (self.highest // 2 + 1) * 2
        if choice == "next":
            return self.highest + 2 if self.highest else 1
        return self.highest + 2 if self.highest else 1  # idle: never opened

    def headers(self, choice, end, continuations, pad, priority, variant) -> None:
        stream = self.new_id(choice)
        fields = request_fields()
        if variant in MALFORMED:
            fields = MALFORMED[variant](fields)
        block = self.encoder.encode(fields)
        self._block(HEADERS, stream, block, end, continuations, pad, priority,
                    Meta(HEADERS, stream, stream_error_ok=variant in MALFORMED and stream > self.highest,
                         reused=0 < stream <= self.highest))
        if stream > self.highest and stream % 2:
            self.highest = stream
            self.opened.append(stream)
        if end:
            self.ended.add(stream)
        if len([s for s in self.opened if s not in self.ended]) > self.limit:
            self.metas[-1].over_limit = True

    def _block(self, kind, stream, block, end, continuations, pad, priority, meta) -> None:
        cut = [block[len(block) * n // (continuations + 1):len(block) * (n + 1) // (continuations + 1)]
               for n in range(continuations + 1)]
        first = cut[0]
        flags = (END_STREAM if end else 0) | (END_HEADERS if continuations == 0 else 0)
        if priority:
            flags |= PRIORITY_FLAG
            first = struct.pack(">IB", 0, 15) + first
        if pad is not None:
            flags |= PADDED
            first = (bytes((len(first[:254]) + 1,)) + first[:254]) if pad == "bad" else (
                bytes((pad,)) + first + bytes(pad))  # bad: the padding as long as the frame (§6.2)
        self.add(frame(kind, flags, stream, first), meta)
        for n, piece in enumerate(cut[1:], 1):
            self.add(frame(CONTINUATION, END_HEADERS if n == continuations else 0, stream, piece),
                     Meta(CONTINUATION, stream, stream_error_ok=meta.stream_error_ok, reused=meta.reused))

    def data(self, choice, length, end, pad) -> None:
        stream = self.on(choice)
        first = stream not in self.sent
        payload = (grpc_message(b"")[:1] + struct.pack(">I", MiB) + bytes(length))[:max(length, 5)] if first else bytes(
            length)  # a 1 MiB message that never completes: no side answers the call early
        flags = END_STREAM if end else 0
        if pad is not None:
            flags |= PADDED
            payload = (bytes((len(payload[:254]) + 1,)) + payload[:254]) if pad == "bad" else (
                bytes((pad,)) + payload + bytes(pad))  # bad: the padding as long as the frame (§6.1)
        self.sent[stream] = self.sent.get(stream, 0) + len(payload)
        self.total += len(payload)
        idle = stream not in self.opened
        self.add(frame(DATA, flags, stream, payload),
                 Meta(DATA, stream, stream_error_ok=stream != 0 and not idle and pad != "bad",
                      window=self.sent[stream] > self.stream_window or self.total > self.credit))
        if end:
            self.ended.add(stream)

    def window_update(self, choice, increment, length) -> None:
        stream = self.on(choice)
        payload = struct.pack(">I", increment)[:length] + bytes(max(0, length - 4))
        self.add(frame(WINDOW_UPDATE, 0, stream, payload),
                 Meta(WINDOW_UPDATE, stream, stream_error_ok=stream != 0 and stream in self.opened and length == 4))

    def step(self, step) -> None:
        kind, *args = step
        if kind == "headers":
            self.headers(*args)
        elif kind == "data":
            self.data(*args)
        elif kind == "window_update":
            self.window_update(*args)
        elif kind == "ping":
            length, stream, ack = args
            self.add(frame(PING, 1 if ack else 0, stream, b"p" * length), Meta(PING, stream))
        elif kind == "priority":
            choice, length = args
            stream = self.on(choice)
            payload = (struct.pack(">IB", 0, 15) + b"\0")[:length]
            self.add(frame(PRIORITY, 0, stream, payload), Meta(PRIORITY, stream, stream_error_ok=stream != 0))
        elif kind == "rst":
            choice, length, code = args
            stream = self.on(choice)
            self.add(frame(RST_STREAM, 0, stream, struct.pack(">I", code)[:length]), Meta(RST_STREAM, stream))
            if stream in self.opened:
                self.ended.add(stream)
        elif kind == "unknown":
            kind_id, length, stream = args
            self.add(frame(kind_id, 0xFF, stream, bytes(length)), Meta(kind_id, stream))
        elif kind == "continuation":
            stream = self.on(args[0])
            self.add(frame(CONTINUATION, END_HEADERS, stream, self.encoder.encode([("x-a", "1")])),
                     Meta(CONTINUATION, stream))
        elif kind == "push_promise":
            stream = self.on(args[0])
            self.add(frame(PUSH_PROMISE, END_HEADERS, stream, struct.pack(">I", 2) + self.encoder.encode(
                request_fields())), Meta(PUSH_PROMISE, stream))
        elif kind == "settings":
            pairs, ack, extra, stream = args
            payload = b"".join(struct.pack(">HI", key, value) for key, value in pairs) + bytes(extra)
            self.add(frame(SETTINGS, 1 if ack else 0, stream, b"" if ack and not extra else payload),
                     Meta(SETTINGS, stream))
            if not ack and not stream and not extra:
                for key, value in pairs:  # the router answers within the caller's windows from now on
                    if key == INITIAL_WINDOW_SIZE and value == 0:
                        self.metas[-1].window = True
        elif kind == "trailers":  # on the latest open stream; with none, a request with no pseudo-header (§8.3.1)
            end, variant = args
            live = [s for s in self.opened if s not in self.ended]
            stream = live[-1] if live else self.new_id("next")
            fields = [("x-trailer", "1")] + ([(":path", "/x")] if variant != VALID else [])
            self._block(HEADERS, stream, self.encoder.encode(fields), end, 0, None, False,
                        Meta(HEADERS, stream, stream_error_ok=True))
            if not live:
                self.highest = stream
                self.opened.append(stream)
            if end:
                self.ended.add(stream)
        elif kind == "raw_block":
            stream = self.new_id("next")
            self.add(frame(HEADERS, END_HEADERS | END_STREAM, stream, RAW_BLOCKS[args[0]]), Meta(HEADERS, stream))
            self.highest = stream
            self.opened.append(stream)
            self.ended.add(stream)


def mutate(chunks: list[bytes], metas: list[Meta], mutation) -> tuple[list[bytes], list[Meta], bool]:
    """One field of one frame's header (or a payload byte) changed; the metas of a changed frame are unknown
    (any class may apply), and a changed length leaves the frames' boundaries unknown (the chunks are joined)."""
    at, what, value = mutation
    at %= len(chunks) - 1  # never the final PING: the router's answer to it is how it says "accepted"
    raw = bytearray(chunks[at])
    if what == "type":
        raw[3] = value & 0xFF
    elif what == "flags":
        raw[4] = value & 0xFF
    elif what == "stream":
        raw[5:9] = struct.pack(">I", value)
    elif what == "payload" and len(raw) > 9:
        raw[9 + value % (len(raw) - 9)] ^= 1 << (value >> 8) % 8
    elif what == "length":
        raw[0:3] = struct.pack(">I", value % (len(raw) + 64))[1:]
    chunks = chunks[:at] + [bytes(raw)] + chunks[at + 1:]
    return chunks, metas, what == "length"


# --- the two sides' verdicts ------------------------------------------------------------------------------------


@dataclass
class Said:
    kind: str  # accepted, connection, stream, incomplete (h2 only), closed/silent (the router only)
    code: int | None = None
    stream: int | None = None
    at: int | None = None  # the frame h2 found the error in
    skip: str | None = None  # an h2 limit the RFC does not set

    def __str__(self) -> str:
        code = f" {CODE_NAMES.get(self.code, self.code)}" if self.code is not None else ""
        return f"{self.kind}{code}" + (f" on stream {self.stream}" if self.stream else "")


def h2_side(server: dict[int, int], credit: int, chunks: list[bytes], joined: bool) -> Said:
    values = {MAX_CONCURRENT_STREAMS: server.get(MAX_CONCURRENT_STREAMS, (1 << 32) - 1),
              MAX_HEADER_LIST_SIZE: server.get(MAX_HEADER_LIST_SIZE, 1 << 31),
              INITIAL_WINDOW_SIZE: server.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW),
              MAX_FRAME_SIZE: server.get(MAX_FRAME_SIZE, DEFAULT_FRAME),
              HEADER_TABLE_SIZE: server.get(HEADER_TABLE_SIZE, 4096)}
    conn = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    conn.local_settings = Settings(client=False, initial_values=values)
    conn.max_inbound_frame_size = values[MAX_FRAME_SIZE]
    conn.decoder.max_header_list_size = values[MAX_HEADER_LIST_SIZE]
    conn.decoder.max_allowed_table_size = values[HEADER_TABLE_SIZE]
    conn.initiate_connection()
    conn.receive_data(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, 1, 0))
    if credit > DEFAULT_WINDOW:
        conn.increment_flow_control_window(credit - DEFAULT_WINDOW)
    conn.data_to_send()
    pieces = [b"".join(chunks)] if joined else chunks
    for at, piece in enumerate(pieces):
        try:
            events = conn.receive_data(piece)
        except ProtocolError as exc:
            skip = None
            if isinstance(exc, (DenialOfServiceError, TooManyStreamsError)) or "continuation frames" in str(exc):
                skip = f"h2's own limit ({type(exc).__name__}: {exc})"
            code = int(exc.error_code)
            if "decoding header block" in str(exc):
                code = COMPRESSION_ERROR  # h2 says PROTOCOL_ERROR; RFC 9113 §4.3 COMPRESSION_ERROR
            raw = piece if not joined else b""
            if len(raw) > 9 and raw[3] == SETTINGS and raw[4] & 1:
                code = FRAME_SIZE_ERROR  # an ACK with a payload: h2 says PROTOCOL_ERROR; RFC 9113 §6.5 FRAME_SIZE_ERROR
            return Said("connection", code, at=None if joined else at, skip=skip)
        out = conn.data_to_send()
        while len(out) >= 9:
            length = int.from_bytes(out[:3], "big")
            if out[3] == RST_STREAM:
                return Said("stream", int.from_bytes(out[9:13], "big"), int.from_bytes(out[5:9], "big") & 0x7FFFFFFF,
                            at=None if joined else at)
            out = out[9 + length:]
        if any(isinstance(e, PingReceived) and e.ping_data == TOKEN for e in events):
            return Said("accepted")
    return Said("incomplete")


def router_side(router: RouterProcess, chunks: list[bytes]) -> tuple[Said, Peer]:
    caller = Peer(router.port)
    caller.send(b"".join(chunks))
    verdict = caller.verdict(timeout=3.0, token=TOKEN)
    caller.close()
    if caller.errors:
        kind, code, stream = caller.errors[0]
        return Said(kind, code, stream or None), caller
    return Said(verdict.kind), caller


def _check(router: RouterProcess, steps, mutation=None) -> None:
    probe = Peer(router.port)
    server, credit = dict(probe.server_settings), probe.connection_credit
    probe.close()
    build = Builder(server, credit)
    for step in steps:
        build.step(step)
    build.add(frame(PING, 0, 0, TOKEN), Meta(PING, 0))
    chunks, metas, joined = build.chunks, build.metas, False
    if mutation is not None:
        chunks, metas, joined = mutate(chunks, metas, mutation)
    if any(len(chunk) > 3 and chunk[3] == 0xA for chunk in chunks):
        event("skipped: ALTSVC, an extension h2 parses")
        return
    h2 = h2_side(server, credit, chunks, joined)
    if h2.kind == "incomplete" or h2.skip:
        event(f"skipped: {'the last frame cut' if h2.kind == 'incomplete' else 'an h2 limit'}")
        return
    said, caller = router_side(router, chunks)
    reason = disagreement(h2, said, metas, joined, mutation is not None)
    event(f"h2 {h2.kind}" if reason is None else "differs")
    assert reason is None, f"{reason}\nframes: {[c[:40].hex() for c in chunks]}\nrouter sent: {caller.frames[-6:]}"


def disagreement(h2: Said, router: Said, metas: list[Meta], joined: bool, mutated: bool) -> str | None:
    """None when the two verdicts agree or the RFC allows both; else what differs."""
    upto = metas if h2.at is None else metas[:h2.at + 1]
    if joined or mutated:
        upto = metas  # the changed frame may be any of them: every class its sequence touches applies
    if any(m.after_end or m.over_limit or m.window for m in upto):
        event("skipped: after the caller ended a stream, past a limit or a window")
        return None  # the module docstring says why
    said = f"h2: {h2}; the router: {router}"
    if router.kind == "connection" and router.code == ENHANCE_YOUR_CALM:
        return None  # §10.5: the router's own defence
    if h2.kind == "accepted":
        if router.kind == "accepted":
            return None
        if router.kind == "stream" and router.code in (REFUSED_STREAM, INTERNAL_ERROR, CANCEL):
            return None  # §8.7 and the router's own reasons to end a call
        return f"a sequence h2 accepts: {said}"
    if router.kind not in ("connection", "stream"):
        how = {"closed": " (closed without a GOAWAY)", "silent": " (no answer to the final PING)"}.get(router.kind, "")
        return f"{said}{how}"
    codes = {h2.code}
    frame_meta = metas[h2.at] if h2.at is not None and not joined else None
    if frame_meta is not None and frame_meta.reused or (mutated and any(m.reused for m in metas)):
        codes |= {PROTOCOL_ERROR, STREAM_CLOSED}
    if router.code not in codes:
        return f"the error codes differ: {said}"
    if h2.kind == router.kind == "connection":
        return None
    if h2.kind == "stream":  # the router may end the connection instead (§5.4.1), or the same stream
        return None if router.kind == "connection" or router.stream == h2.stream else f"another stream: {said}"
    # h2 ended the connection, the router only a stream: allowed where the RFC makes it a stream error
    if frame_meta is not None and frame_meta.stream_error_ok and router.stream == frame_meta.stream:
        return None
    if mutated and not joined and router.code in (PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR) and (
            frame_meta is not None and frame_meta.stream == router.stream and frame_meta.stream != 0):
        return None  # a changed frame on that stream: whether the RFC makes it a stream error is not known here
    return f"a connection error the RFC requires: {said}"


# --- the properties ----------------------------------------------------------------------------------------------


@ORACLE
@given(steps=st.lists(frame_steps, min_size=1, max_size=8))
def test_frame_sequences_get_h2s_verdict(oracle, steps):
    oracle(steps)


@ORACLE
@given(steps=st.lists(settings_steps, min_size=1, max_size=5))
def test_settings_get_h2s_verdict(oracle, steps):
    oracle(steps)


@ORACLE
@given(steps=st.lists(header_steps, min_size=1, max_size=6))
def test_header_blocks_and_requests_get_h2s_verdict(oracle, steps):
    oracle(steps)


@ORACLE
@given(steps=st.lists(valid_steps, min_size=1, max_size=6), mutation=mutations)
def test_mutated_frames_get_h2s_verdict(oracle, steps, mutation):
    oracle(steps, mutation)


def test_the_oracle_tells_a_valid_call_from_the_rfcs_must_cases(router):
    """The comparison's own check, on h2 alone: a valid request is accepted, and the MUST cases the conformance
    tests name come out as the RFC says (so a disagreement below is the router's, not the harness's)."""
    server, credit = {MAX_FRAME_SIZE: DEFAULT_FRAME}, DEFAULT_WINDOW
    encoder = hpack.Encoder()
    block = encoder.encode(request_fields())
    ping_ = frame(PING, 0, 0, TOKEN)
    cases = [
        ([frame(HEADERS, END_HEADERS, 1, block), ping_], "accepted", None),
        ([frame(HEADERS, 0, 1, block), ping_], "connection", PROTOCOL_ERROR),
        ([frame(WINDOW_UPDATE, 0, 0, bytes(4)), ping_], "connection", PROTOCOL_ERROR),
        ([frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 31)), ping_], "connection", FLOW_CONTROL_ERROR),
        ([frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 100)), ping_], "connection", PROTOCOL_ERROR),
        ([frame(DATA, 0, 0, b"x"), ping_], "connection", PROTOCOL_ERROR),
        ([frame(HEADERS, END_HEADERS, 2, block), ping_], "connection", PROTOCOL_ERROR),
        ([frame(PING, 0, 0, b"abc"), ping_], "connection", FRAME_SIZE_ERROR),
        ([frame(HEADERS, END_HEADERS, 1, b"\x80"), ping_], "connection", COMPRESSION_ERROR),
    ]
    for chunks, kind, code in cases:
        said = h2_side(server, credit, chunks, False)
        assert (said.kind, said.code) == (kind, code), (chunks, said)
