"""The proofs Curio does not verify (SnapDeals, WinningPoSt) stay off rented machines: by default they go to the
operator's own daemon (route.own_daemon; route.post_address its deprecated name), to the fleet only where
route.unverified_to_fleet lists them, and with neither they are refused with one message naming both settings.
Where each kind goes is said at start-up, written to route_status, shown by `fleet --json` and the dashboard,
and every answer's proof_calls row names where it went."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from concurrent import futures
from datetime import timedelta

import grpc
import pytest
from helpers.curio_client import CurioClient, prove_request
from helpers.serving import free_port, query, stop_process, wait_for

from vastctl import clock
from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.facts import deliveries
from vastctl.route import front as route_front
from vastctl.route import listener as route_listener
from vastctl.route import routing, wire
from vastctl.route import server as route_server
from vastctl.serving import dashboard_cards
from vastctl.state import db

MiB = 1024 * 1024
KINDS = {"porep": wire.POREP_SEAL_COMMIT, "snap": wire.SNAP_DEALS_UPDATE, "window_post": wire.WINDOW_POST_PARTITION,
         "winning_post": wire.WINNING_POST}


class Daemon:
    """A gRPC server speaking cuzk.v1.ProvingEngine that proves every call at once: `seen` the request ids and
    `requests` the bytes it was sent."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.requests: list[bytes] = []
        self._lock = threading.Lock()

        def prove(data, context):
            request = wire.ProveRequest.FromString(data)
            with self._lock:
                self.seen.append(request.submit.request_id)
                self.requests.append(data)
            return wire.ProveResponse(result=wire.AwaitProofResponse(
                job_id=request.submit.request_id, status=wire.STATUS_COMPLETED,
                proof=b"proof:" + request.submit.request_id.encode(), total_ms=5)).SerializeToString()

        handler = grpc.method_handlers_generic_handler(wire.SERVICE, {
            "Prove": grpc.unary_unary_rpc_method_handler(prove),
            "GetStatus": grpc.unary_unary_rpc_method_handler(lambda data, context: b"")})
        self.server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handler],
                                  options=[("grpc.max_receive_message_length", wire.DAEMON_MAX_MESSAGE)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture(params=["as it arrives", "read whole"])
def make_router(tmp_path, request):
    """make(**route) → a router on a state file with one rented machine (`vastctl-a`, its daemon `.prover`)
    joined, its grpcio server, the front end (every Prove sent on as it arrives: route.cut_through_mb 0) or none
    (every Prove read whole: 129), and `.call(kind, request_id, size)` → (code, details, proof)."""
    made = []

    def make(**route):
        path = tmp_path / f"state-{len(made)}.db"
        conn = db.connect(path, now=clock.SYSTEM.now(), create=True)
        raw = {"refresh": "0.1s", "cut_through_mb": 0 if request.param == "as it arrives" else 129, **route}
        config = config_module.from_mapping({"db": str(path), "launch": {"bench_concurrency": 2}, "route": raw})

        class Routed:
            pass

        r = Routed()
        r.path, r.conn, r.config = path, conn, config
        r.prover = Daemon()
        at = clock.to_iso(clock.SYSTEM.now())
        conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                     " bench_rate) VALUES ('u-a', 'vastctl-a', 'running', ?, ?, ?, ?, 60)",
                     (at, at, r.prover.port, at))
        conn.commit()
        r.router = route_server.Router(config, probe=lambda port, timeout: False)
        r.router.start_writer(path)
        r.server, port = route_server.make_server(r.router, "127.0.0.1:0")
        r.server.start()
        r.front = None
        if request.param == "as it arrives":
            r.front = route_front.Front(r.router, route_listener.bind("127.0.0.1:0"), port)
            r.front.start()
            port = r.front.listen.getsockname()[1]
        r.address = f"127.0.0.1:{port}"
        r.channel = grpc.insecure_channel(r.address, options=[("grpc.max_send_message_length", 300 * MiB),
                                                              ("grpc.max_receive_message_length", 300 * MiB)])

        def call(kind, request_id, size=1024):
            try:
                answer = r.channel.unary_unary(wire.PROVE)(prove_request(request_id, KINDS[kind], size), timeout=20)
            except grpc.RpcError as exc:
                return exc.code(), exc.details(), None
            return grpc.StatusCode.OK, "", wire.ProveResponse.FromString(answer).result.proof

        def calls():
            return query(path, "SELECT request_id, kind, uuid, label, result, detail FROM proof_calls ORDER BY id")

        r.call, r.calls = call, calls
        wait_for(lambda: [p["label"] for p in r.router.dispatcher.snapshot()["provers"]] == ["vastctl-a"],
                 "vastctl-a joined")
        made.append(r)
        return r

    yield make
    for r in made:
        r.channel.close()
        if r.front is not None:
            r.front.stop()
            r.front.close()
        r.server.stop(0)
        r.router.stop_writer()
        r.prover.stop()
        r.conn.close()


