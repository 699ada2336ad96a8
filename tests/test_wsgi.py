"""serving/wsgi.py on its own: bodies read within limits, JSON and forms parsed, bearer tokens, method checks, the log."""

from __future__ import annotations

import io
import logging

import pytest

from vastctl.serving import wsgi
from vastctl.serving.wsgi import HTTPError


class Unread(io.BytesIO):
    """A body stream that fails the test if anything reads it."""

    def read(self, *args):
        raise AssertionError("the body was read")


def environ(body: bytes = b"", *, length: str | None = None, **extra) -> dict:
    return {"CONTENT_LENGTH": str(len(body)) if length is None else length, "wsgi.input": io.BytesIO(body), **extra}


def refusal(call, *args, **kwargs) -> tuple[int, str, list]:
    with pytest.raises(HTTPError) as info:
        call(*args, **kwargs)
    return info.value.status, info.value.message, info.value.headers


# --- bodies ------------------------------------------------------------------------------------------------


def test_a_body_is_read_exactly_to_its_content_length():
    assert wsgi.read_body(environ(b"abc"), 1024) == b"abc"
    assert wsgi.read_body({"wsgi.input": Unread()}, 1024) == b""  # no Content-Length: empty, nothing read
    assert wsgi.read_body(environ(b"", length=""), 1024) == b""


def test_a_body_at_the_limit_is_read_and_one_byte_over_is_413_unread():
    assert wsgi.read_body(environ(b"x" * 2048), 2048) == b"x" * 2048
    assert refusal(wsgi.read_body, {"CONTENT_LENGTH": "2049", "wsgi.input": Unread()}, 2048) == (
        413, "body of 2049 bytes is over the 2 KiB limit", [])


def test_the_caller_words_its_own_413():
    def over(length, limit):
        return HTTPError(413, f"{length}>{limit} for a delivery")

    assert refusal(wsgi.read_body, {"CONTENT_LENGTH": "20", "wsgi.input": Unread()}, 10, over_limit=over)[:2] == (
        413, "20>10 for a delivery")


@pytest.mark.parametrize("length", ["ten", "1.5", "-1", "0x10"])
def test_a_content_length_that_is_not_a_whole_number_is_400_unread(length):
    assert refusal(wsgi.read_body, {"CONTENT_LENGTH": length, "wsgi.input": Unread()}, 1024) == (
        400, "Content-Length is not a number", [])


def test_a_body_shorter_than_its_content_length_is_400():
    assert refusal(wsgi.read_body, environ(b"abc", length="5"), 1024)[:2] == (400, "body ended after 3 of 5 bytes")


# --- JSON --------------------------------------------------------------------------------------------------


def test_a_json_object_is_parsed_and_an_empty_body_is_an_empty_object():
    assert wsgi.read_json(environ(b'{"rate": 12.5, "label": "a"}'), 1024) == {"rate": 12.5, "label": "a"}
    assert wsgi.read_json(environ(b""), 1024) == {}
    assert wsgi.read_json(environ(b" \n "), 1024) == {}


@pytest.mark.parametrize("body, message", [
    (b"[1, 2]", "body must be a JSON object, got list"),
    (b'"text"', "body must be a JSON object, got str"),
    (b"\xff\xfe", "body is not UTF-8 text"),
    (b'{"rate": NaN}', "body is not valid JSON: NaN is not a number"),
    (b'{"rate": -Infinity}', "body is not valid JSON: -Infinity is not a number"),
    (b"[" * 100_000, "body is not valid JSON: maximum recursion depth exceeded"),
])
def test_a_body_that_is_not_a_json_object_is_400(body, message):
    status, got, _ = refusal(wsgi.read_json, environ(body), len(body) + 1)
    assert status == 400 and got.startswith(message)


def test_a_json_body_over_the_limit_is_413():
    assert refusal(wsgi.read_json, environ(b"{}" * 1024), 1024)[:2] == (413, "body of 2048 bytes is over the 1 KiB limit")


def test_a_json_constant_is_refused_by_name():
    with pytest.raises(ValueError, match="^Infinity is not a number$"):
        wsgi.refuse_constant("Infinity")


# --- forms -------------------------------------------------------------------------------------------------


