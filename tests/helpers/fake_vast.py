"""A loopback fake of the vast API (offer search, create, the v1 listing, destroy) that checks the key, and the
`vast` fixture serving it on a thread."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

import pytest

from helpers.serving import JsonHandler, on_a_thread

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