# --- where each kind goes: the table ------------------------------------------------------------------------------


def ways(**route):
    return {wire.KIND_NAMES[kind]: way.value
            for kind, way in routing.routing(config_module.from_mapping({"route": route}).route).items()}


def test_the_routing_table_keeps_unverified_kinds_off_the_fleet_unless_listed():
    assert ways() == {"porep": "fleet", "snap": "refused", "window_post": "fleet", "winning_post": "refused"}
    assert ways(own_daemon="10.0.0.5:9820") == {"porep": "fleet", "snap": "own_daemon", "window_post": "own_daemon",
                                                "winning_post": "own_daemon"}
    assert ways(post_address="10.0.0.5:9820") == ways(own_daemon="10.0.0.5:9820")  # the old name, the same table
    assert ways(own_daemon="10.0.0.5:9820", unverified_to_fleet=["snap"]) == {
        "porep": "fleet", "snap": "fleet", "window_post": "own_daemon", "winning_post": "own_daemon"}
    assert ways(unverified_to_fleet=["winning_post", "snap"]) == {
        "porep": "fleet", "snap": "fleet", "window_post": "fleet", "winning_post": "fleet"}


def test_the_start_up_words_say_what_is_refused_sent_unverified_or_deprecated():
    def words(**route):
        return routing.words(config_module.from_mapping({"route": route}).route)

    assert words() == ("SnapDeals and WinningPoSt refused (FAILED_PRECONDITION): Curio does not verify them,"
                       " route.own_daemon is not set and route.unverified_to_fleet does not list them; PoRep and"
                       " WindowPoSt to the rented fleet")
    assert words(own_daemon="10.0.0.5:9820", unverified_to_fleet=["snap"]) == (
        "WindowPoSt and WinningPoSt to your own daemon 10.0.0.5:9820 (route.own_daemon); PoRep and SnapDeals to the"
        " rented fleet (SnapDeals UNVERIFIED, route.unverified_to_fleet: a bad proof goes on chain)")
    assert words(post_address="10.0.0.5:9820").endswith(
        "; route.post_address is deprecated: it is route.own_daemon now, which takes SnapDeals too")


@pytest.mark.parametrize("route,named", [
    ({"unverified_to_fleet": ["porep"]}, "'route.unverified_to_fleet' may list only snap, winning_post, got ['porep']"),
    ({"unverified_to_fleet": "snap"}, "'route.unverified_to_fleet' must be a list of strings"),
    ({"own_daemon": "10.0.0.5:9820", "post_address": "10.0.0.6:9820"}, "name different daemons"),
    ({"own_daemon": "my daemon"}, "'route.own_daemon' must be your own cuzk daemon's host:port"),
    ({"post_address": "nonsense"}, "'route.post_address' must be your own cuzk daemon's host:port"),
])
def test_bad_routing_settings_are_one_error_naming_the_key(route, named):
    with pytest.raises(BadInput) as raised:
        config_module.from_mapping({"route": route})
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_both_names_for_one_daemon_are_accepted():
    route = config_module.from_mapping({"route": {"own_daemon": "10.0.0.5:9820", "post_address": "10.0.0.5:9820"}}).route
    assert route.own_daemon == "10.0.0.5:9820"


