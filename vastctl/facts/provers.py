"""The joined machines as Curio's one cuzk address: their endpoints, nginx's upstream file, and its reload.

Curio's `[Cuzk] Address` takes one address; nginx (jobs/nginx-cuzk-grpc.conf) listens there and balances
each call with `grpc_pass` over the `upstream vastctl_cuzk` block this module writes to
provers.upstream_file: one `server 127.0.0.1:PORT` per joined machine (its tunnel's end on this host).

The file is replaced whole and atomically, and only when the set changed; then provers.reload_command runs.
A reload that fails puts the previous file back (nginx keeps running on what it loaded) and is an error:
the next refresh tries again, since the file still differs from the set. The very first file stays even
then: nginx cannot start before the file it includes exists.
"""

from __future__ import annotations

import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from vastctl import atomicfile, clock, upstream
from vastctl.config import Config
from vastctl.errors import Unavailable
from vastctl.facts import tunnel
from vastctl.state.rows import typed

UPSTREAM = "vastctl_cuzk"
RELOAD_TIMEOUT_S = 60
NO_SERVER = "127.0.0.1:9"  # nginx refuses an empty upstream block: with no machine joined, one marked down


class Run(Protocol):
    """How the reload command is run: subprocess.run's way (detached.run in production, a fake in tests)."""

    def __call__(self, argv: list[str], /, *, capture_output: bool, text: bool, timeout: float, stdin: int,
                 check: bool) -> subprocess.CompletedProcess[str]: ...


class RefreshView(TypedDict):
    """The `provers --json` object."""

    provers: list[Endpoint]
    upstream_file: str | None
    changed: bool
    reloaded: bool


@dataclass
class Refresh:
    provers: list[Endpoint]
    upstream_file: str | None
    changed: bool = False
    reloaded: bool = False
    errors: list[str] = field(default_factory=list)

    def view(self) -> RefreshView:
        return {"provers": self.provers, "upstream_file": self.upstream_file, "changed": self.changed,
                "reloaded": self.reloaded}


class Endpoint(TypedDict):
    """A joined machine as `vastctl provers` lists it and the nginx upstream names it."""

    label: str
    uuid: str
    endpoint: str  # host:port of its tunnel's end on this host
    joined_at: str | None  # display ISO


def endpoints(conn: sqlite3.Connection) -> list[Endpoint]:
    """The joined machines, by port: label, uuid, endpoint (on this host) and since when joined."""
    rows = [typed(row, tunnel.TunnelRow) for row in conn.execute(
        f"SELECT {tunnel.TUNNEL_COLUMNS} FROM instances"
        " WHERE state = 'running' AND tunnel_port IS NOT NULL AND destroyed_at IS NULL ORDER BY tunnel_port")]
    return [{"label": row["label"], "uuid": row["uuid"], "endpoint": f"127.0.0.1:{row['tunnel_port']}",
             "joined_at": clock.display_iso(row["joined_at"])} for row in tunnel.joined_rows(rows)]


def upstream_text(provers: list[Endpoint]) -> str:
    lines = ["# written by `vastctl provers`: the joined machines (their tunnels' ends); edits are overwritten",
             f"upstream {UPSTREAM} {{"]
    for prover in provers:
        label = upstream.clip(prover["label"], 80)  # one line, escaped: a label never ends the comment
        lines.append(f"    server {prover['endpoint']} max_fails=1 fail_timeout=10s;  # {label}")
    if not provers:
        lines.append(f"    server {NO_SERVER} down;  # no machine joined")
    lines.append("}")
    return "\n".join(lines) + "\n"


def refresh(conn: sqlite3.Connection, config: Config, *,
            run: Run = subprocess.run) -> Refresh:
    """Write the upstream file when the joined set changed, then reload; raises Unavailable when the reload
    fails (the previous file back in place) or the file cannot be written (nothing changed)."""
    provers = endpoints(conn)
    configured = config.provers.upstream_file.strip()
    result = Refresh(provers=provers, upstream_file=configured or None)
    if not configured:
        return result
    path = Path(configured).expanduser()
    text = upstream_text(provers)
    previous = atomicfile.read(path)
    if previous == text:
        return result
    try:
        atomicfile.write(path, text)
    except OSError as exc:
        raise Unavailable(f"cannot write provers.upstream_file {path} ({exc.strerror or exc}): the vastctl user"
                          " needs to write its directory; nothing was changed") from None
    result.changed = True
    command = config.provers.reload_command.strip()
    if not command:
        return result
    failure = _reload(command, run)
    if failure is not None:
        if previous is None:  # nothing nginx could have loaded: the first file stays, for nginx's first start
            raise Unavailable(f"provers.reload_command {failure}; the first upstream file {path} was written"
                              " (nginx has not loaded it): start or fix nginx, then run `vastctl provers` again")
        _put_back(path, previous)
        raise Unavailable(f"provers.reload_command {failure}; the previous upstream file was put back: fix the"
                          " command or the nginx config, then run `vastctl provers` again")
    result.reloaded = True
    return result


def _reload(command: str, run: Run) -> str | None:
    """None when the reload command succeeded, else what went wrong, in a few printable words."""
    try:
        done = run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=RELOAD_TIMEOUT_S,
                   stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"did not finish in {RELOAD_TIMEOUT_S}s"
    except OSError as exc:
        return f"could not run ({exc.strerror or exc})"
    if done.returncode == 0:
        return None
    said = " ".join((done.stderr or done.stdout or "").split())
    return f"failed (exit {done.returncode})" + (f": {upstream.clip(said, 300)}" if said else "")


def _put_back(path: Path, previous: str) -> None:
    try:
        atomicfile.write(path, previous)
    except OSError:
        pass  # the new file stays; the error raised next says the reload failed
