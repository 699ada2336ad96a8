"""The values that enter from outside — a config file, a command line, an HTTP body, a demand command's
output, a model's tool call — checked by one set of rules.

Each check returns the value typed, or raises Invalid naming the field (`rate`, `uuid`, `gpu_name`) and what
the value must be. The field is the library's name for it; whoever shows the error words it for its
audience (Invalid.worded): the CLI as the flag that set it (`--rate`), the HTTP server as the body field (`the
"rate" field`), the config as its key (`config key 'fleet.max_dph'`). `str()` of an Invalid uses the bare field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from vastctl import upstream
from vastctl.errors import BadInput, UnknownInstance

MAX_INT = 2**63 - 1  # SQLite's INTEGER: a whole number past it cannot be stored or compared
DAY_S = 86400.0
MIN_DPH = 0.001  # $/h: no GPU rents for less; a price under it (1e-320, 0.0) is not a price, as a negative one is not
TEXT_CHARS = 256  # a uuid, label or GPU name

# Characters that hide or rearrange text in a terminal: C0 and C1 controls and DEL, zero-width and bidi
# formatting (U+202E turns `vastctl-abc` into what reads as another label), line and paragraph separators,
# the byte-order mark, and lone surrogates (undecodable bytes from argv or a JSON "\ud800").
_UNSAFE_CHARS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


class Invalid(BadInput):
    """A value refused: `field` names it, `reason` says what it must be (`must be a finite number ≥ 0, got -1`).

    `lead` is what comes before the field when the field is not the sentence's subject
    (`instance u1 is new here: register it with ` + the field).
    """

    def __init__(self, field: str, reason: str = "", *, lead: str = ""):
        self.field, self.reason, self.lead = field, reason, lead
        super().__init__(self.worded(field))

    def worded(self, name: str) -> str:
        """The message with the field called `name` (`--rate`, `the "rate" field`)."""
        return f"{self.lead}{name} {self.reason}" if self.reason else f"{self.lead}{name}"


class NotFound(Invalid, UnknownInstance):
    """A well-formed value that names no row (exit 2, HTTP 404): the field still says which value to check."""


def shown(value: object, limit: int = 60) -> str:
    """A refused value for a message: its repr, cut short (a 400-digit number is not worth repeating)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = "a number of thousands of digits"
    return upstream.cut(text, limit)


def number(value: object, *, text: bool = False) -> float | None:
    """The float a JSON or YAML number holds (an int past a float's range is infinite), None for anything else
    (a bool, None, a list); with `text`, a string float() reads too (`"50"`, `"1e3"`, from a command line)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and text:
        try:
            return float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def real(value: object, *, text: bool = False) -> float | None:
    """The finite float `value` holds (as number() reads it), else None: for a figure that is dropped rather than
    refused when it is no number (vast's JSON may carry NaN, Infinity or 1e400; a wait with nothing to prove it is
    endless). The module's one test of finiteness: every other module asks here (tests/test_one_check.py)."""
    got = number(value, text=text)
    return got if got is not None and math.isfinite(got) else None


def price(value: object) -> float | None:
    """A $/h from outside (a listing, an offer, a bid's floor): finite and at least MIN_DPH, else None. A NaN
    compares false against every limit, and a negative price or one of 1e-320 lowers (or adds nothing to) the
    spend the guard adds up, so none of them is a price."""
    got = real(value)
    return got if got is not None and got >= MIN_DPH else None


def finite(value: object, field: str, *, what: str = "", text: bool = False) -> float:
    """A finite number ≥ 0 (`what` says its unit after the rule: ` (proofs per hour)`)."""
    got = real(value, text=text)
    if got is None or got < 0:
        raise Invalid(field, f"must be a finite number ≥ 0{what}, got {shown(value)}")
    return got


def whole(value: object, field: str, *, minimum: int = 0, maximum: int = MAX_INT, what: str = "") -> int:
    """A whole number (not a bool, not a float) from `minimum` to `maximum`, both included."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        got = "a number too large" if isinstance(value, int) and value > MAX_INT else repr(value)[:60]
        raise Invalid(field, f"must be a whole number from {minimum} to {maximum}{what}, got {got}")
    return value


def text(value: object, field: str, *, max_len: int = TEXT_CHARS, utf8: bool = False) -> str:
    """A uuid, label or GPU name (or a one-line reason): 1 to `max_len` characters, none of them control or bidi,
    no space at either end. The one rule for the command line, the HTTP server and the agent's tools.

    `utf8`: a lone surrogate (JSON can carry "\\ud800", UTF-8 and so SQLite cannot) is named as such first,
    for a JSON body; elsewhere it is one more character that is not printable."""
    if utf8 and isinstance(value, str) and not _encodable(value):
        raise Invalid(field, f"must be Unicode text, got a lone surrogate in {ascii_shown(value)}")
    if not isinstance(value, str):
        raise Invalid(field, f"must be text, got {type(value).__name__}")
    if not value or len(value) > max_len:
        got = f"{len(value)} characters" if value else "an empty value"
        raise Invalid(field, f"must be 1 to {max_len} printable characters, got {got}")
    bad = _UNSAFE_CHARS.search(value)
    if bad:
        raise Invalid(field, f"must be 1 to {max_len} printable characters: {upstream.escape_controls(bad.group())}"
                             f" (character {bad.start() + 1}) is a control or bidi character")
    if value != value.strip():  # ' vastctl-a' would be another label than the one it reads as
        raise Invalid(field, f"must not begin or end with a space, got"
                             f" {upstream.escape_controls(repr(upstream.cut(value, 60)))}:"
                             f" give {upstream.escape_controls(repr(upstream.cut(value.strip(), 60)))}")
    return value


def ascii_shown(value: object) -> str:
    """shown(), every character past ASCII escaped (for a value that may hold a lone surrogate)."""
    return shown(value).encode("ascii", "backslashreplace").decode("ascii")


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Range:
    """The values one number may take: from `low` to `high`, `low` itself excluded when `above`.

    One table (config.RANGES) serves the config file and `settings set` (the CLI and the dashboard), so a
    value one of them refuses the other refuses too.
    """

    low: float
    high: float
    above: bool = False
    why: str = ""  # said after the refusal: what the excluded end would do

    def allows(self, value: float) -> bool:
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def describe(self, kind: str) -> str:
        """`a whole number from 1 to 100`, `a number above 0 and at most 1000`, `a duration above 0s and at most 1h`."""
        said = _duration_text if kind == "duration" else _number_text
        noun = {"int": "a whole number", "duration": "a duration"}.get(kind, "a number")
        if self.above:
            return f"{noun} above {said(self.low)} and at most {said(self.high)}"
        return f"{noun} from {said(self.low)} to {said(self.high)}"

    def refusal(self, field: str, kind: str, got: object, value: float | None = None) -> Invalid:
        """The refusal of `got` (its number `value`); `why` is said when the value is the excluded end itself."""
        why = f": {self.why}" if self.why and value == self.low else ""
        return Invalid(field, f"must be {self.describe(kind)}, got {shown(got)}{why}")

    def check(self, value: float, field: str, kind: str, got: object) -> float:
        if not self.allows(value):
            raise self.refusal(field, kind, got, value)
        return value


def _number_text(value: float) -> str:
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e16):
        return str(int(value))
    return f"{value:g}"


def _duration_text(seconds: float) -> str:
    for unit, size in (("d", DAY_S), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
