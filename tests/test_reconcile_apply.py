"""reconcile.apply and run_pass against the state file, with a small in-memory market."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from vastctl import clock, reconcile
from vastctl.errors import BenchFailed, Unavailable
from vastctl.guard import Action, Kind
from vastctl.providers.base import ProviderError, RemoteInstance
from vastctl.reconcile.run import _snapshot
from vastctl.state import lifecycle, locks, rates, settings
from vastctl.views import fleet

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


class FakeMarket:
    """Lists what it holds; destroy fails while `failing` says so."""

    def __init__(self):
        self.instances: dict[int, RemoteInstance] = {}
        self.list_error: Exception | None = None
        self.failing: dict[int, int] = {}  # vast_id → failures left (-1: forever)
        self.destroy_calls: list[int] = []

    def add(self, vast_id, label, status="running", **fields):
        self.instances[vast_id] = RemoteInstance(id=vast_id, label=label, actual_status=status,
                                                 intended_status=fields.pop("intended_status", "running"), **fields)

    def list_instances(self):
        if self.list_error is not None:
            raise self.list_error
        return list(self.instances.values())

    def show_instance(self, vast_id):
        return self.instances.get(vast_id)

    def destroy_instance(self, vast_id):
        self.destroy_calls.append(vast_id)
        left = self.failing.get(vast_id, 0)
        if left:
            self.failing[vast_id] = left - 1 if left > 0 else left
            raise ProviderError(f"vast DELETE /api/v0/instances/{vast_id}/: HTTP 500 boom: retry later")
        self.instances.pop(vast_id, None)


@pytest.fixture
def market():
    return FakeMarket()


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def make(conn, label, state="running", *, vast_id=None, machine_id=None, when=None, heartbeat=True, **fields):
    """A row that reached `state` at `when` (default: 30 minutes before NOW)."""
    when = when or at(-30)
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=lifecycle.State.LAUNCHING, reason="launched",
                     source="operator", now=when, fields={"vast_id": vast_id, "machine_id": machine_id})
    columns = {"state": state, "state_since": clock.to_iso(when), **fields}
    if heartbeat and state == "running":
        columns.setdefault("last_heartbeat_at", clock.to_iso(NOW - timedelta(minutes=1)))
    conn.execute(f"UPDATE instances SET {', '.join(f'{k} = ?' for k in columns)} WHERE uuid = ?",
                 (*columns.values(), uuid))
    return uuid


def get(conn, uuid):
    return dict(conn.execute("SELECT * FROM instances WHERE uuid = ?", (uuid,)).fetchone())


def kill_events(conn, uuid=None):
    query = "SELECT * FROM events WHERE to_state = 'killed'" + (" AND uuid = ?" if uuid else "")
    return [dict(r) for r in conn.execute(query, (uuid,) if uuid else ())]


def dump(conn):
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t}")] for t in tables}


def test_a_kill_is_one_event_then_the_machine_is_destroyed(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-14)))
    market.add(11, "vastctl-a")
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    assert [(a["kind"], a["result"]) for a in result.actions] == [("kill", "killed"), ("destroy", "destroyed")]
    assert result.errors == [] and result.refused == []
    (event,) = kill_events(conn)
    assert (event["source"], event["code"], event["label"]) == ("reconcile", "heartbeat_timeout", "vastctl-a")
    assert event["reason"] == "no heartbeat for 14m (limit 10m)"
    row = get(conn, uuid)
    assert row["state"] == "killed" and row["destroyed_at"] == clock.to_iso(NOW)
    assert market.destroy_calls == [11]
    audit = conn.execute("SELECT actor, kind, vast_id, ok FROM actions").fetchall()
    assert [tuple(a) for a in audit] == [("reconcile", "destroy", 11, 1)]
    # the next pass has nothing left to do
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1))).actions == []
    assert len(kill_events(conn)) == 1


def test_destroy_is_retried_every_pass_until_vast_confirms(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11, machine_id=5)
    market.add(11, "vastctl-a", "exited")
    market.failing[11] = 2
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))  # first sight of exited: waits one listing
    first = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1)))
    assert [(a["kind"], a["result"].split(" (")[0]) for a in first.actions] == [
        ("kill", "killed; machine blocklisted"), ("destroy", "destroy failed")]
    assert len(first.errors) == 1 and "HTTP 500" in first.errors[0]
    row = get(conn, uuid)
    assert row["state"] == "killed" and row["destroyed_at"] is None
    assert (row["destroy_attempts"], "HTTP 500" in row["destroy_error"]) == (1, True)
    second = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(2)))
    assert [a["kind"] for a in second.actions] == ["destroy"] and get(conn, uuid)["destroyed_at"] is None
    assert "attempt 2" in second.actions[0]["reason"]
    third = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(3)))
    assert third.actions[0]["result"] == "destroyed" and third.errors == []
    row = get(conn, uuid)
    assert row["destroyed_at"] == clock.to_iso(at(3)) and row["destroy_error"] is None
    assert market.destroy_calls == [11, 11, 11] and 11 not in market.instances
    assert len(kill_events(conn)) == 1
    # died early: its machine is blocklisted
    assert conn.execute("SELECT machine_id FROM blocklist").fetchall()[0][0] == 5


def test_a_kill_racing_the_bench_report_yields_one_event(conn, config, market):
    uuid = make(conn, "vastctl-a", "params_done", vast_id=11, when=at(-95))
    market.add(11, "vastctl-a")
    rows = _snapshot(conn)
    actions = reconcile.plan(rows, market.list_instances(), settings.effective(conn, config), config, NOW)
    assert [a.code for a in actions if a.kind == "kill"] == ["timeout_params_done"]
    with pytest.raises(BenchFailed):  # the primary path wins the race
        rates.bench_report(conn, uuid, 3.0, gate=40.0, now=NOW)
    result = reconcile.apply(conn, market, actions, config, now=NOW)
    assert result.actions[0]["result"].startswith("already killed by instance: bench rate 3 below gate 40")
    assert result.actions[1]["result"] == "destroyed"  # the loser still makes sure the machine is gone
    (event,) = kill_events(conn)
    assert (event["source"], event["code"]) == ("instance", "bench_failed")
    assert result.errors == []


def test_a_kill_losing_inside_the_transition_is_not_an_error(conn, config, market):
    uuid = make(conn, "vastctl-a", "registered", vast_id=11, when=at(-45))
    market.add(11, "vastctl-a")
    actions = reconcile.plan(_snapshot(conn), market.list_instances(), settings.effective(conn, config),
                             config, NOW)
    lifecycle.kill(conn, uuid, "operator: done with it", source="operator", code="operator", now=NOW)
    blind = [dataclasses.replace(a, expect=None) for a in actions]  # no snapshot check: the CAS decides
    result = reconcile.apply(conn, market, blind, config, now=NOW)
    assert result.actions[0]["result"] == "already killed by operator: operator: done with it"
    assert len(kill_events(conn)) == 1 and result.errors == []


def test_a_row_that_moved_on_since_the_plan_is_left_alone(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-14)))
    market.add(11, "vastctl-a")
    actions = reconcile.plan(_snapshot(conn), market.list_instances(), settings.effective(conn, config),
                             config, NOW)
    rates.heartbeat(conn, uuid, now=NOW)  # it came back before apply
    result = reconcile.apply(conn, market, actions, config, now=NOW)
    assert [a["result"] for a in result.actions] == ["skipped: it moved on since the plan (now running)",
                                                     "skipped: not killed (now running)"]
    assert get(conn, uuid)["state"] == "running" and market.destroy_calls == []


def test_lock_held_is_exit_1_and_nothing_happens(conn, config, market):
    make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-30)))
    market.add(11, "vastctl-a")
    assert locks.acquire(conn, "reconcile", ttl_s=600, now=NOW, holder="elsewhere:123")
    before = dump(conn)
    with pytest.raises(Unavailable, match="another reconcile is running") as caught:
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1)))
    assert caught.value.exit_code == 1
    assert dump(conn) == before and market.destroy_calls == []


def test_an_expired_or_dead_lease_does_not_block(conn, config, market):
    locks.acquire(conn, "reconcile", ttl_s=60, now=NOW - timedelta(hours=1), holder="elsewhere:123")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))  # expired
    import socket

    locks.acquire(conn, "reconcile", ttl_s=600, now=NOW, holder=f"{socket.gethostname()}:999999999")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1)))  # its process is gone
    assert conn.execute("SELECT count(*) FROM locks").fetchone()[0] == 0


def test_a_failed_listing_kills_nothing_and_is_recorded(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-30)))
    market.list_error = ProviderError("vast GET /api/v1/instances/: HTTP 502 bad gateway: retry later")
    with pytest.raises(ProviderError):
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    assert get(conn, uuid)["state"] == "running" and kill_events(conn) == []
    (listing,) = conn.execute("SELECT ok, error FROM vast_listings").fetchall()
    assert listing["ok"] == 0 and "HTTP 502" in listing["error"]
    assert conn.execute("SELECT count(*) FROM locks").fetchone()[0] == 0


def test_a_distrusted_listing_kills_nothing_and_counts_nothing(conn, config, market):
    uuids = [make(conn, f"vastctl-{n}", vast_id=10 + n) for n in range(4)]
    for n in range(4):
        market.add(10 + n, f"vastctl-{n}")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    market.instances.clear()  # the API "lost" every instance
    for minute in (1, 2, 3):
        with pytest.raises(reconcile.ListingDistrusted, match="4 of 4 live machines vanished at once"):
            reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(minute)))
    assert all(get(conn, u)["state"] == "running" and get(conn, u)["vast_missing"] == 0 for u in uuids)
    assert kill_events(conn) == []
    oks = [tuple(r) for r in conn.execute("SELECT ok, instances FROM vast_listings ORDER BY id")]
    assert oks == [(1, 4), (0, None), (0, None), (0, None)]


def test_vanished_machine_killed_after_two_good_listings(conn, config, market):
    uuids = [make(conn, f"vastctl-{n}", vast_id=10 + n) for n in range(3)]
    for n in range(3):
        market.add(10 + n, f"vastctl-{n}")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    del market.instances[10]
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1))).actions == []
    assert get(conn, uuids[0])["vast_missing"] == 1
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(2)))
    assert [(a["kind"], a["code"], a["result"]) for a in result.actions] == [
        ("kill", "disappeared", "killed"), ("destroy", "disappeared", "destroyed")]
    assert kill_events(conn)[0]["reason"].startswith("disappeared from vast: instance 10 missing from 2")


def test_two_listings_seconds_apart_confirm_nothing_a_minute_of_them_does(conn, config, market):
    uuids = [make(conn, f"vastctl-{n}", vast_id=10 + n, last_heartbeat_at=clock.to_iso(at(-5))) for n in range(3)]
    for n in range(3):
        market.add(10 + n, f"vastctl-{n}")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    del market.instances[10]
    market.add(11, "vastctl-1", status="offline")
    second = NOW + timedelta(seconds=50)
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(second)).actions == []
    wake = second + timedelta(seconds=5)  # a wake's confirming listing: two listings agree, 5 s apart
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(wake)).actions == []
    assert _snapshot(conn)[0]["vast_missing_since"] == clock.to_iso(second)  # the first listing it missed
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(second + timedelta(seconds=60)))
    assert sorted((a["label"], a["code"]) for a in result.actions if a["kind"] == "kill") == [
        ("vastctl-0", "disappeared"), ("vastctl-1", "offline")]
    assert get(conn, uuids[2])["state"] == "running"


def test_the_cache_records_what_was_seen(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11)
    market.add(11, "vastctl-a", status_msg="success, running img/ssh", machine_id=77, gpu_name="RTX 4090",
               num_gpus=1, dph_total=0.41)
    market.add(12, "someone-else", "exited")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    row = get(conn, uuid)
    assert (row["vast_status"], row["vast_status_msg"], row["vast_seen_at"], row["vast_missing"]) == (
        "running", "success, running img/ssh", clock.to_iso(NOW), 0)
    assert (row["machine_id"], row["gpu_name"], row["dph"]) == (77, "RTX 4090", 0.41)
    cache = {r["vast_id"]: dict(r) for r in conn.execute("SELECT * FROM vast_cache")}
    assert set(cache) == {11, 12} and cache[12]["actual_status"] == "exited"
    del market.instances[12]
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1)))
    cache = {r["vast_id"]: dict(r) for r in conn.execute("SELECT * FROM vast_cache")}
    assert set(cache) == {11}
    assert (cache[11]["first_seen_at"], cache[11]["seen_at"]) == (clock.to_iso(NOW), clock.to_iso(at(1)))
    assert [tuple(r) for r in conn.execute("SELECT ok, instances FROM vast_listings ORDER BY id")] == [(1, 2), (1, 1)]


def test_a_launch_that_crashed_before_recording_the_id_is_found_by_label(conn, config, market):
    uuid = make(conn, "vastctl-a", "launching", when=at(-2))
    market.add(31, "vastctl-a", "loading")
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW)).actions == []
    assert get(conn, uuid)["vast_id"] == 31
    # stuck: killed, and the destroy goes to the instance found by label
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(25)))
    assert [a["result"] for a in result.actions] == ["killed", "destroyed"] and market.destroy_calls == [31]


def test_orphans_destroyed_after_grace_strangers_never(conn, config, market):
    market.add(41, "vastctl-orphan")
    market.add(42, "training-run", "exited")
    market.add(43, None, "offline")
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW)).actions == []
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(19))).actions == []
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(21)))
    assert [(a["kind"], a["label"], a["code"], a["result"]) for a in result.actions] == [
        ("destroy", "vastctl-orphan", "orphan", "destroyed")]
    assert market.destroy_calls == [41] and set(market.instances) == {42, 43}
    (event,) = conn.execute("SELECT * FROM events WHERE kind = 'orphan'").fetchall()
    assert (event["source"], event["code"], event["label"], event["uuid"]) == (
        "reconcile", "orphan", "vastctl-orphan", None)
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(60))).actions == []


def test_a_failing_orphan_destroy_is_retried_and_evented_once(conn, config, market):
    market.add(41, "vastctl-orphan")
    market.failing[41] = 1
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    failed = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(21)))
    assert failed.errors and failed.actions[0]["result"].startswith("destroy failed")
    assert reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(22))).actions[0]["result"] == "destroyed"
    assert conn.execute("SELECT count(*) FROM events WHERE kind = 'orphan'").fetchone()[0] == 1


def test_bench_below_gate_in_bench_done_is_killed_and_blocklisted(conn, config, market):
    uuid = make(conn, "vastctl-a", "bench_done", vast_id=11, machine_id=99, bench_rate=12.0, when=at(-1))
    market.add(11, "vastctl-a")
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    assert result.actions[0]["code"] == "bench_failed"
    assert get(conn, uuid)["kill_code"] == "bench_failed"
    (entry,) = conn.execute("SELECT machine_id, reason FROM blocklist").fetchall()
    assert entry["machine_id"] == 99 and "bench" in entry["reason"]


def test_dry_run_changes_nothing(conn, config, market):
    make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-5)))
    make(conn, "vastctl-b", vast_id=12)
    make(conn, "vastctl-c", "killed", vast_id=13)
    market.add(11, "vastctl-a")
    market.add(13, "vastctl-c")
    market.add(14, "vastctl-orphan")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))  # vastctl-b counted missing once
    market.add(15, "vastctl-new")
    before = dump(conn)
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(25)), dry_run=True)
    assert result.dry_run and all(a["result"] == "planned (dry run)" for a in result.actions)
    assert [(a["kind"], a["label"], a["code"]) for a in result.actions] == [
        ("kill", "vastctl-a", "heartbeat_timeout"), ("destroy", "vastctl-a", "heartbeat_timeout"),
        ("kill", "vastctl-b", "disappeared"), ("destroy", "vastctl-b", "disappeared"),
        ("destroy", "vastctl-orphan", "orphan")]
    assert dump(conn) == before
    assert market.destroy_calls == [13]  # only the real pass's destroy


def test_a_dry_run_needs_no_lease_and_records_no_listing(conn, config, market):
    """A dry run is the pass with every change left out: it plans beside a running pass, and a listing that
    failed or was distrusted is not written to vast_listings."""
    make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-30)))
    make(conn, "vastctl-b", vast_id=12, vast_seen_at=clock.to_iso(at(-1)))
    market.add(11, "vastctl-a")
    market.add(12, "vastctl-b")
    assert locks.acquire(conn, "reconcile", ttl_s=600, now=NOW, holder="elsewhere:123")
    before = dump(conn)
    result = reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(1)), dry_run=True)
    assert [(a["kind"], a["label"], a["result"]) for a in result.actions] == [
        ("kill", "vastctl-a", "planned (dry run)"), ("destroy", "vastctl-a", "planned (dry run)")]
    market.list_error = ProviderError("vast GET /api/v0/instances/: HTTP 502: retry later")
    with pytest.raises(ProviderError):
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(2)), dry_run=True)
    market.list_error = None
    market.instances.clear()  # both vanish at once: distrusted
    with pytest.raises(reconcile.ListingDistrusted):
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(3)), dry_run=True)
    assert dump(conn) == before and market.destroy_calls == []


def test_apply_never_destroys_a_live_row(conn, config, market):
    uuid = make(conn, "vastctl-a", vast_id=11)
    market.add(11, "vastctl-a")
    bogus = Action(kind=Kind.DESTROY, actor="reconcile", label="vastctl-a", reason="bug", uuid=uuid, vast_id=11)
    assert reconcile.apply(conn, market, [bogus], config, now=NOW).actions[0]["result"].startswith("skipped")
    assert market.destroy_calls == []


def test_listing_history_is_pruned_after_a_week_but_the_last_good_one_is_kept(conn, config, market):
    market.add(1, "stranger")
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(-8 * 24 * 60)))  # good, 8 days ago
    market.list_error = ProviderError("vast listing: HTTP 500")
    for days in (3, 1):
        with pytest.raises(ProviderError):
            reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(-days * 24 * 60)))
    with pytest.raises(ProviderError):
        reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(NOW))
    kept = [(r["ok"], r["at"]) for r in conn.execute("SELECT ok, at FROM vast_listings ORDER BY id")]
    assert kept == [(1, clock.to_iso(at(-8 * 24 * 60))), (0, clock.to_iso(at(-3 * 24 * 60))),
                    (0, clock.to_iso(at(-24 * 60))), (0, clock.to_iso(NOW))]
    market.list_error = None
    reconcile.run_pass(conn, market, config, clock=clock.VirtualClock(at(5 * 24 * 60)))  # the 8-day-old good one and the 3-day-old go
    assert [(r["ok"], r["at"]) for r in conn.execute("SELECT ok, at FROM vast_listings ORDER BY id")] == [
        (0, clock.to_iso(at(-24 * 60))), (0, clock.to_iso(NOW)), (1, clock.to_iso(at(5 * 24 * 60)))]


def test_a_long_pass_renews_its_lease_before_each_action(conn, config, market, monkeypatch):
    for n in range(3):  # three killed machines awaiting their destroy
        make(conn, f"vastctl-k{n}", "killed", vast_id=20 + n, kill_code="exited", killed_at=clock.to_iso(at(-5)))
        market.add(20 + n, f"vastctl-k{n}", status="exited")
    virtual = clock.VirtualClock(NOW)
    seen = []

    def destroy(vast_id):  # each destroy takes 10 s of the pass's clock
        seen.append(conn.execute("SELECT expires_at FROM locks WHERE name = 'reconcile'").fetchone()[0])
        market.instances.pop(vast_id, None)
        virtual.advance(10)

    monkeypatch.setattr(market, "destroy_instance", destroy)
    reconcile.run_pass(conn, market, config, clock=virtual)  # the lease renews on the pass's own clock
    ttl = reconcile.LEASE_TTL_S
    assert seen == [clock.to_iso(NOW + timedelta(seconds=s + ttl)) for s in (0, 10, 20)]
    assert conn.execute("SELECT count(*) FROM locks").fetchone()[0] == 0


class SlowMarket(FakeMarket):
    """vast answers the listing after 6 s, during which a machine's report (here an operator's note) lands."""

    def __init__(self, conn, virtual: clock.VirtualClock):
        super().__init__()
        self.conn, self.clock = conn, virtual

    def list_instances(self):
        self.clock.advance(6)
        fleet.notify(self.conn, "written while vast was answering", now=self.clock.now())
        return super().list_instances()


def test_a_slow_listing_never_makes_event_times_run_backwards(conn, config):
    make(conn, "vastctl-a", vast_id=11, last_heartbeat_at=clock.to_iso(at(-14)))
    virtual = clock.VirtualClock(NOW)
    market = SlowMarket(conn, virtual)
    market.add(11, "vastctl-a")
    result = reconcile.run_pass(conn, market, config, clock=virtual)
    assert [a["kind"] for a in result.actions] == ["kill", "destroy"]
    shown = fleet.events(conn, limit=50)
    kinds = [(e["kind"], e["source"]) for e in shown][-2:]
    assert kinds == [("note", "operator"), ("transition", "reconcile")]  # the note first, then the kill
    times = [e["at"] for e in shown]
    assert times == sorted(times), times