# --- the calls ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_by_default_snapdeals_and_winning_post_are_refused_naming_the_settings_and_no_rented_machine_sees_them(
        make_router, caplog, cli):
    caplog.set_level(logging.INFO, logger="vastctl.route")
    r = make_router()
    said = [rec for rec in caplog.records if rec.getMessage().startswith("routing: ")]
    assert [rec.levelname for rec in said] == ["WARNING"] and "SnapDeals and WinningPoSt refused" in said[0].getMessage()
    for kind, request_id, size in (("snap", "snap-1", 2 * MiB), ("winning_post", "winning-1", 1024)):
        code, details, _ = r.call(kind, request_id, size)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        assert "route.own_daemon" in details and f"list {kind} in route.unverified_to_fleet" in details, details
        assert "\n" not in details
    assert r.call("porep", "porep-1")[0] == grpc.StatusCode.OK  # verified kinds still go to the fleet
    assert r.call("window_post", "wdpost-1")[0] == grpc.StatusCode.OK
    assert r.prover.seen == ["porep-1", "wdpost-1"]
    wait_for(lambda: len(r.calls()) == 4, "four calls recorded")
    rows = {row["request_id"]: row for row in r.calls()}
    for request_id, kind in (("snap-1", "snap"), ("winning-1", "winning_post")):
        assert (rows[request_id]["kind"], rows[request_id]["result"], rows[request_id]["uuid"]) == (kind, "refused", None)
        assert "route.own_daemon not set" in rows[request_id]["detail"]
    assert [(rows[i]["label"], rows[i]["result"]) for i in ("porep-1", "wdpost-1")] == [("vastctl-a", "completed")] * 2
    refusals = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("refused ")]
    assert refusals == ["refused snap call snap-1: Curio does not verify it and route.own_daemon is not set",
                        "refused winning_post call winning-1: Curio does not verify it and route.own_daemon is not set"]
    # the router's status says where each kind goes, and `fleet --json` and the dashboard show it
    refused = {"porep": "fleet", "snap": "refused", "window_post": "fleet", "winning_post": "refused"}
    wait_for(lambda: query(r.path, "SELECT routing FROM route_status") == [{"routing": json.dumps(refused, sort_keys=True)}],
             "route_status.routing written")
    listed = cli("--db", r.path, "fleet", "--json")
    assert listed.code == 0 and json.loads(listed.out)["summary"]["router"]["routing"] == refused
    now = clock.SYSTEM.now()
    card = dashboard_cards._router({**deliveries.held(r.conn, now=now).view(), "proof_wait_last_day": deliveries.proof_wait(
        r.conn, since=now - timedelta(days=1), until=now + timedelta(seconds=1), max_wait_s=2700)})
    assert ('unverified by Curio: SnapDeals → refused (route.own_daemon not set) · WinningPoSt → refused'
            ' (route.own_daemon not set)') in card
    assert 'class="card glance warn"' in card  # nothing held, but refusing: not ok


@pytest.mark.slow
def test_a_refused_snapdeals_task_is_what_curio_sees_fail_three_times_and_delete(make_router):
    r = make_router()
    curio = CurioClient(r.address, prove_timeout=20)
    try:
        task = curio.submit("snap-1000-1", kind="snap", payload_bytes=2 * MiB)
        wait_for(task.done.is_set, "the SnapDeals task ends")
    finally:
        curio.close()
    assert task.outcome == "deleted" and [code for code, _ in task.failures] == ["FAILED_PRECONDITION"] * 3
    assert r.prover.seen == []


