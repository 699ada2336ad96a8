"""observe(): one snapshot of the file — capacity, pending capacity at the model's rate, spend, demand, events, last actions."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import config as config_module
from vastctl.facts import demand
from vastctl.observe import disagreement, observe
from vastctl.state import lifecycle, settings
from vastctl.state.lifecycle import KillCode, State
from vastctl.views import fleet

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CFG = config_module.from_mapping({"fleet": {"default_rate": 55, "target_proofs_per_hour": 200}})


def put(conn, label, state, gpu="RTX 4090", dph=0.5, **fields):
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=State.LAUNCHING, reason="t", source="operator",
                     now=NOW - timedelta(hours=1), fields={"gpu_name": gpu, "dph": dph, "vast_id": len(label), **fields})
    path = [State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING]
    if state in path:
        for step in path[: path.index(state) + 1]:
            lifecycle.transition(conn, uuid, step, "t", "instance", now=NOW - timedelta(minutes=30))
    elif state == State.KILLED:
        lifecycle.kill(conn, uuid, "t", source="operator", code=KillCode.OPERATOR, now=NOW - timedelta(minutes=30))
    elif state != State.LAUNCHING:
        lifecycle.transition(conn, uuid, state, "t", "operator", now=NOW - timedelta(minutes=30))
    return uuid


def set_rate(conn, uuid, bench=None, measured=None):
    conn.execute("UPDATE instances SET bench_rate = ?, proofs_per_hour = ? WHERE uuid = ?", (bench, measured, uuid))


def test_capacity_pending_at_the_model_rate_and_spend(conn):
    a = put(conn, "vastctl-a", State.RUNNING)
    set_rate(conn, a, bench=70, measured=64)          # measured wins
    b = put(conn, "vastctl-b", State.RUNNING)
    set_rate(conn, b, bench=80)                       # bench when nothing measured
    c = put(conn, "vastctl-c", State.KILLED)
    set_rate(conn, c, bench=30)                       # a failed bench is still a rate seen for the model
    put(conn, "vastctl-d", State.LAUNCHING)           # 4090: median of 70, 80, 30 = 70
    put(conn, "vastctl-e", State.PARAMS_DONE, gpu="RTX 5090", dph=0.9)  # never benched: default_rate
    put(conn, "vastctl-f", State.STOPPED, dph=0.4)    # no capacity; its disk bills, at a price no listing gave yet
    obs = observe(conn, CFG, now=NOW)
    assert obs.capacity == 64 + 80
    assert obs.pending_capacity == 70 + 55
    # c bills until vast confirms its destroy; f, with no disk price known, counts in full (tests/test_spend.py)
    assert obs.spend_per_hour == pytest.approx(0.5 + 0.5 + 0.5 + 0.9 + 0.5 + 0.4)
    assert obs.model_rates == {"RTX 4090": 70.0}
    by_label = {m["label"]: m for m in obs.machines}
    assert set(by_label) == {"vastctl-a", "vastctl-b", "vastctl-c", "vastctl-d", "vastctl-e", "vastctl-f"}
    assert (by_label["vastctl-d"]["expected_rate"], by_label["vastctl-e"]["expected_rate"]) == (70.0, 55.0)
    assert obs.settings["target_proofs_per_hour"] == 200


def test_destroyed_rows_are_not_machines_and_fleet_reads_the_same_numbers(conn):
    a = put(conn, "vastctl-a", State.RUNNING)
    set_rate(conn, a, bench=70)
    gone = put(conn, "vastctl-g", State.KILLED)
    conn.execute("UPDATE instances SET destroyed_at = '2026-11-30T11:00:00.000000Z' WHERE uuid = ?", (gone,))
    obs = observe(conn, CFG, now=NOW)
    assert [m["label"] for m in obs.machines] == ["vastctl-a"]
    summary = fleet.fleet_view(conn, CFG, now=NOW)["summary"]
    assert (summary["capacity_proofs_per_hour"], summary["spend_per_hour"]) == (obs.capacity, obs.spend_per_hour)
    settings.set_value(conn, CFG, "target_proofs_per_hour", "90", now=NOW)
    assert fleet.fleet_view(conn, CFG, now=NOW)["summary"]["target_proofs_per_hour"] == 90


def test_resumes_are_counted(conn):
    uuid = put(conn, "vastctl-s", State.STOPPED)
    lifecycle.transition(conn, uuid, State.LAUNCHING, "resumed by agent", "agent", now=NOW - timedelta(minutes=20))
    lifecycle.transition(conn, uuid, State.STOPPED, "stopped again", "agent", now=NOW - timedelta(minutes=10))
    (machine,) = observe(conn, CFG, now=NOW).machines
    assert (machine["state"], machine["resumes"]) == ("stopped", 1)


def test_demand_and_events_after_the_cursor(conn):
    put(conn, "vastctl-a", State.REGISTERED)
    demand.report(conn, 59, 100.0, now=NOW - timedelta(minutes=1))
    every = observe(conn, CFG, now=NOW, events_since=0).events
    assert [e["to_state"] for e in every] == ["launching", "registered"]
    assert observe(conn, CFG, now=NOW).events == []
    later = observe(conn, CFG, now=NOW, events_since=every[0]["id"])
    assert [e["id"] for e in later.events] == [every[1]["id"]]
    assert (later.demand.known, later.demand.queued, later.demand.age_s) == (True, 59, 60)


def test_last_actions_come_from_the_previous_step_that_ran(conn):
    conn.execute("INSERT INTO agent_steps (started_at, policy, outcome, actions, refused) VALUES"
                 " ('t1', 'rules', 'ok', ?, ?)",
                 (json.dumps([{"kind": "launch", "result": "launched vastctl-x"}]),
                  json.dumps([{"kind": "stop", "why": "never scale to zero"}])))
    conn.execute("INSERT INTO agent_steps (started_at, policy, outcome, actions) VALUES ('t2', 'rules', 'skipped', NULL)")
    conn.execute("INSERT INTO agent_steps (started_at, policy, outcome, actions) VALUES ('t3', 'rules', 'dry_run', '[]')")
    obs = observe(conn, CFG, now=NOW)
    assert [a["kind"] for a in obs.last_actions] == ["launch", "stop"]


def test_to_prompt_is_json_and_compact(conn):
    a = put(conn, "vastctl-a", State.RUNNING)
    set_rate(conn, a, bench=70)
    demand.report(conn, 3, None, now=NOW)
    prompt = observe(conn, CFG, now=NOW, events_since=0).to_prompt()
    text = json.dumps(prompt)
    assert prompt["demand"]["queued"] == 3 and prompt["capacity_proofs_per_hour"] == 70
    (brief,) = prompt["machines"]
    assert brief["label"] == "vastctl-a" and brief["expected_rate"] == 70 and "uuid" not in brief
    assert len(prompt["events"]) == 5 and "vastctl-a" in text


# --- the observation from raw rows; display formats at the edge --------------------------------------------


def test_the_observation_carries_stored_values_and_fleet_and_the_prompt_format_them(conn):
    a = put(conn, "vastctl-a", State.RUNNING)
    set_rate(conn, a, bench=70, measured=64.4567)
    obs = observe(conn, CFG, now=NOW, events_since=0)
    machine = next(m for m in obs.machines if m["uuid"] == a)
    stored = conn.execute("SELECT proofs_per_hour, state_since FROM instances WHERE uuid = ?", (a,)).fetchone()
    assert machine["proofs_per_hour"] == 64.4567 and machine["state_since"] == stored["state_since"]
    assert obs.events and obs.events[-1]["at"] == conn.execute("SELECT max(at) FROM events").fetchone()[0]
    shown = next(m for m in fleet.fleet_view(conn, CFG, now=NOW)["instances"] if m["uuid"] == a)
    assert shown["proofs_per_hour"] == 64.5 and shown["state_since"] == "2026-11-30T11:30:00Z"
    prompt = obs.to_prompt()
    brief = next(m for m in prompt["machines"] if m["label"] == "vastctl-a")
    assert brief["proofs_per_hour"] == 64.5 and brief["state_since"] == "2026-11-30T11:30:00Z"
    assert prompt["events"][-1]["at"] == "2026-11-30T11:30:00Z"


def test_observe_does_not_import_the_display_module():
    import grimp

    graph = grimp.build_graph("vastctl")
    assert graph.find_shortest_chain(importer="vastctl.observe", imported="vastctl.views.fleet") is None
    assert graph.find_shortest_chain(importer="vastctl.views.fleet", imported="vastctl.observe") is not None


def test_a_failed_destroy_is_a_disagreement_naming_the_attempts_and_the_error():
    killed = {"state": "killed", "vast_status": "running", "vast_missing": 0, "destroyed_at": None,
              "destroy_attempts": 3, "destroy_error": "vast PUT: HTTP 503 retry later"}
    assert disagreement(killed) == "killed but not destroyed at vast (3 failed: vast PUT: HTTP 503 retry later)"
    assert disagreement({**killed, "destroy_attempts": 0}) == "killed, destroy pending"
    assert disagreement({**killed, "destroyed_at": "2026-11-30T05:00:00Z"}) is None
