"""The state file, its -wal and -shm, and the token secret are the vastctl user's alone (mode 600), whatever the umask.

The secret forges every machine's token and the state file holds the admin's
audit trail: a umask of 022 (the usual one) must not make either readable by
every local user.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from vastctl.clock import SYSTEM
from vastctl.state import db, tokens


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def _umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o000], ids=["umask022", "umask002", "umask000"])
def test_init_makes_the_state_file_and_the_secret_600(cli, db_path, mask):
    with _umask(mask):
        assert cli("init").code == 0
    secret = db_path.with_name(db_path.name + ".secret")
    assert (_mode(db_path), _mode(secret)) == (0o600, 0o600)


def test_the_wal_and_shm_beside_the_state_file_are_600_too(cli, db_path):
    with _umask(0o022):
        assert cli("init").code == 0
        conn = db.connect(db_path, now=SYSTEM.now())  # the files exist while a connection is open
        try:
            wal, shm = Path(f"{db_path}-wal"), Path(f"{db_path}-shm")
            assert wal.exists() and shm.exists()
            assert (_mode(wal), _mode(shm)) == (0o600, 0o600)
        finally:
            conn.close()


def test_a_state_file_made_by_a_library_call_with_create_is_600(tmp_path):
    path = tmp_path / "deep" / "vastctl.db"
    with _umask(0o022):
        db.connect(path, now=SYSTEM.now(), create=True).close()
    assert _mode(path) == 0o600


def test_an_existing_state_file_keeps_the_mode_its_owner_gave_it(cli, db_path):
    """Only creation sets the mode: an operator's chmod (e.g. 640 for a backup group) is left alone."""
    assert cli("init").code == 0
    db_path.chmod(0o640)
    assert cli("init").code == 0 and cli("fleet").code == 0
    assert _mode(db_path) == 0o640


def test_rotating_and_retiring_keep_the_secret_600(cli, db_path):
    secret = db_path.with_name(db_path.name + ".secret")
    with _umask(0o022):
        assert cli("init").code == 0
        leftover = secret.with_name(secret.name + ".new")  # from a rotation cut off before its rename
        leftover.write_text("half a secret\n")
        leftover.chmod(0o644)
        assert cli("token", "--rotate").code == 0
        assert _mode(secret) == 0o600 and len(secret.read_text().splitlines()) == 2
        assert cli("token", "--retire-old").code == 0
    assert _mode(secret) == 0o600 and len(secret.read_text().splitlines()) == 1
    assert not leftover.exists()


def test_ensure_secret_makes_a_600_file_under_a_permissive_umask(tmp_path):
    path = tmp_path / "secret"
    with _umask(0o000):
        assert tokens.ensure_secret(path) is True
    assert _mode(path) == 0o600
