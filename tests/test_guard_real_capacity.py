"""never_scale_to_zero protects the last machine really proving, and the label prefix spares rows with nothing at
vast: the guard table (running / booting / dead at vast / silent / not ours, under queued, unknown and empty
demand), then the same at the command line against a stand-in market."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from helpers.agent_cli import running
from helpers.serving import query
from helpers.stand_in_market import Market

from vastctl import config as config_module
from vastctl import guard
from vastctl.facts.demand import Demand
from vastctl.guard import Action, Kind
from vastctl.observe import Observation
from vastctl.providers.base import RemoteInstance

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
QUEUED = Demand(queued=59, proofs_per_hour=80.0, at=NOW, age_s=10, source="command", known=True)
UNKNOWN = Demand(queued=None, proofs_per_hour=None, at=None, age_s=None, source=None, known=False, error="no sample")
EMPTY = Demand(queued=0, proofs_per_hour=0.0, at=NOW, age_s=10, source="command", known=True)
# nothing unclaimed, but work waiting at a daemon or about to be created: still work for the last prover
IN_FLIGHT = Demand(queued=0, in_flight=4, proofs_per_hour=80.0, at=NOW, age_s=10, source="command", known=True)
LOOKAHEAD = Demand(queued=0, in_flight=0, lookahead=12, proofs_per_hour=0.0, at=NOW, age_s=10, source="command",
                   known=True)
LIMITS = {"target_proofs_per_hour": 100.0, "min_bench_rate": 40.0, "max_instances": 8, "max_hourly_spend": 9.0,
          "max_dph": 1.0}


def iso(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def machine(label, state="running", vast_status="running", vast_missing=0, beat_s=30.0, vast_id=7, **extra):
    """A machine as the Observation has it; `beat_s` seconds since its last heartbeat (None: never)."""
    return {"uuid": f"u-{label}", "label": label, "state": state, "dph": 0.5, "expected_rate": 60.0,
            "vast_id": vast_id, "vast_status": None if vast_missing else vast_status, "vast_missing": vast_missing,
            "state_since": iso(3 * 3600), "last_heartbeat_at": None if beat_s is None else iso(beat_s),
            "gpu_name": "RTX 4090", "resumes": 0, **extra}


PROVING = machine("vastctl-ok")
FLEETS = {
    # name: (machines, target label, proves?)
    "running, the last one proving": ([PROVING, machine("vastctl-boot", state="launching", vast_id=None)],
                                      "vastctl-ok", True),
    "running, vast never listed it yet": ([machine("vastctl-new", vast_status=None)], "vastctl-new", True),
    "booting: registered, none running": ([machine("vastctl-reg", state="registered", beat_s=None)],
                                          "vastctl-reg", False),
    "booting: launching, none running": ([machine("vastctl-l", state="launching", vast_id=None, beat_s=None)],
                                         "vastctl-l", False),
    "booting: bench_done": ([machine("vastctl-b", state="bench_done", beat_s=None)], "vastctl-b", False),
    "dead at vast: exited": ([machine("vastctl-x", vast_status="exited")], "vastctl-x", False),
    "dead at vast: missing from the listing": ([machine("vastctl-m", vast_missing=2)], "vastctl-m", False),
    "dead at vast: vast has it stopped": ([machine("vastctl-s", vast_status="stopped")], "vastctl-s", False),
    "silent: heartbeat past timeouts.heartbeat": ([machine("vastctl-q", beat_s=3600)], "vastctl-q", False),
    "silent: running 3 h, never a heartbeat": ([machine("vastctl-n", beat_s=None)], "vastctl-n", False),
    "the only real one beside a dead row": ([machine("vastctl-x", vast_status="exited"), PROVING],
                                            "vastctl-ok", True),
    "the only real one beside a silent row": ([machine("vastctl-q", beat_s=3600), PROVING], "vastctl-ok", True),
    "not ours, nothing at vast, proving": ([machine("training", vast_id=None, vast_status=None)], "training", True),
    "not ours, nothing at vast, booting": ([machine("training", state="registered", vast_id=None, beat_s=None)],
                                           "training", False),
    "one proving left after it": ([PROVING, machine("vastctl-two")], "vastctl-two", False),
}


@pytest.fixture
def cfg():
    return config_module.from_mapping({"agent": {"max_actions_per_step": 5}, "timeouts": {"heartbeat": "10m"}})


def observe(machines, demand):
    return Observation(now=NOW, settings=dict(LIMITS), demand=demand, machines=list(machines), capacity=0.0,
                       pending_capacity=0.0, spend_per_hour=0.0, events=[], last_actions=[])


@pytest.mark.parametrize("kind", [Kind.STOP, Kind.KILL, Kind.DESTROY])
@pytest.mark.parametrize("demand", [QUEUED, UNKNOWN, EMPTY, IN_FLIGHT, LOOKAHEAD],
                         ids=["queued", "unknown", "empty", "in_flight", "lookahead"])
@pytest.mark.parametrize("fleet", list(FLEETS))
def test_the_guard_table(cfg, fleet, demand, kind):
    machines, target, holds_last = FLEETS[fleet]
    obs = observe(machines, demand)
    for actor in ("agent", "operator"):
        verdict = guard.check(obs, Action(kind=kind, actor=actor, label=target), cfg)
        if not target.startswith("vastctl-") and kind is Kind.STOP:  # a stop always reaches vast
            assert (verdict.allowed, verdict.limit) == (False, "label_prefix"), (fleet, actor)
        elif holds_last and demand is not EMPTY:
            assert (verdict.allowed, verdict.limit) == (False, "never_scale_to_zero"), (fleet, actor)
            assert "last one proving" in verdict.why
            forced = guard.check(obs, Action(kind=kind, actor="operator", label=target, force=True), cfg)
            assert forced.forced and forced.limit == "never_scale_to_zero"
        else:
            assert verdict.allowed and not verdict.forced, (fleet, actor, verdict)


def test_proving_reads_our_state_vast_and_the_heartbeat(cfg):
    assert guard.proving(PROVING, cfg, NOW)
    assert not guard.proving(machine("a", beat_s=601), cfg, NOW)
    assert guard.proving(machine("a", beat_s=599), cfg, NOW)
    fresh_from_state = machine("a", beat_s=None, state_since=iso(300))  # just started running: not yet silent
    assert guard.proving(fresh_from_state, cfg, NOW)
    old_beat = machine("a", beat_s=100, state_since=iso(50))  # a beat from before it (re)entered running
    assert guard.proving(old_beat, cfg, NOW)
    assert not guard.proving(machine("a", beat_s=None, state_since=iso(700)), cfg, NOW)
    assert not guard.proving(machine("a", vast_status="loading"), cfg, NOW)


def test_proving_agrees_with_reconciles_heartbeat_rule(cfg):
    """The guard's liveness is reconcile's: a machine reconcile would kill for silence is not proving."""
    from vastctl import reconcile

    for beat_s, since_s in ((30, 3600), (599, 3600), (601, 3600), (None, 300), (None, 700), (100, 50)):
        row = {"uuid": "u", "label": "vastctl-a", "state": "running", "vast_id": 7, "vast_status": "running",
               "vast_seen_at": iso(10), "state_since": iso(since_s),
               "last_heartbeat_at": None if beat_s is None else iso(beat_s)}
        entry = RemoteInstance(id=7, label="vastctl-a", actual_status="running", intended_status="running")
        plan = reconcile.plan([row], [entry], LIMITS, cfg, NOW)
        killed = any(action.code == "heartbeat_timeout" for action in plan)
        assert guard.proving(row, cfg, NOW) is not killed, (beat_s, since_s)


def test_the_steps_earlier_removals_count(cfg):
    obs = observe([machine("vastctl-a"), machine("vastctl-b"), machine("vastctl-x", vast_status="exited")], QUEUED)
    first = Action(kind=Kind.STOP, actor="agent", label="vastctl-a")
    assert guard.check(obs, first, cfg).allowed
    second = guard.check(obs, Action(kind=Kind.KILL, actor="agent", label="vastctl-b"), cfg, earlier=[first])
    assert second.limit == "never_scale_to_zero"  # the exited row is no capacity left behind


# --- the label prefix: a row with nothing at vast is ours to retire; --force passes the rest -----------------


@pytest.mark.parametrize("kind", [Kind.KILL, Kind.DESTROY])
def test_a_row_without_a_vast_instance_is_retired_whatever_its_label(cfg, kind):
    obs = observe([machine("training", state="registered", vast_id=None, beat_s=None), PROVING], QUEUED)
    for actor in ("agent", "operator"):
        assert guard.check(obs, Action(kind=kind, actor=actor, label="training"), cfg).allowed
    # a launching row may have a machine whose create answer was lost: it is looked up at vast, so not exempt
    launching = observe([machine("training", state="launching", vast_id=None, beat_s=None), PROVING], QUEUED)
    assert guard.check(launching, Action(kind=kind, actor="agent", label="training"), cfg).limit == "label_prefix"
    # stop and start always reach vast
    for other in (Kind.STOP, Kind.START):
        assert guard.check(obs, Action(kind=other, actor="operator", label="training"), cfg).limit == "label_prefix"


def test_force_retires_a_row_with_a_vast_instance_and_another_label(cfg):
    obs = observe([machine("oldprefix-a", vast_id=42), PROVING], QUEUED)
    kill = Action(kind=Kind.KILL, actor="operator", label="oldprefix-a")
    refused = guard.check(obs, kill, cfg)
    assert (refused.allowed, refused.limit) == (False, "label_prefix") and "--force" in refused.why
    forced = guard.check(obs, Action(kind=Kind.KILL, actor="operator", label="oldprefix-a", force=True), cfg)
    assert forced.forced and forced.limit == "label_prefix" and forced.why.startswith("forced: ")
    agent = guard.check(obs, Action(kind=Kind.KILL, actor="agent", label="oldprefix-a", force=True), cfg)
    assert agent.limit == "label_prefix" and not agent.allowed
    stop = guard.check(obs, Action(kind=Kind.STOP, actor="operator", label="oldprefix-a", force=True), cfg)
    assert stop.limit == "label_prefix" and not stop.allowed  # --force retires; it does not stop others' machines


def test_force_past_both_rules_records_both(cfg):
    obs = observe([machine("oldprefix-a", vast_id=42)], QUEUED)
    verdict = guard.check(obs, Action(kind=Kind.KILL, actor="operator", label="oldprefix-a", force=True), cfg)
    assert verdict.forced and verdict.limit == "label_prefix+never_scale_to_zero"
    assert "label prefix" in verdict.why and "never scale to zero" in verdict.why


def test_reconcile_destroys_by_vast_id_still_need_the_prefix(cfg):
    obs = observe([machine("hand-made", state="registered", vast_id=None, beat_s=None)], EMPTY)
    by_id = Action(kind=Kind.DESTROY, actor="reconcile", label="hand-made", vast_id=43)
    assert guard.check(obs, by_id, cfg).limit == "label_prefix"  # a listed instance, not the row


# --- at the command line --------------------------------------------------------------------------------


class ShowingMarket(Market):
    def __init__(self, labels):
        super().__init__()
        self.labels = labels  # vast id → label vast lists it under

    def show_instance(self, vast_id):
        return RemoteInstance(id=vast_id, label=self.labels.get(vast_id), actual_status="running")


@pytest.fixture
def market(monkeypatch):
    fake = ShowingMarket({500: "vastctl-a", 501: "vastctl-b", 502: "oldprefix-c"})
    monkeypatch.setattr("vastctl.markets.get_provider", lambda config, *, clock: fake)
    return fake


@pytest.fixture
def ready(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\nfleet:\n  max_instances: 6\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    assert cli("init").code == 0


def set_columns(db_path, label, **columns):
    with sqlite3.connect(db_path) as raw:
        names = ", ".join(f"{name} = ?" for name in columns)
        raw.execute(f"UPDATE instances SET {names} WHERE label = ?", (*columns.values(), label))


def test_kill_of_booting_machines_passes_with_work_queued(ready, cli, market, db_path):
    assert cli("register", "--uuid", "u-r", "--label", "vastctl-r").code == 0
    assert cli("demand", "report", "--queued", "59").code == 0
    result = cli("kill", "vastctl-r", "--reason", "stuck in registered")
    assert result.code == 0, result.err
    assert market.calls == []  # never rented: nothing at vast
    assert query(db_path, "SELECT state, kill_reason FROM instances") == [
        {"state": "killed", "kill_reason": "operator: stuck in registered"}]


def test_stop_of_the_only_machine_vast_runs_is_refused_beside_a_dead_row(ready, cli, market, db_path):
    running(cli, "vastctl-a", vast_id=500)
    running(cli, "vastctl-b", vast_id=501)
    set_columns(db_path, "vastctl-a", vast_status="exited", vast_seen_at="2026-01-01T00:00:00Z")
    set_columns(db_path, "vastctl-b", vast_status="running", vast_seen_at="2026-01-01T00:00:00Z")
    assert cli("demand", "report", "--queued", "59").code == 0
    result = cli("stop", "vastctl-b")
    assert result.code == 4 and "never scale to zero" in result.err and "--force" in result.err
    assert market.calls == []
    result = cli("kill", "vastctl-a", "--reason", "vast says exited")  # proves nothing: passes
    assert result.code == 0, result.err
    assert market.calls == [("destroy", 500)]
    assert query(db_path, "SELECT label, state FROM instances ORDER BY label") == [
        {"label": "vastctl-a", "state": "killed"}, {"label": "vastctl-b", "state": "running"}]


def test_kill_of_a_row_without_our_prefix(ready, cli, market, db_path):
    running(cli, "vastctl-a", vast_id=500)
    result = cli("register", "--uuid", "u-t", "--label", "training-job")
    assert result.code == 0 and "training-job" in result.err and "prefix 'vastctl-'" in result.err
    assert cli("demand", "report", "--queued", "59").code == 0
    result = cli("kill", "training-job", "--reason", "not a prover")  # nothing at vast: passes
    assert result.code == 0, result.err
    running(cli, "oldprefix-c", vast_id=502)  # e.g. rented before vast.label_prefix changed
    result = cli("kill", "oldprefix-c", "--reason", "old fleet")
    assert result.code == 4 and "label prefix" in result.err and "--force" in result.err
    assert market.calls == []
    result = cli("kill", "oldprefix-c", "--reason", "old fleet", "--force")
    assert result.code == 0, result.err
    assert market.calls == [("destroy", 502)]
    (forced,) = query(db_path, "SELECT actor, ok, result FROM actions WHERE kind = 'kill' AND ok = 1")
    assert forced["result"].startswith("forced past the guard (label_prefix)")
    (event,) = query(db_path, "SELECT reason FROM events WHERE label = 'oldprefix-c' AND to_state = 'killed'")
    assert event["reason"] == "operator: old fleet (forced)"


# --- stop of a machine whose vast id is only claimed ------------------------------------------------------


def test_stop_of_a_claimed_id_says_it_is_unconfirmed_and_what_confirms_it(ready, cli, market, db_path):
    assert cli("register", "--uuid", "u1", "--label", "vastctl-c", "--vast-id", "4711").code == 0
    for verb in ("stop", "start"):
        result = cli(verb, "vastctl-c")
        assert result.code == 3 and "never rented" not in result.err
        assert "vastctl-c claims vast instance 4711" in result.err and "no vast listing has confirmed it" in result.err
        assert "`vastctl reconcile` confirms it once vast lists instance 4711 under the label 'vastctl-c'" in result.err
    assert cli("register", "--uuid", "u2", "--label", "hand-made", "--vast-id", "4712").code == 0
    result = cli("stop", "hand-made")
    assert result.code == 3 and "reconcile never confirms it: the label lacks our prefix 'vastctl-'" in result.err
    assert cli("register", "--uuid", "u3", "--label", "vastctl-n").code == 0
    assert "vastctl-n was never rented" in cli("stop", "vastctl-n").err  # no claim: that is what is true
    assert market.calls == []
    assert {r["state"] for r in query(db_path, "SELECT state FROM instances")} == {"registered"}


def test_the_library_stop_says_the_same(conn, cfg):
    from vastctl import operations
    from vastctl.errors import Refused
    from vastctl.state import lifecycle

    lifecycle.register(conn, "u1", label="vastctl-c", vast_id=4711, now=NOW)
    with pytest.raises(Refused, match="vastctl-c claims vast instance 4711"):
        operations.stop(conn, Market(), "vastctl-c", config=cfg, now=NOW)
