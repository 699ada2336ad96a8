"""launch / stop / start / kill against a market in memory: a Provider that records its calls and what the state file
held at each create, offers, a config with the fleet's limits (the `cfg` fixture), and the rows the calls leave."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from vastctl import config as config_module
from vastctl.facts import demand
from vastctl.providers.base import Offer
from vastctl.state import lifecycle, tokens
from vastctl.state.lifecycle import State

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)


def offer(oid, machine, dph=0.4, gpu="RTX 4090"):
    return Offer(id=oid, machine_id=machine, gpu_name=gpu, num_gpus=1, dph_total=dph, cpu_ram_gb=512,
                 inet_down_mbps=900, reliability=0.99)


class FakeMarket:
    """A Provider that records calls, and what the state file held at each create."""

    def __init__(self, conn, offers=()):
        self.conn = conn
        self.offers = list(offers)
        self.calls = []
        self.rows_at_create = []
        self.create_errors = {}  # offer id → exception
        self.instances = []
        self.fail = {}  # method name → exception
        self.next_id = 1000

    def search_offers(self, query):
        self.calls.append(("search", query))
        if query.offer_id is not None:
            return [o for o in self.offers if o.id == query.offer_id]
        return [o for o in self.offers if query.max_dph is None or o.dph_total <= query.max_dph][: query.limit]

    def create_instance(self, request):
        self.calls.append(("create", request))
        self.rows_at_create.append([dict(r) for r in self.conn.execute("SELECT * FROM instances")])
        if request.offer_id in self.create_errors:
            raise self.create_errors[request.offer_id]
        self.next_id += 1
        return self.next_id

    def _maybe_fail(self, name):
        if name in self.fail:
            raise self.fail[name]

    def list_instances(self):
        self.calls.append(("list",))
        self._maybe_fail("list")
        return self.instances

    def show_instance(self, vast_id):
        return None

    def destroy_instance(self, vast_id):
        self.calls.append(("destroy", vast_id))
        self._maybe_fail("destroy")

    def stop_instance(self, vast_id):
        self.calls.append(("stop", vast_id))
        self._maybe_fail("stop")

    def start_instance(self, vast_id):
        self.calls.append(("start", vast_id))
        self._maybe_fail("start")

    def creates(self):
        return [c[1] for c in self.calls if c[0] == "create"]


@pytest.fixture
def cfg(db_path):
    config = config_module.from_mapping({
        "db": str(db_path), "server": {"url": "https://manager.example:8443"},
        "launch": {"image": "ghcr.io/x/cuzk:1", "disk_gb": 150, "env": {"CURIO_DB_HOST": "yb.internal"}},
        "fleet": {"max_instances": 4, "max_dph": 1.0, "max_hourly_spend": 3.0},
    })
    tokens.ensure_secret(config.secret_path)
    return config


def rows(conn):
    return [dict(r) for r in conn.execute("SELECT * FROM instances ORDER BY created_at, label")]


def actions(conn):
    return [dict(r) for r in conn.execute("SELECT * FROM actions ORDER BY id")]


def live_row(conn, state=State.RUNNING, vast_id=77, dph=0.5):
    demand.report(conn, 0, None, now=NOW)  # an empty queue: the guard lets the last machine go
    lifecycle.create(conn, uuid="u1", label="vastctl-a", state=State.LAUNCHING, reason="t", source="operator",
                     fields={"vast_id": vast_id, "machine_id": 7, "dph": dph}, now=NOW)
    path = [State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING]
    for step in path[: path.index(state) + 1] if state in path else []:
        lifecycle.transition(conn, "u1", step, "t", "instance", now=NOW)
    return lifecycle.get(conn, "u1")
