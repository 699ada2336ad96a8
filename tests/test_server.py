"""`vastctl serve` over real HTTP on 127.0.0.1: every endpoint, every error code, the token rules, bad input."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
import uuid as uuid_module

import pytest
import requests
from helpers.serving import ADMIN_TOKEN, Manager

from vastctl import config as config_module
from vastctl.clock import SYSTEM
from vastctl.state import db, lifecycle
from vastctl.views import fleet

pytestmark = pytest.mark.slow  # a real serve process on loopback


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("manager"), gate=40).start(0, "--timeout", "2")
    yield m
    assert m.stop() == 0
    assert "stopped" in m.log()


@pytest.fixture
def new_uuid():
    return f"u-{uuid_module.uuid4()}"


def post(manager, uuid, report, body=None, *, token=None, data=None, headers=None):
    token = manager.token(uuid) if token is None else token
    all_headers = {"Authorization": f"Bearer {token}"} if token else {}
    all_headers.update(headers or {})
    if data is None and body is not None:
        data = json.dumps(body)
    return requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", data=data, headers=all_headers, timeout=10)


def register(manager, uuid, label=None):
    response = post(manager, uuid, "register", {"label": label or f"vastctl-{uuid}"})
    assert response.status_code == 200, response.text
    return response


def walk_to(manager, uuid, state):
    """Register and report up to `state` (registered, params_done, bench_done, running)."""
    register(manager, uuid)
    for report, body, reached in (("params-done", None, "params_done"), ("bench-report", {"rate": 50}, "bench_done"),
                                  ("running", None, "running")):
        if state == "registered":
            return
        assert post(manager, uuid, report, body).json()["state"] == reached
        if state == reached:
            return


def snapshot(manager):
    return manager.rows(), manager.events()


def test_healthz(manager):
    response = requests.get(f"{manager.url}/healthz", timeout=10)
    assert (response.status_code, response.json()) == (200, {"ok": True})
    assert response.headers["Content-Type"] == "application/json"


def test_the_whole_lifecycle_over_http(manager, new_uuid):
    steps = [
        ("register", {"label": "vastctl-http-a", "vast_id": 77, "gpu_name": "RTX 4090", "num_gpus": 2},
         {"state": "registered"}),
        ("params-done", None, {"state": "params_done"}),
        ("bench-report", {"rate": 68.5}, {"state": "bench_done", "passed": True}),
        ("running", None, {"state": "running"}),
        ("heartbeat", {"proofs_done": 4}, {"state": "running"}),
    ]
    for report, body, answer in steps:
        response = post(manager, new_uuid, report, body)
        assert (response.status_code, response.json()) == (200, answer), report
    row = manager.rows()[new_uuid]
    assert (row["label"], row["state"], row["claimed_vast_id"], row["gpu_name"], row["num_gpus"], row["bench_rate"],
            row["proofs_done"]) == ("vastctl-http-a", "running", 77, "RTX 4090", 2, 68.5, 4)
    assert row["last_heartbeat_at"] is not None
    assert [(e["from_state"], e["to_state"], e["source"]) for e in manager.events(new_uuid)] == [
        (None, "registered", "instance"), ("registered", "params_done", "instance"),
        ("params_done", "bench_done", "instance"), ("bench_done", "running", "instance")]


def test_empty_bodies_and_nulls_are_accepted(manager, new_uuid):
    walk_to(manager, new_uuid, "bench_done")
    assert post(manager, new_uuid, "running", data="").status_code == 200
    assert post(manager, new_uuid, "heartbeat", {"proofs_done": None}).json() == {"state": "running"}
    assert post(manager, new_uuid, "heartbeat", {}).status_code == 200


def test_below_gate_bench_is_an_answer_not_an_error(manager, new_uuid):
    walk_to(manager, new_uuid, "params_done")
    for _ in range(2):  # delivered twice: the same answer, one kill event
        response = post(manager, new_uuid, "bench-report", {"rate": 3.1})
        assert response.status_code == 200
        answer = response.json()
        assert (answer["state"], answer["passed"]) == ("killed", False)
        assert "below gate 40" in answer["reason"] and "do not prove" in answer["reason"]
    row = manager.rows()[new_uuid]
    assert (row["state"], row["kill_code"], row["bench_rate"]) == ("killed", "bench_failed", 3.1)
    assert [e["to_state"] for e in manager.events(new_uuid)].count("killed") == 1


def test_repeated_reports_make_one_event(manager, new_uuid):
    """Each report delivered twice (a retry after a lost answer): the same answer, no second event."""
    steps = [("register", {"label": "vastctl-twice"}), ("params-done", None), ("bench-report", {"rate": 55}),
             ("running", None), ("heartbeat", {"proofs_done": 9})]
    for report, body in steps:
        first, second = post(manager, new_uuid, report, body), post(manager, new_uuid, report, body)
        assert (first.status_code, second.status_code) == (200, 200)
        assert first.json() == second.json()
    assert len(manager.events(new_uuid)) == 4
    assert manager.rows()[new_uuid]["proofs_done"] == 9


def test_uuid_with_reserved_characters(manager):
    odd = "odd uuid/with?slash#and%"
    response = requests.post(f"{manager.url}/v1/instances/{requests.utils.quote(odd, safe='')}/register",
                             json={"label": "vastctl-odd"}, headers={"Authorization": f"Bearer {manager.token(odd)}"},
                             timeout=10)
    assert response.status_code == 200, response.text
    assert manager.rows()[odd]["label"] == "vastctl-odd"


# --- tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token abc"])
def test_no_token_is_401(manager, new_uuid, header):
    before = snapshot(manager)
    headers = {} if header is None else {"Authorization": header}
    response = requests.post(f"{manager.url}/v1/instances/{new_uuid}/register", json={"label": "vastctl-x"},
                             headers=headers, timeout=10)
    assert response.status_code == 401
    assert "bearer token" in response.json()["error"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert snapshot(manager) == before


@pytest.mark.parametrize("token", ["0" * 64, "not-a-token", "é-non-ascii", "x" * 5000])
def test_wrong_token_is_401(manager, new_uuid, token):
    walk_to(manager, new_uuid, "registered")
    before = snapshot(manager)
    headers = {"Authorization": f"Bearer {token}".encode()}
    response = requests.post(f"{manager.url}/v1/instances/{new_uuid}/params-done", headers=headers, timeout=10)
    assert response.status_code == 401
    assert response.json()["error"].startswith("invalid token")
    assert snapshot(manager) == before


def test_a_token_speaks_only_for_its_own_uuid(manager, new_uuid):
    other = f"other-{new_uuid}"
    walk_to(manager, new_uuid, "registered")
    walk_to(manager, other, "registered")
    before = snapshot(manager)
    response = post(manager, new_uuid, "params-done", token=manager.token(other))
    assert response.status_code == 403
    assert "another machine" in response.json()["error"]
    # a known machine's token cannot register (adopt) a new uuid either
    assert post(manager, f"new-{new_uuid}", "register", {"label": "vastctl-steal"},
                token=manager.token(other)).status_code == 403
    assert snapshot(manager) == before


def test_token_checked_before_the_body(manager, new_uuid):
    response = post(manager, new_uuid, "register", data="{not json", token="0" * 64)
    assert response.status_code == 401


# --- 404, 405, 409 ----------------------------------------------------------------------------


def test_unknown_uuid_is_404(manager, new_uuid):
    before = snapshot(manager)
    for report, body in (("params-done", None), ("bench-report", {"rate": 50}), ("running", None),
                         ("heartbeat", {"proofs_done": 1})):
        response = post(manager, new_uuid, report, body)
        assert response.status_code == 404, report
        assert new_uuid in response.json()["error"]
    assert snapshot(manager) == before


@pytest.mark.parametrize("path", ["/", "/v1", "/v1/instances/u1", "/v1/instances/u1/reboot", "/v1/instances//register",
                                  "/v2/fleet", "/v1/instances/u1/register/extra"])
def test_unknown_endpoint_is_404(manager, path):
    response = requests.post(f"{manager.url}{path}", timeout=10)
    assert response.status_code == 404
    assert "no such endpoint" in response.json()["error"]


def test_wrong_method_is_405(manager, new_uuid):
    response = requests.get(f"{manager.url}/v1/instances/{new_uuid}/register", timeout=10)
    assert (response.status_code, response.headers["Allow"]) == (405, "POST")
    assert requests.post(f"{manager.url}/healthz", timeout=10).status_code == 405
    assert requests.delete(f"{manager.url}/v1/fleet", timeout=10).status_code == 405


def test_refused_by_the_lifecycle_is_409(manager, new_uuid):
    walk_to(manager, new_uuid, "registered")
    before = snapshot(manager)
    response = post(manager, new_uuid, "running")
    assert response.status_code == 409
    assert "cannot go to running" in response.json()["error"]
    assert snapshot(manager) == before


def test_killed_machine_gets_409_for_every_report(manager, new_uuid):
    walk_to(manager, new_uuid, "params_done")
    assert post(manager, new_uuid, "bench-report", {"rate": 1}).json()["passed"] is False
    before = snapshot(manager)
    for report, body in (("register", {"label": "x"}), ("running", None), ("heartbeat", {"proofs_done": 1})):
        response = post(manager, new_uuid, report, body)
        assert response.status_code == 409, report
        assert "killed" in response.json()["error"]
    assert snapshot(manager) == before


@pytest.mark.parametrize("destroyed", [False, True])
def test_a_killed_machines_token_is_refused_for_every_request(manager, new_uuid, destroyed):
    """Killed (and destroyed) is for good: whatever the request, its token no longer speaks, and nothing changes."""
    walk_to(manager, new_uuid, "running")
    conn = db.connect(manager.db_path, now=SYSTEM.now())
    lifecycle.kill(conn, new_uuid, "replaced by the operator", source="operator", code="operator", now=SYSTEM.now())
    if destroyed:
        with conn:
            conn.execute("UPDATE instances SET destroyed_at = state_since WHERE uuid = ?", (new_uuid,))
    conn.close()
    before = snapshot(manager)
    for report, data in (("register", '{"label": "vastctl-again"}'), ("params-done", ""), ("bench-report", '{"rate": 99}'),
                         ("running", ""), ("heartbeat", '{"proofs_done": 7}'), ("heartbeat", "{not json"),
                         ("register", '{"vast_id": -1}')):
        response = post(manager, new_uuid, report, data=data)
        assert response.status_code == 409, (report, data, response.text)
        error = response.json()["error"]
        assert error.startswith(f"instance vastctl-{new_uuid} was {'destroyed' if destroyed else 'killed'}"
                                " (replaced by the operator)")
        assert "its token is no longer accepted" in error
    assert snapshot(manager) == before


# --- bad input: 400 and 413 -------------------------------------------------------------------


BAD_BODIES = [
    ("heartbeat", "{not json", "not valid JSON"),
    ("heartbeat", "[1, 2]", "JSON object"),
    ("heartbeat", "null", "JSON object"),
    ("heartbeat", '"text"', "JSON object"),
    ("heartbeat", b"\xff\xfe{}", "UTF-8"),
    ("heartbeat", '{"proofs_done": -1}', "proofs_done"),
    ("heartbeat", '{"proofs_done": 1.5}', "proofs_done"),
    ("heartbeat", '{"proofs_done": "7"}', "proofs_done"),
    ("heartbeat", '{"proofs_done": true}', "proofs_done"),
    ("heartbeat", '{"proofs_done": 100000000000000000000000}', "proofs_done"),
    ("heartbeat", '{"proofs_done": 1, "proofs": 2}', 'unknown field "proofs"'),
    ("heartbeat", "[" * 50000 + "]" * 10, "not valid JSON"),
    ("heartbeat", '{"proofs_done": ' + "1" * 6000 + "}", "not valid JSON"),
    ("bench-report", '{"rate": NaN}', "not valid JSON"),
    ("bench-report", '{"rate": Infinity}', "not valid JSON"),
    ("bench-report", '{"rate": -Infinity}', "not valid JSON"),
    ("bench-report", '{"rate": 1e999}', "finite number"),
    ("bench-report", '{"rate": -1}', "finite number"),
    ("bench-report", '{"rate": "fast"}', "finite number"),
    ("bench-report", '{"rate": "50"}', "finite number"),
    ("bench-report", '{"rate": true}', "finite number"),
    ("bench-report", '{"rate": null}', 'needs the "rate" field'),
    ("bench-report", "{}", "needs"),
    ("bench-report", '{"failed": true, "reason": "two\\nlines"}', 'the "reason" field must be 1 to 500 printable'),
    ("bench-report", '{"failed": true, "reason": ""}', 'the "reason" field must be 1 to 500 printable'),
    ("running", '{"stages": {"fetch": -1}}', 'the "stages.fetch" field must be a finite number'),
    ("running", '{"stages": {"boot": 3}}', 'has an unknown stage'),
    ("params-done", '{"rate": 5}', "unknown field"),
    ("register", '{"label": 5}', 'the "label" field must be text'),
    ("register", '{"label": "a\\nb"}', 'the "label" field must be 1 to 256 printable'),
    ("register", '{"label": ""}', 'the "label" field must be 1 to 256 printable'),
    # a number too large for a float, and text UTF-8 cannot hold: each was a 500 with a traceback in the log
    ("bench-report", '{"rate": 1' + "0" * 400 + "}", 'the "rate" field must be a finite number'),
    ("bench-report", '{"rate": -1' + "0" * 400 + "}", 'the "rate" field must be a finite number'),
    ("register", '{"label": "vastctl-\\ud800"}', 'the "label" field must be Unicode text'),
    ("register", '{"gpu_name": "RTX \\udfff"}', 'the "gpu_name" field must be Unicode text'),
    ("register", '{"\\ud800": 1}', 'unknown field "\\ud800"'),
    ("register", '{"vast_id": "77"}', "vast_id"),
    ("register", '{"num_gpus": 0}', "num_gpus"),
    ("register", '{"gpu_name": ["RTX"]}', "gpu_name"),
    ("register", '{"gpu_name": "' + "x" * 300 + '"}', "gpu_name"),
]


@pytest.mark.parametrize("report,body,says", BAD_BODIES)
def test_bad_input_is_400_and_changes_nothing(manager, report, body, says):
    machine = "bad-input-machine"
    if machine not in manager.rows():
        walk_to(manager, machine, "params_done")
    before = snapshot(manager)
    data = body if isinstance(body, bytes) else body.encode()
    response = post(manager, machine, report, data=data, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]
    assert snapshot(manager) == before
    assert requests.get(f"{manager.url}/healthz", timeout=10).status_code == 200


@pytest.mark.parametrize("report,body,parts", [
    ("bench-report", '{"rate": -1}', {"field": "rate", "reason": "must be a finite number ≥ 0, got -1", "lead": ""}),
    ("register", '{"label": 5}', {"field": "label", "reason": "must be text, got int", "lead": ""}),
])
def test_a_refused_value_carries_its_field_and_reason_apart_from_the_sentence(manager, report, body, parts):
    machine = "bad-input-machine"
    if machine not in manager.rows():
        walk_to(manager, machine, "params_done")
    answer = post(manager, machine, report, data=body.encode(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert {key: answer.json()[key] for key in parts} == parts
    assert answer.json()["error"] == f'the "{parts["field"]}" field {parts["reason"]}'


def test_register_of_a_new_uuid_needs_a_label(manager, new_uuid):
    response = post(manager, new_uuid, "register", {"gpu_name": "RTX 4090"})
    assert response.status_code == 400
    assert "label" in response.json()["error"]
    assert new_uuid not in manager.rows()


def test_body_limit_is_64_kib(manager, new_uuid):
    walk_to(manager, new_uuid, "running")
    body = json.dumps({"proofs_done": 3})
    at_limit = body + " " * (64 * 1024 - len(body))
    assert post(manager, new_uuid, "heartbeat", data=at_limit).status_code == 200
    before = snapshot(manager)
    response = post(manager, new_uuid, "heartbeat", data=at_limit + " ")
    assert response.status_code == 413
    assert "64 KiB" in response.json()["error"]
    assert snapshot(manager) == before


def test_huge_body_is_refused_before_it_is_read(manager, new_uuid):
    walk_to(manager, new_uuid, "running")
    with socket.create_connection(("127.0.0.1", manager.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/instances/{new_uuid}/heartbeat HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {manager.token(new_uuid)}\r\n"
                     f"Content-Length: {10 * 1024**3}\r\n\r\n".encode())
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413")
    assert requests.get(f"{manager.url}/healthz", timeout=10).status_code == 200


def test_chunked_body_over_the_limit_is_413(manager, new_uuid):
    walk_to(manager, new_uuid, "running")

    def chunks():
        for _ in range(20):
            yield b" " * 8192
        yield b'{"proofs_done": 1}'

    response = requests.post(f"{manager.url}/v1/instances/{new_uuid}/heartbeat", data=chunks(),
                             headers={"Authorization": f"Bearer {manager.token(new_uuid)}"}, timeout=10)
    assert response.status_code == 413


# --- slow clients -----------------------------------------------------------------------------


def test_slow_clients_hold_no_worker_and_are_cut_off(manager, new_uuid):
    """Ten half-sent requests (more than the 4 workers) do not block others; idle ones are closed (--timeout 2)."""
    walk_to(manager, new_uuid, "running")
    slow = []
    for _ in range(10):
        sock = socket.create_connection(("127.0.0.1", manager.port), timeout=10)
        sock.sendall(f"POST /v1/instances/{new_uuid}/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{{".encode())
        slow.append(sock)
    try:
        started = time.monotonic()
        assert post(manager, new_uuid, "heartbeat", {"proofs_done": 5}).status_code == 200
        assert time.monotonic() - started < 1.5
        # waitress closes a connection silent for --timeout; nothing was applied from it
        for sock in slow:
            sock.settimeout(10)
            assert sock.recv(1024) == b""
    finally:
        for sock in slow:
            sock.close()
    assert manager.rows()[new_uuid]["proofs_done"] == 5


def test_slow_dribbling_client_does_not_block_others(manager, new_uuid):
    walk_to(manager, new_uuid, "running")
    stop = threading.Event()

    def dribble():
        with socket.create_connection(("127.0.0.1", manager.port), timeout=10) as sock:
            request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 40
            for byte in request:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.02)

    thread = threading.Thread(target=dribble)
    thread.start()
    try:
        for n in range(5):
            assert post(manager, new_uuid, "heartbeat", {"proofs_done": n}).status_code == 200
    finally:
        stop.set()
        thread.join()


# --- GET /v1/fleet ----------------------------------------------------------------------------


def test_fleet_with_the_admin_token(manager, new_uuid):
    walk_to(manager, new_uuid, "running")
    response = requests.get(f"{manager.url}/v1/fleet", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert response.status_code == 200
    view = response.json()
    config = config_module.load(str(manager.config_path), env={"VASTCTL_DB": str(manager.db_path)})
    conn = db.connect(manager.db_path, now=SYSTEM.now())
    try:
        assert view == json.loads(json.dumps(fleet.fleet_view(conn, config, now=SYSTEM.now())))
        everything = requests.get(f"{manager.url}/v1/fleet?all=1", timeout=10,
                                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        assert everything == json.loads(json.dumps(fleet.fleet_view(conn, config, include_killed=True, now=SYSTEM.now())))
    finally:
        conn.close()
    assert new_uuid in {i["uuid"] for i in view["instances"]}
    assert set(view["summary"]) >= {"by_state", "capacity_proofs_per_hour", "target_proofs_per_hour", "spend_per_hour"}


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {ADMIN_TOKEN}", f"Bearer {ADMIN_TOKEN}x"])
def test_fleet_without_the_admin_token_is_401(manager, header):
    headers = {} if header is None else {"Authorization": header}
    response = requests.get(f"{manager.url}/v1/fleet", headers=headers, timeout=10)
    assert response.status_code == 401
    assert "admin_token" in response.json()["error"]


def test_a_machine_token_does_not_open_the_fleet(manager, new_uuid):
    walk_to(manager, new_uuid, "registered")
    response = requests.get(f"{manager.url}/v1/fleet", headers={"Authorization": f"Bearer {manager.token(new_uuid)}"},
                            timeout=10)
    assert response.status_code == 401


def test_fleet_is_refused_when_no_admin_token_is_configured(tmp_path):
    closed = Manager(tmp_path / "closed", admin_token="").start()
    try:
        for header in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer anything"}):
            response = requests.get(f"{closed.url}/v1/fleet", headers=header, timeout=10)
            assert response.status_code == 403
            assert "disabled" in response.json()["error"]
    finally:
        assert closed.stop() == 0
    assert "GET /v1/fleet is disabled" in closed.log()


# --- concurrency and logs ---------------------------------------------------------------------


def test_concurrent_heartbeats_all_land(manager):
    machines = [f"conc-{i}" for i in range(12)]
    for machine in machines:
        walk_to(manager, machine, "running")
    failures = []

    def beat(machine):
        with requests.Session() as session:
            for n in range(1, 21):
                response = session.post(f"{manager.url}/v1/instances/{machine}/heartbeat", json={"proofs_done": n},
                                        headers={"Authorization": f"Bearer {manager.token(machine)}"}, timeout=30)
                if response.status_code != 200:
                    failures.append(response.text)

    threads = [threading.Thread(target=beat, args=(m,)) for m in machines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    rows = manager.rows()
    assert all(rows[m]["proofs_done"] == 20 for m in machines)


def test_access_log_never_shows_tokens(manager, new_uuid):
    walk_to(manager, new_uuid, "running")
    requests.get(f"{manager.url}/v1/fleet?token=abc", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    post(manager, new_uuid, "heartbeat", {"proofs_done": 1})
    post(manager, new_uuid, "heartbeat", {"proofs_done": 1}, token="f" * 64)
    last = f'"POST /v1/instances/{new_uuid}/heartbeat" 401'
    deadline = time.monotonic() + 10  # the log is written in batches a few times a second
    while last not in manager.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = manager.log()
    assert f'"POST /v1/instances/{new_uuid}/heartbeat" 200' in log
    assert last in log
    assert '"GET /v1/fleet" 200' in log
    for secret in (manager.token(new_uuid), "f" * 64, ADMIN_TOKEN, manager.secret.decode(), "Authorization", "Bearer",
                   "token=abc"):
        assert secret not in log


def test_server_is_up_after_everything(manager):
    assert requests.get(f"{manager.url}/healthz", timeout=10).json() == {"ok": True}
    assert manager.proc.poll() is None


def test_state_file_gone_is_503_not_a_crash(tmp_path):
    m = Manager(tmp_path / "gone").start()
    try:
        conn = sqlite3.connect(m.db_path)
        conn.execute("DROP TABLE instances")
        conn.commit()
        conn.close()
        response = requests.post(f"{m.url}/v1/instances/u1/register", json={"label": "vastctl-a"},
                                 headers={"Authorization": f"Bearer {m.token('u1')}"}, timeout=10)
        assert response.status_code == 500
        assert response.json() == {"error": "internal error: see the manager's log"}
        assert requests.get(f"{m.url}/healthz", timeout=10).status_code == 200
    finally:
        assert m.stop() == 0
    assert "unexpected error answering POST /v1/instances/u1/register" in m.log()


def test_state_file_that_cannot_be_opened_is_503(tmp_path):
    """A worker that cannot open the file answers 503 (boot scripts retry), never 400 (they would give up)."""
    m = Manager(tmp_path / "unopenable").start()
    try:
        for suffix in ("", "-wal", "-shm"):  # workers open the file at their first request: take it away before
            path = m.db_path.with_name(m.db_path.name + suffix)
            if path.exists():
                path.rename(tmp_path / f"moved{suffix}")
        response = requests.get(f"{m.url}/healthz", timeout=10)
        assert response.status_code == 503
        assert response.json()["error"] == "the manager cannot open its state file: retry later"
        assert response.headers["Retry-After"] == "5"
        scrape = requests.get(f"{m.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        assert (scrape.status_code, scrape.headers.get("Retry-After")) == (503, "5")  # the operator's side says it too
        assert "cannot open its state file" in scrape.json()["error"]
        assert not m.db_path.exists()  # and serve did not make an empty one
    finally:
        assert m.stop() == 0
    assert "cannot open the state file: no state file at" in m.log()


def test_a_report_costs_the_event_loop_the_same_with_300_idle_connections_open(tmp_path, monkeypatch):
    """The loop asks only connections that can have changed: idle ones cost nothing per pass (serve_bench --slow)."""
    from waitress import wasyncore

    from vastctl import transport
    from vastctl.serving import server
    from vastctl.state import tokens

    config = config_module.from_mapping({})
    config.db = str(tmp_path / "loop.db")
    db.connect(config.db_path, create=True, now=SYSTEM.now()).close()
    tokens.ensure_secret(config.secret_path)
    asked = {"n": 0, "full": 0}
    in_full_pass = {"now": False}

    per_channel: dict = {}

    def counting(original):
        def wrapper(*args):
            if not in_full_pass["now"]:
                asked["n"] += 1
                channel = args[-1] if len(args) > 1 else args[0]
                per_channel[id(channel)] = per_channel.get(id(channel), 0) + 1
            return original(*args)
        return wrapper

    def noting_full_passes(original):
        def once(loop, timeout):
            in_full_pass["now"] = loop.sweep_ran  # this pass asks every connection, idle or not
            asked["full"] += in_full_pass["now"]
            try:
                return original(loop, timeout)
            finally:
                in_full_pass["now"] = False
        return once

    monkeypatch.setattr(transport.DeadlineChannel, "readable", counting(transport.DeadlineChannel.readable))
    monkeypatch.setattr(transport.EventLoop, "channel_flags", counting(transport.EventLoop.channel_flags))
    monkeypatch.setattr(transport.EventLoop, "once", noting_full_passes(transport.EventLoop.once))

    def sweeping(original):
        def maintenance(server, now):
            in_full_pass["now"] = True  # the sweep runs inside a pass, which then asks every connection
            asked["full"] += 1
            return original(server, now)
        return maintenance

    monkeypatch.setattr(transport.DeadlineServer, "maintenance", sweeping(transport.DeadlineServer.maintenance))
    srv = server.make_server(config, port=0, clock=SYSTEM)
    loop = threading.Thread(target=srv.run, daemon=True)
    loop.start()
    idle = [socket.create_connection(("127.0.0.1", srv.effective_port)) for _ in range(300)]
    try:
        deadline = time.monotonic() + 10
        while len(srv.active_channels) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(srv.active_channels) == 300
        secret = tokens.read_secret(config.secret_path)
        url = f"http://127.0.0.1:{srv.effective_port}/v1/instances/u-loop"
        auth = {"Authorization": f"Bearer {tokens.machine_token(secret, 'u-loop')}"}
        with requests.Session() as session:
            def report(name, body):
                response = session.post(f"{url}/{name}", json=body, headers=auth, timeout=10)
                assert response.status_code == 200, response.text
            report("register", {"label": "vastctl-u-loop"})
            asked["n"] = asked["full"] = 0
            started = time.monotonic()
            for proofs in range(1, 51):
                report("heartbeat", {"proofs_done": proofs})
            elapsed = time.monotonic() - started
            # the one connection reporting is asked as often as its work needs (more passes on a loaded
            # machine); what must not grow is the asking of the 300 that sit idle
            asks = sorted(per_channel.values())
            per_report = sum(asks[:-1]) / 50
    finally:
        for sock in idle:
            sock.close()
        wasyncore.close_all(srv._map)  # the loop leaves once its map is empty
        loop.join(timeout=10)
        srv.task_dispatcher.shutdown()
    # poll2 asked all 301 connections on every pass, > 600 a report; now the idle ones are asked only in the
    # full passes, which come only after a maintenance sweep (every 2.5 s here) or a quiet second
    assert per_report < 20, (per_report, asked)
    assert asked["full"] <= 2 * elapsed + 3, (asked["full"], elapsed)
