"""A real `vastctl serve` process on 127.0.0.1 for the server and remote-mode tests."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from vastctl.clock import SYSTEM
from vastctl.state import db, tokens

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
SCRUBBED = ("VASTCTL_SERVER", "VASTCTL_TOKEN", "VASTCTL_UUID", "VASTCTL_LABEL", "VASTCTL_RETRY_FOR", "VASTCTL_ADMIN_TOKEN",
            "VAST_API_KEY", "ANTHROPIC_API_KEY")


def run_vastctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vastctl", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


# Sets the open-file limit, then execs the command: the limit a test gives a process, set without preexec_fn. A
# preexec_fn makes subprocess fork the test's worker and run Python in the child before its exec, and a worker that
# loaded grpcio (the router's tests) then runs gRPC's fork handlers there, which may write a log line to the child's
# stderr before the command's first word.
_FILE_LIMITED = ("import os, resource, sys;"
                 " resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])));"
                 " os.execv(sys.argv[3], sys.argv[3:])")


def under_file_limit(soft: int, hard: int, command: list[str]) -> list[str]:
    """`command` run with at most `soft` open files (and `hard` as the most it may raise that to); its pid is the
    command's (the launcher execs it)."""
    return [sys.executable, "-c", _FILE_LIMITED, str(soft), str(hard), *command]


@contextmanager
def on_a_thread(server):
    """A loopback HTTP server (a fake of vast, say) answering on a thread for as long as the block runs."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def free_port_block(count: int) -> int:
    """The first of `count` consecutive loopback ports free now, below the kernel's ephemeral range (32768 up),
    so no connection another test opens meanwhile takes one of them as its source port (as the product's own
    tunnel.first_port default, 20000, is)."""
    for _ in range(200):
        first = random.randrange(20000, 32768 - count)
        try:
            with ExitStack() as held:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise AssertionError(f"no {count} consecutive free ports below 32768")


def wait_for(condition, what: str = "the condition", timeout: float = 30, proc: subprocess.Popen | None = None,
             log: Path | None = None):
    """condition()'s first true value, polled every 50 ms; an AssertionError naming `what` after `timeout` s,
    or at once when `proc` has exited (with `log`'s text, if given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    detail = log.read_text(errors="replace") if log is not None and log.exists() else ""
    if proc is not None and proc.poll() is not None:
        raise AssertionError(f"the process exited (code {proc.returncode}) while waiting for {what}\n{detail}")
    raise AssertionError(f"timed out waiting for {what} ({timeout}s)\n{detail}")


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it is still there after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def query(db_path, sql: str, *args) -> list[dict]:
    """The rows a query reads from a state file, each a dict, over a connection of its own."""
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql, args)]
    finally:
        conn.close()


class JsonHandler(BaseHTTPRequestHandler):
    """A loopback fake's handler (of vast, say): quiet, reads a JSON request body, answers JSON."""

    def log_message(self, *args):
        pass

    def read_json(self):
        """The request's JSON body; {} when it has none."""
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def send_json(self, status: int, body) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Manager:
    """A state file, its token secret and config in `home`, and `vastctl serve` over them."""

    def __init__(self, home: Path, *, admin_token: str = ADMIN_TOKEN, gate: float = 40):
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.db_path = home / "manager.db"
        self.config_path = home / "config.yaml"
        self.config_path.write_text(f'server:\n  admin_token: "{admin_token}"\nfleet:\n  min_bench_rate: {gate}\n')
        db.connect(self.db_path, create=True, now=SYSTEM.now()).close()
        tokens.ensure_secret(Path(str(self.db_path) + ".secret"))
        self.secret = tokens.read_secret(Path(str(self.db_path) + ".secret"))
        self.log_path = home / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        self.env.update(HOME=str(home), VASTCTL_DB=str(self.db_path), VASTCTL_CONFIG=str(self.config_path))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, uuid: str) -> str:
        return tokens.machine_token(self.secret, uuid)

    def start(self, port: int = 0, *extra: str) -> Manager:
        with self.log_path.open("a") as log:
            log.write("--- start\n")
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vastctl", "serve", "--port", str(port), *extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=self.log_path.open("a"),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = re.search(r"serving on http://127\.0\.0\.1:(\d+)", self.log_path.read_text()[offset:])
            if match:
                self.port = int(match.group(1))
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log_path.read_text()}")
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError(f"serve did not start: {self.log_path.read_text()}")

    def stop(self) -> int:
        """SIGTERM, as systemd stops it; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def log(self) -> str:
        return self.log_path.read_text()

    def rows(self) -> dict[str, dict]:
        return {row["uuid"]: row for row in query(self.db_path, "SELECT * FROM instances")}

    def events(self, uuid: str | None = None) -> list[dict]:
        if uuid is None:
            return query(self.db_path, "SELECT * FROM events ORDER BY id")
        return query(self.db_path, "SELECT * FROM events WHERE uuid = ? ORDER BY id", uuid)
