"""`vastctl route`: the proof router Curio's `[Cuzk] Address` points at (vastctl/route/server.py)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from vastctl.cli.app import app, globals_of, say
from vastctl.errors import BadInput, Unavailable

if TYPE_CHECKING:  # route.server imports grpc, loaded only when `vastctl route` runs
    import grpc

    from vastctl.clock import Clock
    from vastctl.route.front import Front
    from vastctl.route.server import Router


@app.command("route")
def route_cmd(
    ctx: typer.Context,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="host:port to serve cuzk.v1.ProvingEngine on (default route.listen).")] = None,
) -> None:
    """Hold, balance and retry Curio's proof calls over the joined provers: Curio's one cuzk address.

    A call no prover can take now waits here (bounded by its deadline and route.max_held) instead of
    failing; each goes to the prover with the most free slots; a call a prover dropped is sent to another,
    one it answered never is. Every call is recorded in the state file. SIGTERM: no new calls, calls in
    flight get route.drain_timeout.

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
    from vastctl.route import server as route_server
    _log_to_stderr()
    router = route_server.Router(config, clock=g.clock)
    router.start_writer(config.db_path)
    try:
        listening = route_front.bind(address)
    except (OSError, ValueError):
        router.stop_writer()
        raise Unavailable(f"cannot listen on {address}: the address is in use (another router or a cuzk daemon?)"
                          " or not this host's; set route.listen or --listen") from None
    port = listening.getsockname()[1]
    try:  # grpcio serves what the front end passes on (vastctl/route/front.py), on a loopback port of its own
        server, internal_port = route_server.make_server(router, "127.0.0.1:0")
    except (OSError, RuntimeError):
        listening.close()
        router.stop_writer()
        raise Unavailable("cannot listen on a loopback port for the router's own gRPC server") from None
    front = route_front.Front(router, listening, internal_port)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    server.start()
    front.start()
    say(f"routing on {host}:{port} (state file {config.db_path}; post_address"
        f" {config.route.post_address or 'none: PoSt goes to the fleet, ahead of other calls'}; stop with SIGTERM)")
    stopping.wait()
    _drain(router, server, front, config.route.drain_timeout, g.clock)
    router.stop_writer()
    say("stopped")


def _drain(router: Router, server: grpc.Server, front: Front, timeout: float, clock: Clock) -> None:
    """No new call; what is held or on a prover gets `timeout` to finish; what is still held then is refused."""
    state = router.dispatcher.snapshot()
    say(f"stopping: taking no new calls; {state['held']} held, {state['in_flight']} on provers"
        f" (route.drain_timeout {timeout:g}s)")
    front.stop()
    done = server.stop(grace=timeout + 5)
    deadline = clock.monotonic() + timeout
    while clock.monotonic() < deadline:
        state = router.dispatcher.snapshot()
        if not state["held"] and not state["in_flight"]:
            break
        clock.sleep(0.2)
    state = router.dispatcher.snapshot()
    if state["held"]:
        say(f"stopping: refusing {state['held']} held call(s) (UNAVAILABLE: Curio retries them)")
    router.dispatcher.close()
    front.wait(timeout=10)
    done.wait(timeout=10)
    front.close()


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("vastctl.route")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