def test_a_form_gives_each_field_its_last_value_and_keeps_blank_ones():
    form = wsgi.read_form(environ(b"key=a&key=b&reason=&text=caf%C3%A9+au+lait"), 1024)
    assert form == {"key": "b", "reason": "", "text": "café au lait"}


def test_a_form_over_the_limit_is_400_unread():
    assert refusal(wsgi.read_form, {"CONTENT_LENGTH": "2049", "wsgi.input": Unread()}, 2048) == (
        400, "the form is over 2 KiB", [])


@pytest.mark.parametrize("body", [b"text=\xff", b"&".join(b"f%d=1" % n for n in range(wsgi.FORM_FIELDS + 1))])
def test_a_form_not_in_utf8_or_with_too_many_fields_is_400(body):
    assert refusal(wsgi.read_form, environ(body), 1024) == (400, "the form is not UTF-8 text with at most 20 fields", [])


def test_a_form_of_as_many_fields_as_allowed_is_read():
    body = b"&".join(b"f%d=1" % n for n in range(wsgi.FORM_FIELDS))
    assert len(wsgi.read_form(environ(body), 1024)) == wsgi.FORM_FIELDS


# --- tokens, methods, paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("header, token", [
    ("Bearer abc", "abc"),
    ("bearer   abc  ", "abc"),
    ("  BEARER abc", "abc"),
    ("Basic abc", None),
    ("Bearer", None),
    ("Bearer   ", None),
    ("", None),
])
def test_the_bearer_token_is_the_authorization_headers_second_word(header, token):
    assert wsgi.bearer({"HTTP_AUTHORIZATION": header}) == token


def test_no_authorization_header_is_no_token():
    assert wsgi.bearer({}) is None


def test_another_method_is_405_naming_the_allowed_one():
    wsgi.allow("POST", "POST")
    assert refusal(wsgi.allow, "GET", "POST") == (405, "use POST here, not GET", [("Allow", "POST")])
    with pytest.raises(wsgi.MethodNotAllowed) as info:
        wsgi.allow("DELETE", "GET")
    assert info.value.allowed == "GET"


def test_head_is_taken_for_get_only_when_asked():
    wsgi.allow("HEAD", "GET", head=True)
    assert refusal(wsgi.allow, "HEAD", "GET")[:2] == (405, "use GET here, not HEAD")
    assert refusal(wsgi.allow, "PUT", "GET", head=True)[:2] == (405, "use GET here, not PUT")


def test_the_path_is_the_one_sent_with_its_escapes_and_without_its_query():
    assert wsgi.raw_path({"REQUEST_URI": "/v1/instances/a%2Fb/register?x=1", "PATH_INFO": "/v1/instances/a/b/register"}) \
        == "/v1/instances/a%2Fb/register"
    assert wsgi.raw_path({"PATH_INFO": "/healthz"}) == "/healthz"
    assert wsgi.raw_path({}) == ""


# --- the access log ----------------------------------------------------------------------------------------


def test_a_logged_path_is_ascii_on_one_line_and_cut():
    assert wsgi.loggable("/v1/ü\n\x1b[31m") == "/v1/\\xfc\\n\\x1b[31m"
    long = wsgi.loggable("/" + "a" * 1000)
    assert len(long) <= wsgi.LOGGED_PATH_CHARS and long.endswith("…")


def test_the_access_log_line_is_address_method_path_status_and_duration_only(caplog):
    request = {"REMOTE_ADDR": "10.0.0.7", "HTTP_AUTHORIZATION": "Bearer secret-token", "QUERY_STRING": "token=t"}
    with caplog.at_level(logging.INFO, logger="vastctl.serve"):
        wsgi.log_request(request, "POST", "/v1/ü", 409, 0.01234)
        wsgi.log_request({}, "GET", "/healthz", 200, 0)
    assert [r.getMessage() for r in caplog.records] == ['10.0.0.7 "POST /v1/\\xfc" 409 12.3ms', '- "GET /healthz" 200 0.0ms']


def test_an_unexpected_error_is_logged_with_its_traceback_and_an_escaped_path(caplog):
    with caplog.at_level(logging.ERROR, logger="vastctl.serve"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            wsgi.log_unexpected("GET", "/\n")
    (record,) = caplog.records
    assert record.getMessage() == "unexpected error answering GET /\\n" and record.exc_info[0] is RuntimeError
