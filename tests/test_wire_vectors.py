"""Known-answer vectors for the formats vastctl produces or checks on the wire, written out byte for byte.

Each expected value here was made outside vastctl (the webhook signatures by `openssl dgst -sha256 -hmac`,
the others by hand from the format its docs state), so a change to a format fails here even when the code
that writes it and the code that reads it change together:

  webhook signature   docs/http-api.md, "vast's webhook deliveries": sha256= HMAC-SHA256 of "<ts>.<body>"
  authorized_keys     docs/tunnels.md: restrict,port-forwarding,permitlisten="127.0.0.1:PORT" KEY LABEL
  nginx upstream      docs/joining-curio.md: `upstream vastctl_cuzk { server 127.0.0.1:PORT ...; }`
  demand JSON         docs/curio-demand.md: {"queued": N, "in_flight": N, "lookahead": N, "proofs_per_hour": X}
  report bodies       docs/http-api.md, "Requests": the JSON each boot-script report POSTs
"""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pytest
import requests
from requests.adapters import BaseAdapter

from vastctl.clock import VirtualClock
from vastctl.facts import provers, tunnel
from vastctl.facts.demand import Sample, parse_output
from vastctl.machine.remote import RemoteReports
from vastctl.serving import webhooks
from vastctl.serving.server import App
from vastctl.state import lifecycle, rates, tokens

# --- the webhook signature ---------------------------------------------------------------------------------

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)  # 1782907200
SECRET = "whsec_test_0123456789abcdef0123"
BODY = (b'{"event_id":"evt-kat","notif_type":"offline","subject":"Instance offline",'
        b'"message":"Your instance 5001 went offline"}')
# printf '%s' '1782907200.<BODY>' | openssl dgst -sha256 -hmac whsec_test_0123456789abcdef0123
SIGNED = "sha256=02a50e72ecb9ea4f8e915308b2edf4967baf0c1f5ef95f45d3833cde085d3032"
# the same over the body alone (no timestamp): what a signature that dropped the timestamp would be
BODY_ONLY = "sha256=32b345f252a7c3da7b271605dbca69864cd4b0a76d3be7723c6c1e8fc7bb350e"


def test_the_webhook_signature_is_the_hmac_of_timestamp_dot_body():
    assert webhooks.signature(SECRET.encode(), b"1782907200", BODY) == SIGNED


@pytest.fixture
def app(conn, config):
    tokens.ensure_secret(config.secret_path)
    webhooks.add_secret(config.webhook_secret_path, SECRET, now=NOW)
    return App(config, tokens.Keyring(config.secret_path), clock=VirtualClock(NOW))


def deliver(app, signature: str) -> int:
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": webhooks.PATH, "REMOTE_ADDR": "127.0.0.1",
               "CONTENT_LENGTH": str(len(BODY)), "wsgi.input": io.BytesIO(BODY), "HTTP_X_VAST_EVENT_ID": "evt-kat",
               "HTTP_X_VAST_DELIVERY_ATTEMPT": "1", "HTTP_X_VAST_TIMESTAMP": "1782907200",
               "HTTP_X_VAST_SIGNATURE_256": signature}
    status = {}
    b"".join(app(environ, lambda line, headers: status.setdefault("code", int(line.split()[0]))))
    return status["code"]


def test_a_delivery_signed_as_docs_say_is_taken_and_one_signed_without_the_timestamp_is_refused(app):
    assert deliver(app, BODY_ONLY) == 401
    assert deliver(app, SIGNED.upper().replace("SHA256=", "sha256=")) == 200  # hex in either case


# --- authorized_keys and the nginx upstream ----------------------------------------------------------------

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKat0000000000000000000000000000000000000000 machine@boot"


def test_an_authorized_keys_line_is_its_port_alone_the_key_and_a_safe_label():
    assert tunnel.authorized_line(20017, KEY, "vastctl-a b;c") == (
        'restrict,port-forwarding,permitlisten="127.0.0.1:20017" ssh-ed25519 '
        "AAAAC3NzaC1lZDI1NTE5AAAAIKat0000000000000000000000000000000000000000 vastctl-a_b_c")


