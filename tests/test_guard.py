"""guard.check: every limit, for every actor it applies to (and not for those it does not), and the records it leaves."""

from __future__ import annotations

import pytest
from helpers.guard_observations import EMPTY, NOW, QUEUED, launch, machine, obs

from vastctl import config as config_module
from vastctl import guard
from vastctl.facts.demand import Demand
from vastctl.guard import Action, Kind
from vastctl.state.lifecycle import KillCode

UNKNOWN = Demand(queued=None, proofs_per_hour=None, at=None, age_s=None, source=None, known=False, error="no sample")


@pytest.fixture
def cfg():
    return config_module.from_mapping({"agent": {"max_actions_per_step": 3}})


ACTORS = ["agent", "operator", "reconcile"]


@pytest.mark.parametrize("actor", ACTORS)
def test_max_instances(cfg, actor):
    fleet = obs([machine("vastctl-a"), machine("vastctl-b"), machine("vastctl-c", state="stopped")])
    assert guard.check(fleet, launch(actor), cfg).allowed
    verdict = guard.check(fleet, launch(actor, count=2), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "max_instances")
    assert "would make 5 machines; max_instances is 4" in verdict.why
    earlier = [launch(actor)]  # one already allowed in this step counts too
    assert guard.check(fleet, launch(actor), cfg, earlier=earlier).limit == "max_instances"


@pytest.mark.parametrize("actor", ACTORS)
def test_max_dph_on_launch_and_start(cfg, actor):
    fleet = obs([machine("vastctl-s", state="stopped", dph=1.4)], demand=EMPTY)
    verdict = guard.check(fleet, launch(actor, offer_id=7, dph=1.5), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "max_dph") and "offer 7 costs $1.5/h" in verdict.why
    assert guard.check(fleet, launch(actor, offer_id=7, dph=0.9), cfg).allowed
    start = Action(kind=Kind.START, actor=actor, label="vastctl-s")
    assert guard.check(fleet, start, cfg).limit == "max_dph"
    assert guard.check(obs(fleet.machines, max_dph=2.0), start, cfg).allowed


@pytest.mark.parametrize("actor", ACTORS)
def test_max_hourly_spend(cfg, actor):
    fleet = obs([machine("vastctl-a", dph=0.9), machine("vastctl-b", dph=0.9),
                 machine("vastctl-s", state="stopped", dph=0.9)], max_instances=10)  # billing $1.80/h, not the stopped
    assert guard.check(fleet, launch(actor, dph=0.9), cfg).allowed
    verdict = guard.check(fleet, launch(actor, dph=0.7, count=2), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "max_hourly_spend") and "$3.20/h" in verdict.why
    start = Action(kind=Kind.START, actor=actor, label="vastctl-s")
    assert guard.check(fleet, start, cfg).allowed
    assert guard.check(fleet, start, cfg, earlier=[launch(actor, dph=0.9)]).limit == "max_hourly_spend"


@pytest.mark.parametrize("actor", ACTORS)
def test_allowed_gpu_models(cfg, actor):
    verdict = guard.check(obs(), launch(actor, gpu_name="RTX 3090"), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "gpus") and "fleet.gpus" in verdict.why
    assert guard.check(obs(), launch(actor, gpu_name="RTX 5090"), cfg).allowed


def test_max_actions_per_step_binds_the_agent_only(cfg):
    fleet = obs([machine("vastctl-a"), machine("vastctl-b")], max_instances=20, max_hourly_spend=100)
    earlier = [launch("agent", count=2)]
    note = Action(kind=Kind.NOTE, actor="agent", text="remember the spike")
    assert guard.check(fleet, launch("agent"), cfg, earlier=earlier).allowed
    verdict = guard.check(fleet, launch("agent"), cfg, earlier=earlier + [note, launch("agent")])
    assert (verdict.allowed, verdict.limit) == (False, "max_actions_per_step")
    assert guard.check(fleet, note, cfg, earlier=earlier * 3).allowed  # notes spend nothing
    for actor in ("operator", "reconcile"):
        many = [launch(actor)] * 5
        assert guard.check(fleet, launch(actor), cfg, earlier=many).limit != "max_actions_per_step"


@pytest.mark.parametrize("kind", [Kind.STOP, Kind.START, Kind.KILL, Kind.DESTROY])
@pytest.mark.parametrize("actor", ["agent", "operator"])
def test_label_prefix(cfg, kind, actor):
    fleet = obs([machine("training-job"), machine("vastctl-a"), machine("vastctl-b")], demand=EMPTY)
    verdict = guard.check(fleet, Action(kind=kind, actor=actor, label="training-job"), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "label_prefix") and "'vastctl-'" in verdict.why
    assert guard.check(fleet, Action(kind=kind, actor=actor, label="vastctl-a"), cfg).allowed


