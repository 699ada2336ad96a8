"""What `vastctl serve` runs on beneath the WSGI app: waitress, with three changes.

- FramingParser refuses a request whose length is framed two ways (request
  smuggling, RFC 9112 §6.1).
- DeadlineChannel and DeadlineServer give a request `request_timeout` to
  arrive in full, however slowly it trickles.
- EventLoop replaces waitress's poll loop on Linux, so a pass costs the same
  however many idle or trickling connections are open.

server.make_server builds these; nothing else imports this module (it loads waitress).
"""

from __future__ import annotations

import collections
import select
import threading
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser, ParsingError
from waitress.server import TcpWSGIServer
from waitress.wasyncore import readwrite

from vastctl.clock import Clock


class FramingParser(HTTPRequestParser):
    """waitress's request parser, refusing a request whose length is framed two ways (RFC 9112 §6.1).

    waitress reads a body by Transfer-Encoding when Content-Length is also
    given, so a proxy in front that trusts Content-Length and waitress disagree
    on where the request ends: the bytes after the chunked body run as a second
    request the proxy never saw (request smuggling). Such a request, or an
    HTTP/1.0 one with any Transfer-Encoding, is answered 400 and the connection
    closed (waitress closes after every error answer); the bytes that arrived
    with it are dropped, never parsed as a request.
    """

    framing_refused = False

    def parse_header(self, header_plus: bytes) -> None:
        super().parse_header(header_plus)  # pops TRANSFER_ENCODING in HTTP/1.1, setting `chunked`
        if "CONTENT_LENGTH" in self.headers and (self.chunked or "TRANSFER_ENCODING" in self.headers):
            self.framing_refused = True
            raise ParsingError("a request may give Content-Length or Transfer-Encoding, not both"
                               " (RFC 9112 section 6.1): send one; this connection is closed")
        if "TRANSFER_ENCODING" in self.headers:  # left there only for HTTP/1.0, which has no chunked bodies
            self.framing_refused = True
            raise ParsingError("HTTP/1.0 has no Transfer-Encoding (RFC 9112 section 6.1): send Content-Length;"
                               " this connection is closed")

    def received(self, data: bytes) -> int:
        consumed: int = super().received(data)
        return len(data) if self.framing_refused else consumed  # what followed it is no request of ours


class DeadlineChannel(HTTPChannel):
    """A connection that remembers when its current request began to arrive."""

    parser_class = FramingParser
    request_started: float | None = None  # clock.monotonic() at the current request's first byte

    def received(self, data: bytes) -> bool:
        if data and self.request_started is None:
            self.request_started = self.server.clock.monotonic()
        arrived: bool = super().received(data)
        return arrived

    def service(self) -> None:
        self.request_started = None  # arrived in full: from here on it is the worker's time, not the client's
        _serving.fd = self._fileno
        try:
            super().service()
        finally:
            _serving.fd = None

    def add_channel(self, map: dict[int, Any] | None = None) -> None:
        super().add_channel(map)
        loop = getattr(self.server, "event_loop", None)
        if loop is not None:
            loop.recheck.add(self._fileno)

    def del_channel(self, map: dict[int, Any] | None = None) -> None:
        fd = self._fileno
        loop = getattr(self.server, "event_loop", None)
        if loop is not None and fd is not None:
            loop.forget(fd)  # before the socket closes, so a new connection on the same number starts clean
        super().del_channel(map)


class DeadlineServer(TcpWSGIServer):
    """waitress's TCP server, whose sweep also closes a connection whose request is overdue.

    waitress's `channel_timeout` closes a connection only after that long
    without a byte, so a client sending one byte every few seconds holds its
    connection for ever; a few hundred of them fill `connection_limit` and no
    report gets in. Here a request must arrive in full within
    `request_timeout` of its first byte, however busy its sender looks. The
    clock starts at a request's first byte and stops when a worker takes the
    request, so a keep-alive connection idle between requests is judged by
    `channel_timeout` alone.
    """

    channel_class = DeadlineChannel

    def __init__(self, *args: Any, request_timeout: float, clock: Clock, **kwargs: Any) -> None:
        self.request_timeout = request_timeout
        self.clock = clock
        super().__init__(*args, **kwargs)

    event_loop: EventLoop | None = None

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # the idle ones
        cutoff = self.clock.monotonic() - self.request_timeout
        for channel in list(self.active_channels.values()):
            started = channel.request_started
            if not channel.requests and started is not None and started < cutoff:
                channel.will_close = True
        if self.event_loop is not None:
            self.event_loop.sweep_ran = True  # any channel may now be closing: ask them all again

    def pull_trigger(self) -> None:
        fd = getattr(_serving, "fd", None)
        if fd is not None and self.event_loop is not None:
            self.event_loop.touched.append(fd)  # before the wake-up, so the pass it causes asks this connection
        super().pull_trigger()

    def run(self) -> None:
        """waitress's run(), on EventLoop where epoll exists (Linux), else on waitress's own poll loop."""
        if not hasattr(select, "epoll"):
            super().run()
            return
        self.event_loop = EventLoop(self._map, self.channel_class, self.adj)
        try:
            self.event_loop.run(self.adj.asyncore_loop_timeout)
        except (SystemExit, KeyboardInterrupt):
            self.task_dispatcher.shutdown()
        finally:
            self.event_loop.close()


