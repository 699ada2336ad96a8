"""Machine tokens: an HMAC-SHA256 of the uuid under a secret made at `init`.

A token proves which machine is calling; nothing needs storing per machine,
and a leaked token speaks only for its own uuid.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from .errors import BadInput


def ensure_secret(path: Path) -> bool:
    """Create the secret file (mode 600) if it is missing; True when it was made now."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return True


def read_secret(path: Path) -> bytes:
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        raise BadInput(f"no token secret at {path}: run `vastctl init` (or set server.secret_file)") from None
    if len(secret) < 32:
        raise BadInput(f"the token secret in {path} is too short: delete it and run `vastctl init`")
    return secret.encode()


def machine_token(secret: bytes, uuid: str) -> str:
    return hmac.new(secret, uuid.encode(), hashlib.sha256).hexdigest()


def token_matches(secret: bytes, uuid: str, token: str) -> bool:
    """Constant-time check that `token` is the one for `uuid`."""
    return hmac.compare_digest(machine_token(secret, uuid), token)
