"""`vastctl route`: cuzk.v1.ProvingEngine in front of the joined provers, so Curio never loses a proof at the
fleet's edge.

Curio counts every failed Prove as a failed task and deletes a PoRep task after ~8 minutes of them; a
replacement machine takes 15-90 minutes. So the router holds what it cannot place, never fails fast:

  Prove      read only once route.max_held_mb has room for it (till then it waits unread, its sender
             paused by HTTP/2 flow control), then held until a prover has a free slot (dispatch.py), bounded
             by the call's own deadline and route.max_held; sent with its bytes untouched; a call the prover
             dropped before answering (UNAVAILABLE: reset, the tunnel gone; or the machine left the joined
             set while it held the call) is sent again to another prover, at most route.max_retries times; a
             prover not reached (a refused connect) was sent nothing: the call waits for it or goes elsewhere,
             no attempt spent (dispatch.py has each prover's health). Whatever the prover
             answered (gRPC OK, a proof FAILED inside it, or a status the daemon chose) goes back as it came
             and is never sent again. Over the daemon's 128 MiB it is refused at once. By its kind
             (routing.py): SnapDeals and WinningPoSt, which Curio does not verify, go to route.own_daemon (or
             the fleet where route.unverified_to_fleet says so, else are refused); WindowPoSt goes to
             route.own_daemon when set, else ahead of every held call. A prover's answer over wire.MAX_ANSWER
             is an error for that prover, never passed on.
  GetStatus  the joined provers' answers, each parsed alone (one that does not parse or carries absurd
             counts is left out and logged), summed and clamped (status.py), plus the router's held calls as
             queue "router-held".
  the rest   UNIMPLEMENTED with a message (Curio calls only Prove and GetStatus).

Every attempt is recorded (facts/deliveries.py) by one writer thread, which also reads the joined provers
from the state file every route.refresh and writes what the router holds.
"""

from __future__ import annotations

import logging
import queue
import socket
import sqlite3
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError

from vastctl import clock as clock_module
from vastctl.clock import Clock
from vastctl.config import Config
from vastctl.facts import deliveries, tunnel
from vastctl.route import cut_through, dispatch, health, memory, routing, status, wire
from vastctl.route.buffers import Buffers
from vastctl.route.dispatch import Dispatcher, Prover, ProverSpec
from vastctl.route.routing import Way
from vastctl.state import db

log = logging.getLogger("vastctl.route")

ANSWERED = ("completed", "failed")  # a proof came back (FAILED inside gRPC OK too): returned as it came
# route.max_held_mb counts a kept call (held or on a prover) at COPIES x its size: its bytes, gRPC's copy while it
# is sent and a margin for the allocator. Reading a message peaks at three copies of it (gRPC's buffer,
# grpcio's bytearray, the bytes made of it; bench/README.md, "Proof router"), so a call is read only while
# READ_RESERVE, enough for the largest message a daemon takes, fits beside what is kept (docs/joining-curio.md
# gives the bound)
COPIES = 3
READ_RESERVE = int(3.25 * wire.DAEMON_MAX_MESSAGE)
TRIM_FROM = 8 * 1024 * 1024  # a message at least this big was read: give the freed read buffers back to the system
STATUS_TIMEOUT_S = 2.0  # one prover's GetStatus (Curio gives the whole call 5 s)
NO_DEADLINE_S = 24 * 3600.0  # a call with no deadline (grpcurl, a test call) is held and proved at most this long
PROBE_TIMEOUT_S = 1.0  # the router's own check of a machine reconcile has not joined yet
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", wire.CURIO_MAX_MESSAGE),
    # a prover's answer is a proof of KBs: a longer one is refused from its length prefix, before it is read
    # (RESOURCE_EXHAUSTED, an error for that prover), never passed on
    ("grpc.max_receive_message_length", wire.MAX_ANSWER),
    ("grpc.enable_retries", 0),  # the router decides what is sent again, never the channel
    ("grpc.keepalive_time_ms", 60_000),  # a tunnel that went silent is found within minutes, not at the deadline
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.max_pings_without_data", 0),
]
OWN_DAEMON_LABEL = "own_daemon"  # proof_calls.label of a call sent to route.own_daemon (uuid empty)


class CallContext(Protocol):
    """What the router asks of a call: a grpcio ServicerContext, or front.py's for a call it sends as it arrives."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn: ...

    def is_active(self) -> bool: ...

    def time_remaining(self) -> float | None: ...


class Router:
    def __init__(self, config: Config, *, clock: Clock = clock_module.SYSTEM,
                 probe: Callable[[int, float], bool] = tunnel.probe) -> None:
        route = config.route
        self.config = config
        self.clock = clock
        self.probe = probe
        self.dispatcher = Dispatcher(max_held=route.max_held, max_bytes=route.max_held_mb * 1024 * 1024,
                                     fail_threshold=route.fail_threshold, clock=clock, read_reserve=READ_RESERVE,
                                     ejection_base=route.ejection_base, max_ejected_percent=route.max_ejected_percent)
        self.buffers = Buffers(max_bytes=route.max_held_mb * 1024 * 1024, clock=clock)  # for calls sent as they arrive
        self._channels: dict[str, grpc.Channel] = {}  # one per prover (uuid): closed when it leaves
        self._arriving: dict[str, dict[int, socket.socket]] = {}  # prover → the connections of calls sent as they arrive
        self._lock = threading.Lock()
        self._records: queue.Queue[tuple[Any, ...]] = queue.Queue()  # ("call", row) or ("set_aside", uuid, why)
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        # where each kind goes (routing.py): said at start-up, written to route_status (the dashboard), never silent
        self.ways = routing.routing(route)
        self._own_channel = (grpc.insecure_channel(route.own_daemon, options=CHANNEL_OPTIONS)
                             if route.own_daemon else None)
        self.statuses = status.Statuses(self._channel, clock=clock, timeout=STATUS_TIMEOUT_S)
        log.log(logging.WARNING if routing.risky(route) else logging.INFO, "routing: %s", routing.words(route))

    # --- the calls ----------------------------------------------------------------------------------------

    def prove(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """Prove, served as a stream of its one message (the same call on the wire): a unary handler is given
        a call only once grpcio has read its whole message, so the router could not keep a call it has no
        room for from costing memory. Here it decides first, and a call it has no room for waits unread."""
        started = self.clock.monotonic()
        try:
            unread = self.dispatcher.enter()
        except dispatch.Closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "vastctl route is stopping: it takes no new calls")
        try:
            request = self._read(requests, context, unread, started)
            return self._prove(request, context, unread, started)
        finally:
            self.dispatcher.leave(unread)  # its place and reserve, if it never got as far as admit

    def prove_arriving(self, incoming: cut_through.Incoming, header: wire.ProveHeader,
                       context: CallContext) -> bytes:
        """Prove for a call the front end (front.py) sends on as it arrives (`cuts`): decided on its size and
        first fields before its message is read, held like any other, its message read once the router has
        room for it, sent to the prover as it comes and kept whole for a resend."""
        started = self.clock.monotonic()
        size = incoming.length
        base = {"request_id": header.request_id[:200], "kind": _kind(header), "size_bytes": size}
        if size > wire.DAEMON_MAX_MESSAGE:
            self._refuse_too_big(base, started, context)
        try:
            unread = self.dispatcher.enter()
        except dispatch.Closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "vastctl route is stopping: it takes no new calls")
        try:
            self._wait_to_read(context, unread, started, reserve=size)
            incoming.open()
            return self._route(incoming, size, header, context, unread, started)
        finally:
            self.dispatcher.leave(unread)

    def cuts(self, header: wire.ProveHeader, size: int) -> bool:
        """Whether a Prove goes through `prove_arriving`: big enough (route.cut_through_mb) to be worth it, and
        not a call bound for route.own_daemon (that goes whole, unheld, as PoSt to route.post_address always has).
        A call refused for its kind (Way.REFUSED) is refused by `_route` either way, before any prover is tried."""
        if self.ways.get(header.proof_kind) is Way.OWN_DAEMON:
            return False
        return size >= self.config.route.cut_through_mb * 1024 * 1024

    def _read(self, requests: Iterator[bytes], context: CallContext, unread: dispatch.Unread,
              started: float) -> bytes:
        """The call's message, read once the router has room for it (dispatch.Dispatcher.wait_to_read)."""
        self._wait_to_read(context, unread, started)
        try:
            request = next(requests, None)
        except grpc.RpcError:  # the caller went away while its message came in
            context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
        if request is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a Prove carries one cuzk.v1.ProveRequest; none came")
        assert request is not None  # abort raised
        if len(request) >= TRIM_FROM:
            memory.give_back()
        return request

    def _wait_to_read(self, context: CallContext, unread: dispatch.Unread, started: float,
                      reserve: int | None = None) -> None:
        base = {"request_id": None, "kind": "unread", "size_bytes": 0}
        while True:
            remaining = self._remaining(context, started)
            if remaining <= 0:
                self._record(base, "expired", started, attempt=0, detail="waited unread past its deadline")
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"vastctl route kept this call unread {self.clock.monotonic() - started:.0f}s: the"
                              " memory for requests (route.max_held_mb) stayed in use until its deadline")
            if not context.is_active():
                if remaining <= health.DEADLINE_SLACK_S:  # its deadline passed at the caller a moment before here
                    self._record(base, "expired", started, attempt=0, detail="waited unread past its deadline")
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed while it waited unread")
                self._record(base, "abandoned", started, attempt=0, detail="the caller went away while unread")
                context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
            try:
                if self.dispatcher.wait_to_read(unread, timeout=min(remaining, 1.0), reserve=reserve):
                    return
            except dispatch.Closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, "vastctl route is stopping: it takes no new calls")

    def _refuse_too_big(self, base: dict[str, Any], started: float, context: CallContext) -> None:
        self._record(base, "refused", started, attempt=0, detail="over 128 MiB")
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"vastctl route: a {base['size_bytes']}-byte request is over the 134217728 bytes (128 MiB) a"
                      " cuzk daemon accepts; no prover was tried")

    def _prove(self, request: bytes, context: CallContext, unread: dispatch.Unread, started: float) -> bytes:
        size = len(request)
        try:
            header = wire.prove_header(request)
        except wire.Malformed as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a cuzk.v1.ProveRequest ({exc})")
        if size > wire.DAEMON_MAX_MESSAGE:
            self._refuse_too_big({"request_id": header.request_id[:200], "kind": _kind(header), "size_bytes": size},
                                 started, context)
        return self._route(request, size, header, context, unread, started)

    def _route(self, request: bytes | cut_through.Incoming, size: int, header: wire.ProveHeader,
               context: CallContext, unread: dispatch.Unread, started: float) -> bytes:
        """A read call, under 128 MiB, where its kind goes (routing.py): refused, to route.own_daemon, or held
        until a prover takes it. A call sent on as it arrives (an Incoming) keeps one copy of itself; one read
        whole, COPIES."""
        base = {"request_id": header.request_id[:200], "kind": _kind(header), "size_bytes": size}
        kept = size if isinstance(request, cut_through.Incoming) else size * COPIES
        way = self.ways.get(header.proof_kind, Way.FLEET)
        if way is Way.REFUSED:
            self._refuse_unverified(header, base, started, context)
        if way is Way.OWN_DAEMON:
            assert isinstance(request, bytes)  # cuts() leaves these to grpcio
            self.dispatcher.keep(unread, kept)  # not the read reserve for as long as the own daemon takes
            return self._to_own_daemon(request, context, base, started)
        klass = dispatch.CLASS_POST if header.proof_kind in wire.POST_KINDS else dispatch.CLASS_PROOF
        kind = base["kind"]
        try:
            ticket = self.dispatcher.admit(klass=klass, size=kept, read=unread)
        except dispatch.Full as exc:
            self._record(base, "refused", started, attempt=0, detail=str(exc))
            log.warning("refused %s call %s: %s", kind, base["request_id"], exc)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"vastctl route is full: {exc}; retry later")
        except dispatch.Closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "vastctl route is stopping: it takes no new calls")
        try:
            return self._place(request, context, ticket, base, started)
        finally:
            self.dispatcher.finish(ticket)

    def _place(self, request: bytes | cut_through.Incoming, context: CallContext, ticket: dispatch.Ticket,
               base: dict[str, Any], started: float) -> bytes:
        """Hold the call until a prover takes it, send it, and answer with what came back. A prover not reached
        was sent nothing: that is no attempt, no row, and no drop against route.max_retries; the call is held
        again while the prover is tried again later (dispatch.py)."""
        attempt = 0  # times sent
        while True:
            prover = self._wait_for_slot(context, ticket, base, started, attempt)
            sent = self.clock.monotonic()
            outcome: str = "dropped"
            answer: Any = "the router failed while sending it"
            try:
                outcome, answer = self._send(prover, request, self._remaining(context, started))
            finally:  # the slot comes back whatever happened, so a fault here never shrinks the fleet
                timings: dict[str, Any] = {}
                if outcome == "completed":
                    timings = _timings(answer)
                    outcome = "completed" if timings.pop("status") == wire.STATUS_COMPLETED else "failed"
                detail = (f"{answer[0].name}: {answer[1]}" if outcome == "error"
                          else timings.get("detail", "") if outcome in ANSWERED else answer)
                self._release(ticket, prover, outcome, str(detail)[:200])
                if outcome != "unreached":
                    attempt += 1
                    self._queue_record({**base, **timings, "uuid": prover.spec.uuid, "label": prover.spec.label,
                                        "attempt": attempt, "held_ms": _ms(sent - started),
                                        "prover_ms": _ms(self.clock.monotonic() - sent),
                                        "result": "dropped" if outcome == "moved" else outcome,
                                        **({"detail": str(detail)[:500]} if outcome not in ANSWERED else {})})
            if outcome in ANSWERED:
                proved: bytes = answer  # the prover's answer as it came (grpc types it Any)
                return proved
            if outcome == "unreached":
                continue
            if outcome == "error":
                context.abort(*answer)
            if outcome == "expired":
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, answer)
            if outcome == "abandoned":  # only a call sent on as it arrives: the caller went away meanwhile
                context.abort(grpc.StatusCode.CANCELLED, answer)
            if attempt > self.config.route.max_retries:
                log.error("gave up on %s call %s: dropped by %d provers, the last: %s", base["kind"],
                          base["request_id"], attempt, answer)
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              f"vastctl route: {attempt} provers dropped this call (route.max_retries"
                              f" {self.config.route.max_retries}); the last: {answer}")
            log.info("%s call %s dropped by %s (%s): sending it again", base["kind"], base["request_id"],
                     prover.spec.label, answer)

    def _wait_for_slot(self, context: CallContext, ticket: dispatch.Ticket, base: dict[str, Any],
                       started: float, attempt: int) -> Prover:
        while True:
            remaining = self._remaining(context, started)
            if remaining <= 0:
                self._record(base, "expired", started, attempt=attempt, detail="held past its deadline")
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"vastctl route held this call {self.clock.monotonic() - started:.0f}s: no prover had"
                              " a free slot before its deadline")
            if not context.is_active():
                if remaining <= health.DEADLINE_SLACK_S:  # its deadline passed at the caller a moment before here
                    self._record(base, "expired", started, attempt=attempt, detail="held past its deadline")
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed while it was held")
                self._record(base, "abandoned", started, attempt=attempt, detail="the caller went away while held")
                context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
            try:
                prover = self.dispatcher.acquire(ticket, timeout=min(remaining, 1.0))
            except dispatch.Closed:
                self._record(base, "refused", started, attempt=attempt, detail="the router stopped while it was held")
                log.warning("stopping: refused held %s call %s", base["kind"], base["request_id"])
                context.abort(grpc.StatusCode.UNAVAILABLE, "vastctl route stopped while this call was held")
            if prover is not None:
                return prover

    def _remaining(self, context: CallContext, started: float) -> float:
        """Seconds left of the call's deadline; a call without one (grpcio then says ~9e18 s) gets NO_DEADLINE_S
        from its arrival."""
        own = NO_DEADLINE_S - (self.clock.monotonic() - started)
        remaining = context.time_remaining()
        return own if remaining is None else min(remaining, own)

    def _send(self, prover: Prover, request: bytes | cut_through.Incoming, timeout: float) -> tuple[str, Any]:
        """(outcome, what came back): completed (the response bytes), error ((code, details) the daemon
        chose), dropped/moved/unreached (why), expired (a message).

        Every Prove, small or large, goes to a prover over the router's own HTTP/2 client (cut_through.py),
        which holds the prover to one answer of at most wire.MAX_ANSWER, to the whole request, within the call's
        deadline; a blocking call in the handler's own thread. A call is taken back from a prover that left by
        shutting its connection (refresh)."""
        label = prover.spec.label
        message = request if isinstance(request, cut_through.Incoming) else \
            cut_through.Incoming.whole(request, self.buffers)
        deadline = self.clock.monotonic() + timeout
        outcome, answer = cut_through.send(prover.spec.endpoint, message, path=wire.PROVE, timeout=timeout,
                                           clock=self.clock, track=lambda sock: self._track(prover, sock))
        return health.of_cut_through(label, prover.gone, outcome, answer,
                                     at_deadline=self.clock.monotonic() >= deadline - health.DEADLINE_SLACK_S)

    def _to_own_daemon(self, request: bytes, context: CallContext, base: dict[str, Any],
                       started: float) -> bytes:
        """To route.own_daemon, once, unheld: its answer or status goes back as it came (UNAVAILABLE, the daemon
        not reached, names it), recorded under the label `own_daemon`."""
        assert self._own_channel is not None
        sent = self.clock.monotonic()
        where = {"label": OWN_DAEMON_LABEL, "attempt": 1, "held_ms": _ms(sent - started)}
        try:
            answer = self._own_channel.unary_unary(wire.PROVE)(request, timeout=self._remaining(context, started))
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            self._queue_record({**base, **where, "result": "error", "prover_ms": _ms(self.clock.monotonic() - sent),
                                "detail": f"{code.name}: {details}"[:500]})
            if code == grpc.StatusCode.UNAVAILABLE:
                details = f"vastctl route: your own daemon {self.config.route.own_daemon} (route.own_daemon): {details}"
            context.abort(code, details[:1000])
        timings = _timings(answer)
        result = "completed" if timings.pop("status") == wire.STATUS_COMPLETED else "failed"
        self._queue_record({**base, **timings, **where, "result": result,
                            "prover_ms": _ms(self.clock.monotonic() - sent)})
        proved: bytes = answer  # the daemon's answer as it came (grpc types it Any)
        return proved

    def _refuse_unverified(self, header: wire.ProveHeader, base: dict[str, Any], started: float,
                           context: CallContext) -> NoReturn:
        """A kind Curio does not verify, with no own daemon and not sent to the fleet by choice: refused, recorded
        and logged, each in one line naming the two settings."""
        name = wire.KIND_NAMES[header.proof_kind]
        self._record(base, "refused", started, attempt=0,
                     detail=f"unverified kind: route.own_daemon not set, route.unverified_to_fleet does not list {name}")
        log.warning("refused %s call %s: Curio does not verify it and route.own_daemon is not set", name,
                    base["request_id"])
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, routing.refusal(header.proof_kind))

    def get_status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """The joined provers' answers, each judged alone, summed and clamped (status.py): one prover's answer
        that does not parse or carries absurd counts is left out, never fails GetStatus for every caller."""
        return self.statuses.answer(self.dispatcher.snapshot())

    def _status_of(self, prover: dict[str, Any]) -> Any | None:
        """One prover's GetStatusResponse, judged alone (status.Statuses.of), or None."""
        return self.statuses.of(prover)

    # --- the provers --------------------------------------------------------------------------------------

    def refresh(self, conn: sqlite3.Connection) -> None:
        """Read the joined set from the state file; calls on a prover that left it are moved."""
        slots = self.config.launch.bench_concurrency
        rows = deliveries.candidates(conn)
        unjoined = [row for row in rows if not row["joined"]]
        reached: set[str] = set()
        if unjoined:  # not yet joined by reconcile's check: the router's own, so a join is seen within seconds
            timeout = min(self.config.tunnel.check_timeout, PROBE_TIMEOUT_S)
            with futures.ThreadPoolExecutor(max_workers=min(16, len(unjoined))) as pool:
                ups = pool.map(lambda row: self.probe(row["tunnel_port"], timeout), unjoined)
                reached = {row["uuid"] for row, up in zip(unjoined, ups) if up}
        routed = deliveries.routed_rates(conn, now=self.clock.now(), slots=slots)
        specs = [ProverSpec(uuid=row["uuid"], label=row["label"], endpoint=f"127.0.0.1:{row['tunnel_port']}",
                            slots=slots, rate=measured_rate(row, routed.get(row["uuid"])))
                 for row in rows if row["joined"] or row["uuid"] in reached]
        before = {p["uuid"] for p in self.dispatcher.snapshot()["provers"] if not p["gone"]}
        left = self.dispatcher.update(specs)
        joined = [spec.label for spec in specs if spec.uuid not in before]
        if joined:
            log.info("provers joined: %s", ", ".join(joined))
        for uuid in left:
            log.info("prover %s left the joined set: its calls are moved", uuid)
            with self._lock:
                channel = self._channels.pop(uuid, None)
                sockets = list(self._arriving.get(uuid, {}).values())
            if channel is not None:
                channel.close()  # every call on it ends at once, and is sent to another prover
            for sock in sockets:  # and so does every call sent on to it as it arrived
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for label in self.dispatcher.taken_back():
            log.info("prover %s taken back: its ejection ended", label)
        self._watch_lingering()

    def _watch_lingering(self) -> None:
        """Ask the daemons holding slots for calls given up (cuzk proves on for a caller gone) what work they
        have: a slot comes free once its daemon shows fewer calls than slots so held (dispatch.py)."""
        uuids = set(self.dispatcher.lingering_provers())
        provers = [p for p in self.dispatcher.snapshot()["provers"] if p["uuid"] in uuids]
        if not provers:
            return
        with futures.ThreadPoolExecutor(max_workers=min(16, len(provers)), thread_name_prefix="route-work") as pool:
            answers = list(pool.map(self._status_of, provers))
        for prover, answer in zip(provers, answers):  # None: not reached or not believed; a proof's time frees
            if answer is not None and self.dispatcher.observe_work(prover["uuid"], health.work(answer)):
                log.info("prover %s: slots of calls given up free again", prover["label"])

    def _release(self, ticket: dispatch.Ticket, prover: Prover, outcome: str, detail: str) -> None:
        """Give the slot back; say what it did to the prover's health, and record a prover to kill (once)."""
        change = self.dispatcher.release(ticket, prover, outcome, detail)
        if change is not None:
            health.tell(prover.spec.label, change)
            if change.report is not None:
                self._records.put(("set_aside", prover.spec.uuid, change.report))

    def _track(self, prover: Prover, sock: socket.socket | None) -> None:
        """The connection a call sent on as it arrives has open to `prover` (None: closed), so refresh can shut
        it when the prover leaves; one call, one connection, one thread, so the thread names it."""
        key = threading.get_ident()
        with self._lock:
            open_now = self._arriving.setdefault(prover.spec.uuid, {})
            if sock is None:
                open_now.pop(key, None)
                if not open_now:
                    del self._arriving[prover.spec.uuid]
            else:
                open_now[key] = sock
            if sock is not None and prover.gone:
                sock.shutdown(socket.SHUT_RDWR)

    def _channel(self, uuid: str, endpoint: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(uuid)
            if channel is None:
                channel = self._channels[uuid] = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
            return channel

    # --- the writer thread --------------------------------------------------------------------------------

    def _record(self, base: dict[str, Any], result: str, started: float, *, attempt: int, detail: str) -> None:
        self._queue_record({**base, "result": result, "held_ms": _ms(self.clock.monotonic() - started),
                            "attempt": attempt, "detail": detail})

    def _queue_record(self, call: dict[str, Any]) -> None:
        self._records.put(("call", {**call, "at": clock_module.to_iso(self.clock.now())}))

    def start_writer(self, db_path: str | Path) -> None:
        conn = db.connect(db_path, now=self.clock.now())
        conn.close()
        self._writer = threading.Thread(target=self._write_loop, args=(db_path,), name="route-writer", daemon=True)
        self._writer.start()

    def _write_loop(self, db_path: str | Path) -> None:
        conn = db.connect(db_path, now=self.clock.now())
        try:
            while True:
                stopping = self._stop.is_set()
                self._flush(conn)
                self.buffers.trim()
                try:
                    self.refresh(conn)
                    deliveries.write_status(conn, self.dispatcher.snapshot(), now=self.clock.now(),
                                            routing=routing.named(self.ways))
                except Exception as exc:  # noqa: BLE001 - a locked or damaged file must not stop the calls
                    log.error("could not read or write the state file: %s", exc)
                if stopping:
                    return
                self._stop.wait(self.config.route.refresh)
        finally:
            conn.close()

    def _flush(self, conn: sqlite3.Connection) -> None:
        calls: list[tuple[Any, ...]] = []
        asides: list[tuple[Any, ...]] = []
        while True:
            try:
                item = self._records.get_nowait()
            except queue.Empty:
                break
            (calls if item[0] == "call" else asides).append(item)
        try:
            deliveries.record_calls(conn, [call for _, call in calls])
            for _, uuid, why in asides:
                deliveries.set_aside(conn, uuid, why, now=self.clock.now())
        except Exception as exc:  # noqa: BLE001 - kept for the next flush rather than lost
            log.error("could not record %d calls: %s", len(calls), exc)
            for item in calls + asides:
                self._records.put(item)

    def stop_writer(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=30)


def _timings(answer: bytes) -> dict[str, Any]:
    """The status and the daemon's timings of a prover's answer. An answer that is not a ProveResponse (a
    machine's bytes are a claim) counts as the machine's failed proof; it is passed back as it came."""
    try:
        result = wire.ProveResponse.FromString(answer).result
    except DecodeError:
        return {"status": wire.STATUS_FAILED, "detail": f"the prover answered {len(answer)} bytes that are not a ProveResponse"}
    return {"status": result.status, "queue_wait_ms": result.queue_wait_ms, "srs_load_ms": result.srs_load_ms,
            "synthesis_ms": result.synthesis_ms, "gpu_compute_ms": result.gpu_compute_ms, "total_ms": result.total_ms,
            **({"detail": result.error_message[:500]} if result.error_message else {})}


def _kind(header: wire.ProveHeader) -> str:
    return wire.KIND_NAMES.get(header.proof_kind, str(header.proof_kind))


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def measured_rate(row: deliveries.Candidate, routed: deliveries.Routed | None) -> float:
    """What breaks a tie between provers with as many free slots: the rate the router saw the machine prove
    (its calls over the last hour, once there are enough of them), else the rate its benchmark measured."""
    if routed is not None and routed.enough:
        return routed.rate
    return float(row["bench_rate"] or 0.0)


class _Handler(grpc.GenericRpcHandler):
    """Every method of cuzk.v1.ProvingEngine, bytes in and out: the router parses only what it routes on."""

    def __init__(self, router: Router) -> None:
        self.methods = {
            wire.PROVE: grpc.stream_unary_rpc_method_handler(router.prove),
            wire.GET_STATUS: grpc.unary_unary_rpc_method_handler(router.get_status),
        }

    def service(self, handler_call_details: Any) -> Any:  # grpc's types (untyped)
        method = handler_call_details.method
        if method in self.methods:
            return self.methods[method]
        return grpc.unary_unary_rpc_method_handler(_unimplemented)


def _unimplemented(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.UNIMPLEMENTED,
                  "vastctl route serves Prove and GetStatus (the calls Curio makes); send the others to a daemon")
    return b""


def make_server(router: Router, listen: str) -> tuple[grpc.Server, int]:
    """A gRPC server on `listen` (host:port; port 0 picks one); returns it and the port bound."""
    route = router.config.route
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=route.max_held + 1024, thread_name_prefix="route"),
        handlers=[_Handler(router)],
        options=[("grpc.max_receive_message_length", wire.CURIO_MAX_MESSAGE + 1024 * 1024),
                 ("grpc.max_send_message_length", wire.CURIO_MAX_MESSAGE),
                 ("grpc.so_reuseport", 0),
                 # a call waiting unread is given the first 64 KiB window only: with BDP probing on, grpc
                 # widened it to megabytes a call (bench/README.md, "Proof router"), which a burst of calls would hold unread
                 ("grpc.http2.bdp_probe", 0)],
    )
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return server, port
