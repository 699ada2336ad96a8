"""validate: one set of rules for the values from outside; a refusal names its field, each audience words it."""

from __future__ import annotations

import math

import pytest

from vastctl import validate
from vastctl.cli import said
from vastctl.errors import BadInput, UnknownInstance
from vastctl.serving.server import in_api_terms
from vastctl.state import lifecycle, rates, settings
from vastctl.validate import MAX_INT, Invalid, NotFound, Range


@pytest.mark.parametrize("value,expected", [(0, 0.0), (2.5, 2.5), (10**400, math.inf)])
def test_number_reads_json_and_yaml_numbers(value, expected):
    assert validate.number(value) == expected


@pytest.mark.parametrize("value", [True, None, "5", [1], {"a": 1}])
def test_number_refuses_what_is_not_a_number_unless_text_is_allowed(value):
    assert validate.number(value) is None
    assert validate.number("5", text=True) == 5.0 and validate.number("five", text=True) is None


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), 10**400, True, "1", None])
def test_finite_refuses_with_the_field_and_the_value(value):
    with pytest.raises(Invalid) as caught:
        validate.finite(value, "rate")
    assert caught.value.field == "rate" and caught.value.exit_code == 2
    assert str(caught.value).startswith("rate must be a finite number ≥ 0, got ")


def test_finite_takes_text_only_when_told():
    assert validate.finite("50", "rate", text=True) == 50.0
    assert validate.finite(0, "rate") == 0.0 and validate.finite(10**20, "rate") == 1e20


@pytest.mark.parametrize("value", [-1, MAX_INT + 1, True, 1.0, "3"])
def test_whole_fits_sqlite(value):
    with pytest.raises(Invalid, match=f"n must be a whole number from 0 to {MAX_INT}"):
        validate.whole(value, "n")
    assert validate.whole(MAX_INT, "n") == MAX_INT


def test_whole_says_too_large_rather_than_repeating_it():
    with pytest.raises(Invalid) as caught:
        validate.whole(10**300, "n")
    assert str(caught.value).endswith("got a number too large")


def test_text_names_the_lone_surrogate_for_a_json_body_only():
    with pytest.raises(Invalid, match="must be Unicode text, got a lone surrogate"):
        validate.text("a\ud800", "label", utf8=True)
    with pytest.raises(Invalid, match=r"must be 1 to 256 printable characters: \\ud800"):
        validate.text("a\ud800", "label")


def test_a_range_refusal_says_why_its_excluded_end_is_refused():
    allowed = Range(0, 10, above=True, why="0 would stop everything")
    with pytest.raises(Invalid) as caught:
        allowed.check(0, "x", "float", 0)
    assert str(caught.value) == "x must be a number above 0 and at most 10, got 0: 0 would stop everything"
    assert allowed.check(10, "x", "float", 10) == 10


# --- one refusal, worded for each audience -------------------------------------------------------------


def test_the_library_names_the_field_the_cli_its_flag_the_server_the_body_field():
    with pytest.raises(Invalid) as caught:
        rates.validate_rate("fast")
    assert str(caught.value) == "rate must be a number of proofs per hour, got 'fast'"
    assert said(caught.value) == "--rate must be a number of proofs per hour, got 'fast'"
    assert in_api_terms(caught.value) == "the \"rate\" field must be a number of proofs per hour, got 'fast'"


def test_a_field_inside_the_sentence_is_worded_in_place():
    error = Invalid("label", lead="instance u1 is new here: register it with ")
    assert said(error) == "instance u1 is new here: register it with --label"
    assert in_api_terms(error) == 'instance u1 is new here: register it with the "label" field'


def test_an_unknown_uuid_is_not_found_and_says_which_value_to_check(conn):
    with pytest.raises(UnknownInstance) as caught:
        lifecycle.get(conn, "u-nobody")
    assert isinstance(caught.value, NotFound)
    assert said(caught.value) == "no instance with uuid 'u-nobody': check --uuid (see `vastctl fleet --all`)"
    assert in_api_terms(caught.value) == ("no instance with uuid 'u-nobody': check the uuid in the path"
                                          " (see `vastctl fleet --all`)")


