"""Replacing a file that a daemon reads (sshd's authorized_keys, nginx's upstream list) without a half-written moment.

The new text goes to a temporary file in the same directory, is flushed to disk, then renamed over the old
one: a reader sees the whole old file or the whole new one, never a mix, and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def read(path: Path) -> str | None:
    """The file's text, or None when it cannot be read as text (missing, unreadable, not ours): then it is
    written anew, and a write that fails too says why."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace `path` with `text` atomically (same directory, fsync, rename); raises OSError as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself reaches the disk
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