class EventLoop:
    """waitress's poll loop, paying per pass only for the connections whose wishes may have changed.

    wasyncore's poll2 asks every open connection readable() and writable()
    and registers each anew on every pass: with 500 idle or trickling
    connections open, that Python loop held the GIL for more than half of
    serve's time under the bench, while the one worker waited for it. Here
    the events a connection wants stay registered in an epoll set, and a pass
    asks again only: the dispatchers that are not connections (the listener,
    whose readable() runs the maintenance sweep, and the trigger), the
    connections that had an event, the ones a worker touched (it pulls the
    trigger when it finishes a request or leaves output behind, and
    DeadlineServer.pull_trigger names the connection), the new ones, and
    after a sweep or a quiet second, all of them.

    The registration may want more than the connection does (a connection
    whose request is in service keeps its read interest): an event nobody
    wants is not handed on, and the registration is narrowed then, so a
    pipelining client or a socket that is always writable cannot spin the loop.
    """

    READ = select.POLLIN | select.POLLPRI
    WRITE = select.POLLOUT
    TROUBLE = select.POLLHUP | select.POLLERR

    def __init__(self, map: dict[int, Any], channel_class: type[DeadlineChannel], adj: Adjustments) -> None:
        self.map = map
        self.channel_class = channel_class
        self.lookahead = adj.channel_request_lookahead
        self.epoll = select.epoll()
        self.registered: dict[int, int] = {}  # fd → the events registered for it (absent: not registered)
        self.recheck: set[int] = set()  # connections to ask again at the next pass (main thread only)
        self.touched: collections.deque[int] = collections.deque()  # connections workers are done with (thread-safe)
        self.sweep_ran = True  # the first pass asks every dispatcher
        self.others: list[tuple[int, Any]] = []  # the dispatchers that are not connections, found at each full pass

    def run(self, timeout: float) -> None:
        while self.map:
            self.once(timeout)

    def once(self, timeout: float) -> None:
        if self.sweep_ran:
            self.others = [(fd, obj) for fd, obj in list(self.map.items()) if not isinstance(obj, self.channel_class)]
        for fd, obj in self.others:
            flags = self.flags_of(obj) if self.map.get(fd) is obj else 0  # the listener's readable() may run the sweep
            if self.registered.get(fd, 0) != flags:
                self.set(fd, flags)  # exactly: a listener past connection_limit must stop accepting
        touched = self.touched
        while touched:
            self.recheck.add(touched.popleft())
        check: list[int] | set[int]
        if self.sweep_ran:
            self.sweep_ran = False
            check = list(self.map)
        else:
            check, self.recheck = self.recheck, set()
        for fd in check:
            obj = self.map.get(fd)
            if obj is not None and isinstance(obj, self.channel_class):
                self.ask(fd, self.channel_flags(obj))
        try:
            events = self.epoll.poll(timeout)
        except InterruptedError:
            events = []
        if not events:
            self.sweep_ran = True  # a quiet second: ask everything again, whatever was missed
        for fd, flags in events:
            obj = self.map.get(fd)
            if obj is None:
                continue
            if isinstance(obj, self.channel_class):
                wanted = self.channel_flags(obj)
                if flags & ~(wanted | self.TROUBLE) or (flags & self.TROUBLE and not wanted):
                    self.narrow(fd, wanted)  # registered for more than it wants now: no spinning on it
                flags &= wanted | (self.TROUBLE if wanted else 0)
                self.recheck.add(fd)
                if not flags:
                    continue
            readwrite(obj, flags)

    def channel_flags(self, channel: DeadlineChannel) -> int:
        """HTTPChannel.readable() and writable(), inline: this runs at least once per request."""
        closing = channel.will_close or channel.close_when_flushed
        pending = channel.total_outbufs_len
        readable = not (closing or pending or len(channel.requests) > self.lookahead)
        return (self.READ if readable else 0) | (self.WRITE if closing or pending else 0)

    def flags_of(self, obj: Any) -> int:
        return (self.READ if obj.readable() else 0) | (self.WRITE if obj.writable() and not obj.accepting else 0)

    def ask(self, fd: int, wanted: int) -> None:
        """Make sure the registration covers `wanted` (it may cover more until an unwanted event narrows it)."""
        have = self.registered.get(fd, 0)
        if wanted & ~have:
            self.set(fd, have | wanted)

    def narrow(self, fd: int, wanted: int) -> None:
        self.set(fd, wanted)

    def set(self, fd: int, flags: int) -> None:
        try:
            if not flags:
                if fd in self.registered:
                    self.epoll.unregister(fd)
            elif fd in self.registered:
                self.epoll.modify(fd, flags)
            else:
                self.epoll.register(fd, flags)
        except FileNotFoundError:  # closed and reopened behind our back: register afresh
            if flags:
                self.epoll.register(fd, flags)
        except FileExistsError:
            self.epoll.modify(fd, flags)
        except OSError:  # the fd is gone: its dispatcher leaves the map
            self.registered.pop(fd, None)
            return
        if flags:
            self.registered[fd] = flags
        else:
            self.registered.pop(fd, None)

    def forget(self, fd: int) -> None:
        if self.registered.pop(fd, None) is not None:
            try:
                self.epoll.unregister(fd)
            except OSError:
                pass
        self.recheck.discard(fd)

    def close(self) -> None:
        self.epoll.close()


_serving = threading.local()  # the connection a worker thread is serving, for DeadlineServer.pull_trigger
