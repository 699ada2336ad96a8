"""The whole path with real processes on loopback: launch at a fake vast API, the machine reports to a real
`vastctl serve` in remote mode, reconcile watches vast, kills the machine when vast says it exited, destroys it."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest
from serving import JsonHandler, Manager, free_port, on_a_thread, run_vastctl

pytestmark = pytest.mark.slow  # real processes and servers on loopback

KEY = "e2e-vast-key-0123"


class FakeVast(ThreadingHTTPServer):
    """Just enough of the vast API: offer search, create, the v1 listing, destroy. Checks the key."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeVastHandler)
        self.instances: dict[int, dict] = {}
        self.creates: list[dict] = []
        self.next_id = 5001
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeVastHandler(JsonHandler):
    server: FakeVast

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {KEY}" or KEY in self.path:
            self.send_json(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
            return False
        return True

    def do_POST(self):
        if not self._authorised():
            return
        if self.path == "/api/v0/bundles/":
            self.read_json()
            self.send_json(200, {"offers": [{"id": 77, "machine_id": 9001, "gpu_name": "RTX 4090", "num_gpus": 1,
                                         "dph_total": 0.45, "cpu_ram": 515000, "inet_down": 900.0,
                                         "reliability": 0.99}]})
        else:
            self.send_json(404, {"success": False, "error": "not_found"})

    def do_PUT(self):
        if not self._authorised():
            return
        body = self.read_json()
        if self.path == "/api/v0/asks/77/":
            with self.server.lock:
                vast_id = self.server.next_id
                self.server.next_id += 1
                self.server.creates.append(body)
                self.server.instances[vast_id] = {
                    "id": vast_id, "label": body["label"], "actual_status": "running", "intended_status": "running",
                    "cur_state": "running", "status_msg": "success, running", "machine_id": 9001,
                    "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.45,
                }
            self.send_json(200, {"success": True, "new_contract": vast_id})
        else:
            self.send_json(404, {"success": False, "error": "no_such_ask"})

    def do_GET(self):
        if not self._authorised():
            return
        if self.path.startswith("/api/v1/instances/"):
            with self.server.lock:
                rows = list(self.server.instances.values())
            self.send_json(200, {"success": True, "instances": rows, "next_token": None, "total_instances": len(rows)})
        else:
            self.send_json(404, {"success": False, "error": "not_found"})

    def do_DELETE(self):
        if not self._authorised():
            return
        vast_id = int(self.path.strip("/").split("/")[-1])
        with self.server.lock:
            gone = self.server.instances.pop(vast_id, None)
        self.send_json(200 if gone else 404, {"success": bool(gone)} if gone else {"success": False,
                                                                               "error": "no_such_instance"})


@pytest.fixture
def vast():
    with on_a_thread(FakeVast()) as server:
        yield server


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "manager")
    port = free_port()
    m.config_path.write_text(
        f"server:\n  url: http://127.0.0.1:{port}\n  admin_token: admin-token-for-tests-0123456789\n"
        "fleet:\n  min_bench_rate: 40\n  max_dph: 1.0\n"
        "launch:\n  vastctl_source: vastctl==0.1.0\n  install: /opt/provers/install.sh\n"
        "reconcile:\n  confirm_after: 0s\n"  # cron's two listings are a minute apart; here they are back to back
    )
    m.start(port)
    yield m
    m.stop()


def test_launch_report_reconcile_kill_destroy(manager, vast, tmp_path):
    operator = {**manager.env, "VAST_API_KEY": KEY, "VAST_API_URL": vast.url}

    launched = run_vastctl("launch", "--gpu", "RTX 4090", "--json", env=operator)
    assert launched.returncode == 0, launched.stderr
    (machine,) = json.loads(launched.stdout)["launched"]
    (create,) = vast.creates
    env = create["env"]
    assert env["VASTCTL_UUID"] == machine["uuid"] and env["VASTCTL_LABEL"] == machine["label"]
    assert env["VASTCTL_SERVER"] == manager.url and env["VASTCTL_TOKEN"] == manager.token(machine["uuid"])
    assert (env["VASTCTL_PIP"], env["VASTCTL_INSTALL"]) == ("vastctl==0.1.0", "/opt/provers/install.sh")
    assert machine["label"].startswith("vastctl-") and machine["vast_id"] == 5001

    # the rented machine: remote mode only, no state file of its own
    home = tmp_path / "machine"
    home.mkdir()
    on_machine = {"HOME": str(home), **env, "VASTCTL_DB": str(home / "must-not-exist.db")}
    for args in (["register", "--vast-id", "5001", "--gpu", "RTX 4090"], ["params-done"],
                 ["bench-report", "--rate", "70"], ["running"], ["heartbeat", "--proofs-done", "3"]):
        done = run_vastctl(*args, env=on_machine)
        assert done.returncode == 0, (args, done.stderr)
    assert not (home / "must-not-exist.db").exists()
    row = manager.rows()[machine["uuid"]]
    assert (row["state"], row["bench_rate"], row["proofs_done"]) == ("running", 70.0, 3)

    quiet = run_vastctl("reconcile", "--json", env=operator)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["actions"] == []
    view = json.loads(run_vastctl("fleet", "--json", env=operator).stdout)
    (shown,) = view["instances"]
    assert (shown["state"], shown["vast_status"], shown["disagreement"]) == ("running", "running", None)

    vast.instances[5001]["actual_status"] = "exited"
    first = json.loads(run_vastctl("reconcile", "--json", env=operator).stdout)
    assert first["actions"] == []  # one listing saying exited is not yet proof
    second = run_vastctl("reconcile", "--json", env=operator)
    assert second.returncode == 0, second.stderr
    kinds = [(a["kind"], a["result"]) for a in json.loads(second.stdout)["actions"]]
    assert kinds[0][0] == "kill" and kinds[0][1].startswith("killed") and kinds[1] == ("destroy", "destroyed")
    assert vast.instances == {}

    row = manager.rows()[machine["uuid"]]
    assert (row["state"], row["kill_code"]) == ("killed", "exited") and row["destroyed_at"]
    kills = [e for e in manager.events(machine["uuid"]) if e["to_state"] == "killed"]
    assert len(kills) == 1 and kills[0]["source"] == "reconcile" and kills[0]["label"] == machine["label"]

    told = run_vastctl("heartbeat", "--proofs-done", "4", env=on_machine)
    assert told.returncode == 3 and told.stderr.startswith("error: ")
