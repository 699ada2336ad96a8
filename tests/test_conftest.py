"""tests/conftest.py's rule: a test not marked `slow` that starts a process or a server fails and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CASES = '''
import socket
import subprocess

import pytest


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_starts_a_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()


def test_starts_nothing():
    assert True


@pytest.mark.slow
def test_marked_and_starts_a_process():
    subprocess.run(["true"], check=True)
'''


@pytest.mark.slow
def test_an_unmarked_test_that_starts_a_process_or_a_server_fails_and_a_marked_one_passes(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = slow: starts real processes or servers\n"
                                         "filterwarnings = ignore:'click.utils.get_:DeprecationWarning\n")  # as pyproject
    tests_on_path = {**os.environ, "PYTHONPATH": str(HERE)}  # where the modules its pytest_plugins names are
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rf",
                           "test_cases.py"], cwd=tmp_path, env=tests_on_path, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 1, out
    assert out.splitlines()[-1].startswith("4 passed, 2 errors in "), out  # each fails at its teardown
    assert "test_starts_a_process starts a process (true) but is not marked slow" in out, out
    assert "test_starts_a_server starts a server (a listening socket) but is not marked slow" in out, out
    assert "test_starts_nothing" not in out and "test_marked_and_starts_a_process" not in out
