"""A prover's health in the router with real gRPC servers on loopback: a refused connect is no dropped call, a
daemon that restarts costs nothing, and a call given up keeps its slot while the daemon proves on."""

from __future__ import annotations

import collections
import logging
import socket
import threading

import pytest
from helpers.prover_stand_ins import CuzkStandIn, RouterOnFile, closed_port
from helpers.serving import query, wait_for

from vastctl import clock
from vastctl.route import cut_through, h2, wire
from vastctl.route.buffers import Buffers

pytestmark = pytest.mark.slow  # gRPC servers on loopback


@pytest.fixture(params=["as it arrives", "read whole"])
def through(request):
    """Each test twice: every Prove sent on by the front end as it arrives, and every Prove read whole by grpcio."""
    return request.param


@pytest.fixture
def site(tmp_path, through):
    """make(**route): a router on a fresh state file with these route keys; closed after the test."""
    made: list[RouterOnFile] = []
    stand_ins: list[CuzkStandIn] = []

    class Site:
        def make(self, **route):
            made.append(RouterOnFile(tmp_path / "state.db", through=through, route=route))
            return made[-1]

        def stand_in(self):
            stand_ins.append(CuzkStandIn())
            return stand_ins[-1]

    yield Site()
    for stand_in in stand_ins:
        stand_in.gate.set()
        stand_in.stop()
    for router in made:
        router.close()


def test_a_closed_port_and_one_closed_before_http2_are_not_reached_and_a_lost_connection_is_a_drop():
    """What the router reads as "not reached": a refused connect, and sshd's way with a tunnel whose far side is
    gone (accepted, then closed before any HTTP/2); a daemon that spoke HTTP/2 and then lost the connection with
    the call on it dropped the call."""
    accepting = socket.create_server(("127.0.0.1", 0))
    speaking = socket.create_server(("127.0.0.1", 0))

    def close_each(server, greeting):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(greeting)
            conn.recv(1 << 16)
            conn.close()

    threading.Thread(target=close_each, args=(accepting, b""), daemon=True).start()
    threading.Thread(target=close_each, args=(speaking, h2.settings()), daemon=True).start()
    try:
        request = wire.ProveRequest(submit=wire.SubmitProofRequest(request_id="r")).SerializeToString()
        outcomes = []
        for port in (closed_port(), accepting.getsockname()[1], speaking.getsockname()[1]):
            incoming = cut_through.Incoming.whole(request, Buffers(max_bytes=1 << 20, clock=clock.SYSTEM))
            outcomes.append(cut_through.send(f"127.0.0.1:{port}", incoming, path=wire.PROVE, timeout=10,
                                             clock=clock.SYSTEM, track=lambda sock: None)[0])
        assert outcomes == ["unreached", "unreached", "dropped"]
    finally:
        accepting.close()
        speaking.close()


def test_a_refused_connect_is_no_attempt_the_call_goes_to_another_prover_and_the_refuser_is_tried_later(site, caplog):
    caplog.set_level(logging.INFO, logger="vastctl.route")
    router = site.make()
    refuser = closed_port()
    router.join(refuser, "vastctl-refuses", rate=90)  # the better rate: the call goes to it first
    good = site.stand_in()
    router.join(good.port, "vastctl-good", rate=10)
    result = router.prove("sector-1")
    assert result.status == wire.STATUS_COMPLETED and good.seen == ["sector-1"]
    wait_for(lambda: router.calls(), "the call recorded")
    assert [(c["label"], c["result"], c["attempt"]) for c in router.calls()] == [("vastctl-good", "completed", 1)]
    refused = router.prover("vastctl-refuses")
    assert (refused["unreached"], refused["streak"], refused["ejections"]) == (1, 0, 0)  # no drop, not ejected
    (said,) = [r.getMessage() for r in caplog.records if "not reached" in r.getMessage()]
    assert said.startswith("prover vastctl-refuses not reached (1 connects in a row failed (vastctl-refuses:"
                           " UNAVAILABLE") and said.endswith("its calls wait or go elsewhere; tried again in 0.5s")


