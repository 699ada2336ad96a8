"""launch.join ssh: each machine's reverse SSH tunnel to the manager — its port, its key, the authorized_keys file,
and the manager's own check that the machine's daemon answers through it.

  port             one of tunnel.first_port..last_port on the manager's 127.0.0.1, unique among machines not yet
                   confirmed destroyed (a killed machine's open session may still hold it)
  key pair         made fresh for each launch; the private half goes to the machine in its create request's
                   env (like its token) and is kept nowhere here; the row keeps the public half
  authorized_keys  one line per live machine, `restrict,port-forwarding,permitlisten="127.0.0.1:PORT"` and
                   nothing else, rewritten whole and atomically from the rows after every launch and kill:
                   a killed machine's key is gone at its next connect
  joined           the manager itself speaks HTTP/2 (what gRPC runs on) through 127.0.0.1:PORT and the daemon
                   answers; the machine's own word is not asked. joined_at says since when; tunnel_down_since
                   since when a joined machine stopped answering (reconcile kills it past tunnel.down_timeout)
"""

from __future__ import annotations

import base64
import grp
import os
import pwd
import re
import socket
import sqlite3
import stat
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, TypedDict

from vastctl import atomicfile, clock
from vastctl.config import Config
from vastctl.errors import BadInput, Unavailable
from vastctl.state.db import transaction
from vastctl.state.lifecycle import State, record_event
from vastctl.state.rows import typed

if TYPE_CHECKING:
    from typing_extensions import ReadOnly  # typing's own from Python 3.13

KEY_TYPE = "ed25519"
PUBLIC_KEY = re.compile(r"^(ssh-ed25519|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|ssh-rsa)"
                        r" ([A-Za-z0-9+/]+={0,2})(?: .*)?$")
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame, the client's first
SETTINGS_TYPE = 4
PROBE_WORKERS = 16
JOINED, LEFT = "joined", "tunnel_lost"  # event kinds


def enabled(config: Config) -> bool:
    return config.launch.join == "ssh"


# --- at launch ----------------------------------------------------------------------------------------


def new_key_pair(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH format, public key line) made by ssh-keygen in a private temporary directory
    that is removed at once: the private half exists only in the value returned."""
    with tempfile.TemporaryDirectory(prefix="vastctl-key-") as directory:
        path = Path(directory) / "key"
        try:
            subprocess.run(["ssh-keygen", "-q", "-t", KEY_TYPE, "-N", "", "-C", comment, "-f", str(path)],
                           check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"cannot make a tunnel key with ssh-keygen ({type(exc).__name__}): install"
                              " openssh-client on the manager, or set launch.join to none") from None
        private = path.read_text(encoding="ascii")
        public = path.with_suffix(".pub").read_text(encoding="ascii").strip()
    return private, public


def allocate_port(conn: sqlite3.Connection, config: Config) -> int:
    """The lowest port of the range no machine holds (a port is held until the machine is confirmed destroyed).

    Launches run one at a time (the launch lease); the unique index on the column stops a second holder anyway.
    """
    held = {row[0] for row in conn.execute(
        "SELECT tunnel_port FROM instances WHERE tunnel_port IS NOT NULL AND destroyed_at IS NULL")}
    for port in range(config.tunnel.first_port, config.tunnel.last_port + 1):
        if port not in held:
            return port
    raise Unavailable(f"every tunnel port of {config.tunnel.first_port}-{config.tunnel.last_port} is held by a"
                      " machine not yet destroyed: widen tunnel.first_port/last_port, or retry once reconcile has"
                      " destroyed the killed ones")


def host_key(config: Config) -> str:
    """The manager's SSH host key (`TYPE BASE64`) the machines pin, from tunnel.host_key_file."""
    path = Path(config.tunnel.host_key_file).expanduser()
    try:
        line = path.read_text(encoding="ascii").strip().splitlines()[0]
    except (OSError, UnicodeDecodeError, IndexError):
        raise BadInput(f"tunnel.host_key_file {path} cannot be read as an SSH public key: point it at this host's"
                       " key (e.g. /etc/ssh/ssh_host_ed25519_key.pub), or set launch.join to none") from None
    match = PUBLIC_KEY.match(line)
    if not match:
        raise BadInput(f"tunnel.host_key_file {path} does not hold an SSH public key line (TYPE BASE64 comment)")
    return f"{match.group(1)} {match.group(2)}"


