"""A throwaway PostgreSQL cluster on 127.0.0.1 for the tests: initdb into a temp dir, start, stop.

PostgreSQL refuses to run as root; when the tests run as root (CI containers) the
cluster's files are handed to `nobody` and initdb/postgres run as that user.
Password authentication is scram-sha-256 for every connection, as on a real
Curio database (user `yugabyte`, as YugabyteDB's default).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "yugabyte"
PASSWORD = "yugabyte-test-password"
START_TIMEOUT_S = 60


def bindir() -> Path | None:
    """Where initdb and postgres live: `pg_config --bindir`, else Debian's /usr/lib/postgresql/N/bin (newest)."""
    candidates = []
    if shutil.which("pg_config"):
        result = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            candidates.append(result.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in candidates:
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    return None


def unavailable_reason() -> str | None:
    """Why no cluster can be started here (None: it can)."""
    if bindir() is None:
        return "PostgreSQL server binaries not found (apt-get install postgresql; .ci/run does)"
    if shutil.which("psql") is None:
        return "psql not found (apt-get install postgresql-client)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            return "running as root and no `nobody` user to run PostgreSQL as (initdb refuses root)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """One PostgreSQL server: `url()` for libpq clients, `sql()` to run statements as the superuser."""

    def __init__(self) -> None:
        self.bin = bindir()
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam("nobody")
            self._owner = (entry.pw_uid, entry.pw_gid)
        # as root, in /tmp itself: $TMPDIR or pytest's directories may be closed to `nobody`
        self.root = Path(tempfile.mkdtemp(prefix="vastctl-pg-", dir="/tmp" if self._owner else None))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "postgres.log"
        self.port = _free_port()

    def _run(self, *args: str, check: bool = True, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
        """Run a server binary as the cluster's owner (never root)."""
        extra = {}
        if self._owner is not None:
            extra = {"user": self._owner[0], "group": self._owner[1], "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": str(self.root)}
        result = subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True, env=env,
                                cwd=self.root, timeout=timeout, check=False, **extra)
        if check and result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({result.returncode}): {result.stderr.strip()}\n{log}")
        return result

    def start(self) -> "Cluster":
        self.sockets.mkdir()
        password_file = self.root / "password"
        password_file.write_text(PASSWORD + "\n")
        if self._owner is not None:
            for path in (self.root, self.sockets, password_file):
                os.chown(path, *self._owner)
        self._run("initdb", "-D", str(self.data), "-U", USER, f"--pwfile={password_file}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sockets}"
                   " -c fsync=off -c max_connections=30")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", str(START_TIMEOUT_S), "start")
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, *, password: str = PASSWORD, database: str = "postgres", port: int | None = None) -> str:
        return f"postgres://{USER}:{password}@127.0.0.1:{port or self.port}/{database}"

    def env(self) -> dict[str, str]:
        """libpq's environment for the superuser over TCP (password included)."""
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": USER, "PGPASSWORD": PASSWORD,
                "PGDATABASE": "postgres"}

    def sql(self, statements: str) -> str:
        """Run statements in one psql session as the superuser; stdout (tuples only, unaligned)."""
        result = subprocess.run(["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", statements],
                                env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=60,
                                check=False)
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def session(self, statements: str) -> subprocess.Popen:
        """A psql session in the background that has been sent `statements` (e.g. to hold a lock); stdin stays
        open so the session lasts until the caller closes it or kills the process."""
        process = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                   env={**os.environ, **self.env(), "PGAPPNAME": "vastctl-test-holder"})
        process.stdin.write(statements + "\n")
        process.stdin.flush()
        return process
