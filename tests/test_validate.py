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
