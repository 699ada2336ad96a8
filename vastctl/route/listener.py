"""The router's listening socket: the one systemd passed (socket activation), or one bound on route.listen.

With jobs/vastctl-route.socket installed, systemd holds the socket and passes it to each router process as
fd 3, with LISTEN_FDS=1 and LISTEN_PID naming that process (sd_listen_fds(3)). The socket outlives the
process: while one router stops and the next starts, Curio's connects wait in its backlog and are taken by
the next router, instead of being refused (a refused connect is a failed call, and for Curio a failed task).
Without the unit the router binds route.listen itself, and a restart refuses connects while no router runs.

  LISTEN_PID        LISTEN_FDS   the router
  unset             -            binds route.listen
  another process   -            binds route.listen (the variables were meant for a parent)
  this process      1            takes fd 3, once it checks it is a listening TCP socket
  this process      not 1        refuses to start: one ListenStream in the socket unit

The variables are removed from the environment once read, as sd_listen_fds(1) does, so nothing the router
starts takes them for its own.
"""

from __future__ import annotations

import os
import socket
from typing import MutableMapping

from vastctl.errors import BadInput

SD_LISTEN_FDS_START = 3  # the first socket systemd passes
BACKLOG = 4096  # connects waiting for the router's accept (the kernel caps it at net.core.somaxconn)
ENVIRONMENT = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
UNIT = "jobs/vastctl-route.socket"


def take(address: str, environ: MutableMapping[str, str] | None = None) -> tuple[socket.socket, bool]:
    """The router's listening socket and whether systemd passed it; bound on `address` (host:port) when
    systemd passed none. OSError when it cannot be bound; BadInput when what systemd passed is unusable."""
    inherited = from_systemd(os.environ if environ is None else environ)
    if inherited is not None:
        return inherited, True
    return bind(address), False


def from_systemd(environ: MutableMapping[str, str], *, pid: int | None = None,
                 fd: int = SD_LISTEN_FDS_START) -> socket.socket | None:
    """The listening socket systemd passed this process (`pid`, default this one) as `fd`, or None when it
    passed none. The LISTEN_* variables are removed either way."""
    listen_pid, listen_fds = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    for name in ENVIRONMENT:
        environ.pop(name, None)
    if listen_pid is None or listen_fds is None:
        return None
    if not listen_pid.isdigit() or int(listen_pid) != (os.getpid() if pid is None else pid):
        return None
    if listen_fds != "1":
        raise BadInput(f"systemd passed {listen_fds!r} sockets (LISTEN_FDS) where the router takes one: give"
                       f" {UNIT} exactly one ListenStream")
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        raise BadInput(f"fd {fd}, which systemd said is the router's socket (LISTEN_FDS=1), is not a socket: check"
                       f" {UNIT}") from None
    try:
        accepting = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        accepting = 0
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM or not accepting:
        sock.close()
        raise BadInput(f"fd {fd} from systemd is not a listening TCP socket: {UNIT} needs ListenStream=host:port"
                       " (route.listen's address), not a path, a datagram socket or Accept=yes")
    sock.set_inheritable(False)  # as sd_listen_fds leaves it: no process the router starts holds it open
    sock.setblocking(True)  # the flag is the socket's, shared with systemd's copy: set to what a bound one has
    return sock


def bind(address: str) -> socket.socket:
    """A listening socket on host:port (port 0 picks one; an IPv6 host may be in brackets); OSError when it
    cannot be had."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def name(sock: socket.socket) -> tuple[str, int]:
    """The host (an IPv6 one in brackets) and port a listening socket is on."""
    host, port = sock.getsockname()[:2]
    return (f"[{host}]" if ":" in host else host), port