def test_a_daemon_that_restarts_on_its_port_costs_no_call_and_no_machine(site):
    """The one prover, two calls on it and three held; its daemon stops (its port refuses) and comes back on the
    same port: every call completes, the refusals are no rows, and the machine is neither ejected nor reported."""
    router = site.make()
    daemon = site.stand_in()
    daemon.gate.clear()
    router.join(daemon.port, "vastctl-only")
    answers: dict[str, object] = {}
    callers = [threading.Thread(target=lambda n=n: answers.setdefault(f"r-{n}", router.prove(f"r-{n}", timeout=60)))
               for n in range(5)]
    for caller in callers:
        caller.start()
    wait_for(lambda: daemon.running == 2 and router.router.dispatcher.snapshot()["held"] == 3,
             "two calls on the daemon, three held")
    on_it = set(daemon.seen)
    daemon.stop()
    wait_for(lambda: router.prover("vastctl-only")["unreached"] >= 1, "the router refused by the stopped daemon")
    assert router.prover("vastctl-only")["ejections"] == 0  # the last prover: tried again, never ejected
    daemon.gate.set()
    daemon.start()  # back on the same port
    for caller in callers:
        caller.join(60)
    assert {rid: getattr(answer, "status", answer) for rid, answer in answers.items()} == {
        f"r-{n}": wire.STATUS_COMPLETED for n in range(5)}
    wait_for(lambda: sum(c["result"] == "completed" for c in router.calls()) == 5, "five calls recorded completed")
    calls = router.calls()
    assert collections.Counter(c["request_id"] for c in calls if c["result"] == "completed") == {
        f"r-{n}": 1 for n in range(5)}
    dropped = [c for c in calls if c["result"] != "completed"]
    # the calls on the daemon when it stopped (and any it accepted while it went down) were sent and lost, once
    # each and as one failure; the refused connects are no rows and no attempts
    assert on_it <= {c["request_id"] for c in dropped} and all(c["result"] == "dropped" for c in dropped)
    assert all(c["attempt"] == 1 for c in dropped)
    assert not [c for c in calls if "connect" in (c["detail"] or "")]
    state = router.prover("vastctl-only")
    assert (state["ejections"], state["set_aside"], state["unreached"]) == (0, None, 0)
    assert query(router.path, "SELECT route_failing_since FROM instances") == [{"route_failing_since": None}]
    assert query(router.path, "SELECT kind FROM events WHERE kind = 'route_set_aside'") == []


def test_a_call_given_up_keeps_its_slot_until_the_daemons_own_status_shows_its_work_gone(site):
    """cuzk proves on for a caller that went away: two calls past their deadline still fill the prover's two
    slots, so a third is held, not sent, until GetStatus shows the daemon's jobs done."""
    router = site.make()
    daemon = site.stand_in()
    daemon.gate.clear()
    router.join(daemon.port, "vastctl-busy")  # rate 60, 2 slots: a proof takes 120 s, longer than this test
    for n in range(2):
        assert router.prove(f"gone-{n}", timeout=2) == "DEADLINE_EXCEEDED"
    assert daemon.running == 2  # both proved on by the daemon
    answer = []
    caller = threading.Thread(target=lambda: answer.append(router.prove("next", timeout=60)))
    caller.start()
    wait_for(lambda: router.router.dispatcher.snapshot()["held"] == 1, "the next call held")
    # the router's attempts end at the deadline too (a moment after the caller's): their slots stay taken
    wait_for(lambda: (router.prover("vastctl-busy")["busy"], router.prover("vastctl-busy")["lingering"]) == (0, 2),
             "both slots held by calls given up")
    assert daemon.seen == ["gone-0", "gone-1"]
    daemon.gate.set()  # the daemon's jobs end; its GetStatus shows it, and the slots come free
    caller.join(30)
    assert answer[0].status == wire.STATUS_COMPLETED and daemon.seen == ["gone-0", "gone-1", "next"]
    assert daemon.most_running == 2  # never more than its slots
    assert router.prover("vastctl-busy")["streak"] == 0  # sent with its deadline near: not held against it
