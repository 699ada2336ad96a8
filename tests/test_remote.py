"""RemoteReports: the request that goes out, the answer → typed error mapping, and the retry loop (fake clock)."""

from __future__ import annotations

import json

import pytest
import requests
import responses

from vastctl.cli import said
from vastctl.errors import BadInput, BenchFailed, Refused, Unavailable, UnknownInstance
from vastctl.machine.remote import DEFAULT_RETRY_FOR, MAX_DELAY, RemoteReports
from vastctl.validate import Invalid

SERVER = "https://manager.example.test"
TOKEN = "a" * 64


class FakeClock:
    """The backoff's clock: sleeping moves monotonic time on at once and is recorded."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def retried():
    return []


@pytest.fixture
def remote(clock, retried):
    def make(retry_for=60.0, server=SERVER):
        return RemoteReports(server, TOKEN, clock=clock, retry_for=retry_for,
                             jitter=lambda: 1.0, on_retry=lambda *args: retried.append(args))
    return make


def url(uuid, report):
    return f"{SERVER}/v1/instances/{uuid}/{report}"


@responses.activate
def test_each_report_sends_the_contract_request(remote):
    calls = [
        (lambda r: r.register("u1", label="vastctl-a", vast_id=7, gpu_name="RTX 4090", num_gpus=1), "register",
         {"label": "vastctl-a", "vast_id": 7, "gpu_name": "RTX 4090", "num_gpus": 1}, {"state": "registered"}),
        (lambda r: r.register("u1", label="vastctl-a"), "register", {"label": "vastctl-a"}, {"state": "registered"}),
        (lambda r: r.params_done("u1"), "params-done", {}, {"state": "params_done"}),
        (lambda r: r.bench_report("u1", 68.5), "bench-report", {"rate": 68.5}, {"state": "bench_done", "passed": True}),
        (lambda r: r.running("u1"), "running", {}, {"state": "running"}),
        (lambda r: r.heartbeat("u1", 12), "heartbeat", {"proofs_done": 12}, {"state": "running"}),
        (lambda r: r.heartbeat("u1"), "heartbeat", {}, {"state": "running"}),
    ]
    reports = remote()
    for call, report, body, answer in calls:
        responses.post(url("u1", report), json=answer)
        assert call(reports) == answer
        sent = responses.calls[-1].request
        assert sent.method == "POST"
        assert sent.url == url("u1", report)
        assert sent.headers["Authorization"] == f"Bearer {TOKEN}"
        assert json.loads(sent.body) == body
        assert TOKEN not in sent.url
        assert sent.req_kwargs["timeout"] == (5.0, 30.0)


@responses.activate
def test_uuid_is_escaped_in_the_path(remote):
    responses.post(f"{SERVER}/v1/instances/a%2Fb%20c/running", json={"state": "running"})
    assert remote().running("a/b c") == {"state": "running"}


@responses.activate
def test_server_with_a_path_prefix_and_trailing_slash(remote):
    responses.post(f"{SERVER}/vastctl/v1/instances/u1/running", json={"state": "running"})
    assert remote(server=f"{SERVER}/vastctl/").running("u1") == {"state": "running"}


@responses.activate
def test_below_gate_bench_raises_bench_failed(remote):
    reason = "instance vastctl-a: bench rate 3 below gate 40; it is being killed, do not prove"
    responses.post(url("u1", "bench-report"), json={"state": "killed", "passed": False, "reason": reason})
    with pytest.raises(BenchFailed) as caught:
        remote().bench_report("u1", 3)
    assert (caught.value.exit_code, str(caught.value)) == (5, reason)


@pytest.mark.parametrize("status,error,exit_code,says", [
    (400, BadInput, 2, "rate must be"),
    (401, BadInput, 2, "VASTCTL_TOKEN"),
    (403, BadInput, 2, "another machine"),
    (404, UnknownInstance, 2, "no instance"),
    (409, Refused, 3, "cannot go to running"),
    (413, BadInput, 2, "64 KiB"),
    (418, BadInput, 2, "418"),
])
@responses.activate
def test_client_errors_map_to_exit_codes_without_retry(remote, clock, status, error, exit_code, says):
    messages = {400: "rate must be a finite number", 401: "invalid token", 403: "this token belongs to another machine",
                404: "no instance with uuid 'u1'", 409: "instance a is registered; it cannot go to running",
                413: "body over the 64 KiB limit", 418: "teapot"}
    responses.post(url("u1", "running"), status=status, json={"error": messages[status]})
    with pytest.raises(error) as caught:
        remote().running("u1")
    assert caught.value.exit_code == exit_code
    assert says in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert len(responses.calls) == 1 and clock.sleeps == []


@responses.activate
def test_unreachable_then_up(remote, clock, retried):
    responses.post(url("u1", "heartbeat"), body=requests.ConnectionError("Connection refused"))
    responses.post(url("u1", "heartbeat"), body=requests.ConnectionError("Connection refused"))
    responses.post(url("u1", "heartbeat"), json={"state": "running"})
    assert remote().heartbeat("u1", 3) == {"state": "running"}
    assert len(responses.calls) == 3
    assert clock.sleeps == [0.5, 1.0]
    assert "Connection refused" in retried[0][0]


@responses.activate
@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_5xx_and_429_are_retried(remote, clock, status):
    responses.post(url("u1", "params-done"), status=status, json={"error": "state file busy"})
    responses.post(url("u1", "params-done"), json={"state": "params_done"})
    assert remote().params_done("u1") == {"state": "params_done"}
    assert len(clock.sleeps) == 1


@responses.activate
def test_read_timeout_is_retried(remote, clock):
    responses.post(url("u1", "running"), body=requests.ReadTimeout("read timed out"))
    responses.post(url("u1", "running"), json={"state": "running"})
    assert remote().running("u1") == {"state": "running"}


@responses.activate
def test_gives_up_after_retry_for_with_exit_1(remote, clock, retried):
    responses.post(url("u1", "heartbeat"), status=503, json={"error": "the state file stayed busy"})
    with pytest.raises(Unavailable) as caught:
        remote(retry_for=120).heartbeat("u1", 1)
    assert caught.value.exit_code == 1
    assert "did not take the report for 2m" in str(caught.value) and "HTTP 503" in str(caught.value)
    assert clock.now == pytest.approx(1000 + 120)
    assert max(clock.sleeps) == MAX_DELAY  # capped exponential backoff
    assert clock.sleeps[:4] == [0.5, 1.0, 2.0, 4.0]
    assert len(responses.calls) == len(clock.sleeps) + 1


@responses.activate
def test_retry_for_zero_tries_once(remote, clock):
    responses.post(url("u1", "running"), body=requests.ConnectionError("Connection refused"))
    with pytest.raises(Unavailable):
        remote(retry_for=0).running("u1")
    assert len(responses.calls) == 1 and clock.sleeps == []


def test_jitter_spreads_the_waits(clock):
    reports = RemoteReports(SERVER, TOKEN, clock=clock, retry_for=10,
                            jitter=lambda: 0.0)
    with responses.RequestsMock() as mock:
        mock.post(url("u1", "running"), body=requests.ConnectionError("down"))
        mock.post(url("u1", "running"), json={"state": "running"})
        reports.running("u1")
    assert clock.sleeps == [0.25]


@responses.activate
@pytest.mark.parametrize("args,flag", [
    (("bench-report", "--uuid", "u1", "--rate", "fast"), "--rate"),
    (("bench-report", "--uuid", "u1", "--rate", "nan"), "--rate"),
    (("bench-report", "--uuid", "u1", "--rate", "-1"), "--rate"),
    (("bench-report", "--uuid", "u1", "--rate", "1e999"), "--rate"),
    (("bench-report", "--uuid", "u1", "--failed", "--reason", "two\nlines"), "--reason"),
    (("heartbeat", "--uuid", "u1", "--proofs-done", "-3"), "--proofs-done"),
    (("heartbeat", "--uuid", "u1", "--proofs-done", str(2**63)), "--proofs-done"),
    (("running", "--uuid", ""), "--uuid"),
    (("running", "--uuid", "bad\nuuid"), "--uuid"),
    (("params-done", "--uuid", "u1\u202e"), "--uuid"),
    (("register", "--uuid", "u1", "--label", "x" * 300), "--label"),
    (("register", "--uuid", "u1", "--num-gpus", "0"), "--num-gpus"),
    (("running", "--uuid", "u1", "--stages", "fetch=-1"), "stages.fetch must be"),
    (("register", "--uuid", "u1", "--label", "vastctl-a", "--gpu", "RTX\n4090"), "--gpu must be"),
    (("log-push", "--uuid", "u1", "--name", "../etc/passwd", "--file", "/nonexistent"), "--name must be"),
    (("log-push", "--uuid", "u1\x1b", "--name", "bench", "--file", "/nonexistent"), "--uuid must be"),
])
def test_bad_input_is_exit_2_at_the_command_line_without_a_request(cli, monkeypatch, args, flag):
    """A command line is where a remote report's values enter (state/lifecycle.py says where each is checked):
    checked there, once, so RemoteReports takes them as checked and a bad one never reaches the manager."""
    monkeypatch.setenv("VASTCTL_SERVER", SERVER)
    monkeypatch.setenv("VASTCTL_TOKEN", TOKEN)
    result = cli(*args)
    assert result.code == 2 and result.err.startswith(f"error: {flag}") and result.err.count("\n") == 1, result.err
    assert len(responses.calls) == 0


@responses.activate
def test_redirect_is_not_followed(remote):
    responses.post(url("u1", "running"), status=301, headers={"Location": "https://elsewhere.test/v1"})
    with pytest.raises(BadInput) as caught:
        remote().running("u1")
    assert "redirects to https://elsewhere.test/v1" in str(caught.value)
    assert len(responses.calls) == 1


@responses.activate
def test_an_answer_that_is_not_vastctl(remote):
    responses.post(url("u1", "running"), body="<html>hello</html>", status=200)
    with pytest.raises(BadInput) as caught:
        remote().running("u1")
    assert "is VASTCTL_SERVER the manager" in str(caught.value)


def test_from_env_reads_and_checks_each_variable():
    reports = RemoteReports.from_env({"VASTCTL_SERVER": SERVER, "VASTCTL_TOKEN": TOKEN}, clock=FakeClock())
    assert (reports.server, reports.retry_for) == (SERVER, DEFAULT_RETRY_FOR) and DEFAULT_RETRY_FOR == 300
    assert RemoteReports.from_env({"VASTCTL_SERVER": SERVER, "VASTCTL_TOKEN": TOKEN,
                                   "VASTCTL_RETRY_FOR": "90s"}, clock=FakeClock()).retry_for == 90
    cases = [
        ({"VASTCTL_SERVER": SERVER}, "VASTCTL_TOKEN is not set"),
        ({"VASTCTL_SERVER": SERVER, "VASTCTL_TOKEN": "two words"}, "VASTCTL_TOKEN must be"),
        ({"VASTCTL_SERVER": "manager:8080", "VASTCTL_TOKEN": TOKEN}, "VASTCTL_SERVER must be"),
        ({"VASTCTL_SERVER": "ftp://x", "VASTCTL_TOKEN": TOKEN}, "VASTCTL_SERVER must be"),
        ({"VASTCTL_SERVER": SERVER, "VASTCTL_TOKEN": TOKEN, "VASTCTL_RETRY_FOR": "soon"}, "VASTCTL_RETRY_FOR"),
        ({"VASTCTL_SERVER": SERVER, "VASTCTL_TOKEN": TOKEN, "VASTCTL_RETRY_FOR": "-5"}, "VASTCTL_RETRY_FOR"),
    ]
    for env, says in cases:
        with pytest.raises(BadInput) as caught:
            RemoteReports.from_env(env, clock=FakeClock())
        assert says in str(caught.value)
        assert "two words" not in str(caught.value)


@pytest.mark.parametrize("status,body,error,says", [
    # a refused value comes with its parts (field, reason, lead): worded with the flag, as a local report is
    (400, {"error": 'instance u1 is new here: register it with the "label" field', "field": "label", "reason": "",
           "lead": "instance u1 is new here: register it with "}, Invalid,
     "instance u1 is new here: register it with --label"),
    (400, {"error": 'the "gpu_name" field must be Unicode text', "field": "gpu_name", "reason": "must be Unicode text",
           "lead": ""}, Invalid, "--gpu must be Unicode text"),
    # without them (a manager from before the parts, or a field no flag gives) the manager's words, as they came
    (400, {"error": 'the "gpu_name" field must be Unicode text'}, BadInput, 'the "gpu_name" field must be Unicode text'),
    (400, {"error": 'the "stages.fetch" field must be at most 86400 seconds', "field": "stages.fetch",
           "reason": "must be at most 86400 seconds", "lead": ""}, BadInput,
     'the "stages.fetch" field must be at most 86400 seconds'),
    (404, {"error": "no instance with uuid 'u1': check the uuid in the path (see `vastctl fleet --all`)",
           "field": "uuid", "reason": "(see `vastctl fleet --all`)", "lead": "no instance with uuid 'u1': check "},
     UnknownInstance, "no instance with uuid 'u1': check --uuid (see `vastctl fleet --all`)"),
    (404, {"error": "no instance with uuid 'u1'"}, UnknownInstance, "no instance with uuid 'u1'"),
    (409, {"error": "instance a is registered; it cannot go to running"}, Refused,
     "instance a is registered; it cannot go to running"),
])
@responses.activate
def test_the_managers_answers_are_shown_in_flags_without_a_prefix(remote, status, body, error, says):
    """The lifecycle's own words, as a local report prints them: the same line whichever way the report went.
    The flag is found from the answer's `field`, never by reading the manager's message."""
    responses.post(url("u1", "register"), status=status, json=body)
    with pytest.raises(error) as caught:
        remote().register("u1", vast_id=5)
    assert said(caught.value) == says


@responses.activate
def test_a_below_gate_reason_is_shown_as_the_manager_gave_it(remote):
    responses.post(url("u1", "bench-report"), json={"state": "killed", "passed": False,
                                                    "reason": "bench rate 3 below gate 10"})
    with pytest.raises(BenchFailed) as caught:
        remote().bench_report("u1", 3)
    assert str(caught.value) == "bench rate 3 below gate 10"


@pytest.mark.parametrize("server", ["https://user:hunter2@manager.example.test", "https://hunter2@manager.example.test/",
                                    "user:hunter2@manager.example.test", "https://u:hun/ter2@m.example.test",
                                    "https://u:p@ss-hunter2@m.example.test"])
def test_credentials_in_the_server_url_are_refused_unprinted(server):
    with pytest.raises(BadInput) as caught:
        RemoteReports(server, TOKEN, clock=FakeClock())
    assert str(caught.value).startswith("VASTCTL_SERVER must not hold a user or password")
    assert "hunter2" not in str(caught.value) and "ter2" not in str(caught.value)


@responses.activate
def test_a_redirect_to_a_url_with_credentials_is_shown_without_them(remote):
    responses.post(url("u1", "running"), status=302, headers={"Location": "https://admin:hunter2@elsewhere.test/v1"})
    with pytest.raises(BadInput) as caught:
        remote().running("u1")
    assert "redirects to https://…@elsewhere.test/v1" in str(caught.value)
    assert "hunter2" not in str(caught.value)
