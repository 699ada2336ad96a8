"""A router handed over (SIGHUP, `systemctl reload vastctl-route`): the next router serves new connections at
once while this one still finishes a proof on a prover, so a restart during a long proof leaves no caller waiting
in the socket's backlog (Curio's client gives up on a connection after 20 s without its HTTP/2 handshake).

Real parts: router processes on a socket the test holds as systemd does (helpers/route_processes.py), Curio's own
client (grpc-go), stand-in daemons whose proofs finish when the test says.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
from helpers.route_processes import ROUTER_EXIT_S, GoClient, RouteHost, assert_every_call_got_its_proof
from helpers.serving import wait_for

pytestmark = pytest.mark.slow  # router processes, servers on loopback, a Go program


@pytest.fixture
def host(tmp_path):
    made = RouteHost(tmp_path, drain_timeout=60)
    successors: list[int] = []
    made.successors = successors  # type: ignore[attr-defined]
    yield made
    made.close()
    for pid in successors:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def successor_of(router) -> int:
    found = wait_for(lambda: re.search(r"handed over to the next router \(pid (\d+)\)", router.log()),
                     "the router hands over", proc=router.proc, log=router.log_path)
    return int(found.group(1))


def test_a_router_handed_over_lets_the_next_serve_new_calls_while_it_finishes_a_long_proof(host, go_client,
                                                                                             tmp_path):
    first = host.start_router()
    daemon = host.daemon("a")
    daemon.hold.clear()  # the proof on the prover takes as long as the test says
    host.wait_provers(1)
    long_call = GoClient(go_client, tmp_path, host.address, name="long", calls=1)
    later = None
    try:
        wait_for(lambda: daemon.received == ["long-0-0"], "the long proof is on the prover")
        first.proc.send_signal(signal.SIGHUP)
        successor = successor_of(first)
        host.successors.append(successor)  # type: ignore[attr-defined]
        assert first.proc.poll() is None  # it still has the long proof
        later = GoClient(go_client, tmp_path, host.address, name="later", calls=3)
        daemon.release("later-0-0")
        daemon.release("later-0-1")
        daemon.release("later-0-2")
        wait_for(lambda: later.proc.poll() is not None, "three new calls answered by the next router")
        assert later.proc.returncode == 0, later.err.read_text()
        assert_every_call_got_its_proof(later.results())
        assert first.proc.poll() is None and long_call.proc.poll() is None  # the overlap: both routers serve
        daemon.release("long-0-0")
        wait_for(lambda: long_call.proc.poll() is not None, "the long call answered by the router it was on")
        assert long_call.proc.returncode == 0, long_call.err.read_text()
        assert_every_call_got_its_proof(long_call.results())
        assert first.wait(timeout=ROUTER_EXIT_S) == 0
        assert "route.drain_timeout passed" not in first.log()
        os.kill(successor, 0)  # the next router serves on
    finally:
        long_call.close()
        if later is not None:
            later.close()
    # each router records what it answered (the next one every route.refresh): once, in the one state file
    wait_for(lambda: sorted(c["request_id"] for c in host.calls() if c["result"] == "completed") ==
             ["later-0-0", "later-0-1", "later-0-2", "long-0-0"], "one completed row for each call answered")


def test_a_handover_whose_successor_cannot_serve_leaves_this_router_serving(host, go_client, tmp_path):
    router = host.start_router()
    host.daemon("a")
    host.wait_provers(1)
    host.config_path.write_text("route: [not, a, mapping]\n")  # the next router cannot start on it
    router.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "could not hand over" in router.log(), "the handover fails", proc=router.proc,
             log=router.log_path)
    assert "still routing" in router.log()
    curio = GoClient(go_client, tmp_path, host.address, calls=2)
    try:
        wait_for(lambda: curio.proc.poll() is not None, "two calls answered")
        assert curio.proc.returncode == 0, curio.err.read_text()
        assert_every_call_got_its_proof(curio.results())
    finally:
        curio.close()
    assert router.proc.poll() is None