def check_config(config: Config) -> None:
    """launch.join ssh needs a host to dial and a key to pin; refused before any money is spent."""
    if not config.tunnel.host.strip():
        raise BadInput("launch.join is ssh but tunnel.host is empty: set it to this host's address as the machines"
                       " dial it (docs/joining-curio.md)")
    host_key(config)


def machine_env(config: Config, port: int, private_key: str) -> dict[str, str]:
    """What the boot script's join step reads. The key is base64 (one line, as every env value must be)."""
    return {
        "VASTCTL_JOIN": "ssh",
        "VASTCTL_TUNNEL_HOST": config.tunnel.host.strip(),
        "VASTCTL_TUNNEL_SSH_PORT": str(config.tunnel.ssh_port),
        "VASTCTL_TUNNEL_USER": config.tunnel.user,
        "VASTCTL_TUNNEL_PORT": str(port),
        "VASTCTL_TUNNEL_HOST_KEY": host_key(config),
        "VASTCTL_TUNNEL_KEY": base64.b64encode(private_key.encode("ascii")).decode("ascii"),
    }


PUBLIC_ENV = ("VASTCTL_JOIN", "VASTCTL_TUNNEL_HOST", "VASTCTL_TUNNEL_SSH_PORT", "VASTCTL_TUNNEL_USER",
              "VASTCTL_TUNNEL_PORT", "VASTCTL_TUNNEL_HOST_KEY")  # the audit may show these; never the key


# --- authorized_keys ------------------------------------------------------------------------------------


def authorized_line(port: int, public_key: str, label: str) -> str:
    """One machine's line: its own port on the manager's loopback, and nothing else (no pty, no agent, no X11,
    no local forwarding: `restrict` takes everything, `port-forwarding` gives back forwarding, `permitlisten`
    limits it to that one listen address)."""
    match = PUBLIC_KEY.match(public_key.strip())
    if not match or not isinstance(port, int):
        raise ValueError(f"not a public key line for {label}")
    safe_label = re.sub(r"[^A-Za-z0-9._-]", "_", label)[:64]
    return f'restrict,port-forwarding,permitlisten="127.0.0.1:{port}" {match.group(1)} {match.group(2)} {safe_label}'


def authorized_keys_text(conn: sqlite3.Connection) -> str:
    rows = conn.execute("SELECT label, tunnel_port, tunnel_public_key FROM instances WHERE state != 'killed'"
                        " AND tunnel_port IS NOT NULL AND tunnel_public_key IS NOT NULL ORDER BY tunnel_port")
    lines = ["# written by vastctl (vastctl/facts/tunnel.py): one line per live machine; edits are overwritten"]
    for row in rows:
        try:
            lines.append(authorized_line(row["tunnel_port"], row["tunnel_public_key"], row["label"]))
        except ValueError:  # a row edited by hand: that machine cannot connect (tunnel_down), the others can
            lines.append(f"# {re.sub(r'[^A-Za-z0-9._-]', '_', str(row['label']))[:64]}: no valid public key")
    return "\n".join(lines) + "\n"


