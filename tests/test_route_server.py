"""route.server in this process: real gRPC servers standing in for cuzk daemons on loopback, a real client, the
router's decisions on each kind of answer, and the rows it records."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import grpc
import pytest
from helpers.route_daemon import Daemon, completed
from helpers.serving import query, wait_for

from vastctl import clock
from vastctl import config as config_module
from vastctl.route import front as route_front
from vastctl.route import listener as route_listener
from vastctl.route import server as route_server
from vastctl.route import wire
from vastctl.state import db

pytestmark = pytest.mark.slow  # gRPC servers on loopback

MiB = 1024 * 1024


@pytest.fixture(params=["as it arrives", "read whole"])
def through(request):
    """Every test twice: the client on the front end with every Prove sent on as it arrives (route.cut_through_mb
    0), and the client on the router's grpcio server itself, every call read whole."""
    return request.param


@pytest.fixture
def fleet(tmp_path, request, through):
    """A state file, a router on it (refreshing every 0.1 s) and a client channel to it; `join(daemon)` adds a
    running machine whose tunnel end is that daemon, `leave(uuid)` kills its row. A test parametrizing `fleet` (indirect) adds
    to its route section."""
    path = tmp_path / "state.db"
    now = clock.SYSTEM.now()
    conn = db.connect(path, now=now, create=True)
    route = {"refresh": "0.1s", "max_held": 5, "cut_through_mb": 0 if through == "as it arrives" else 129,
             **getattr(request, "param", {})}
    config = config_module.from_mapping({"db": str(path), "launch": {"bench_concurrency": 2}, "route": route})

    class Fleet:
        router = route_server.Router(config, probe=lambda port, timeout: False)
        daemons: list[Daemon] = []

        def join(self, daemon, name, rate=60.0):
            at = clock.to_iso(clock.SYSTEM.now())
            conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                         " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                         (f"u-{name}", name, at, at, daemon.port, at, rate))
            conn.commit()
            self.daemons.append(daemon)
            wait_for(lambda: any(p["label"] == name for p in self.router.dispatcher.snapshot()["provers"]),
                     f"{name} joined")

        def leave(self, name):
            conn.execute("UPDATE instances SET state = 'killed' WHERE label = ?", (name,))
            conn.commit()

        def prove(self, request_id, kind=wire.POREP_SEAL_COMMIT, size=100, timeout=20):
            request = wire.ProveRequest(submit=wire.SubmitProofRequest(
                request_id=request_id, proof_kind=kind, vanilla_proof=b"v" * size)).SerializeToString()
            return wire.ProveResponse.FromString(self.call(request, timeout=timeout)).result

        def calls(self):
            return query(path, "SELECT request_id, label, result, attempt, detail FROM proof_calls ORDER BY id")

    f = Fleet()
    f.router.start_writer(path)
    f.server, port = route_server.make_server(f.router, "127.0.0.1:0")
    f.server.start()
    f.front = None
    if through == "as it arrives":
        f.front = route_front.Front(f.router, route_listener.bind("127.0.0.1:0"), port)
        f.front.start()
        port = f.front.listen.getsockname()[1]
    f.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 300 * MiB),
                                                                   ("grpc.max_receive_message_length", 300 * MiB)])
    f.call = f.channel.unary_unary(wire.PROVE)
    f.path = path
    yield f
    f.channel.close()
    if f.front is not None:
        f.front.stop()
        f.front.close()
    f.server.stop(0)
    f.router.stop_writer()
    for daemon in f.daemons:
        daemon.stop()
    conn.close()


def recorded(fleet, count):
    wait_for(lambda: len(fleet.calls()) >= count, f"{count} recorded calls")
    return fleet.calls()


def test_a_proof_failed_inside_grpc_ok_is_passed_back_counted_as_the_machines_and_never_resent(fleet):
    bad = Daemon(lambda request, context: completed(request, wire.STATUS_FAILED, "synthesis: out of memory"))
    fleet.join(bad, "vastctl-bad")
    fleet.join(Daemon(), "vastctl-good", rate=10)
    result = fleet.prove("sector-1")
    assert (result.status, result.error_message) == (wire.STATUS_FAILED, "synthesis: out of memory")
    assert bad.seen == ["sector-1"] and fleet.daemons[1].seen == []
    assert recorded(fleet, 1) == [{"request_id": "sector-1", "label": "vastctl-bad", "result": "failed", "attempt": 1,
                                   "detail": "synthesis: out of memory"}]


