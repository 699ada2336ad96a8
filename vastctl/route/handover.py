"""A router handing its listening socket to the next one (SIGHUP: `systemctl reload vastctl-route`), so that a
restart or an upgrade overlaps instead of leaving a gap.

A stop, then a start, leaves new connections in the socket's backlog for as long as the old router drains, and a
drain lasts as long as the longest proof on a prover (minutes); Curio's client gives up on a connection whose
HTTP/2 handshake has not come within 20 s, and its call fails. Handed over, the next router takes new
connections at once, and this one finishes its calls (front.py's graceful stop) and exits.

The successor is this same command, started as systemd starts a socket-activated service: the socket at fd 3,
LISTEN_FDS=1, LISTEN_PID its own pid (listener.py). It says it is serving on a pipe named by READY_FD, and to
systemd (Type=notify: READY=1 and MAINPID, so systemd follows it as the service's process).
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys

READY_FD = "VASTCTL_ROUTE_READY_FD"  # the pipe the successor writes one byte to once it serves
READY_TIMEOUT_S = 60.0
# the successor's first step: the socket to fd 3, LISTEN_* set to name it, then `vastctl` itself (exec keeps
# the pid LISTEN_PID names)
ACTIVATE = ("import os, sys\n"
             "fd = int(sys.argv[1])\n"
             "if fd != 3:\n"
             "    os.dup2(fd, 3)\n"
             "    os.close(fd)\n"
             "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
             "os.execv(sys.argv[2], sys.argv[2:])\n")


class HandoverFailed(Exception):
    """No successor took over: this router goes on serving."""


def start_successor(listening: socket.socket, argv: list[str] | None = None,
                    timeout: float = READY_TIMEOUT_S) -> int:
    """Start the next router on `listening` and wait until it serves; its pid. HandoverFailed (why) when it
    exits or is not serving within `timeout` seconds (then it is stopped)."""
    command = [sys.executable, "-m", "vastctl", *(sys.argv[1:] if argv is None else argv)]
    read_end, write_end = os.pipe()
    fd = os.dup(listening.fileno())
    try:
        env = {**os.environ, READY_FD: str(write_end)}
        successor = subprocess.Popen([sys.executable, "-c", ACTIVATE, str(fd), *command], env=env,
                                     pass_fds=(fd, write_end), stdin=subprocess.DEVNULL)
    finally:
        os.close(fd)
        os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout)
        said = os.read(read_end, 1) if ready else b""
    finally:
        os.close(read_end)
    if said == b"1":
        return successor.pid
    exited = successor.poll()
    if exited is None:
        successor.terminate()
        successor.wait()
    raise HandoverFailed(f"the next router exited ({exited})" if exited is not None or ready
                         else f"the next router was not serving within {timeout:g}s")


def serving() -> None:
    """This router serves: tell whoever started it (the router it takes over from, systemd)."""
    notify(f"READY=1\nMAINPID={os.getpid()}")
    fd = os.environ.pop(READY_FD, None)
    if fd is not None and fd.isdigit():
        try:
            os.write(int(fd), b"1")
            os.close(int(fd))
        except OSError:
            pass


def notify(state: str) -> None:
    """sd_notify(3): a datagram to $NOTIFY_SOCKET when systemd set one (Type=notify), else nothing."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError:
        pass
