"""The simulated market: seeded, on an injected clock, booting machines through the real reports, billing them,
and failing the ways vast does, shown the way vast shows it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import timedelta

import pytest
from helpers.sim_markets import QUIET, START, Market, healthy_offer, make_market

from vastctl import clock as clocks
from vastctl import operations
from vastctl.clock import VirtualClock
from vastctl.config import Config
from vastctl.errors import VastctlError
from vastctl.machine.reports import LocalReports
from vastctl.markets import get_provider
from vastctl.providers import sim_market
from vastctl.providers.base import (
    CreateRequest,
    DeadlinePassed,
    OfferGone,
    OfferQuery,
    ProviderError,
    ProviderRejected,
)
from vastctl.providers.sim import FAULT_KINDS, FIRST_VAST_ID, SimProvider
from vastctl.state import db
from vastctl.state.lifecycle import KillCode


def run_scenario(directory, *, seed: int, failures: str, hours: float, fleet: int = 12) -> Market:
    """A fleet kept at `fleet` machines, reconciled every minute, one machine stopped and resumed every 3 hours."""
    market = make_market(directory, seed=seed, failures=failures)
    for minute in range(int(hours * 60)):
        live = market.conn.execute("SELECT count(*) FROM instances WHERE state != 'killed'").fetchone()[0]
        if live < fleet and minute % 5 == 0:
            for gpu in ("RTX 4090", "RTX 5090"):
                try:
                    market.launch(gpu=gpu, count=min(3, fleet - live))
                    break
                except VastctlError:
                    continue
        if minute % 180 == 90:
            running = market.conn.execute(
                "SELECT uuid FROM instances WHERE state = 'running' ORDER BY created_at LIMIT 1").fetchone()
            if running:
                try:
                    operations.stop(market.conn, market.sim, running["uuid"], config=market.config, force=True,
                                    now=market.clock.now())
                    operations.start(market.conn, market.sim, market.config, running["uuid"], now=market.clock.now())
                except VastctlError:
                    pass
        try:
            market.reconcile()
        except VastctlError:
            pass
        market.advance(60)
    return market


def fingerprint(market: Market):
    """Everything a run produced that does not carry a random uuid: money, faults, and the event log."""
    totals = market.sim.totals()
    records = [(r["vast_id"], r["machine_id"], r["cost"], r["billed_hours"], r["gpu_hours"], r["died_at"],
                r["destroyed_at"]) for r in totals.instances]
    faults = [(f["at"], f["kind"], f["vast_id"], f["detail"]) for f in market.sim.faults()]
    events = [tuple(r) for r in market.conn.execute(
        "SELECT at, kind, from_state, to_state, code FROM events ORDER BY id")]
    rows = [tuple(r) for r in market.conn.execute(
        "SELECT vast_id, state, kill_code, bench_rate, proofs_done, proofs_per_hour, killed_at, destroyed_at"
        " FROM instances ORDER BY vast_id, created_at")]
    return totals.cost, totals.billed_hours, records, faults, events, rows


# --- the tables, the layers ------------------------------------------------------------------------


def test_the_markets_tables_come_with_every_file_and_stay_empty_until_a_market_is_set_up(tmp_path, conn):
    """The tables come through the migrations (their columns are pinned in test_db); a market fills them."""
    sim_tables = ("sim_meta", "sim_hosts", "sim_instances", "sim_faults")
    assert {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in sim_tables} == dict.fromkeys(
        sim_tables, 0)
    market = make_market(tmp_path)
    assert market.conn.execute("SELECT count(*) FROM sim_hosts").fetchone()[0] == sum(g.hosts for g in sim_market.GPUS)
    # built again on the same file: the same market, not a second one
    again = SimProvider(market.conn, market.sim.reports, clock=market.clock, seed=99)
    assert again.seed == 1 and market.conn.execute("SELECT count(*) FROM sim_meta").fetchone()[0] == 1


@pytest.mark.slow
def test_the_simulator_imports_no_state_module():
    code = ("import sys, vastctl.providers.sim\n"
            "print(sorted(m for m in sys.modules if m.startswith('vastctl.') and m.split('.')[1] in"
            " ('db', 'lifecycle', 'settings', 'blocklist', 'locks', 'audit', 'tokens', 'reports', 'operations',"
            " 'reconcile', 'fleet')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- the market's model ----------------------------------------------------------------------------


def test_true_rates_follow_host_ram_and_gpu():
    assert sim_market.model_rate("RTX 5070 Ti", 128) == pytest.approx(24)
    assert sim_market.model_rate("RTX 5070 Ti", 256) == pytest.approx(68)
    assert sim_market.model_rate("RTX 5070 Ti", 384) == pytest.approx(84)
    assert sim_market.model_rate("RTX 5070 Ti", 512) == pytest.approx(95)
    assert sim_market.model_rate("H100 SXM", 128) == pytest.approx(24)  # RAM bounds even the fastest GPU
    assert sim_market.model_rate("RTX 3090", 512) == pytest.approx(50)  # and the GPU bounds a big host
    hosts = sim_market.make_hosts(1)
    assert {host.gpu_name for host in hosts} == {g.name for g in sim_market.GPUS}
    assert min(h.cpu_ram_gb for h in hosts) == 128 and max(h.cpu_ram_gb for h in hosts) == 512
    slow = [h for h in hosts if h.slow]
    assert slow and all(h.true_rate < sim_market.model_rate(h.gpu_name, h.cpu_ram_gb) * 0.9 for h in slow)
    assert len({h.base_dph for h in hosts if h.gpu_name == "RTX 4090"}) > 10  # prices vary


def test_offers_are_filtered_sorted_and_priced_with_the_disk(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    query = OfferQuery(gpu_names=["RTX 4090"], max_dph=0.7, min_cpu_ram_gb=256, min_inet_down_mbps=500,
                       min_reliability=0.95, disk_gb=150, limit=8)
    offers = market.sim.search_offers(query)
    assert 0 < len(offers) <= 8
    assert [o.dph_total for o in offers] == sorted(o.dph_total for o in offers)
    for offer in offers:
        assert offer.gpu_name == "RTX 4090" and offer.dph_total <= 0.7 and offer.cpu_ram_gb >= 256
        assert offer.inet_down_mbps >= 500 and offer.reliability >= 0.95
        assert offer.dph_total == pytest.approx(offer.raw["dph_base"] + offer.raw["storage_cost"] * 150 / 720, abs=1e-3)
    one = market.sim.search_offers(OfferQuery(offer_id=offers[0].id))
    assert [o.id for o in one] == [offers[0].id]


def test_a_rented_offer_is_no_longer_offered_and_renting_it_again_is_refused(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offer = healthy_offer(market)
    request = CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label="vastctl-x", onstart="",
                            env={"VASTCTL_UUID": "u-x", "VASTCTL_LABEL": "vastctl-x"})
    assert market.sim.create_instance(request) == FIRST_VAST_ID
    assert offer.id not in [o.id for o in market.sim.search_offers(OfferQuery(limit=500))]
    with pytest.raises(OfferGone):
        market.sim.create_instance(request)


# --- determinism -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_same_seed_gives_the_same_run_to_the_digit_and_another_seed_another(tmp_path):
    runs = [fingerprint(run_scenario(tmp_path / name, seed=seed, failures="high", hours=5))
            for name, seed in (("a", 7), ("b", 7), ("c", 8))]
    assert runs[0] == runs[1]
    assert runs[0][0] > 0 and runs[0][3]  # money was spent and something failed
    assert runs[0][0] != runs[2][0] and runs[0][2] != runs[2][2]


# --- boot through the real reports -----------------------------------------------------------------


def test_a_launch_walks_the_lifecycle_through_the_reports_on_simulated_time(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offer = healthy_offer(market)
    result = market.launch(offer_id=offer.id)
    uuid = result.launched[0]["uuid"]
    assert market.row(uuid)["state"] == "launching" and market.row(uuid)["vast_id"] == FIRST_VAST_ID
    seen = ["launching"]
    for _ in range(6 * 60):
        market.advance(60)
        assert market.sim.list_instances()  # consulting the market runs it up to the clock
        market.sim.work(10**9, 60)  # a queue that never empties: it proves at its true rate once running
        state = market.row(uuid)["state"]
        if state != seen[-1]:
            seen.append(state)
    assert seen == ["launching", "registered", "params_done", "running"]  # bench_done → running takes seconds
    steps = [r[0] for r in market.conn.execute(
        "SELECT to_state FROM events WHERE uuid = ? AND kind = 'transition' ORDER BY id", (uuid,))]
    assert steps == ["launching", "registered", "params_done", "bench_done", "running"]
    row = market.row(uuid)
    assert row["bench_rate"] >= 40 and row["proofs_done"] > 100 and row["proofs_per_hour"] > 40
    beat = clocks.from_iso(row["last_heartbeat_at"])
    assert market.clock.now() - timedelta(seconds=60) <= beat <= market.clock.now()
    # every report carries the simulated moment it was made: times between the steps, none from the wall clock
    times = [clocks.from_iso(r["at"]) for r in market.conn.execute("SELECT at FROM events WHERE uuid = ?", (uuid,))]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(START <= t <= market.clock.now() for t in times)
    params = next(t for t, r in zip(times, market.conn.execute("SELECT to_state FROM events WHERE uuid = ?", (uuid,)))
                  if r["to_state"] == "params_done")
    registered = next(t for t, r in zip(times, market.conn.execute("SELECT to_state FROM events WHERE uuid = ?",
                                                                   (uuid,))) if r["to_state"] == "registered")
    fetch_s = sim_market.PARAMS_GIB * sim_market.GIB_BITS / (offer.inet_down_mbps * 1e6)
    assert (params - registered).total_seconds() >= fetch_s  # the ~53 GiB fetch at the offer's bandwidth
    listed = {item.id: item for item in market.sim.list_instances()}
    assert listed[FIRST_VAST_ID].actual_status == "running" and listed[FIRST_VAST_ID].label == row["label"]


def test_a_market_consulted_after_hours_jumps_to_its_events_and_sends_only_the_last_heartbeat(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    made = []

    def counting_reports(at):
        made.append(at)
        return LocalReports(market.conn, market.config, now=at)

    market.sim.reports = counting_reports
    offer = healthy_offer(market)
    uuid = market.launch(offer_id=offer.id).launched[0]["uuid"]
    market.advance(2 * 3600)
    market.sim.list_instances()  # one consultation covers the whole boot
    assert market.row(uuid)["state"] == "running"
    assert made == sorted(made) and len(made) <= 8  # register … running and one heartbeat, not one per minute
    made.clear()
    assert sum(share.proofs for share in market.sim.work(10**9, 5 * 3600)) > 0  # five hours of work, which its counter counts
    market.advance(5 * 3600 + 30)
    market.sim.list_instances()
    assert len(made) == 1
    row = market.row(uuid)
    beat = clocks.from_iso(row["last_heartbeat_at"])
    assert made == [beat] and market.clock.now() - timedelta(seconds=60) < beat <= market.clock.now()
    host = next(h for h in market.sim.hosts() if h.offer_id == offer.id)
    assert row["proofs_done"] == int(host.true_rate * 5)  # the proofs it did, not its capacity since running


def test_a_machine_below_the_gate_is_killed_by_its_bench_report_and_idles(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    uuid = market.launch(offer_id=healthy_offer(market, slow=True).id).launched[0]["uuid"]
    for _ in range(4 * 60):
        market.advance(60)
        market.sim.list_instances()
    row = market.row(uuid)
    assert row["state"] == "killed" and row["kill_code"] == "bench_failed" and row["last_heartbeat_at"] is None
    assert market.conn.execute("SELECT source FROM events WHERE uuid = ? AND to_state = 'killed'",
                               (uuid,)).fetchone()[0] == "instance"
    vast = {item.id: item for item in market.sim.list_instances()}[row["vast_id"]]
    assert vast.actual_status == "running"  # it idles, up and billed, until destroyed
    record = market.sim.totals().instances[0]
    assert record["died_at"] is None and record["destroyed_at"] is None and record["gpu_hours"] > 0


def test_two_fleets_on_one_seed_meet_the_same_boot_on_the_same_host(tmp_path):
    """A boot is drawn by host and the host's n-th rental, not by instance id: fleet A rents another host first
    (so its instance ids differ from B's), yet both meet the same boot on the shared host. A second rental of a
    host draws afresh."""
    rates = dataclasses.replace(QUIET, start_failed=0.3, stall=0.3, slow_bench=0.3)
    first, second = make_market(tmp_path / "a", rates=rates), make_market(tmp_path / "b", rates=rates)
    offers = first.sim.search_offers(OfferQuery(min_cpu_ram_gb=0, min_inet_down_mbps=0, limit=500))
    other, shared = offers[0], offers[1]
    first.sim.create_instance(CreateRequest(offer_id=other.id, image="img", disk_gb=150, label="a", onstart="", env={}))
    request = CreateRequest(offer_id=shared.id, image="img", disk_gb=150, label="s", onstart="", env={})
    in_first, in_second = first.sim.create_instance(request), second.sim.create_instance(request)
    assert in_first != in_second
    for market in (first, second):
        market.advance(3 * 3600)
        market.sim.list_instances()

    def seen(market, vast_id):
        record = next(r for r in market.sim.totals().instances if r["vast_id"] == vast_id)
        faults = [(f["at"], f["kind"]) for f in market.sim.faults() if f["vast_id"] == vast_id]
        return record["cost"], record["gpu_hours"], record["died_at"], faults

    assert seen(first, in_first) == seen(second, in_second)
    second.sim.destroy_instance(in_second)
    second.advance(3600)
    again = second.sim.create_instance(request)
    turns = dict(second.conn.execute("SELECT vast_id, turn FROM sim_instances").fetchall())
    assert turns == {in_second: 0, again: 1}


def test_a_market_drawn_by_instance_id_is_refused_not_run_on_with_other_draws(tmp_path):
    """A file whose simulated market is of the schema before (boots drawn by instance id) would change every boot
    on its way if run on: it is refused with the fix, and left as it was."""
    market = make_market(tmp_path, rates=QUIET)
    market.sim.create_instance(CreateRequest(offer_id=healthy_offer(market).id, image="img", disk_gb=150, label="a",
                                             onstart="", env={}))
    market.conn.execute("UPDATE sim_meta SET schema_version = 3")
    before = [tuple(row) for row in market.conn.execute("SELECT * FROM sim_instances")]
    with pytest.raises(VastctlError, match=r"older vastctl \(schema 3\): point VASTCTL_DB at a fresh file"):
        SimProvider(market.conn, lambda at: LocalReports(market.conn, market.config, now=at), clock=market.clock,
                    seed=1, rates=QUIET)
    assert [tuple(row) for row in market.conn.execute("SELECT * FROM sim_instances")] == before


# --- billing ---------------------------------------------------------------------------------------


def test_billing_gpu_and_storage_while_running_storage_while_stopped_nothing_after_destroy(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offer = healthy_offer(market)
    host = next(h for h in market.sim.hosts() if h.offer_id == offer.id)
    vast_id = market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label="vastctl-b",
                                                       onstart="", env={}))
    listed = market.sim.list_instances()[0]
    gpu, storage = listed.raw["dph_base"], listed.raw["storage_total_cost"]
    plan = sim_market.boot_plan(1, host, 0, 0, QUIET, resume=False)  # the host's first rental, first start
    up_at = plan.provision_s + plan.pull_s  # GPU billing starts when the container runs
    market.advance(3 * 3600)
    market.sim.stop_instance(vast_id)
    market.advance(2 * 3600)
    totals = market.sim.totals()
    assert totals.cost == pytest.approx(storage * 5 + gpu * (3 * 3600 - up_at) / 3600, rel=1e-9)
    assert totals.billed_hours == pytest.approx(5) and totals.gpu_hours == pytest.approx(3 - up_at / 3600)
    market.sim.destroy_instance(vast_id)
    market.advance(10 * 3600)
    after = market.sim.totals()
    assert after.cost == pytest.approx(totals.cost) and after.billed_hours == pytest.approx(5)
    assert after.instances[0]["destroyed_at"] == START + timedelta(hours=5)
    assert market.sim.list_instances() == [] and market.sim.show_instance(vast_id) is None


def test_billing_runs_on_after_our_kill_until_the_refused_destroy_lands(tmp_path):
    rates = dataclasses.replace(QUIET, destroy_refused=1.0)
    market = make_market(tmp_path, rates=rates)
    offer = healthy_offer(market)
    refused_s = sim_market.destroy_refused_for(1, offer.machine_id, 0, rates)
    assert refused_s >= 180
    uuid = market.launch(offer_id=offer.id).launched[0]["uuid"]
    market.advance(2 * 3600)
    row, error = operations.kill(market.conn, market.sim, uuid, "operator: test", code=KillCode.OPERATOR, config=market.config,
                                 force=True,
                                 now=market.clock.now())
    assert row["state"] == "killed" and "refused" in error and row["destroyed_at"] is None
    before = market.sim.totals()
    market.advance(refused_s + 1)
    market.reconcile()  # the next pass destroys it again, and now it lands
    assert market.row(uuid)["destroyed_at"] == clocks.to_iso(market.clock.now())
    after = market.sim.totals()
    dph = before.instances[0]["dph_total"]
    assert after.cost - before.cost == pytest.approx(dph * (refused_s + 1) / 3600, rel=1e-6)
    record = after.instances[0]
    assert record["destroy_requested_at"] == START + timedelta(hours=2)
    assert record["destroyed_at"] == market.clock.now()
    assert after.faults["destroy_refused"] == 1


# --- failures --------------------------------------------------------------------------------------


def test_an_exited_machine_is_killed_and_destroyed_by_reconcile_and_its_death_time_recorded(tmp_path):
    market = make_market(tmp_path, rates=dataclasses.replace(QUIET, exit_per_hour=2.0))
    uuid = market.launch(offer_id=healthy_offer(market).id).launched[0]["uuid"]
    for _ in range(10 * 60):
        market.advance(60)
        market.reconcile()
        if market.row(uuid)["destroyed_at"]:
            break
    row = market.row(uuid)
    assert row["state"] == "killed" and row["kill_code"] == "exited" and row["vast_status"] == "exited"
    record = market.sim.totals().instances[0]
    killed = clocks.from_iso(row["killed_at"])
    assert record["died_at"] < killed <= record["died_at"] + timedelta(minutes=3)  # two listings a minute apart
    assert record["destroyed_at"] == killed
    assert market.sim.list_instances() == []


def test_transient_errors_and_truncated_listings_raise_but_the_market_still_moves(tmp_path):
    market = make_market(tmp_path, rates=dataclasses.replace(QUIET, api_error=1.0))
    with pytest.raises(ProviderError, match="HTTP 503"):
        market.sim.search_offers(OfferQuery())
    truncating = make_market(tmp_path / "t", rates=dataclasses.replace(QUIET, truncated_listing=1.0))
    assert truncating.sim.list_instances() == []  # nothing to truncate
    offer = healthy_offer(truncating)
    truncating.sim.create_instance(CreateRequest(offer_id=offer.id, image="i", disk_gb=150, label="vastctl-t",
                                                 onstart="", env={}))
    truncating.advance(3600)
    with pytest.raises(ProviderError, match="partial"):
        truncating.sim.list_instances()
    assert truncating.sim.totals().cost > 0  # billed through the failed call
    assert truncating.sim.totals().faults["truncated_listing"] == 1


def test_a_create_whose_answer_is_lost_may_still_have_rented(tmp_path):
    market = make_market(tmp_path, rates=dataclasses.replace(QUIET, api_error=1.0))
    outcomes = []
    for offer_id in [h.offer_id for h in market.sim.hosts()][:12]:
        request = CreateRequest(offer_id=offer_id, image="i", disk_gb=150, label=f"vastctl-{offer_id}", onstart="",
                                env={})
        try:
            market.sim.create_instance(request)
        except OfferGone:
            continue
        except ProviderError as exc:
            outcomes.append("outcome is unknown" in str(exc))
    rented = market.conn.execute("SELECT count(*) FROM sim_instances").fetchone()[0]
    assert outcomes and all(outcomes) and 0 < rented < len(outcomes)


def test_stop_start_and_a_resume_that_sits_in_scheduling(tmp_path):
    market = make_market(tmp_path, rates=dataclasses.replace(QUIET, scheduling=1.0))
    uuid = market.launch(offer_id=healthy_offer(market).id).launched[0]["uuid"]
    market.advance(3600)
    operations.stop(market.conn, market.sim, uuid, config=market.config, force=True, now=market.clock.now())
    assert market.sim.list_instances()[0].actual_status == "stopped"
    operations.start(market.conn, market.sim, market.config, uuid, now=market.clock.now())
    for _ in range(10):
        market.advance(60)
        market.reconcile()
    row = market.row(uuid)
    assert row["kill_code"] == "scheduling_timeout" and row["vast_status"] == "stopped"
    assert market.sim.totals().faults["scheduling"] == 1
    with pytest.raises(ProviderRejected, match="no such instance"):
        market.sim.start_instance(row["vast_id"])


def test_a_resumed_machine_boots_again_and_registers_as_a_restart(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    uuid = market.launch(offer_id=healthy_offer(market).id).launched[0]["uuid"]
    for _ in range(120):
        market.advance(60)
        market.reconcile()
    assert market.row(uuid)["state"] == "running"
    operations.stop(market.conn, market.sim, uuid, config=market.config, force=True, now=market.clock.now())
    market.advance(3600)
    operations.start(market.conn, market.sim, market.config, uuid, now=market.clock.now())
    for _ in range(30):
        market.advance(60)
        market.reconcile()
    row = market.row(uuid)
    assert row["state"] == "running"  # params kept on disk: back in minutes, not a second fetch
    steps = [r[0] for r in market.conn.execute(
        "SELECT to_state FROM events WHERE uuid = ? AND kind = 'transition' ORDER BY id", (uuid,))]
    assert steps[-5:] == ["launching", "registered", "params_done", "bench_done", "running"]


def test_another_process_advancing_the_market_makes_a_call_fail_like_a_busy_api(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    busy_until = clocks.to_iso(market.clock.now() + timedelta(seconds=60))
    market.conn.execute("UPDATE sim_meta SET busy_by = 'elsewhere:1', busy_until = ?", (busy_until,))
    with pytest.raises(ProviderError, match="busy"):
        market.sim.list_instances()
    market.advance(61)
    assert market.sim.list_instances() == []


def test_no_call_is_made_past_the_deadline_and_the_market_is_left_as_it_was(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offer = healthy_offer(market)
    vast_id = market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label="vastctl-d",
                                                       onstart="", env={}))
    calls = market.conn.execute("SELECT calls, version FROM sim_meta").fetchone()
    market.sim.deadline = market.clock.monotonic()  # the caller's budget is spent
    market.advance(3600)
    for call in (market.sim.list_instances, lambda: market.sim.show_instance(vast_id),
                 lambda: market.sim.search_offers(OfferQuery(limit=3)),
                 lambda: market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150,
                                                                  label="vastctl-e", onstart="", env={})),
                 lambda: market.sim.destroy_instance(vast_id), lambda: market.sim.stop_instance(vast_id),
                 lambda: market.sim.start_instance(vast_id),
                 lambda: market.sim.change_bid(vast_id, 1.0)):
        with pytest.raises(DeadlinePassed, match="not called: the deadline had passed"):
            call()
    assert tuple(market.conn.execute("SELECT calls, version FROM sim_meta").fetchone()) == tuple(calls)
    market.sim.deadline = market.clock.monotonic() + 50
    (listed,) = market.sim.list_instances()
    assert (listed.id, listed.label) == (vast_id, "vastctl-d")  # nothing was destroyed or relabelled


def test_a_reconcile_pass_under_the_sim_stops_calling_at_its_deadline(tmp_path, monkeypatch):
    """As with vast (test_reconcile_faults): a destroy that would start past reconcile.deadline is not made, the pass
    says deadline_passed and leaves it to the next one."""
    rates = dataclasses.replace(QUIET, destroy_refused=1.0)  # the kills' own destroys are refused: left to reconcile
    market = make_market(tmp_path, rates=rates)
    uuids = [market.launch(offer_id=healthy_offer(market).id).launched[0]["uuid"] for _ in range(2)]
    market.advance(2 * 3600)
    for uuid in uuids:
        operations.kill(market.conn, market.sim, uuid, "operator: test", code=KillCode.OPERATOR, config=market.config,
                        force=True, now=market.clock.now())
    vast_ids = [market.row(uuid)["vast_id"] for uuid in uuids]
    hosts = [record["machine_id"] for record in market.sim.totals().instances]
    market.advance(max(sim_market.destroy_refused_for(1, machine_id, 0, rates) for machine_id in hosts) + 1)
    destroy = market.sim.destroy_instance

    def slow_destroy(vast_id):  # each destroy reaches the market 40 s after it is sent: the second one past 50 s
        market.clock.advance(40)
        destroy(vast_id)

    monkeypatch.setattr(market.sim, "destroy_instance", slow_destroy)
    result = market.reconcile()
    assert result.deadline_passed is True
    outcomes = [a["result"] for a in result.actions if a["kind"] == "destroy"]
    assert outcomes[0] == "destroyed" and outcomes[1].startswith("not done: vast DELETE"), outcomes
    assert "reconcile.deadline 50s reached" in result.errors[-1]
    (not_made,) = [a["label"] for a in result.actions if a["kind"] == "destroy" and a["result"].startswith("not done")]
    assert [item.id for item in market.sim.list_instances()] == [  # the second destroy (in label order) was not made
        vast_id for uuid, vast_id in zip(uuids, vast_ids) if market.row(uuid)["label"] == not_made]
    monkeypatch.undo()
    assert market.reconcile().deadline_passed is False  # the next pass, with its own budget, destroys it
    assert market.sim.list_instances() == [] and all(market.row(uuid)["destroyed_at"] for uuid in uuids)


def test_provider_sim_needs_no_key_and_shares_the_state_file(tmp_path):
    config = Config(db=str(tmp_path / "f.db"), provider="sim")
    config.sim.seed, config.sim.failures = 5, "high"
    virtual = VirtualClock(START)
    db.connect(config.db_path, create=True, now=virtual.now()).close()
    provider = get_provider(config, clock=virtual, env={})
    assert isinstance(provider, SimProvider) and provider.seed == 5 and provider.rates == sim_market.FAILURES["high"]
    assert provider.clock is virtual  # the caller's clock: the market runs to its time
    assert provider.search_offers(OfferQuery(limit=3))


# --- a simulated day at the high failure level -----------------------------------------------------


@pytest.fixture(scope="module")
def high_day(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("day"), seed=3, failures="high", hours=24)


def killed_for(market: Market, kind: str) -> list[dict]:
    """The rows of the machines that suffered `kind`."""
    ids = [f["vast_id"] for f in market.sim.faults() if f["kind"] == kind]
    return [dict(r) for r in market.conn.execute(
        f"SELECT * FROM instances WHERE vast_id IN ({', '.join('?' for _ in ids)})", ids)]


@pytest.mark.slow
def test_every_failure_kind_happens_within_a_day_at_the_high_level(high_day):
    faults = high_day.sim.totals().faults
    assert set(faults) == set(FAULT_KINDS)
    assert all(faults[kind] > 0 for kind in FAULT_KINDS), faults


@pytest.mark.slow
@pytest.mark.parametrize("kind, codes, statuses", [
    ("exit", {"exited"}, {"exited"}),
    ("vanish", {"disappeared"}, None),
    ("offline", {"offline"}, {"unknown", "offline"}),
    ("start_failed", {"start_failed"}, {"created"}),
    ("stall", {"timeout_registered"}, {"running"}),
    ("slow_bench", {"timeout_params_done"}, {"running"}),
    ("scheduling", {"scheduling_timeout"}, {"stopped"}),
])
def test_each_failure_shows_up_the_way_vast_shows_it_and_is_handled(high_day, kind, codes, statuses):
    rows = [row for row in killed_for(high_day, kind) if row["kill_code"] in codes]
    assert rows, kind
    for row in rows:
        assert row["state"] == "killed"
        if statuses is not None:
            assert row["vast_status"] in statuses
        if kind == "start_failed":
            assert "OCI runtime create failed" in row["vast_status_msg"]


@pytest.mark.slow
def test_refused_destroys_and_failed_listings_are_retried_until_they_succeed(high_day):
    conn = high_day.conn
    refused = [r for r in killed_for(high_day, "destroy_refused")]
    assert refused and all(r["destroy_attempts"] >= 1 for r in refused)
    assert any(r["destroyed_at"] for r in refused)
    errors = [r["error"] for r in conn.execute("SELECT error FROM vast_listings WHERE ok = 0")]
    assert any("HTTP 503" in e for e in errors) and any("partial" in e for e in errors)
    assert conn.execute("SELECT count(*) FROM vast_listings WHERE ok = 1").fetchone()[0] > 1000


@pytest.mark.slow
def test_a_simulated_day_writes_only_simulated_time(high_day):
    end = clocks.to_iso(high_day.clock.now())
    start = clocks.to_iso(START)
    for table, column in (("events", "at"), ("actions", "at"), ("vast_listings", "at"), ("instances", "created_at"),
                          ("instances", "state_since"), ("instances", "last_heartbeat_at"),
                          ("instances", "killed_at"), ("instances", "destroyed_at"), ("sim_faults", "at"),
                          ("sim_instances", "created_at"), ("sim_instances", "died_at")):
        low, high = high_day.conn.execute(f"SELECT min({column}), max({column}) FROM {table}").fetchone()
        assert low is not None and start <= low <= high <= end, (table, column, low, high)


@pytest.mark.slow
def test_dead_machines_are_recorded_with_their_death_time_and_billing_ends_at_the_destroy(high_day):
    totals = high_day.sim.totals()
    dead = [r for r in totals.instances if r["died_at"] is not None]
    assert dead
    for record in dead:
        assert record["created_at"] <= record["died_at"]
        if record["destroyed_at"] is not None:
            assert record["died_at"] <= record["destroyed_at"]
    assert totals.cost == pytest.approx(sum(r["cost"] for r in totals.instances))
    assert 0 < totals.gpu_hours <= totals.billed_hours


# --- interruptible rentals ---------------------------------------------------------------------------


def test_offers_name_a_min_bid_below_the_on_demand_price_and_a_bid_under_it_rents_nothing(tmp_path):
    market = make_market(tmp_path, rates=QUIET)
    offers = market.sim.search_offers(OfferQuery(limit=500))
    for offer in offers:
        share = (offer.raw["min_bid"] - (offer.dph_total - offer.raw["dph_base"])) / offer.raw["dph_base"]
        assert sim_market.BID_FLOOR[0] - 0.01 <= share <= sim_market.BID_FLOOR[1] + 0.01
    offer = healthy_offer(market)
    with pytest.raises(ProviderRejected, match="min_bid"):
        market.sim.create_instance(CreateRequest(offer_id=offer.id, image="img", disk_gb=150, label="vastctl-low",
                                                 onstart="", env={}, price=round(offer.raw["min_bid"] * 0.9, 4)))
    assert market.sim.list_instances() == []


def test_an_interruptible_machine_bills_its_bid_pauses_when_outbid_and_a_higher_bid_resumes_it(tmp_path):
    rates = dataclasses.replace(QUIET, outbid_per_hour=20.0)  # a rival within minutes of proving
    market = make_market(tmp_path, rates=rates)
    market.config.launch.rental = "interruptible"
    offer = healthy_offer(market)
    row = market.launch(offer_id=offer.id).launched[0]
    request = json.loads(market.conn.execute("SELECT request FROM actions WHERE kind = 'launch'").fetchone()[0])
    assert request["price"] == pytest.approx(round(offer.raw["min_bid"] * 1.1, 4))
    assert market.row(row["uuid"])["bid"] == request["price"] and market.row(row["uuid"])["dph"] == request["price"]
    assert market.row(row["uuid"])["ask_dph"] == offer.dph_total
    for _ in range(8 * 60):
        market.advance(60)
        market.reconcile()
        listed = market.sim.list_instances()
        if listed and listed[0].actual_status == "stopped":
            break
    paused = market.sim.list_instances()[0]
    assert paused.raw["is_bid"] is True and paused.intended_status == "running"  # outbid: vast stopped it
    market.reconcile()
    assert market.row(row["uuid"])["state"] == "running"  # waited for, not killed
    assert market.row(row["uuid"])["outbid_since"] is not None
    # paused: only storage bills
    before = market.sim.totals().cost
    market.advance(300)
    assert market.sim.totals().cost - before == pytest.approx(paused.storage_dph * 300 / 3600, rel=1e-6)
    rival = market.conn.execute("SELECT outbid_price FROM sim_instances").fetchone()[0]
    rebid = operations.rebid(market.conn, market.sim, market.config, row["label"], round(rival + 0.01, 4),
                             actor="operator", reason="outbid", now=market.clock.now())
    assert rebid["bid"] == rebid["dph"] == pytest.approx(rival + 0.01)
    assert clocks.from_iso(rebid["outbid_since"]) == market.clock.now()  # the new bid gets its wait
    audit = market.conn.execute("SELECT ok, request, result FROM actions WHERE kind = 'rebid'").fetchall()
    assert [(r[0], json.loads(r[1])["price"], r[2]) for r in audit] == [(1, pytest.approx(rival + 0.01), "accepted")]
    market.advance(6 * 60)
    market.reconcile()
    resumed = market.sim.list_instances()[0]
    assert resumed.actual_status == "running" and resumed.raw["bid_price"] == pytest.approx(rival + 0.01)
    assert market.row(row["uuid"])["outbid_since"] is None
    beat = clocks.from_iso(market.row(row["uuid"])["last_heartbeat_at"])
    assert market.clock.now() - beat <= timedelta(seconds=60)  # proving again
    assert market.sim.totals().outbids >= 1
    with pytest.raises(ProviderRejected, match="not an interruptible"):
        other = healthy_offer(market)
        vast_id = market.sim.create_instance(CreateRequest(offer_id=other.id, image="img", disk_gb=150,
                                                           label="vastctl-od", onstart="", env={}))
        market.sim.change_bid(vast_id, 0.5)


def test_an_interruptible_machine_proves_only_while_no_rival_bid_for_its_host_is_over_its_own(tmp_path):
    """The rival bids are the market's own (sim_market.rivals: a function of the seed, the host and the hour,
    whoever rents), so the lower bound knows them in hindsight: a machine rented by bid is stopped when one over
    its bid comes, and never proves while one holds the host."""
    rates = dataclasses.replace(QUIET, outbid_per_hour=1.0)
    market = make_market(tmp_path, rates=rates)
    market.config.launch.rental = "interruptible"
    offer = healthy_offer(market)
    market.launch(offer_id=offer.id)
    host = next(h for h in market.sim.hosts() if h.offer_id == offer.id)

    def over(machine, at: float) -> bool:
        held = sim_market.rivals(market.sim.seed, host, at, at + 1e-3, rates)
        return max((r.gpu_bid for r in held if r.at <= at), default=0.0) > machine.gpu_dph

    proving = stopped = 0
    for _ in range(12 * 60):
        market.advance(60)
        market.sim.totals()  # the market advanced to now (not an API call: no fault)
        machine = next(iter(market.sim.engine.machines.values()))
        at = market.clock.now().timestamp()
        if any(m is machine for m in market.sim.engine.proving()):
            proving += 1
            assert not over(machine, at)
        elif machine.proving_since is not None and over(machine, at):
            stopped += 1
            assert machine.actual_status == "stopped" and machine.paused_at is not None
    assert proving > 60 and stopped > 10
    outbids = [row[0] for row in market.conn.execute("SELECT at FROM sim_faults WHERE kind = 'outbid'")]
    assert outbids and all(over(machine, clocks.from_iso(at).timestamp()) for at in outbids)
    with pytest.raises(ProviderRejected, match="never lowered"):  # it pays at least what it was rented at
        market.sim.change_bid(machine.vast_id, round(machine.bid - 0.01, 4))
