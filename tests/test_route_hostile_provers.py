"""A prover is a hostile peer: the router in this process (a state file, Router, its grpcio server, the front
end, a gRPC client channel on it) with stand-in provers that break the rules (helpers/hostile_prover.py), each
misbehaviour on both of the router's ways to a prover where it applies: a small call through grpcio's channel,
a large one (route.cut_through_mb 1, 2 MiB or more) sent on as it arrives.

What must hold whatever a prover does: the caller gets a proper error, or the proof of a good prover the call
was sent on to, never OK with a bad prover's bytes; no bad answer is recorded `completed`; a call ends by its
deadline with its slot and memory given back; a prover that runs calls to their deadline is set aside; and
GetStatus answers with the good provers' figures."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError
from helpers.hostile_prover import MAX_COMPLETED, GoodProver, HostileProver, MiB, good_proof
from helpers.serving import query, wait_for

from vastctl import clock
from vastctl import config as config_module
from vastctl.route import front as route_front
from vastctl.route import listener as route_listener
from vastctl.route import server as route_server
from vastctl.route import wire
from vastctl.state import db

pytestmark = pytest.mark.slow  # gRPC servers and stand-in provers on loopback

SIZES = {"small": 256 * 1024, "large": 2 * MiB}  # below and above route.cut_through_mb 1
PATHS = pytest.mark.parametrize("path", ["small", "large"])
HOSTILE, GOOD = "vastctl-hostile", "vastctl-good"


class Site:
    """A state file, a router (refreshing every 0.1 s), its grpcio server, its front end, a client channel."""

    def __init__(self, tmp_path, **route):
        self.path = tmp_path / "state.db"
        self.conn = db.connect(self.path, now=clock.SYSTEM.now(), create=True)
        config = config_module.from_mapping({"db": str(self.path), "launch": {"bench_concurrency": 2},
                                             "route": {"refresh": "0.1s", "max_held": 5, "cut_through_mb": 1,
                                                       **route}})
        self.router = route_server.Router(config, probe=lambda port, timeout: False)
        self.router.start_writer(self.path)
        self.server, internal = route_server.make_server(self.router, "127.0.0.1:0")
        self.server.start()
        self.front = route_front.Front(self.router, route_listener.bind("127.0.0.1:0"), internal)
        self.front.start()
        self.port = self.front.listen.getsockname()[1]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[
            ("grpc.max_send_message_length", 300 * MiB), ("grpc.max_receive_message_length", 300 * MiB),
            ("grpc.enable_retries", 0)])
        self.provers: list = []

    def join(self, prover, name, rate=60.0):
        """A running machine whose tunnel ends at `prover`; the best rate is tried first."""
        self.provers.append(prover)
        at = clock.to_iso(clock.SYSTEM.now())
        self.conn.execute("INSERT INTO instances (uuid, label, state, created_at, state_since, tunnel_port, joined_at,"
                          " bench_rate) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                          (f"u-{name}", name, at, at, prover.port, at, rate))
        self.conn.commit()
        wait_for(lambda: any(p["label"] == name for p in self.router.dispatcher.snapshot()["provers"]),
                 f"{name} joined")
        return prover

    def prove(self, request: bytes, timeout: float):
        """("ok", answer bytes) or ("error", code, details)."""
        try:
            return ("ok", self.channel.unary_unary(wire.PROVE)(request, timeout=timeout))
        except grpc.RpcError as exc:
            return ("error", exc.code(), exc.details() or "")

    def rows(self, label=None):
        rows = query(self.path, "SELECT request_id, label, result, attempt, size_bytes, detail FROM proof_calls"
                                " ORDER BY id")
        return [r for r in rows if label is None or r["label"] == label]

    def prover_entry(self, label):
        return next((p for p in self.router.dispatcher.snapshot()["provers"] if p["label"] == label), None)

    def stop(self):
        # the provers first: a router thread blocked on one of them is let go before the router stops
        still = [name for prover in self.provers if isinstance(prover, HostileProver) for name in prover.stop()]
        for prover in self.provers:
            if isinstance(prover, GoodProver):
                prover.stop()
        self.channel.close()
        self.front.stop()
        self.front.close()
        self.server.stop(0)
        self.router.stop_writer()
        self.conn.close()
        assert not still, f"stand-in threads still running: {still}"


@pytest.fixture
def site(tmp_path):
    made: list[Site] = []

    def make(**route):
        made.append(Site(tmp_path, **route))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def request_of(request_id, size, kind=wire.POREP_SEAL_COMMIT):
    return wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id=request_id, proof_kind=kind, vanilla_proof=bytes(range(256)) * (size // 256))).SerializeToString()


def rss() -> int:
    """This process's resident memory, in bytes (the router runs in it)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def assert_no_bad_answer(outcome, request_id, good):
    """A proper error, or the good prover's proof of this very call; never OK with a hostile prover's bytes, and
    never the deadline (the router must find the fault itself, not wait it out)."""
    if outcome[0] == "ok":
        try:
            answer = wire.ProveResponse.FromString(outcome[1]).result
        except DecodeError:
            raise AssertionError(f"OK with {len(outcome[1])} bytes that are not a ProveResponse") from None
        assert (answer.status, answer.proof) == (wire.STATUS_COMPLETED, good_proof(request_id)), (
            f"OK with a hostile prover's answer ({len(outcome[1])} bytes): {bytes(answer.proof[:60])!r}")
        assert request_id in good.seen
        return
    _, code, details = outcome
    assert code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED), outcome
    assert details and "\n" not in details, outcome