def test_a_status_the_daemon_chose_is_passed_back_as_it_came_and_never_resent(fleet):
    def refuse(request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid proof_kind: 9")

    picky = Daemon(refuse)
    fleet.join(picky, "vastctl-picky")
    fleet.join(Daemon(), "vastctl-other", rate=10)
    with pytest.raises(grpc.RpcError) as raised:
        fleet.prove("sector-2")
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid proof_kind: 9")
    assert picky.seen == ["sector-2"] and fleet.daemons[1].seen == []
    (row,) = recorded(fleet, 1)
    assert (row["result"], row["detail"]) == ("error", "INVALID_ARGUMENT: invalid proof_kind: 9")


def test_a_call_a_prover_dropped_is_sent_to_another_with_the_same_request_and_answered_once(fleet):
    gone = Daemon()
    gone.release.clear()  # it takes the call and dies before answering
    fleet.join(gone, "vastctl-gone", rate=90)  # the best rate: the first call goes to it
    fleet.join(Daemon(), "vastctl-alive", rate=10)
    answer = []
    caller = threading.Thread(target=lambda: answer.append(fleet.prove("sector-3")))
    caller.start()
    wait_for(lambda: gone.seen == ["sector-3"], "the call on the prover about to die")
    gone.stop()  # UNAVAILABLE after the call was sent, before any answer (a refused connect: test_route_health)
    caller.join(20)
    result = answer[0]
    assert (result.status, result.proof) == (wire.STATUS_COMPLETED, b"proof:sector-3")
    assert fleet.daemons[1].seen == ["sector-3"]
    rows = recorded(fleet, 2)
    assert [(r["label"], r["result"], r["attempt"]) for r in rows] == [
        ("vastctl-gone", "dropped", 1), ("vastctl-alive", "completed", 2)]
    assert rows[0]["detail"].startswith("vastctl-gone: UNAVAILABLE")


def test_a_call_on_a_machine_that_leaves_the_joined_set_is_moved_and_completes_elsewhere(fleet):
    stuck = Daemon()
    stuck.release.clear()  # it takes the call and never answers
    fleet.join(stuck, "vastctl-stuck", rate=90)
    answer = []
    caller = threading.Thread(target=lambda: answer.append(fleet.prove("sector-4")))
    caller.start()
    wait_for(lambda: stuck.seen == ["sector-4"], "the call on the stuck prover")
    fleet.join(Daemon(), "vastctl-next", rate=10)
    fleet.leave("vastctl-stuck")  # killed (reconcile, the operator): what it held is moved
    caller.join(20)
    assert answer[0].proof == b"proof:sector-4" and fleet.daemons[1].seen == ["sector-4"]
    assert [(r["label"], r["result"]) for r in recorded(fleet, 2)] == [("vastctl-stuck", "dropped"),
                                                                       ("vastctl-next", "completed")]
    stuck.release.set()


def test_with_no_prover_a_call_is_held_and_completes_when_one_joins(fleet):
    answer = []
    caller = threading.Thread(target=lambda: answer.append(fleet.prove("sector-5")))
    caller.start()
    wait_for(lambda: query(fleet.path, "SELECT held FROM route_status") == [{"held": 1}], "the call held")
    assert answer == []
    fleet.join(Daemon(), "vastctl-late")
    caller.join(20)
    assert answer[0].status == wire.STATUS_COMPLETED
    (row,) = recorded(fleet, 1)
    assert row["result"] == "completed"
    assert query(fleet.path, "SELECT held_ms > 0 AS waited FROM proof_calls") == [{"waited": 1}]


def test_a_held_call_past_its_deadline_expires_and_past_max_held_one_is_refused(fleet):
    with pytest.raises(grpc.RpcError) as raised:
        fleet.prove("sector-6", timeout=1.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the caller's deadline passes a moment before the router lets the call go: till then it takes a place
    wait_for(lambda: fleet.router.dispatcher.snapshot()["held"] == 0, "the expired call let go")
    holders = [threading.Thread(target=lambda i=i: _swallow(fleet.prove, f"held-{i}", timeout=8)) for i in range(5)]
    for holder in holders:
        holder.start()
    wait_for(lambda: fleet.router.dispatcher.snapshot()["held"] == 5, "five calls held")
    with pytest.raises(grpc.RpcError) as full:
        fleet.prove("one-too-many")
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "5 calls already held (route.max_held 5)" in full.value.details()
    results = {r["request_id"]: r["result"] for r in recorded(fleet, 2)}
    assert results["one-too-many"] == "refused"
    fleet.join(Daemon(), "vastctl-saves")
    for holder in holders:
        holder.join(20)


@pytest.mark.parametrize("fleet", [{"max_held_mb": 6}], indirect=True)
def test_a_burst_past_max_held_mb_waits_unread_in_order_and_every_call_completes(fleet, monkeypatch, through):
    """Read whole, a 1 MiB call is kept at 3 MiB and reading one needs a 3.25 MiB reserve here (3.25 x 128 MiB in
    production): under 6 MiB one call is kept while the rest wait unread. Sent on as it arrives, a call is kept
    at its size and read under that reserve: under 1.5 MiB, the same. None fails, none is read before its turn."""
    monkeypatch.setattr(fleet.router.dispatcher, "read_reserve", int(3.25 * MiB))
    budget = 6 * MiB if through == "read whole" else int(1.5 * MiB)
    monkeypatch.setattr(fleet.router.dispatcher, "max_bytes", budget)
    daemon = Daemon()
    daemon.release.clear()  # the prover holds its calls until released
    fleet.join(daemon, "vastctl-mem")
    answers: dict[str, object] = {}
    callers = []
    for n in range(5):
        callers.append(threading.Thread(target=lambda n=n: answers.setdefault(
            f"burst-{n}", _outcome(fleet.prove, f"burst-{n}", size=MiB))))
        callers[-1].start()
        wait_for(lambda n=n: fleet.router.dispatcher.snapshot()["held"] + len(daemon.seen) == n + 1, f"call {n} in")
    snapshot = fleet.router.dispatcher.snapshot()
    assert daemon.seen == ["burst-0"] and snapshot["unread"] == 4 and snapshot["held"] == 4
    assert (3 * MiB if through == "read whole" else MiB) < snapshot["kept_bytes"] <= budget
    assert _outcome(fleet.prove, "late", size=MiB, timeout=1.5) == "DEADLINE_EXCEEDED"  # its own deadline, unread
    daemon.release.set()
    for caller in callers:
        caller.join(30)
    assert answers == {f"burst-{n}": wire.STATUS_COMPLETED for n in range(5)}
    assert daemon.seen == [f"burst-{n}" for n in range(5)]  # read, and so sent, in arrival order
    rows = recorded(fleet, 6)
    assert sorted(r["result"] for r in rows) == ["completed"] * 5 + ["expired"]
    assert [r["request_id"] for r in rows if r["result"] == "expired"] == [None]  # never read: no id known


def _outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw).status
    except grpc.RpcError as exc:
        return exc.code().name


def _swallow(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError:
        pass


def test_over_128_mib_is_refused_at_once_and_120_mb_passes(fleet):
    daemon = Daemon()
    fleet.join(daemon, "vastctl-big")
    with pytest.raises(grpc.RpcError) as raised:
        fleet.prove("too-big", size=129 * MiB)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the 134217728 bytes (128 MiB) a cuzk daemon accepts; no prover was tried" in raised.value.details()
    assert fleet.prove("fits", size=120_000_000).status == wire.STATUS_COMPLETED
    assert daemon.seen == ["fits"]


def test_get_status_sums_the_provers_and_shows_the_held_calls_and_other_methods_are_unimplemented(fleet):
    fleet.join(Daemon(), "vastctl-s1")
    fleet.join(Daemon(), "vastctl-s2")
    fleet.prove("one")
    status = wire.GetStatusResponse.FromString(fleet.channel.unary_unary(wire.GET_STATUS)(b"", timeout=5))
    assert status.total_proofs_completed == 1
    assert [(q.proof_kind, q.pending, q.in_progress) for q in status.queues] == [("porep", 2, 4), ("router-held", 0, 0)]
    with pytest.raises(grpc.RpcError) as raised:
        fleet.channel.unary_unary(f"/{wire.SERVICE}/SubmitProof")(b"", timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "serves Prove and GetStatus" in raised.value.details()


@pytest.mark.parametrize("fleet", [{"ejection_base": "0.3s"}], indirect=True)
def test_a_prover_that_keeps_failing_proofs_after_it_was_taken_back_is_set_aside_with_an_event(fleet):
    bad = Daemon(lambda request, context: completed(request, wire.STATUS_FAILED, "gpu fault"))
    fleet.join(bad, "vastctl-faulty")
    for n in range(3):
        assert fleet.prove(f"f-{n}").status == wire.STATUS_FAILED
    # ejected for 0.3 s: the next call is held until it is back (the only prover), then sent to it
    assert fleet.prove("f-3").status == wire.STATUS_FAILED
    assert query(fleet.path, "SELECT route_failing_since FROM instances") == [{"route_failing_since": None}]
    for n in (4, 5):  # three in a row again since it was taken back: ejected again, and reported
        assert fleet.prove(f"f-{n}").status == wire.STATUS_FAILED
    wait_for(lambda: query(fleet.path, "SELECT route_failing_since IS NOT NULL AS aside FROM instances")
             == [{"aside": 1}], "the prover set aside")
    (event,) = query(fleet.path, "SELECT kind, source, reason FROM events WHERE kind = 'route_set_aside'")
    assert event["source"] == "route"
    assert event["reason"] == ("the router sends it no more calls: ejected 2 times for failed answers with none"
                               " good between, the last: 3 calls in a row dropped, failed or held to their"
                               " deadline, the last failed (gpu fault) (route.fail_threshold 3)")
    with pytest.raises(grpc.RpcError) as raised:  # no prover left: held until its deadline, not sent to it
        fleet.prove("f-6", timeout=1.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert bad.seen == [f"f-{n}" for n in range(6)]


def test_post_goes_to_post_address_when_set(tmp_path):
    own = Daemon()
    path = tmp_path / "state.db"
    db.connect(path, now=datetime.now(timezone.utc), create=True).close()
    config = config_module.from_mapping({"db": str(path), "route": {"post_address": f"127.0.0.1:{own.port}"}})
    router = route_server.Router(config, probe=lambda port, timeout: False)
    router.start_writer(path)
    server, port = route_server.make_server(router, "127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = wire.ProveRequest(submit=wire.SubmitProofRequest(request_id="wdpost-1",
                                                                       proof_kind=wire.WINDOW_POST_PARTITION))
            answer = wire.ProveResponse.FromString(channel.unary_unary(wire.PROVE)(request.SerializeToString(),
                                                                                  timeout=10))
        assert answer.result.status == wire.STATUS_COMPLETED and own.seen == ["wdpost-1"]
        wait_for(lambda: query(path, "SELECT label, kind, result FROM proof_calls")
                 == [{"label": "own_daemon", "kind": "window_post", "result": "completed"}], "the PoSt call recorded")
    finally:
        server.stop(0)
        router.stop_writer()
        own.stop()


def test_an_answer_that_is_not_a_prove_response_is_the_machines_failed_proof_passed_back_once(fleet):
    hostile = Daemon(lambda request, context: b"\x0a\xff\xff")  # a length past the message: not a ProveResponse
    fleet.join(hostile, "vastctl-hostile")
    fleet.join(Daemon(), "vastctl-fine", rate=10)
    assert fleet.call(wire.ProveRequest(submit=wire.SubmitProofRequest(request_id="odd-1", proof_kind=1))
                      .SerializeToString(), timeout=20) == b"\x0a\xff\xff"
    assert hostile.seen == ["odd-1"] and fleet.daemons[1].seen == []
    (row,) = recorded(fleet, 1)
    assert (row["result"], row["detail"]) == ("failed", "the prover answered 3 bytes that are not a ProveResponse")
    assert fleet.router.dispatcher.snapshot()["in_flight"] == 0  # its slot came back
