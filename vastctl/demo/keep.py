"""`vastctl demo --keep FILE`: the day's state file kept, self-contained, for the ordinary commands and serve."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from vastctl import config as config_module
from vastctl.errors import BadInput


def check_keep(path: Path) -> None:
    """--keep FILE: a new file in a directory that exists (an operator's state file is never overwritten)."""
    if any(Path(f"{path}{suffix}").exists() for suffix in KEPT_BESIDE):
        raise BadInput(f"--keep {path}: the file (or {path}.secret, {path}.admin-token) already exists: name a new file")
    if not path.resolve().parent.is_dir():
        raise BadInput(f"--keep {path}: the directory {path.resolve().parent} does not exist")


KEPT_BESIDE = ("", ".secret", ".admin-token")  # the kept file and what is kept beside it


def keep_state(directory: Path, path: Path) -> str:
    """Copy the demo's state file out of its scratch `directory` as one self-contained file (SQLite's backup:
    the write-ahead log folded in), its token secret beside it and a fresh admin token for its dashboard (which
    serve reads from beside the file when no config names one), all readable by the owner only. The token."""
    import os
    import secrets
    import shutil

    check_keep(path)
    source = sqlite3.connect(directory / "demo.db")
    target = sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    secret = Path(f"{path}.secret")
    shutil.copyfile(directory / "demo.db.secret", secret)
    token = secrets.token_urlsafe(32)
    fd = os.open(config_module.admin_token_file(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    for name in (path, secret):
        os.chmod(name, 0o600)
    return token