def waited(routed, condition, what, timeout=20):
    """wait_for, whose failure also says what the router recorded and holds."""
    try:
        return wait_for(condition, what, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; recorded: {routed.rows()}; the router: {routed.router.dispatcher.snapshot()}") from None


def hostile_rows(routed, request_id):
    """The attempts the hostile prover was given this call, once the writer recorded them."""
    return waited(routed, lambda: [r for r in routed.rows(HOSTILE) if r["request_id"] == request_id],
                  f"{request_id}'s attempt on the hostile prover recorded")


def set_aside(routed, label):
    """Whether the router sends `label` no more calls for now: ejected (back in some seconds) or set aside in its
    dispatcher, left the joined set for it, or marked failing in the state file."""
    entry = routed.prover_entry(label)
    if entry is None or entry.get("gone"):
        return True
    if entry.get("set_aside") or entry.get("back_in_s") is not None:  # reported, or ejected for a while
        return True
    marked = query(routed.path, "SELECT route_failing_since FROM instances WHERE label = ?", label)
    return bool(marked and marked[0]["route_failing_since"])


def idle(routed):
    snapshot = routed.router.dispatcher.snapshot()
    return snapshot["in_flight"] == 0 and snapshot["held"] == 0 and snapshot.get("kept_bytes", 0) == 0


def settled(routed):
    """Every call over: no slot still taken by a call, nothing held, no request memory kept. (A slot whose call's
    caller or deadline went while the daemon may still prove it is another matter: the router may keep it
    until the daemon's status shows the work gone.)"""
    waited(routed, lambda: idle(routed), "every slot and every request's memory given back")


# --- a prover that stops reading ------------------------------------------------------------------------------

@PATHS
def test_a_prover_that_stops_reading_loses_the_call_at_its_deadline_with_its_slot_and_memory_freed(site, path):
    """It opens its windows, takes the call's HEADERS and reads nothing more: the call ends by its deadline (3 s),
    recorded, its slot and its memory given back, and the next call completes on a good prover."""
    routed = site()
    staller = routed.join(HostileProver("stall"), HOSTILE, rate=10)
    size = 16 * MiB if path == "large" else SIZES["small"]  # large: past every socket buffer on the way
    before = rss()
    outcome = routed.prove(request_of("stalled", size), timeout=3)
    assert outcome[0] == "error" and outcome[1] != grpc.StatusCode.OK, outcome[:2]
    assert staller.prove_calls(), "the stalled prover never had the call"
    settled(routed)
    assert all(r["result"] != "completed" for r in hostile_rows(routed, "stalled"))
    assert rss() - before < 200 * MiB
    good = routed.join(GoodProver(), GOOD, rate=90)
    outcome = routed.prove(request_of("after-stall", size), timeout=30)
    assert outcome[0] == "ok" and wire.ProveResponse.FromString(outcome[1]).result.proof == good_proof("after-stall")
    assert good.seen == ["after-stall"]


# --- a huge answer ----------------------------------------------------------------------------------------------

@PATHS
def test_a_provers_200_mib_answer_is_an_error_never_passed_on(site, path):
    """A well-formed ProveResponse of 200 MiB, within the router's windows, to a small or a 2 MiB call: an answer
    is a few KB, so this one is an error for that call (or the call goes to the good prover), and the router's
    memory does not grow by the answer."""
    routed = site()
    huge = routed.join(HostileProver("huge"), HOSTILE, rate=90)
    good = routed.join(GoodProver(), GOOD, rate=10)
    before = rss()
    outcome = routed.prove(request_of("huge-answer", SIZES[path]), timeout=60)
    grown = rss() - before
    assert_no_bad_answer(outcome, "huge-answer", good)
    assert huge.prove_calls()
    assert all(r["result"] != "completed" for r in hostile_rows(routed, "huge-answer"))
    settled(routed)
    assert grown < 150 * MiB, f"RSS grew {grown // MiB} MiB on a 200 MiB answer"


# --- HEADERS and endless CONTINUATION -------------------------------------------------------------------------

@PATHS
def test_a_prover_answering_headers_and_endless_continuation_frames_is_cut_off_and_the_call_not_left_hanging(
        site, path):
    """The answer's header block never ends: the router caps it, closes that connection and fails (or resends)
    the call well before its 20 s deadline, rather than growing the block until then."""
    routed = site()
    flood = routed.join(HostileProver("flood"), HOSTILE, rate=90)
    good = routed.join(GoodProver(), GOOD, rate=10)
    outcome = routed.prove(request_of("flooded", SIZES[path]), timeout=20)
    assert_no_bad_answer(outcome, "flooded", good)
    waited(routed, lambda: flood.flood_ended, "the flood ended")
    assert flood.flood_ended == "closed by the peer", flood.flood_ended
    assert flood.flood_bytes < 64 * MiB, f"the router took a {flood.flood_bytes // MiB} MiB header block"
    assert all(r["result"] != "completed" for r in hostile_rows(routed, "flooded"))
    settled(routed)


# --- a prover that never answers ------------------------------------------------------------------------------

@PATHS
def test_a_prover_that_takes_calls_and_never_answers_is_set_aside_after_fail_threshold_of_them(site, path):
    """route.fail_threshold 2: two calls run to their deadline (2 s) on a prover that reads them whole and never
    answers count against it (its benchmark says a proof takes it 0.2 s, so the deadline was not too short for
    it); it is set aside, and the next call goes to a good prover."""
    routed = site(fail_threshold=2)
    silent = routed.join(HostileProver("silent"), HOSTILE, rate=36000)  # 2 slots: one proof in 0.2 s
    for n in (1, 2):
        outcome = routed.prove(request_of(f"unanswered-{n}", SIZES[path]), timeout=2)
        assert outcome[0] == "error" and outcome[1] != grpc.StatusCode.OK, outcome[:2]
        assert len(silent.prove_calls()) == n
        waited(routed, lambda: routed.rows(HOSTILE)[n - 1:], f"call {n} recorded")
    waited(routed, lambda: set_aside(routed, HOSTILE), "the silent prover set aside", timeout=15)
    assert all(r["result"] != "completed" for r in routed.rows(HOSTILE))
    good = routed.join(GoodProver(), GOOD, rate=10)
    outcome = routed.prove(request_of("after-silence", SIZES[path]), timeout=30)
    assert outcome[0] == "ok", outcome
    assert wire.ProveResponse.FromString(outcome[1]).result.proof == good_proof("after-silence")
    assert good.seen == ["after-silence"] and len(silent.prove_calls()) == 2
    settled(routed)


# --- an OK before the request reached the prover --------------------------------------------------------------

@PATHS
def test_an_ok_answer_sent_before_the_request_reached_the_prover_is_never_a_completed_proof(site, path):
    """The prover gives the call no window and answers OK with a fake proof as soon as its HEADERS come: it
    cannot have proved a request it never had, so the fake is not passed on nor recorded `completed`."""
    routed = site()
    early = routed.join(HostileProver("early_ok"), HOSTILE, rate=90)
    good = routed.join(GoodProver(), GOOD, rate=10)
    request = request_of("answered-early", SIZES[path])
    outcome = routed.prove(request, timeout=30)
    (call, *_) = early.prove_calls()
    assert call.received_at_answer is not None and call.received_at_answer < len(request)
    assert_no_bad_answer(outcome, "answered-early", good)
    assert all(r["result"] != "completed" for r in hostile_rows(routed, "answered-early"))
    settled(routed)


# --- more than one message, or a prefix that lies -------------------------------------------------------------

@PATHS
@pytest.mark.parametrize("behaviour", ["two", "prefix_over", "prefix_under"])
def test_an_answer_that_is_not_exactly_one_message_is_an_error_never_passed_on_as_ok(site, path, behaviour):
    """two: two length-prefixed messages then OK trailers; prefix_over/prefix_under: a prefix claiming 100 bytes
    more/fewer than the message sent. Never joined or cut into an OK answer, never recorded `completed`."""
    routed = site()
    hostile = routed.join(HostileProver(behaviour), HOSTILE, rate=90)
    good = routed.join(GoodProver(), GOOD, rate=10)
    request_id = f"{behaviour}-answer"
    outcome = routed.prove(request_of(request_id, SIZES[path]), timeout=30)
    assert_no_bad_answer(outcome, request_id, good)
    assert hostile.prove_calls()
    assert all(r["result"] != "completed" for r in hostile_rows(routed, request_id))
    settled(routed)


# --- GetStatus ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["garbage", "max_completed"])
def test_get_status_answers_with_the_good_provers_figures_beside_a_prover_whose_status_is_bad(site, status):
    """One prover's GetStatus answer does not parse (garbage) or says 2^64-1 proofs completed: it is skipped (or
    the sum clamped), and every caller still gets the good prover's figures."""
    routed = site()
    routed.join(HostileProver("good", status=status), HOSTILE, rate=90)
    routed.join(GoodProver(completed=7), GOOD, rate=10)
    for _ in range(3):  # every caller, not just the first
        answer = wire.GetStatusResponse.FromString(
            routed.channel.unary_unary(wire.GET_STATUS)(b"", timeout=10))
        allowed = {7} if status == "garbage" else {7, MAX_COMPLETED}
        assert answer.total_proofs_completed in allowed, answer.total_proofs_completed
        assert "gpu of good" in [gpu.name for gpu in answer.gpus]
        queues = {q.proof_kind: (q.pending, q.in_progress) for q in answer.queues}
        assert queues.get("porep") == (1, 2), queues
        assert "router-held" in queues