def test_a_field_the_cli_has_no_flag_for_keeps_its_name():
    assert said(Invalid("queued", "must be a whole number ≥ 0")) == "queued must be a whole number ≥ 0"
    assert said(Invalid("max_dph", "must be a finite number ≥ 0, got -1")).startswith("--max-dph must be")


def test_a_setting_is_named_by_its_key_wherever_it_is_set():
    """`settings set max_dph` and the dashboard's form both say `max_dph`: not an Invalid the CLI would rename."""
    with pytest.raises(BadInput) as caught:
        settings.parse_value("max_dph", "-1")
    assert not isinstance(caught.value, Invalid)
    assert said(caught.value).startswith("max_dph must be a number above 0 and at most 1000, got '-1'")


def test_library_messages_speak_no_flags():
    for check in (lambda: rates.validate_proofs(-1), lambda: validate.text("", "uuid"),
                  lambda: rates.validate_rate(-1)):
        with pytest.raises(Invalid) as caught:
            check()
        assert "--" not in str(caught.value)


# --- how a refused value and a range are worded, exactly --------------------------------------------------


def test_a_refused_value_is_shown_as_its_repr_cut_at_the_limit():
    assert validate.shown("abc") == "'abc'" and validate.shown(2.5) == "2.5" and validate.shown(None) == "None"
    assert validate.shown("x" * 100) == "'" + "x" * 58 + "…"  # 60 characters, the last one the ellipsis
    assert validate.shown("x" * 58) == "'" + "x" * 58 + "'"  # exactly 60: whole
    assert validate.shown("abcdef", limit=4) == "'ab…"
    assert validate.shown(10**5000) == "a number of thousands of digits"  # past Python's digits for repr()


def test_ascii_shown_escapes_every_character_past_ascii():
    assert validate.ascii_shown("a\ud800b") == "'a\\ud800b'"
    assert validate.ascii_shown("é×") == "'\\xe9\\xd7'"
    assert validate.ascii_shown("plain") == "'plain'"


def test_a_lone_surrogate_is_named_with_the_value_escaped():
    with pytest.raises(Invalid) as caught:
        validate.text("a\ud800", "label", utf8=True)
    assert str(caught.value) == "label must be Unicode text, got a lone surrogate in 'a\\ud800'"
    assert validate.text("é", "label", utf8=True) == "é"  # past ASCII but encodable: taken


@pytest.mark.parametrize("value, kind, text", [
    (Range(1, 100), "int", "a whole number from 1 to 100"),
    (Range(0, 1000, above=True), "float", "a number above 0 and at most 1000"),
    (Range(0, 3600, above=True), "duration", "a duration above 0s and at most 1h"),
    (Range(60, 2 * 86400), "duration", "a duration from 1m to 2d"),
    (Range(90, 5400), "duration", "a duration from 90s to 90m"),  # whole minutes, not 1.5h
    (Range(1.5, 86400 + 3600), "duration", "a duration from 1.5s to 25h"),
    (Range(0.5, 2.5), "float", "a number from 0.5 to 2.5"),
    (Range(0, 1e20), "float", "a number from 0 to 1e+20"),
    (Range(-3, 3.0), "float", "a number from -3 to 3"),
])
def test_a_range_describes_itself_in_its_kinds_words(value, kind, text):
    assert value.describe(kind) == text


def test_a_range_refusal_shows_the_value_given_and_says_why_only_at_the_excluded_end():
    allowed = Range(0, 10, above=True, why="0 would stop everything")
    assert str(allowed.refusal("x", "int", "11", 11.0)) == "x must be a whole number above 0 and at most 10, got '11'"
    assert str(allowed.refusal("x", "int", 0, 0.0)).endswith("got 0: 0 would stop everything")
    assert str(Range(0, 10).refusal("x", "int", -1, -1.0)) == "x must be a whole number from 0 to 10, got -1"
    with pytest.raises(Invalid) as caught:
        Range(0, 10, why="never said").check(11, "x", "int", 11)
    assert str(caught.value) == "x must be a whole number from 0 to 10, got 11"


