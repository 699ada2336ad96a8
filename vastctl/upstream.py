"""Text that came from outside (vast's answers and errors), made safe before it is shown or stored.

`clip()` is the one way such text reaches stderr, a table, an event reason or
a column: on one line, secrets masked, control and bidi characters escaped,
and only then cut to length (`cut()`). `escape_controls()` is also what
lifecycle.printable shows any text with. Masking after a cut misses a key cut in half and
leaks its start. Secrets are the keys clients register with `remember_secret`
(the vast client does on construction) and anything that looks like a bearer
token or an `api_key=` parameter.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

MASK = "***"
MIN_SECRET_CHARS = 6  # shorter "keys" are test values; masking them would garble ordinary text
_SECRETS: set[str] = set()
_TOKEN_PATTERNS = (
    re.compile(r"(?i)(\bbearer\s+)[^\s\"',;)}\]]+"),
    re.compile(r"(?i)(\b(?:api[_-]?key|token|password|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&)}\]]+"),
)
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def remember_secret(secret: str | None) -> None:
    """Mask `secret` in every upstream text this process shows or stores from now on."""
    if secret and len(secret) >= MIN_SECRET_CHARS:
        _SECRETS.add(secret)


def mask(text: str) -> str:
    """Remembered secrets and bearer-like tokens replaced by ***."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda found: found.group(1) + MASK, text)
    return text


def escape_controls(text: str) -> str:
    """Control, format (bidi overrides), separator and unpaired surrogate characters as visible escapes."""
    if text.isprintable():  # none of those categories (nor any separator but the space): the common case
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clip(text: Any, limit: int = 300) -> str:
    """One line, masked, escaped, then cut to `limit` characters (an ellipsis marks the cut)."""
    return cut(escape_controls(mask(" ".join(str(text).split()))), limit)


def cut(text: str, limit: int) -> str:
    """`text` at most `limit` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
