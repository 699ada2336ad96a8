"""Every test runs isolated: a temp HOME, a temp state file, no real keys or servers in the environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from vastctl import config as config_module
from vastctl.clock import SYSTEM
from vastctl.state import db

# The fixtures several test modules share, each in the module of its topic under tests/helpers/: a test takes
# one by naming it, never by importing it (the argument would shadow the import: ruff's F811). pytest_plugins
# counts only in a conftest read at start-up, as this one is (testpaths), and makes every fixture it names
# visible to every test: no two of them share a name, and a module's own fixture of that name still wins there.
# The modules under tests/helpers/ have their asserts rewritten, as a test module's are.
pytest.register_assert_rewrite("helpers")
pytest_plugins = [
    "helpers.agent_cli",
    "helpers.boot",
    "helpers.dashboard",
    "helpers.fake_vast",
    "helpers.mocked_vast",
    "helpers.operations_market",
]

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE): without it each
# worker rewrites the asserts of every test module and compiles vastctl afresh (~12 s of CPU a worker, most
# of the quick pass), and each vastctl process a test starts compiles it again. __pycache__ is ignored by git.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# --- tests' files in memory where the machine has room ---------------------------------------------------
# Most tests make a state file, and on a disk each one's creation and close wait on fsync (~75 ms a file on
# this machine's ext4 under load, ~19 ms on tmpfs): a third of the quick pass. pytest puts tmp_path under
# tempfile.gettempdir(), so pointing that (and TMPDIR, for the processes tests start) at /dev/shm moves them
# all, with pytest's own numbered directories, retention and locking. Only with room to spare: a container's
# /dev/shm is often 64 MiB, and there the files stay where they were.
SHM = Path("/dev/shm")
SHM_ROOM = 2 << 30


def _files_in_memory() -> None:
    if os.environ.get("TMPDIR") or not (SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK)):
        return
    stats = os.statvfs(SHM)
    if stats.f_bavail * stats.f_frsize >= SHM_ROOM:
        os.environ["TMPDIR"] = str(SHM)
        tempfile.tempdir = str(SHM)


_files_in_memory()

SCRUBBED = (
    "VAST_API_KEY", "VAST_API_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "VASTCTL_DB", "VASTCTL_CONFIG",
    "VASTCTL_SERVER", "VASTCTL_TOKEN", "VASTCTL_UUID", "VASTCTL_LABEL", "VASTCTL_RETRY_FOR", "VASTCTL_ADMIN_TOKEN", "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): the slow tests mostly wait on processes, servers and timeouts, so the whole
    suite runs three workers a core; `-m "not slow"` computes, one a core (measured in bench/README.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if config.getoption("markexpr", "").replace(" ", "") == "notslow" else 3 * cores


# --- a test that starts a process or a server is marked `slow` -------------------------------------------
# `-m "not slow"` is the quick pass while editing. Each test not marked `slow` runs with Popen and listen()
# watched: one that starts a process (subprocess, a shell) or opens a listening socket (a server, a fake on a
# thread) fails and says to mark it. fc-list is matplotlib asking fontconfig for its fonts, once per process.
_STARTED: list[str] | None = None
_IGNORED = {"fc-list"}
_popen_init = subprocess.Popen.__init__
_listen = socket.socket.listen


def _watched_popen_init(self, args, *rest, **kwargs):
    if _STARTED is not None:
        words = str(args[0] if isinstance(args, (list, tuple)) and args else args).split()
        program = os.path.basename(words[0]) if words else "?"
        if program not in _IGNORED:
            _STARTED.append(f"a process ({program})")
    _popen_init(self, args, *rest, **kwargs)


def _watched_listen(self, *args):
    if _STARTED is not None:
        _STARTED.append("a server (a listening socket)")
    return _listen(self, *args)


subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]
socket.socket.listen = _watched_listen  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _STARTED
    _STARTED = None if item.get_closest_marker("slow") else []
    try:
        yield
    finally:
        _STARTED = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _STARTED and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} starts {' and '.join(sorted(set(_STARTED)))} but is not marked slow: "
                           "add @pytest.mark.slow (tests/conftest.py)")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for name in SCRUBBED:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("VASTCTL_DB", str(tmp_path / "vastctl.db"))
    yield


@pytest.fixture(scope="session")
def go_client(tmp_path_factory):
    """Curio's own client in grpc-go, built once a session from Debian's packages (helpers/route_processes.py)."""
    from helpers.route_processes import go_client_binary

    return go_client_binary(tmp_path_factory)


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "vastctl.db"


@pytest.fixture
def config(db_path) -> config_module.Config:
    return config_module.load()


@pytest.fixture
def conn(db_path):
    connection = db.connect(db_path, create=True, now=SYSTEM.now())
    yield connection
    connection.close()


@pytest.fixture
def initialised(cli):
    """An initialised state file, made the way an operator makes it: no config file, no keys."""
    assert cli("init").code == 0


@pytest.fixture
def ready(initialised):
    """`initialised`, under the name most tests ask for; a module whose tests need a config redefines `ready`."""


@pytest.fixture
def store(ready, db_path):
    """An initialised state file and a connection to it."""
    connection = db.connect(db_path, now=SYSTEM.now())
    yield connection
    connection.close()


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `vastctl ARGS…` in this process; returns exit code, stdout and stderr."""
    from vastctl.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