def test_a_range_takes_its_ends_unless_the_low_one_is_excluded():
    assert Range(0, 10).allows(0) and Range(0, 10).allows(10) and not Range(0, 10).allows(10.0001)
    assert not Range(0, 10, above=True).allows(0) and Range(0, 10, above=True).allows(1e-9)
    assert not Range(0, 10).allows(-1e-9)


@pytest.mark.parametrize("value, kw, refusal", [
    (5, {}, "label must be text, got int"),
    (None, {"utf8": True}, "label must be text, got NoneType"),
    ("", {}, "label must be 1 to 256 printable characters, got an empty value"),
    ("a" * 257, {}, "label must be 1 to 256 printable characters, got 257 characters"),
    ("abcdef", {"max_len": 5}, "label must be 1 to 5 printable characters, got 6 characters"),
    ("ab\x07c", {}, "label must be 1 to 256 printable characters: \\x07 (character 3) is a control or bidi character"),
    ("ab\u202ec", {}, "label must be 1 to 256 printable characters: \\u202e (character 3) is a control or bidi character"),
    ("a\ud800", {}, "label must be 1 to 256 printable characters: \\ud800 (character 2) is a control or bidi character"),
    (" vastctl-a", {}, "label must not begin or end with a space, got ' vastctl-a': give 'vastctl-a'"),
    (" " + "x" * 70, {}, f"label must not begin or end with a space, got ' {'x' * 58}…': give '{'x' * 59}…'"),
], ids=["int", "none", "empty", "too-long", "past-max-len", "control", "bidi", "surrogate", "space", "long-space"])
def test_text_refuses_each_fault_in_its_own_words(value, kw, refusal):
    with pytest.raises(Invalid) as caught:
        validate.text(value, "label", **kw)
    assert str(caught.value) == refusal


def test_text_takes_a_value_up_to_its_limit_as_it_is():
    assert validate.text("a" * 256, "label") == "a" * 256
    assert validate.text("abcde", "label", max_len=5) == "abcde"
    assert validate.text("vastctl-a b", "label", utf8=True) == "vastctl-a b"  # a space inside is a character


@pytest.mark.parametrize("value, kw, refusal", [
    (2**63, {}, "n must be a whole number from 0 to 9223372036854775807, got a number too large"),
    (-1, {}, "n must be a whole number from 0 to 9223372036854775807, got -1"),
    (1.5, {"what": " (proofs)"}, "n must be a whole number from 0 to 9223372036854775807 (proofs), got 1.5"),
    (True, {}, "n must be a whole number from 0 to 9223372036854775807, got True"),
    (MAX_INT, {"maximum": 10}, "n must be a whole number from 0 to 10, got 9223372036854775807"),
    (0, {"minimum": 1, "maximum": 10}, "n must be a whole number from 1 to 10, got 0"),
    ("9" * 100, {}, f"n must be a whole number from 0 to 9223372036854775807, got '{'9' * 59}"),
])
def test_whole_refuses_in_words_that_show_the_value_cut_or_name_it_too_large(value, kw, refusal):
    with pytest.raises(Invalid) as caught:
        validate.whole(value, "n", **kw)
    assert str(caught.value) == refusal


def test_whole_takes_its_ends():
    assert validate.whole(MAX_INT, "n") == MAX_INT and validate.whole(0, "n") == 0
    assert validate.whole(10, "n", minimum=10, maximum=10) == 10


def test_finite_shows_the_value_it_refuses():
    with pytest.raises(Invalid) as caught:
        validate.finite("x", "rate", what=" (proofs per hour)")
    assert str(caught.value) == "rate must be a finite number ≥ 0 (proofs per hour), got 'x'"


def test_a_range_end_of_1e16_is_said_in_exponent_form():
    assert Range(0, 1e16).describe("float") == "a number from 0 to 1e+16"
    assert Range(0, 1e15).describe("float") == "a number from 0 to 1000000000000000"
