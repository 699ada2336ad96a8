"""The HTTP plumbing `vastctl serve`'s parts share: bodies read within a limit, the bearer token, method checks,
the error an answer other than 200 travels as, and the access log.

server.App (the machines' API and vast's webhooks) and dashboard (the operator's
pages and /metrics) answer differently, JSON for one and HTML pages for the other,
but read a request the same way, so they read it here. Every refusal is an
HTTPError carrying its status and message; each app turns it into its own body.

A body is read only once its Content-Length is known to be within the caller's
limit, and must arrive in full: waitress only hands over a request whose body
came whole, so a short one means a caller that is not waitress lied about it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from vastctl.facts.json_value import JSON
from vastctl.upstream import cut

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment  # PEP 3333's environ: CGI's variables beside wsgi.input and the rest

FORM_FIELDS = 20  # the most fields a form may have: the dashboard's largest has six
CHALLENGE = [("WWW-Authenticate", 'Bearer realm="vastctl"')]  # sent with a 401 that asks for a bearer token
LOGGED_PATH_CHARS = 300

access_log = logging.getLogger("vastctl.serve")


class HTTPError(Exception):
    """An answer other than 200, with the message for `{"error": …}` and any headers it needs."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


class MethodNotAllowed(HTTPError):
    """405, with the Allow header naming the one method the path takes."""

    def __init__(self, method: str, allowed: str):
        super().__init__(405, f"use {allowed} here, not {method}", [("Allow", allowed)])
        self.allowed = allowed


def allow(method: str, allowed: str, *, head: bool = False) -> None:
    """Refuse any method but `allowed` with a 405; with `head`, HEAD too is taken (a GET answered without its body)."""
    if method != allowed and not (head and method == "HEAD"):
        raise MethodNotAllowed(method, allowed)


def bearer(environ: WSGIEnvironment) -> str | None:
    """The token of `Authorization: Bearer <token>` (any case of "Bearer"); None without one."""
    header: str = environ.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def raw_path(environ: WSGIEnvironment) -> str:
    """The path as sent (percent-escapes intact), so a uuid may hold any printable character."""
    raw: str | None = environ.get("REQUEST_URI")
    if raw:
        return raw.split("?", 1)[0]
    path: str = environ.get("PATH_INFO", "")
    return path


def too_large(length: int, limit: int) -> HTTPError:
    """The 413 of a body over `limit` bytes."""
    return HTTPError(413, f"body of {length} bytes is over the {limit // 1024} KiB limit")


def read_body(environ: WSGIEnvironment, limit: int, *,
              over_limit: Callable[[int, int], HTTPError] = too_large) -> bytes:
    """The request's body, refused unread when Content-Length is over `limit` (`over_limit(length, limit)`).

    400 for a Content-Length that is not a whole number or a body that ends before it.
    """
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length < 0:
        raise HTTPError(400, "Content-Length is not a number")
    if length > limit:
        raise over_limit(length, limit)
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    if len(body) != length:
        raise HTTPError(400, f"body ended after {len(body)} of {length} bytes")
    return body


def read_json(environ: WSGIEnvironment, limit: int) -> dict[str, JSON]:
    """The body as a JSON object ({} for an empty one); 400 for anything else, NaN and Infinity included."""
    raw = read_body(environ, limit)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=refuse_constant)
    except UnicodeDecodeError:
        raise HTTPError(400, "body is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise HTTPError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HTTPError(400, f"body must be a JSON object, got {type(value).__name__}")
    return value


def refuse_constant(name: str) -> None:
    """json.loads' parse_constant: NaN, Infinity and -Infinity are not JSON numbers, so not accepted as one."""
    raise ValueError(f"{name} is not a number")


def read_form(environ: WSGIEnvironment, limit: int) -> dict[str, str]:
    """An urlencoded form's fields (the last value of a repeated one); 400 past `limit` bytes or FORM_FIELDS fields."""
    raw = read_body(environ, limit, over_limit=_form_too_large)
    try:
        fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=FORM_FIELDS, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise HTTPError(400, f"the form is not UTF-8 text with at most {FORM_FIELDS} fields") from None
    return {name: values[-1] for name, values in fields.items()}


def _form_too_large(length: int, limit: int) -> HTTPError:
    return HTTPError(400, f"the form is over {limit // 1024} KiB")


def loggable(text: str) -> str:
    """A path (or other text a client chose) fit for one log line: escaped to ASCII, cut."""
    return cut(text.encode("unicode_escape").decode("ascii"), LOGGED_PATH_CHARS)


def log_request(environ: WSGIEnvironment, method: str, path: str, status: int, seconds: float) -> None:
    """The access log's line: client address, method, path, status and duration; never headers, query or body."""
    access_log.info('%s "%s %s" %d %.1fms', environ.get("REMOTE_ADDR", "-"), method, loggable(path), status,
                    seconds * 1000)


def log_unexpected(method: str, path: str) -> None:
    """The traceback of an error no refusal accounts for (answered 500), under the request's method and path."""
    access_log.exception("unexpected error answering %s %s", method, loggable(path))