def test_the_upstream_file_is_one_server_line_per_joined_machine():
    joined = [{"label": "vastctl-a", "endpoint": "127.0.0.1:20017"}, {"label": "vastctl-b", "endpoint": "127.0.0.1:20018"}]
    assert provers.upstream_text(joined) == (
        "# written by `vastctl provers`: the joined machines (their tunnels' ends); edits are overwritten\n"
        "upstream vastctl_cuzk {\n"
        "    server 127.0.0.1:20017 max_fails=1 fail_timeout=10s;  # vastctl-a\n"
        "    server 127.0.0.1:20018 max_fails=1 fail_timeout=10s;  # vastctl-b\n"
        "}\n")
    assert provers.upstream_text([]) == (
        "# written by `vastctl provers`: the joined machines (their tunnels' ends); edits are overwritten\n"
        "upstream vastctl_cuzk {\n"
        "    server 127.0.0.1:9 down;  # no machine joined\n"
        "}\n")


# --- the demand command's JSON -----------------------------------------------------------------------------


def test_the_demand_commands_line_as_docs_show_it():
    assert parse_output('{"queued": 6, "in_flight": 4, "lookahead": 3, "proofs_per_hour": 4}\n') == Sample(
        queued=6, in_flight=4, lookahead=3, proofs_per_hour=4.0)
    assert parse_output('{"queued": 0}') == Sample(queued=0, in_flight=None, lookahead=None, proofs_per_hour=None)


# --- the boot script's report bodies -----------------------------------------------------------------------


class Capture(BaseAdapter):
    """A requests transport that keeps each request as sent and answers 200 with `answer`."""

    def __init__(self, answer: dict):
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []
        self.answer = answer

    def send(self, request, **kwargs):
        self.sent.append(request)
        response = requests.Response()
        response.status_code = 200
        response.headers["Content-Type"] = "application/json"
        response._content = json.dumps(self.answer).encode()
        response.url = request.url
        response.request = request
        return response

    def close(self):
        pass


def reports(answer: dict) -> tuple[RemoteReports, Capture]:
    capture = Capture(answer)
    session = requests.Session()
    session.mount("http://", capture)
    return RemoteReports("http://manager.test:8080", "tok-kat", clock=VirtualClock(NOW), session=session), capture


@pytest.mark.parametrize(("report", "args", "kwargs", "answer", "path", "body"), [
    ("register", ("u-1",), {"label": "vastctl-a", "vast_id": 5001, "gpu_name": "RTX 4090", "num_gpus": 1},
     {"state": "registered"}, "register", b'{"label": "vastctl-a", "vast_id": 5001, "gpu_name": "RTX 4090", "num_gpus": 1}'),
    ("params_done", ("u-1",), {}, {"state": "params_done"}, "params-done", b"{}"),
    # values as the command line hands them on, checked where they enter (rates.validate_rate, validate_stages)
    ("bench_report", ("u-1", rates.validate_rate("42.5")), {}, {"state": "bench_done", "passed": True},
     "bench-report", b'{"rate": 42.5}'),
    ("running", ("u-1",), {"stages": lifecycle.validate_stages({"fetch": 412, "daemon": 35})}, {"state": "running"},
     "running",
     b'{"stages": {"fetch": 412.0, "daemon": 35.0}}'),  # seconds to 0.1, written as numbers with a point
    ("heartbeat", ("u-1", 17), {}, {"state": "running"}, "heartbeat", b'{"proofs_done": 17}'),
    ("heartbeat", ("u-1",), {}, {"state": "running"}, "heartbeat", b"{}"),
    ("log_push", ("u-1", "cuzk", "line one\n"), {}, {"state": "running", "name": "cuzk", "chars": 9, "cut": False},
     "log", b'{"name": "cuzk", "text": "line one\\n"}'),
])
def test_each_report_posts_the_body_docs_state(report, args, kwargs, answer, path, body):
    remote, capture = reports(answer)
    assert getattr(remote, report)(*args, **kwargs) == answer
    (sent,) = capture.sent
    assert (sent.method, sent.url) == ("POST", f"http://manager.test:8080/v1/instances/u-1/{path}")
    assert sent.headers["Authorization"] == "Bearer tok-kat" and sent.headers["Content-Type"] == "application/json"
    assert sent.body == body


def test_a_failed_bench_posts_failed_and_its_reason():
    remote, capture = reports({"state": "killed", "passed": False, "reason": "bench failed: no GPU"})
    with pytest.raises(Exception, match="no GPU"):
        remote.bench_failed("u-1", "no GPU")
    assert capture.sent[0].body == b'{"failed": true, "reason": "no GPU"}'
