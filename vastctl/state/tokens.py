"""Machine tokens: an HMAC-SHA256 of the uuid under a secret made at `init`.

A token proves which machine is calling; nothing needs storing per machine,
and a leaked token speaks only for its own uuid.

The secret file holds one secret a line, newest first: the first signs every
new token, and all of them verify. Rotating prepends a fresh secret, so
running machines keep their tokens until they are replaced; retiring drops
all but the first, after which the old tokens stop working. A line may end
in `# added <time>`, which is how retiring knows which machines predate the
newest secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as random_secrets
import sqlite3
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from vastctl import clock
from vastctl.errors import BadInput
from vastctl.upstream import cut

MIN_LENGTH = 32
# What a missing secret file usually means: the command was not pointed at the manager's config.
NO_SECRET_FIX = ("point VASTCTL_CONFIG (or --config) at the config that names the state file, or set"
                 " server.secret_file, or restore the secret from a backup; `vastctl init` would make a new one,"
                 " which no running machine's token matches")


def ensure_secret(path: Path) -> bool:
    """Create the secret file (mode 600) if it is missing; True when it was made now."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(random_secrets.token_hex(32) + "\n")
    return True


def read_secrets(path: Path) -> list[bytes]:
    """Every secret in the file, newest (the signing one) first."""
    return [secret for secret, _ in _read_lines(path)]


def read_secret(path: Path) -> bytes:
    """The secret new tokens are signed with: the file's first."""
    return read_secrets(path)[0]


def newest_added(path: Path) -> datetime | None:
    """When the signing secret was added by a rotation (None for the one `init` made)."""
    return _read_lines(path)[0][1]


def rotate_secret(path: Path, *, now: datetime) -> int:
    """Put a fresh secret first (it signs from now on); the others keep verifying. Returns how many there are."""
    lines = _read_lines(path)
    fresh = (random_secrets.token_hex(32).encode(), now)
    _write_lines(path, [fresh, *lines])
    return len(lines) + 1


def retire_old_secrets(path: Path) -> int:
    """Keep only the signing secret: tokens made under the others stop working. Returns how many went."""
    lines = _read_lines(path)
    if len(lines) > 1:
        _write_lines(path, lines[:1])
    return len(lines) - 1


def live_before_rotation(conn: sqlite3.Connection, path: Path) -> list[str]:
    """Labels of live machines created before the newest secret was added: their tokens die with the old secrets."""
    added = newest_added(path)
    if added is None:
        return []
    return [row[0] for row in conn.execute(
        "SELECT label FROM instances WHERE state != 'killed' AND destroyed_at IS NULL AND created_at < ?"
        " ORDER BY created_at", (clock.to_iso(added),))]


def machine_token(secret: bytes, uuid: str) -> str:
    return hmac.new(secret, uuid.encode(), hashlib.sha256).hexdigest()


def token_matches(secret: bytes, uuid: str, token: str) -> bool:
    """Constant-time check that `token` is the one for `uuid`."""
    return hmac.compare_digest(machine_token(secret, uuid), token)


class Keyring:
    """The secrets of one file, re-read when the file changes, and who owns a given token.

    `serve` runs for weeks while an operator rotates the secret: a launch after
    the rotation hands out a token under the new secret, so the file is checked
    (one stat) at each use and re-read when it changed. A file that has become
    unreadable or broken keeps the secrets already loaded, and `on_error` hears why.

    `owner()` tells "another machine's token" (403) from "no machine's" (401)
    without one HMAC per row: every known uuid's tokens are indexed once, by
    their SHA-256, and only uuids new since the last look are added, so a bad
    token costs the same with ten machines or ten thousand.
    """

    def __init__(self, path: Path, *, on_error: Callable[[str], None] = lambda message: None):
        self.path = path
        self.on_error = on_error
        self._lock = threading.Lock()
        self._stamp = _stamp(path)
        self._secrets = read_secrets(path)
        self._owners: dict[bytes, str] = {}
        self._indexed_up_to = 0

    def secrets(self) -> list[bytes]:
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._reload(stamp)
        return self._secrets

    def matches(self, uuid: str, token: str) -> bool:
        if not token.isascii():
            return False
        return any([token_matches(secret, uuid, token) for secret in self.secrets()])  # every secret: same time

    def owner(self, token: str, uuids_after: Callable[[int], Iterable[tuple[int, str]]]) -> str | None:
        """The uuid whose token this is, or None. `uuids_after(n)` yields (rowid, uuid) of rows with rowid > n."""
        secrets = self.secrets()
        with self._lock:
            for rowid, uuid in uuids_after(self._indexed_up_to):
                for secret in secrets:
                    self._owners[_digest(machine_token(secret, uuid))] = uuid
                self._indexed_up_to = max(self._indexed_up_to, rowid)
            return self._owners.get(_digest(token))

    def _reload(self, stamp: tuple[int, int, int] | None) -> None:
        try:
            loaded = read_secrets(self.path)
        except (BadInput, OSError) as exc:
            self.on_error(f"keeping the token secrets already loaded: {exc}")
        else:
            self._secrets = loaded
            self._owners = {}
            self._indexed_up_to = 0
        self._stamp = stamp


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def secret_lines(path: Path, missing: str) -> list[tuple[int, str, str]]:
    """(line number, secret, the `# …` comment after it) of every line of a secret file that holds a secret,
    newest first as the file keeps them; no file is BadInput(missing). The token and webhook secret files share it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(missing) from None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        text_before, _, comment = line.partition("#")
        if secret := text_before.strip():
            found.append((number, secret, comment))
    return found


def _read_lines(path: Path) -> list[tuple[bytes, datetime | None]]:
    lines = []
    for number, secret, comment in secret_lines(path, f"no token secret at {path}: {NO_SECRET_FIX}"):
        if len(secret) < MIN_LENGTH:
            raise BadInput(f"the token secret on line {number} of {path} is too short (under {MIN_LENGTH}"
                           " characters): remove that line, or delete the file and run `vastctl init`")
        lines.append((secret.encode(), _added(comment, path, number)))
    if not lines:
        raise BadInput(f"the token secret file {path} holds no secret: delete it and run `vastctl init`")
    return lines


def _added(comment: str, path: Path, number: int) -> datetime | None:
    stamp = comment.strip()  # the file's own format, written by add_secret: "added <ISO time>"
    if not stamp.startswith("added "):
        return None
    try:
        return clock.from_iso(stamp.removeprefix("added ").strip())
    except ValueError:
        raise BadInput(f"line {number} of {path} ends in {cut(comment, 60)!r}, not '# added <ISO time>':"
                       " fix or remove the comment") from None


def _write_lines(path: Path, lines: list[tuple[bytes, datetime | None]]) -> None:
    """Replace the file in one step (a crash leaves the old or the new file, never half of one), mode 600."""
    text = "".join(secret.decode() + (f"  # added {clock.to_iso(added)}" if added else "") + "\n"
                   for secret, added in lines)
    temporary = path.with_name(path.name + ".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover .new of another mode keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