def test_label_prefix_for_reconcile_binds_destroys_by_vast_id_only(cfg):
    fleet = obs([machine("hand-made")])
    by_id = Action(kind=Kind.DESTROY, actor="reconcile", label="someone-else", vast_id=42)
    assert guard.check(fleet, by_id, cfg).limit == "label_prefix"
    assert guard.check(fleet, Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-x", vast_id=42), cfg).allowed
    row_kill = Action(kind=Kind.KILL, actor="reconcile", label="hand-made", uuid="u-hand-made")
    assert guard.check(fleet, row_kill, cfg).allowed  # a row reported to us: the safety net ends its billing


@pytest.mark.parametrize("kind", [Kind.STOP, Kind.KILL, Kind.DESTROY])
@pytest.mark.parametrize("demand", [QUEUED, UNKNOWN], ids=["queued", "unknown"])
def test_never_scale_to_zero(cfg, kind, demand):
    last = obs([machine("vastctl-a"), machine("vastctl-b", state="launching")], demand=demand)
    for actor in ("agent", "operator"):
        verdict = guard.check(last, Action(kind=kind, actor=actor, label="vastctl-a"), cfg)
        assert (verdict.allowed, verdict.limit) == (False, "never_scale_to_zero"), actor
        assert "would leave no machine running" in verdict.why
    assert "--force" in guard.check(last, Action(kind=kind, actor="operator", label="vastctl-a"), cfg).why
    # reconcile's kills of dead machines are never refused by it
    assert guard.check(last, Action(kind=kind, actor="reconcile", label="vastctl-a", uuid="u-vastctl-a"), cfg).allowed
    # nor is removing what is not capacity, nor the last one when the queue is known empty
    stopped = obs([machine("vastctl-s", state="stopped")], demand=demand)
    assert guard.check(stopped, Action(kind=kind, actor="agent", label="vastctl-s"), cfg).allowed
    empty = obs(last.machines, demand=EMPTY)
    assert guard.check(empty, Action(kind=kind, actor="agent", label="vastctl-a"), cfg).allowed


def test_never_scale_to_zero_counts_the_earlier_actions_of_the_step(cfg):
    fleet = obs([machine("vastctl-a"), machine("vastctl-b")])
    first = Action(kind=Kind.STOP, actor="agent", label="vastctl-a")
    assert guard.check(fleet, first, cfg).allowed
    verdict = guard.check(fleet, Action(kind=Kind.DESTROY, actor="agent", label="vastctl-b"), cfg, earlier=[first])
    assert verdict.limit == "never_scale_to_zero"
    # nothing proving at all: a machine on its way proves nothing, and retiring it takes nothing away
    booting = obs([machine("vastctl-l", state="params_done")])
    assert guard.check(booting, Action(kind=Kind.KILL, actor="agent", label="vastctl-l"), cfg).allowed


def test_force_passes_only_the_operator_and_only_that_rule(cfg):
    last = obs([machine("vastctl-a")])
    forced = guard.check(last, Action(kind=Kind.STOP, actor="operator", label="vastctl-a", force=True), cfg)
    assert forced.allowed and forced.forced and forced.limit == "never_scale_to_zero"
    assert forced.why.startswith("forced: ")
    agent = guard.check(last, Action(kind=Kind.STOP, actor="agent", label="vastctl-a", force=True), cfg)
    assert not agent.allowed
    other = guard.check(obs(), launch("operator", count=9, force=True), cfg)
    assert (other.allowed, other.limit) == (False, "max_instances")
    plain = guard.check(obs([machine("vastctl-a"), machine("vastctl-b")]),
                        Action(kind=Kind.STOP, actor="operator", label="vastctl-a", force=True), cfg)
    assert plain.allowed and not plain.forced  # --force that was not needed records nothing


def test_unknown_kind_and_actor_are_refused(cfg):
    verdict = guard.check(obs(), Action(kind="reboot", actor="agent", label="vastctl-a"), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "kind") and "launch, stop, start, kill, destroy, note" in verdict.why
    assert guard.check(obs(), Action(kind=Kind.LAUNCH, actor="cron", gpu_name="RTX 4090"), cfg).limit == "actor"


def test_record_keeps_refusals_and_overrides_only(conn, cfg):
    last = obs([machine("vastctl-a")])
    refused_action = Action(kind=Kind.STOP, actor="agent", label="vastctl-a", uuid="u-vastctl-a", reason="idle")
    guard.record(conn, refused_action, guard.check(last, refused_action, cfg), now=NOW)
    forced_action = Action(kind=Kind.KILL, actor="operator", label="vastctl-a", force=True)
    guard.record(conn, forced_action, guard.check(last, forced_action, cfg), now=NOW)
    fine = launch("operator")
    guard.record(conn, fine, guard.check(last, fine, cfg), now=NOW)
    rows = [dict(r) for r in conn.execute("SELECT actor, kind, label, ok, result, request FROM actions ORDER BY id")]
    assert [(r["actor"], r["kind"], r["label"], r["ok"]) for r in rows] == [
        ("agent", "stop", "vastctl-a", 0), ("operator", "kill", "vastctl-a", 1)]
    assert rows[0]["result"].startswith("refused by the guard (never_scale_to_zero): stop vastctl-a would leave")
    assert rows[1]["result"].startswith("forced past the guard (never_scale_to_zero)")
    assert '"reason": "idle"' in rows[0]["request"]


def test_refusal_view_names_the_limit():
    action = launch("agent", count=2, dph=0.4)
    view = guard.Verdict(False, "too many", "max_instances").refusal(action)
    assert view == {"kind": "launch", "label": None, "reason": "", "result": None, "actor": "agent", "count": 2,
                    "gpu_name": "RTX 4090", "dph": 0.4, "why": "too many", "limit": "max_instances"}


# --- where actions are applied: one branch per kind, nothing falls through to a destroy ------------------


class Market:
    def __init__(self):
        self.calls = []

    def destroy_instance(self, vast_id):
        self.calls.append(("destroy", vast_id))

    def stop_instance(self, vast_id):
        self.calls.append(("stop", vast_id))

    def start_instance(self, vast_id):
        self.calls.append(("start", vast_id))

    def list_instances(self):
        return []


def test_reconcile_apply_has_no_fall_through(conn, config):
    from vastctl import reconcile

    market = Market()
    odd = [Action(kind=Kind.STOP, actor="reconcile", label="vastctl-x", reason="?", vast_id=42),
           Action(kind="reboot", actor="reconcile", label="vastctl-y", reason="?", vast_id=43),  # not a Kind
           Action(kind=Kind.KILL, actor="reconcile", label="vastctl-z", reason="?", vast_id=44)]  # names no row
    result = reconcile.apply(conn, market, odd, config, now=NOW)
    assert market.calls == []
    assert [a["result"] for a in result.actions] == [
        "error: reconcile does not apply a 'stop' action to vast id",
        "error: reconcile does not apply a 'reboot' action to vast id",
        "error: reconcile does not apply a 'kill' action to vast id"]
    assert len(result.errors) == 3 and result.refused == []


def test_reconcile_destroys_by_vast_id_only_with_our_prefix(conn, config):
    from vastctl import reconcile

    market = Market()
    strays = [Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-orphan", reason="orphan", vast_id=42,
                     code=KillCode.ORPHAN),
              Action(kind=Kind.DESTROY, actor="reconcile", label="training-job", reason="?", vast_id=43)]
    result = reconcile.apply(conn, market, strays, config, now=NOW)
    assert market.calls == [("destroy", 42)]
    assert [(r["label"], r["limit"]) for r in result.refused] == [("training-job", "label_prefix")]
    audit = [tuple(r) for r in conn.execute("SELECT actor, kind, label, ok FROM actions ORDER BY id")]
    assert audit == [("reconcile", "destroy", "vastctl-orphan", 1), ("reconcile", "destroy", "training-job", 0)]


def test_agent_apply_rejects_an_unknown_kind(conn, config):
    from vastctl.agent import step
    from vastctl.errors import BadInput

    market = Market()
    with pytest.raises(BadInput, match="unknown action kind 'reboot'"):
        step.apply(conn, market, config, Action(kind="reboot", actor="agent", label="vastctl-a"), now=NOW)
    with pytest.raises(BadInput, match="needs the machine's label"):
        step.apply(conn, market, config, Action(kind=Kind.STOP, actor="agent"), now=NOW)
    assert market.calls == []


def test_never_scale_to_zero_counts_the_calls_the_proof_router_holds(cfg):
    import dataclasses

    held = dataclasses.replace(EMPTY, held=4)  # the source says nothing waits, the router holds four calls
    assert held.work == 4
    last = obs([machine("vastctl-a")], demand=held)
    verdict = guard.check(last, Action(kind=Kind.STOP, actor="agent", label="vastctl-a"), cfg)
    assert (verdict.allowed, verdict.limit) == (False, "never_scale_to_zero")
    assert "4 of them held at the proof router for a free prover" in verdict.why
    in_flight = dataclasses.replace(EMPTY, in_flight=6, held=4)  # Curio counts held calls in flight: not added
    assert in_flight.work == 6
