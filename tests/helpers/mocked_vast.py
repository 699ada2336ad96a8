"""vast mocked on the wire (`responses`) behind the real client, for reconcile passes run at the command line: the
`vast_api` fixture on one virtual clock, the listing's instances, and a fleet of running rows to match them."""

from __future__ import annotations

from datetime import timedelta

import pytest
import responses

from helpers.provider_vast import RecordingClock
from vastctl import clock
from vastctl.cli.app import Globals
from vastctl.state import lifecycle

API = "http://vast.test"
LIST = f"{API}/api/v1/instances/"
KEY = "test-key-123"


@pytest.fixture
def vast_api(monkeypatch):
    """vast mocked on the wire; every pass runs on one virtual clock (`vast_api.clock`), so backoff never really
    sleeps."""
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("VAST_API_URL", API)
    virtual = RecordingClock(clock.SYSTEM.now())  # the rows below are written at wall-clock times
    monkeypatch.setattr(Globals, "clock", virtual)  # the command's one clock
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        mock.clock, mock.sleeps = virtual, virtual.sleeps
        yield mock


def instance(vast_id, label, status="running", **extra):
    return {"id": vast_id, "label": label, "actual_status": status, "intended_status": "running",
            "cur_state": "running", "status_msg": "success", "machine_id": 1000 + vast_id, "gpu_name": "RTX 4090",
            "num_gpus": 1, "dph_total": 0.4, **extra}


def fleet(store, n=4, stale=()):
    """n running rows vastctl-0…; those in `stale` have not sent a heartbeat for 30 minutes."""
    now = clock.SYSTEM.now()
    items = []
    for i in range(n):
        label = f"vastctl-{i}"
        lifecycle.create(store, uuid=f"u{i}", label=label, state=lifecycle.State.LAUNCHING, reason="launched",
                         source="operator", now=now - timedelta(hours=1), fields={"vast_id": 100 + i})
        beat = now - timedelta(minutes=30 if i in stale else 1)
        store.execute("UPDATE instances SET state = 'running', last_heartbeat_at = ? WHERE uuid = ?",
                      (clock.to_iso(beat), f"u{i}"))
        items.append(instance(100 + i, label))
    return items


def states(store):
    return {r["label"]: (r["state"], r["destroyed_at"] is not None)
            for r in store.execute("SELECT label, state, destroyed_at FROM instances")}
