"""The HTTP/2 core (vastctl/route/h2_connection.py) from the client's side, as the router's connections to
provers and to its own grpcio server use it: frames in, events and errors out, no socket. The server's side
is held to the RFC over real sockets (tests/test_route_conformance.py, tests/test_route_h2_oracle.py)."""

from __future__ import annotations

import hpack
import pytest

from vastctl.route import h2
from vastctl.route import h2_connection as core


def frame(kind, flags, stream, payload=b""):
    return h2.Frame(kind, flags, stream, memoryview(payload) if kind == h2.DATA else payload)


def client(**knobs):
    connection = core.Connection(server=False, **knobs)
    connection.preface()
    return connection, connection.open_stream()


def fault(connection, *frames):
    with pytest.raises(h2.ConnectionFault) as raised:
        for each in frames:
            connection.receive(each)
    return raised.value.code


def answer_head(encoder, end=False):
    return frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0), 1,
                 encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]))


def test_a_server_may_not_push_nor_open_a_stream_nor_answer_one_never_opened():
    connection, _ = client()
    assert fault(connection, frame(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\0\0\0\2")) == h2.PROTOCOL_ERROR
    connection, _ = client()
    assert fault(connection, answer_head_on(connection, 2)) == h2.PROTOCOL_ERROR
    connection, _ = client()
    assert fault(connection, answer_head_on(connection, 3)) == h2.PROTOCOL_ERROR  # 1 is the only one open
    connection, _ = client()
    assert fault(connection, frame(h2.DATA, 0, 5, b"x")) == h2.PROTOCOL_ERROR


def answer_head_on(connection, stream):
    return frame(h2.HEADERS, h2.END_HEADERS, stream, hpack.Encoder().encode([(b":status", b"200")]))


def test_an_answer_past_the_window_we_gave_is_a_flow_control_error_and_one_within_it_is_data():
    connection, stream = client(window=100, connection_window=h2.DEFAULT_WINDOW)
    encoder = hpack.Encoder()
    assert isinstance(connection.receive(answer_head(encoder)), core.Headers)
    event = connection.receive(frame(h2.DATA, 0, stream, b"x" * 100))
    assert isinstance(event, core.Data) and bytes(event.payload) == b"x" * 100 and event.flow == 100
    assert fault(connection, frame(h2.DATA, 0, stream, b"y")) == h2.FLOW_CONTROL_ERROR


def test_a_header_block_is_contiguous_capped_and_decoded_whole():
    connection, stream = client(max_header_list=1024)
    encoder = hpack.Encoder()
    block = encoder.encode([(b":status", b"200"), (b"x-pad", b"p" * 300)])
    assert connection.receive(frame(h2.HEADERS, 0, stream, block[:10])) is None
    assert fault(connection, frame(h2.PING, 0, 0, b"8 bytes!")) == h2.PROTOCOL_ERROR  # inside the block
    connection, stream = client(max_header_list=1024)
    connection.receive(frame(h2.HEADERS, 0, stream, b"\x00" * 10))
    flood = [frame(h2.CONTINUATION, 0, stream, b"\x00" * 400) for _ in range(3)]
    assert fault(connection, *flood) == h2.ENHANCE_YOUR_CALM
    connection, stream = client()
    connection.receive(frame(h2.HEADERS, 0, stream, block[:10]))
    event = connection.receive(frame(h2.CONTINUATION, h2.END_HEADERS, stream, block[10:]))
    assert isinstance(event, core.Headers) and (b"x-pad", b"p" * 300) in event.fields
    connection, stream = client()
    assert fault(connection, frame(h2.HEADERS, h2.END_HEADERS, stream, b"\xff\xff\xff\xff")) == h2.COMPRESSION_ERROR


@pytest.mark.parametrize(("setting", "value", "code"), [
    (h2.MAX_FRAME_SIZE, 0, h2.PROTOCOL_ERROR), (h2.MAX_FRAME_SIZE, 100, h2.PROTOCOL_ERROR),
    (h2.MAX_FRAME_SIZE, 1 << 24, h2.PROTOCOL_ERROR), (h2.INITIAL_WINDOW_SIZE, 1 << 31, h2.FLOW_CONTROL_ERROR),
    (h2.ENABLE_PUSH, 2, h2.PROTOCOL_ERROR)])
def test_settings_out_of_range_end_the_connection(setting, value, code):
    connection, _ = client()
    payload = setting.to_bytes(2, "big") + value.to_bytes(4, "big")
    assert fault(connection, frame(h2.SETTINGS, 0, 0, payload)) == code


def test_settings_come_into_force_only_once_applied_after_their_acknowledgement():
    connection, stream = client()
    payload = h2.MAX_FRAME_SIZE.to_bytes(2, "big") + (1 << 20).to_bytes(4, "big") + \
        h2.INITIAL_WINDOW_SIZE.to_bytes(2, "big") + (1 << 20).to_bytes(4, "big")
    event = connection.receive(frame(h2.SETTINGS, 0, 0, payload))
    assert isinstance(event, core.Settings) and event.values == {h2.MAX_FRAME_SIZE: 1 << 20,
                                                                  h2.INITIAL_WINDOW_SIZE: 1 << 20}
    assert connection.take_out() == [h2.frame(h2.SETTINGS, h2.ACK, 0)]
    with connection.cond:
        assert connection.take(stream, 1 << 20) == h2.DEFAULT_FRAME  # the old frame size still
    connection.apply_settings()
    connection.receive(frame(h2.WINDOW_UPDATE, 0, 0, (1 << 20).to_bytes(4, "big")))
    with connection.cond:
        assert connection.take(stream, 1 << 20) == (1 << 20) - h2.DEFAULT_FRAME  # what the stream's window left


def test_window_updates_of_zero_or_past_2_31_are_errors_on_their_stream_or_the_connection():
    connection, stream = client()
    event = connection.receive(frame(h2.WINDOW_UPDATE, 0, stream, b"\0\0\0\0"))
    assert event == core.Reset(stream, h2.PROTOCOL_ERROR, True)
    assert connection.take_out() == [h2.rst_stream(stream, h2.PROTOCOL_ERROR)]
    assert fault(connection, frame(h2.WINDOW_UPDATE, 0, 0, b"\0\0\0\0")) == h2.PROTOCOL_ERROR
    connection, stream = client()
    assert fault(connection, frame(h2.WINDOW_UPDATE, 0, 0, h2.LARGEST_WINDOW.to_bytes(4, "big"))) == \
        h2.FLOW_CONTROL_ERROR
    connection, stream = client()
    event = connection.receive(frame(h2.WINDOW_UPDATE, 0, stream, h2.LARGEST_WINDOW.to_bytes(4, "big")))
    assert event == core.Reset(stream, h2.FLOW_CONTROL_ERROR, True)


@pytest.mark.parametrize(("kind", "stream", "payload", "code"), [
    (h2.PING, 0, b"abc", h2.FRAME_SIZE_ERROR), (h2.PING, 1, b"8 bytes!", h2.PROTOCOL_ERROR),
    (h2.SETTINGS, 1, b"", h2.PROTOCOL_ERROR), (h2.SETTINGS, 0, b"abcde", h2.FRAME_SIZE_ERROR),
    (h2.RST_STREAM, 0, b"\0\0\0\0", h2.PROTOCOL_ERROR), (h2.RST_STREAM, 1, b"\0\0", h2.FRAME_SIZE_ERROR),
    (h2.GOAWAY, 1, b"\0" * 8, h2.PROTOCOL_ERROR), (h2.GOAWAY, 0, b"\0" * 7, h2.FRAME_SIZE_ERROR),
    (h2.WINDOW_UPDATE, 0, b"\0\0\1", h2.FRAME_SIZE_ERROR), (h2.DATA, 0, b"x", h2.PROTOCOL_ERROR),
    (h2.HEADERS, 0, b"", h2.PROTOCOL_ERROR), (h2.PRIORITY, 0, b"\0" * 5, h2.PROTOCOL_ERROR),
])
def test_frames_of_the_wrong_size_or_on_the_wrong_stream_end_the_connection(kind, stream, payload, code):
    connection, _ = client()
    assert fault(connection, frame(kind, 0, stream, payload)) == code


def test_a_goaway_below_our_stream_says_the_call_was_never_processed_and_a_ping_is_answered():
    connection, stream = client()
    event = connection.receive(frame(h2.GOAWAY, 0, 0, (0).to_bytes(4, "big") + h2.NO_ERROR.to_bytes(4, "big")))
    assert event == core.GoAway(0, h2.NO_ERROR) and connection.unprocessed() == [stream]
    connection.receive(frame(h2.PING, 0, 0, b"8 bytes!"))
    assert connection.take_out() == [h2.frame(h2.PING, h2.ACK, 0, b"8 bytes!")]


def test_frames_after_our_reset_are_ignored_but_still_count_against_the_connection_window():
    connection, stream = client(connection_window=h2.DEFAULT_WINDOW)
    connection.reset(stream, h2.CANCEL)
    assert connection.receive(answer_head(hpack.Encoder())) is None
    assert connection.receive(frame(h2.DATA, 0, stream, b"x" * 1000)) is None
    assert connection.take_out() == [h2.window_update(0, 1000)]  # given back: the stream is gone
