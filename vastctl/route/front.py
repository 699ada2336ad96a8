"""The router's front end: the listening socket Curio's nodes connect to, and its connections (caller.py).

The accept loop never ends but on a stop: a failed accept (EMFILE, ENFILE, no memory) or a thread that cannot
start is logged and retried after a pause, so running out of descriptors for a moment never leaves a router that
answers nothing. Connections are capped at MAX_CONNECTIONS, below the unit's LimitNOFILE: a new one past the cap
takes the place of the connection idle longest (GOAWAY, no call open), or is closed at once.

A stop is graceful: no new connection is accepted (the listening socket itself may outlive the process, handed
to the next router by systemd: route/listener.py), every connection gets GOAWAY so its caller opens new calls on
a new connection, and the calls taken finish (`wait`).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading

from vastctl.clock import SYSTEM, Clock
from vastctl.route import h2
from vastctl.route.caller import CallerConnection
from vastctl.route.server import Router

log = logging.getLogger("vastctl.route")

MAX_CONNECTIONS = 512  # each costs 2 descriptors and a thread (4 and 2 with calls passed to grpcio)
ACCEPT_PAUSE_S = (0.05, 1.0)  # after a failed accept: the first pause, the longest (doubling between)
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Front:
    """The listening socket and every connection accepted on it."""

    def __init__(self, router: Router, listen: socket.socket, internal_port: int, *,
                 clock: Clock = SYSTEM, max_connections: int = MAX_CONNECTIONS) -> None:
        self.router, self.listen, self.internal_port = router, listen, internal_port
        self.clock, self.max_connections = clock, max_connections
        self.stopping = False
        self.connections: set[CallerConnection] = set()
        self.calls: set[threading.Thread] = set()
        self.lock = threading.Condition()  # the sets above; notified when a stream or a call ends
        self._wake_read, self._wake_write = os.pipe()
        self._stopped = threading.Event()
        self._acceptor: threading.Thread | None = None

    def start(self) -> None:
        self.listen.setblocking(False)  # another router may take a connection between poll and accept
        self._acceptor = threading.Thread(target=self._accept_loop, name="route-accept", daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        poll = select.poll()
        poll.register(self.listen, select.POLLIN)
        poll.register(self._wake_read, select.POLLIN)
        pause = ACCEPT_PAUSE_S[0]
        failing = False
        while not self.stopping:
            poll.poll()
            if self.stopping:
                return
            try:
                sock, _ = self.listen.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                if not failing:
                    log.error("cannot accept a connection (%s): retrying%s", exc,
                              ", fewer connections or a higher LimitNOFILE would help"
                              if exc.errno in _OUT_OF_RESOURCES else "")
                failing = True
                self._pause(pause)
                pause = min(ACCEPT_PAUSE_S[1], pause * 2)
                continue
            if failing:
                log.info("accepting connections again")
            failing, pause = False, ACCEPT_PAUSE_S[0]
            try:
                self._admit(sock)
            except RuntimeError as exc:  # no thread could start: this connection is closed, the loop goes on
                log.error("cannot serve a connection (%s): closed it", exc)
                sock.close()
                self._pause(ACCEPT_PAUSE_S[1])

    def _pause(self, seconds: float) -> None:
        self._stopped.wait(seconds)

    def _admit(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h2.bound_sends(sock)  # a caller that stops reading is let go (caller.WRITE_STALL_S)
        with self.lock:
            evicted = None
            if len(self.connections) >= self.max_connections:
                idle = [c for c in self.connections if not c.busy()]
                if not idle:
                    log.warning("%d connections, every one with calls open: closed a new one", len(self.connections))
                    sock.close()
                    return
                evicted = min(idle, key=lambda c: c.last_active)
                self.connections.discard(evicted)
            connection = CallerConnection(self, sock, self.clock)
            self.connections.add(connection)
        if evicted is not None:
            evicted.evict()
        try:
            threading.Thread(target=connection.run, name="route-caller", daemon=True).start()
        except RuntimeError:
            with self.lock:
                self.connections.discard(connection)
            raise

    # --- what a connection tells the front end (caller.Site) ----------------------------------------------

    def call_started(self, thread: threading.Thread) -> None:
        with self.lock:
            self.calls.add(thread)

    def call_ended(self, thread: threading.Thread) -> None:
        with self.lock:
            self.calls.discard(thread)
            self.lock.notify_all()

    def stream_ended(self) -> None:
        with self.lock:
            self.lock.notify_all()

    def forget(self, connection: CallerConnection) -> None:
        with self.lock:
            self.connections.discard(connection)
            self.lock.notify_all()

    # --- stopping ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Take no new call: no new connection is accepted, and every connection is drained (GOAWAY)."""
        self.stopping = True
        self._stopped.set()
        os.write(self._wake_write, b"x")
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)
        try:
            self.listen.close()  # this process's descriptor: a socket systemd handed over stays open there
        except OSError:
            pass
        with self.lock:
            connections = list(self.connections)
        for connection in connections:
            connection.drain()

    def busy(self) -> int:
        """Calls open on every connection (served here or passed to grpcio)."""
        with self.lock:
            connections = list(self.connections)
        return sum(connection.busy() for connection in connections)

    def wait(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for every call taken to be answered; True when they all were."""
        deadline = self.clock.monotonic() + timeout
        with self.lock:
            while True:
                if not self.busy_locked():
                    return True
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return False
                self.lock.wait(timeout=min(remaining, 0.5))

    def busy_locked(self) -> int:
        return sum(connection.busy() for connection in self.connections) + len(self.calls)

    def close(self) -> None:
        with self.lock:
            connections = list(self.connections)
        for connection in connections:
            connection.close()
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass

