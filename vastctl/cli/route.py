"""`vastctl route`: the proof router Curio's `[Cuzk] Address` points at (vastctl/route/server.py)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from vastctl.cli.app import app, globals_of, say
from vastctl.errors import BadInput, Unavailable

if TYPE_CHECKING:  # route.server imports grpc, loaded only when `vastctl route` runs
    import grpc

    from vastctl.route.front import Front
    from vastctl.route.server import Router

DRAIN_MARGIN_S = 1.0  # past route.drain_timeout: for the refusals of held calls to reach their callers


@app.command("route")
def route_cmd(
    ctx: typer.Context,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="host:port to serve cuzk.v1.ProvingEngine on (default route.listen).")] = None,
) -> None:
    """Hold, balance and retry Curio's proof calls over the joined provers: Curio's one cuzk address.

    A call no prover can take now waits here (bounded by its deadline and route.max_held) instead of
    failing; each goes to the prover with the most free slots; a call a prover dropped is sent to another,
    one it answered never is. Every call is recorded in the state file. It listens on the socket systemd
    passes it (jobs/vastctl-route.socket: calls wait through a restart) or binds the address itself. SIGTERM:
    GOAWAY to every caller (new calls go to a new connection, the next router's), the calls taken finish
    within route.drain_timeout, then what is still held is refused and the router exits. SIGHUP (systemctl
    reload): a new router starts on the same socket first, then this one stops as on SIGTERM.

    Example: vastctl route --listen 127.0.0.1:9820
    """
    g = globals_of(ctx)
    config = g.config
    address = listen or config.route.listen
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        flag = "--listen" if listen else "route.listen"
        raise BadInput(f"{flag} {address!r} is not host:port (a port 0-65535): give e.g. 127.0.0.1:9820")
    # gRPC's core logs its own failures to stderr unless told not to; the router says each in one line of its own
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    conn = g.connect()  # the state file must exist and be ours before a call is taken
    conn.close()
    from vastctl.route import front as route_front
    from vastctl.route import handover as route_handover
    from vastctl.route import listener as route_listener
    from vastctl.route import routing as route_routing
    from vastctl.route import server as route_server
    _log_to_stderr()
    try:  # systemd's socket when it passed one (it outlives this process), else route.listen bound here
        listening, inherited = route_listener.take(address)
    except OSError as exc:
        raise Unavailable(_cannot_listen(address, exc, "--listen" if listen else "route.listen")) from None
    if inherited:
        host, port = route_listener.name(listening)
        differs = f"; route.listen {address} is not used" if address != f"{host}:{port}" else ""
        say(f"listening on the socket systemd passed (fd 3, vastctl-route.socket): {host}:{port}{differs}")
    else:
        port = listening.getsockname()[1]
    router = route_server.Router(config, clock=g.clock)
    router.start_writer(config.db_path)
    try:  # grpcio serves what the front end passes on (vastctl/route/front.py), on a loopback port of its own
        server, internal_port = route_server.make_server(router, "127.0.0.1:0")
    except (OSError, RuntimeError):
        listening.close()
        router.stop_writer()
        raise Unavailable("cannot listen on a loopback port for the router's own gRPC server") from None
    front = route_front.Front(router, listening, internal_port)
    stopping, handing_over = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    def hand_over(*_: object) -> None:
        handing_over.set()
        stopping.set()

    signal.signal(signal.SIGHUP, hand_over)
    server.start()
    front.start()
    say(f"routing on {host}:{port} (state file {config.db_path}; {route_routing.words(config.route)};"
        " stop with SIGTERM, hand over to a new router with SIGHUP)")
    route_handover.serving()
    while True:
        stopping.wait()
        if not handing_over.is_set():
            break
        handing_over.clear()
        try:  # the next router serves before this one stops taking calls: no gap for Curio's connects
            successor = route_handover.start_successor(listening)
        except (route_handover.HandoverFailed, OSError) as exc:
            say(f"could not hand over: {exc}; still routing")
            stopping.clear()
            continue
        say(f"handed over to the next router (pid {successor}); finishing the calls taken here")
        break
    _drain(router, server, front, config.route.drain_timeout)
    router.stop_writer()
    say("stopped")
    _end_process()


def _cannot_listen(address: str, exc: OSError, setting: str) -> str:
    """Why `address` could not be bound, in one line naming the fix. A port taken is the common case, e.g. by
    nginx's balancer (jobs/nginx-cuzk-grpc.conf) given the router's port: nginx says so only in its error.log."""
    host, _, port = address.rpartition(":")
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} is already in use on {host} (nginx's Curio balancer? another router? a cuzk daemon?"
                f" `ss -ltnp 'sport = :{port}'` names it): stop that program, or give {setting} a free port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {address}: {host} is not an address of this host: give {setting} one of its addresses"
    if exc.errno == errno.EACCES:
        return (f"cannot listen on {address}: this user may not bind port {port} (below 1024): give {setting}"
                " a port above 1023")
    return f"cannot listen on {address}: {exc.strerror or exc}: give {setting} an address of this host with a free port"


def _drain(router: Router, server: grpc.Server, front: Front, timeout: float) -> bool:
    """Stop as a gRPC server does, losing no answer; True when every call taken was answered.

    1. No new connection is taken (a socket systemd passed stays open there: the next router takes what waits
       in its backlog) and every connection gets GOAWAY, so its caller opens new calls on a new connection.
    2. Until `timeout` (route.drain_timeout) the calls taken finish: held ones are placed as slots come free,
       and every answer reaches its caller, those passed back through the router's grpcio server included.
    3. Then what is still held is refused (UNAVAILABLE), and DRAIN_MARGIN_S more lets those refusals and any
       answer on its way reach their callers; a call still on a prover after that is cut.
    4. Only then are the connections and the grpcio server closed, so none closes under an answer."""
    state = router.dispatcher.snapshot()
    front.stop()
    say(f"stopping: taking no new calls; {state['held']} held, {state['in_flight']} on provers"
        f" (route.drain_timeout {timeout:g}s)")
    answered = front.wait(timeout)
    if not answered:
        state = router.dispatcher.snapshot()
        say(f"stopping: route.drain_timeout passed; refusing {state['held']} held call(s) (UNAVAILABLE: a failed"
            f" try of a Curio task); {state['in_flight']} on provers get {DRAIN_MARGIN_S:g}s more")
    router.dispatcher.close()
    if not answered:
        answered = front.wait(DRAIN_MARGIN_S)
        if not answered:
            say(f"stopping: cut {front.busy()} call(s) still unanswered")
    front.close()  # before grpcio's server: a call cut ends with its caller's connection, whichever path it took
    server.stop(0)
    return answered


def _end_process() -> NoReturn:
    """Exit at once, as route.drain_timeout promises: a call cut while on a prover, or one whose caller went
    away, may still wait for its prover in one of grpcio's worker threads, which the interpreter's exit would
    wait for (up to the call's own deadline). What the router recorded is written by then (stop_writer)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("vastctl.route")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