def write_authorized_keys(conn: sqlite3.Connection, config: Config) -> bool:
    """Rewrite tunnel.authorized_keys from the rows when it differs; True when it was written.

    Does nothing unless launch.join is ssh or a row still has a tunnel (a config switched back to none
    still prunes the keys of machines killed since).
    """
    has_tunnels = conn.execute("SELECT 1 FROM instances WHERE tunnel_port IS NOT NULL LIMIT 1").fetchone()
    if not enabled(config) and not has_tunnels:
        return False
    path = Path(config.tunnel.authorized_keys).expanduser()
    unreadable = unreadable_by(path, config.tunnel.keys_reader)
    if unreadable:
        raise Unavailable(unreadable)
    text = authorized_keys_text(conn)
    if atomicfile.read(path) == text:
        return False
    try:
        atomicfile.write(path, text, mode=0o644)
    except OSError as exc:
        raise Unavailable(f"cannot write tunnel.authorized_keys {path} ({exc.strerror or exc}): the vastctl user"
                          " needs to write its directory (docs/joining-curio.md)") from None
    return True


def unreadable_by(path: Path, user: str) -> str | None:
    """Why sshd's AuthorizedKeysCommandUser (tunnel.keys_reader) could not read the keys file, or None.

    sshd reads the file as that account, not as vastctl: a directory on the way it cannot enter (the state
    file's own, vastctl:vastctl 750) turns every machine's login into `Permission denied (publickey)`, and the
    machines bench, never join, and bill. Checked before a key is written, so such a launch rents nothing.
    """
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return (f"tunnel.keys_reader {user!r} is no account on this host: name the AuthorizedKeysCommandUser"
                " of jobs/sshd-vastctl-tunnel.conf (nobody)")
    if account.pw_uid == 0:
        return None
    groups = set(os.getgrouplist(user, account.pw_gid))
    path = path.absolute()
    for place, need in [*((parent, 1) for parent in reversed(path.parents)), (path, 4)]:
        try:
            info = place.stat()
        except FileNotFoundError:
            return None  # made below by vastctl itself, readable (0644 in a directory it made)
        except OSError:
            continue
        if info.st_uid == account.pw_uid:
            bits = info.st_mode >> 6
        elif info.st_gid in groups:
            bits = info.st_mode >> 3
        else:
            bits = info.st_mode
        if not bits & need:
            what = "enter" if need == 1 else "read"
            try:
                owner = f"{pwd.getpwuid(info.st_uid).pw_name}:{grp.getgrgid(info.st_gid).gr_name}"
            except KeyError:
                owner = f"{info.st_uid}:{info.st_gid}"
            return (f"sshd reads tunnel.authorized_keys as the account {user} (tunnel.keys_reader), which cannot"
                    f" {what} {place} ({owner}, mode {stat.S_IMODE(info.st_mode):o}): no machine could log in; keep"
                    f" the keys in a directory the account {user} can enter, e.g. /var/lib/vastctl-tunnel, mode 755"
                    " (docs/joining-curio.md)")
    return None


# --- the manager's check ----------------------------------------------------------------------------------


def probe(port: int, timeout: float, host: str = "127.0.0.1") -> bool:
    """Whether an HTTP/2 server (a gRPC daemon) answers at host:port: our preface and SETTINGS out, a SETTINGS
    frame back. sshd accepts a forwarded port's connection even when the machine's side is gone, so a connect
    alone proves nothing; the daemon's own first frame does. Whatever comes back is read as 9 bytes, no more."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(HTTP2_PREFACE + HTTP2_SETTINGS)
            header = b""
            while len(header) < 9:
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    return False
                header += chunk
    except OSError:
        return False
    return header[3] == SETTINGS_TYPE and header[5:9] == b"\x00\x00\x00\x00"  # SETTINGS on stream 0


@dataclass(frozen=True)
class Check:
    uuid: str
    label: str
    port: int
    up: bool


class TunnelRow(TypedDict):
    """The columns of a machine's row that say where its tunnel stands (a SELECT of them, not the whole row)."""

    uuid: str
    label: str
    state: str
    state_since: str
    tunnel_port: int
    joined_at: str | None
    tunnel_down_since: str | None


TUNNEL_COLUMNS = "uuid, label, state, state_since, tunnel_port, joined_at, tunnel_down_since"


