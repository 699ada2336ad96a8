"""A router restart loses no call: the listening socket outlives the process (the test holds it as systemd holds
jobs/vastctl-route.socket's and passes it to each router process as fd 3), a stopping router sends GOAWAY so
Curio's client opens its next calls on a new connection, which waits in the socket's backlog for the next
router, and every answer a prover gives during the drain reaches its caller.

Curio's client is its own: grpc-go (tests/go_curio_client), dialled as lib/cuzk/client.go dials. The stand-in
daemons are real grpcio servers in this process; each proof is made from its call's request id, so a caller
given another call's proof is caught, and every `completed` row of proof_calls is matched to a caller's proof.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys

import pytest
from helpers.route_processes import ROUTER_EXIT_S, GoClient, RouteHost, assert_every_call_got_its_proof, socket_activated
from helpers.serving import wait_for

pytestmark = pytest.mark.slow  # router processes, servers on loopback, a Go program

LOAD_CALLS = 20  # calls the load makes between two restarts (each worker one after another)


@pytest.fixture
def host(tmp_path):
    made = RouteHost(tmp_path, drain_timeout=30)  # longer than any call here: a stop waits for its calls only
    yield made
    made.close()


def assert_completed_rows_are_the_answers(host: RouteHost, results: list[dict]) -> None:
    """Every `completed` row is a proof its caller got, once: a row per call answered, no other."""
    got = collections.Counter(r["id"] for r in results)
    wait_for(lambda: collections.Counter(c["request_id"] for c in host.calls() if c["result"] == "completed") == got,
             "proof_calls: one completed row for each proof a caller got, none other")


def test_calls_on_provers_at_sigterm_are_answered_and_calls_after_it_wait_for_the_next_router(host, go_client,
                                                                                              tmp_path):
    first = host.start_router()
    daemon = host.daemon("a")  # 2 slots
    daemon.hold.clear()  # the proofs it takes finish when the test says
    host.wait_provers(1)
    curio = GoClient(go_client, tmp_path, host.address, workers=3, calls=2)
    try:
        wait_for(lambda: len(daemon.received) == 2 and host.status()["held"] == 1,
                 "two calls on the prover, the third held")
        first.terminate()
        wait_for(lambda: "stopping: taking no new calls; 1 held, 2 on provers" in first.log(), "the router stops")
        assert first.proc.poll() is None  # it waits for the calls it took
        daemon.hold.set()  # the two proofs come back during the drain; the held call takes a slot freed
        assert first.wait(timeout=ROUTER_EXIT_S) == 0
        assert "route.drain_timeout passed" not in first.log() and first.log().endswith("stopped\n")
        firsts = sorted(f"curio-{w}-0" for w in range(3))
        assert sorted(daemon.received) == firsts  # each worker's second call went to a new connection: not here
        wait_for(lambda: sorted(r["id"] for r in curio.results()) == firsts, "the first three calls answered")

        host.start_router()  # systemd starts the next router on the same socket: it takes what waited
        wait_for(lambda: curio.proc.poll() is not None, "the grpc-go client's six calls end")
        assert curio.proc.returncode == 0, curio.err.read_text()
        results = curio.results()
    finally:
        curio.close()
    assert len(results) == 6
    assert_every_call_got_its_proof(results)
    assert_completed_rows_are_the_answers(host, results)


def test_restarts_under_a_3_worker_curio_load_fail_no_call_and_every_completed_row_reached_its_caller(
        host, go_client, tmp_path):
    router = host.start_router()
    daemons = [host.daemon("a", prove_seconds=0.05), host.daemon("b", prove_seconds=0.05)]
    host.wait_provers(2)
    curio = GoClient(go_client, tmp_path, host.address, workers=3, until_stopped=True)
    try:
        for restart in range(2):
            done = len(curio.wait_for_results((restart + 1) * LOAD_CALLS, f"{LOAD_CALLS} calls answered"))
            wait_for(lambda: any(daemon.in_progress for daemon in daemons), "a call on a prover")
            router.terminate()  # mid-load: calls on provers, calls on their way
            assert router.wait(timeout=ROUTER_EXIT_S) == 0
            assert "route.drain_timeout passed" not in router.log()
            router = host.start_router()
            curio.wait_for_results(done + LOAD_CALLS, f"{LOAD_CALLS} calls answered by the next router")
        results = curio.finish()
    finally:
        curio.close()
    failed = [r for r in results if r["code"] != "OK"]
    print(f"{len(results)} calls from 3 grpc-go workers over 2 router restarts: {len(failed)} failed")
    assert_every_call_got_its_proof(results)
    assert_completed_rows_are_the_answers(host, results)


def test_a_socket_from_systemd_that_is_not_listening_stops_the_router_in_one_error_line(host, tmp_path):
    with socket.socket() as unbound:  # a ListenStream that is not: say, Accept=yes's connection socket
        fd = unbound.fileno()
        done = subprocess.run(socket_activated(fd, [sys.executable, "-m", "vastctl", "route"]), pass_fds=(fd,),
                              env=host.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: fd 3 from systemd is not a listening TCP socket: jobs/vastctl-route.socket needs"
        " ListenStream=host:port (route.listen's address), not a path, a datagram socket or Accept=yes"]
