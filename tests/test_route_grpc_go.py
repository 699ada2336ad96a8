"""`vastctl route` against clients nobody here wrote: Curio's own grpc-go client (tests/go_curio_client, built
from Debian's packages as Curio's lib/cuzk/client.go dials: plaintext `dns:///`, 256 MiB each way, no
keepalive, no retry policy, a deadline per Prove) and nghttp2's nghttp and h2load, in the normal flows. The
router is a real process on a config file, on a listening socket passed as systemd passes it (or bound by
itself), in front of stand-in cuzk daemons (real grpcio servers) joined as machines.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess

import pytest
from helpers.curio_client import prove_request
from helpers.route_processes import GoClient, RouteHost, assert_every_call_got_its_proof, proof_of
from helpers.serving import wait_for

from vastctl.route import wire

pytestmark = pytest.mark.slow  # router processes, servers on loopback, a Go program


@pytest.fixture
def host(tmp_path):
    made = RouteHost(tmp_path)
    yield made
    made.close()


def completed_rows(host: RouteHost) -> collections.Counter:
    return collections.Counter(c["request_id"] for c in host.calls() if c["result"] == "completed")


@pytest.mark.parametrize("activated", [True, False], ids=["socket from systemd", "bound itself"])
def test_small_calls_20_at_once_each_get_their_own_proof(host, go_client, tmp_path, activated):
    host.start_router(activated=activated)
    host.daemon("a", prove_seconds=0.01)
    host.daemon("b", prove_seconds=0.01)
    host.wait_provers(2)
    curio = GoClient(go_client, tmp_path, host.address, workers=20, calls=5)
    try:
        wait_for(lambda: curio.proc.poll() is not None, "the grpc-go client's 100 calls end", timeout=120)
        assert curio.proc.returncode == 0, curio.err.read_text()
        results = curio.results()
    finally:
        curio.close()
    assert len(results) == 100
    assert_every_call_got_its_proof(results)
    wait_for(lambda: completed_rows(host) == collections.Counter(r["id"] for r in results),
             "proof_calls: one completed row for each call, none other")
    assert sum(len(daemon.answered) for daemon in host.daemons) == 100


def test_a_64_mb_call_gets_its_proof(host, go_client, tmp_path):
    host.start_router()
    daemon = host.daemon("a")
    host.wait_provers(1)
    curio = GoClient(go_client, tmp_path, host.address, name="big", size=64_000_000, timeout="120s")
    try:
        (result,) = curio.wait_for_results(1, "the 64 MB call ends", timeout=120)
    finally:
        curio.close()
    assert_every_call_got_its_proof([result])
    assert daemon.answered == ["big-0-0"]
    wait_for(lambda: [(c["request_id"], c["result"]) for c in host.calls()] == [("big-0-0", "completed")],
             "proof_calls: the call completed")
    assert host.calls()[0]["size_bytes"] > 64_000_000


def test_a_call_is_held_until_a_prover_joins(host, go_client, tmp_path):
    host.start_router()  # no machine has joined
    curio = GoClient(go_client, tmp_path, host.address, name="held")
    try:
        wait_for(lambda: host.status()["held"] == 1, "route_status: the call is held")
        assert curio.results() == [] and curio.proc.poll() is None  # waiting, not failed
        host.daemon("a")
        (result,) = curio.wait_for_results(1, "the held call ends once a prover joined")
    finally:
        curio.close()
    assert_every_call_got_its_proof([result])
    wait_for(lambda: [(c["request_id"], c["result"]) for c in host.calls()] == [("held-0-0", "completed")],
             "proof_calls: the held call completed")


# --- nghttp2's clients -----------------------------------------------------------------------------------------

GRPC_HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]


def grpc_body(request_id: str) -> bytes:
    """A Prove's request as it goes in a DATA frame: gRPC's 5-byte prefix (uncompressed, length), then the message."""
    message = prove_request(request_id)
    return b"\0" + len(message).to_bytes(4, "big") + message


@pytest.fixture
def nghttp2():
    if shutil.which("nghttp") is None or shutil.which("h2load") is None:
        pytest.skip("nghttp and h2load are not installed (Debian's nghttp2-client: .ci/run installs it)")


def test_nghttp_posts_a_prove_and_gets_the_proof_then_grpc_status_0(host, tmp_path, nghttp2):
    host.start_router()
    host.daemon("a")
    host.wait_provers(1)
    body = tmp_path / "prove.bin"
    body.write_bytes(grpc_body("nghttp-1"))
    url = f"http://{host.address}{wire.PROVE}"
    shown = subprocess.run(["nghttp", "-v", "-n", *GRPC_HEADERS, "-H", ":method: POST", "-d", str(body), url],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert re.search(r"recv \(stream_id=\d+\) :status: 200$", shown.stdout, re.M), shown.stdout
    assert re.search(r"recv \(stream_id=\d+\) grpc-status: 0$", shown.stdout, re.M), shown.stdout
    answer = subprocess.run(["nghttp", *GRPC_HEADERS, "-H", ":method: POST", "-d", str(body), url],
                            capture_output=True, timeout=60, check=False)
    assert answer.returncode == 0, answer.stderr
    data = answer.stdout
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5  # one uncompressed message
    result = wire.ProveResponse.FromString(data[5:]).result
    assert (result.status, result.proof) == (wire.STATUS_COMPLETED, proof_of("nghttp-1"))


def test_h2load_posts_40_proves_on_2_connections_4_at_a_time_and_each_is_answered(host, tmp_path, nghttp2):
    host.start_router()
    host.daemon("a")
    host.daemon("b")
    host.wait_provers(2)
    body = tmp_path / "prove.bin"
    body.write_bytes(grpc_body("h2load-1"))
    run = subprocess.run(["h2load", "-n", "40", "-c", "2", "-m", "4", *GRPC_HEADERS, "-d", str(body),
                          f"http://{host.address}{wire.PROVE}"], capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^requests: 40 total, 40 started, 40 done, 40 succeeded, 0 failed, 0 errored", run.stdout,
                     re.M), run.stdout
    assert re.search(r"^status codes: 40 2xx", run.stdout, re.M), run.stdout
    # a 200 carries a gRPC status in its trailers: the calls' rows say each was a proof
    wait_for(lambda: [c["result"] for c in host.calls()] == ["completed"] * 40, "proof_calls: 40 completed")