class TunnelFields(TypedDict):
    """What down_since() and joined() read of a machine's row: an InstanceRow, a TunnelRow or a Candidate (read
    only, so that a row whose tunnel_port is known to be set passes too)."""

    state: ReadOnly[str]
    state_since: ReadOnly[str]
    tunnel_port: ReadOnly[int | None]
    joined_at: ReadOnly[str | None]
    tunnel_down_since: ReadOnly[str | None]


def checked_rows(conn: sqlite3.Connection) -> list[TunnelRow]:
    """The machines whose tunnel the manager checks: running (they joined before reporting it), with a port."""
    return [typed(row, TunnelRow) for row in conn.execute(
        f"SELECT {TUNNEL_COLUMNS} FROM instances"
        " WHERE state = ? AND tunnel_port IS NOT NULL AND destroyed_at IS NULL ORDER BY tunnel_port",
        (State.RUNNING,))]


def check(conn: sqlite3.Connection, config: Config, *, now: datetime,
          probe_fn: Callable[[int, float], bool] = probe) -> list[Check]:
    """Probe every running machine's tunnel (in parallel, tunnel.check_timeout each) and record what was found:
    joined_at when it first answers, tunnel_down_since when a joined one stops; one event at each change."""
    rows = checked_rows(conn)
    if not rows:
        return []
    timeout = config.tunnel.check_timeout
    with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(rows))) as pool:
        ups = list(pool.map(lambda row: probe_fn(row["tunnel_port"], timeout), rows))
    at = clock.to_iso(now)
    results = []
    with transaction(conn):
        for row, up in zip(rows, ups):
            results.append(Check(uuid=row["uuid"], label=row["label"], port=row["tunnel_port"], up=up))
            current = conn.execute("SELECT state, state_since, tunnel_port, joined_at, tunnel_down_since"
                                   " FROM instances WHERE uuid = ?", (row["uuid"],)).fetchone()
            if current is None or current["state"] != State.RUNNING:
                continue  # moved on while we probed
            now_row = typed(current, TunnelRow)
            updates: dict[str, str | None] = {"tunnel_checked_at": at}
            if up and not joined(now_row):
                updates.update(joined_at=at, tunnel_down_since=None)
                record_event(conn, kind=JOINED, source="reconcile", uuid=row["uuid"], label=row["label"], now=now,
                             reason=f"joined: the manager reaches its daemon through 127.0.0.1:{row['tunnel_port']}")
            elif not up and joined(now_row):
                updates["tunnel_down_since"] = at
                record_event(conn, kind=LEFT, source="reconcile", uuid=row["uuid"], label=row["label"], now=now,
                             reason=f"its daemon no longer answers through 127.0.0.1:{row['tunnel_port']}")
            names = ", ".join(f"{name} = ?" for name in updates)
            conn.execute(f"UPDATE instances SET {names} WHERE uuid = ?", (*updates.values(), row["uuid"]))
    return results


def down_since(row: TunnelFields) -> str | None:
    """Since when a running machine with a tunnel has not been reachable through it (ISO text), or None.

    One that has not joined since it last reported running counts from then: it joins before reporting it
    (a machine resumed or restarted joins again, whatever it did before).
    """
    if row.get("state") != State.RUNNING or row.get("tunnel_port") is None:
        return None
    if not joined_this_run(row):
        return row.get("state_since")
    return row.get("tunnel_down_since")


def joined_this_run(row: TunnelFields) -> bool:
    """joined_at is from the machine's current spell in `running` (ISO texts compare as times)."""
    joined_at = row.get("joined_at")
    return joined_at is not None and joined_at >= (row.get("state_since") or "")


def joined(row: TunnelFields) -> bool | None:
    """Joined now (True), not (False), or no tunnel to speak of (None)."""
    if row.get("tunnel_port") is None:
        return None
    return row.get("state") == State.RUNNING and joined_this_run(row) and row.get("tunnel_down_since") is None


def joined_rows(rows: Iterable[TunnelRow]) -> list[TunnelRow]:
    return [row for row in rows if joined(row)]
