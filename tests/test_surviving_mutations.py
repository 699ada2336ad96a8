"""Three paths one-line mutations of the code survived: a machine killed while its create was in flight is
destroyed once rented; an instance vast still lists after its destroy was confirmed is destroyed again only
while vast has not unloaded it; a failed destroy is a disagreement the fleet names with its error."""

from __future__ import annotations

from datetime import timedelta

from test_operations import NOW, FakeMarket, cfg, offer  # noqa: F401 (cfg is a fixture)
from test_reconcile import NOW as PASS_AT
from test_reconcile import SETTINGS, ago, destroys, row, seen
from test_reconcile import cfg as reconcile_cfg

from vastctl import operations
from vastctl.observe import disagreement
from vastctl.reconcile import plan
from vastctl.state import lifecycle
from vastctl.state.lifecycle import State


def test_a_machine_killed_while_its_create_was_in_flight_is_destroyed_once_vast_answers(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100)])
    real_create = market.create_instance

    def create_while_killed(request):  # the operator (or reconcile) kills the launching row meanwhile
        (uuid,) = [r["uuid"] for r in conn.execute("SELECT uuid FROM instances WHERE state = 'launching'")]
        lifecycle.kill(conn, uuid, "operator: changed my mind", source="operator", code="operator",
                       now=NOW + timedelta(seconds=1))
        return real_create(request)

    market.create_instance = create_while_killed
    operations.launch(conn, market, cfg, offer_id=10, now=NOW)
    vast_id = market.next_id
    assert ("destroy", vast_id) in market.calls  # rented after the kill: its billing ends now, not never
    (machine,) = [dict(r) for r in conn.execute("SELECT * FROM instances")]
    assert machine["state"] == State.KILLED and machine["vast_id"] == vast_id and machine["destroyed_at"]


def test_a_destroyed_instance_still_listed_is_destroyed_again_unless_vast_unloaded_it():
    gone = row("vastctl-7", state="killed", destroyed_at=ago(minutes=10), kill_code="exited")
    history = {gone["vast_id"]: gone}
    loaded = seen(gone, "exited", cur_state="stopped")
    assert destroys(plan([], [loaded], SETTINGS, reconcile_cfg(), PASS_AT, history=history)) == [
        ("vastctl-7", gone["vast_id"])]
    unloaded = seen(gone, "exited", cur_state="unloaded")  # vast is taking it down: nothing to ask again
    assert destroys(plan([], [unloaded], SETTINGS, reconcile_cfg(), PASS_AT, history=history)) == []
    recent = row("vastctl-8", state="killed", destroyed_at=ago(minutes=1), kill_code="exited")
    assert destroys(plan([], [seen(recent, "exited", cur_state="stopped")], SETTINGS, reconcile_cfg(), PASS_AT,
                         history={recent["vast_id"]: recent})) == []  # within the grace: vast is still catching up


def test_a_failed_destroy_is_a_disagreement_naming_the_attempts_and_the_error():
    killed = {"state": "killed", "vast_status": "running", "vast_missing": 0, "destroyed_at": None,
              "destroy_attempts": 3, "destroy_error": "vast PUT: HTTP 503 retry later"}
    assert disagreement(killed) == "killed but not destroyed at vast (3 failed: vast PUT: HTTP 503 retry later)"
    assert disagreement({**killed, "destroy_attempts": 0}) == "killed, destroy pending"
    assert disagreement({**killed, "destroyed_at": "2026-11-30T05:00:00Z"}) is None