@pytest.mark.slow
@pytest.mark.parametrize("key", ["own_daemon", "post_address"])
def test_with_an_own_daemon_unverified_kinds_go_there_whole_and_are_recorded_under_it(make_router, key):
    own = Daemon()
    try:
        r = make_router(**{key: f"127.0.0.1:{own.port}"})
        big = prove_request("snap-1", KINDS["snap"], 2 * MiB)  # over route.cut_through_mb: yet never cut through
        header = wire.prove_header(big)
        assert not r.router.cuts(header, len(big) - 5)
        assert not r.router.cuts(wire.ProveHeader("w", wire.WINNING_POST), 100 * MiB)
        for kind, request_id, size in (("snap", "snap-1", 2 * MiB), ("winning_post", "winning-1", 1024),
                                       ("window_post", "wdpost-1", 1024), ("porep", "porep-1", 2 * MiB)):
            code, details, proof = r.call(kind, request_id, size)
            assert (code, proof) == (grpc.StatusCode.OK, f"proof:{request_id}".encode()), details
        assert own.seen == ["snap-1", "winning-1", "wdpost-1"] and r.prover.seen == ["porep-1"]
        assert own.requests[0] == big  # the bytes as Curio sent them
        wait_for(lambda: len(r.calls()) == 4, "four calls recorded")
        assert [(c["request_id"], c["label"], c["uuid"], c["result"]) for c in r.calls()] == [
            ("snap-1", "own_daemon", None, "completed"), ("winning-1", "own_daemon", None, "completed"),
            ("wdpost-1", "own_daemon", None, "completed"), ("porep-1", "vastctl-a", "u-a", "completed")]
    finally:
        own.stop()


@pytest.mark.slow
def test_a_kind_listed_in_unverified_to_fleet_goes_to_the_fleet_and_the_other_to_the_own_daemon(make_router):
    own = Daemon()
    try:
        r = make_router(own_daemon=f"127.0.0.1:{own.port}", unverified_to_fleet=["snap"])
        assert r.router.cuts(wire.ProveHeader("s", wire.SNAP_DEALS_UPDATE), 2 * MiB) == (r.front is not None)
        assert r.call("snap", "snap-1", 2 * MiB)[0] == grpc.StatusCode.OK
        assert r.call("winning_post", "winning-1")[0] == grpc.StatusCode.OK
        assert r.prover.seen == ["snap-1"] and own.seen == ["winning-1"]
        wait_for(lambda: [(c["request_id"], c["label"]) for c in r.calls()] ==
                 [("snap-1", "vastctl-a"), ("winning-1", "own_daemon")], "each call names where it went")
    finally:
        own.stop()


@pytest.mark.slow
def test_an_own_daemon_that_is_down_fails_the_call_naming_it_and_nothing_goes_to_the_fleet(make_router):
    port = free_port()  # nothing listens there
    r = make_router(own_daemon=f"127.0.0.1:{port}")
    code, details, _ = r.call("winning_post", "winning-1")
    assert code == grpc.StatusCode.UNAVAILABLE and f"your own daemon 127.0.0.1:{port} (route.own_daemon)" in details
    assert r.prover.seen == []
    wait_for(lambda: [(c["label"], c["result"]) for c in r.calls()] == [("own_daemon", "error")],
             "the call recorded as the own daemon's error")


# --- `vastctl route` says it as it starts ---------------------------------------------------------------------------


@pytest.mark.slow
def test_vastctl_route_says_at_start_up_where_unverified_kinds_go(tmp_path):
    path = tmp_path / "state.db"
    db.connect(path, now=clock.SYSTEM.now(), create=True).close()
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path / "route.log"
    env = {**os.environ, "VASTCTL_DB": str(path), "HOME": str(tmp_path)}
    with log.open("w") as err:
        router = subprocess.Popen([sys.executable, "-m", "vastctl", "route", "--listen", address], env=env,
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        said = wait_for(lambda: [line for line in log.read_text().splitlines() if line.startswith("routing on ")],
                        "the start-up line", proc=router, log=log)
    finally:
        stop_process(router)
    assert said == [f"routing on {address} (state file {path}; SnapDeals and WinningPoSt refused (FAILED_PRECONDITION):"
                    " Curio does not verify them, route.own_daemon is not set and route.unverified_to_fleet does not"
                    " list them; PoRep and WindowPoSt to the rented fleet; stop with SIGTERM, hand over to a new router"
                    " with SIGHUP)"]
    assert "WARNING routing: SnapDeals and WinningPoSt refused" in log.read_text()
