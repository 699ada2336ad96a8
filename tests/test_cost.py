"""`vastctl cost`: vastctl's account of what vast billed, checked against the simulated market's own billing.

The market bills in sim_engine.Engine.accrue; the test wraps it to split every billed stretch into the
parts vastctl accounts for (rented, stopped disks, after a destroy was asked for), then compares each part of
`cost.account()` over a simulated day with it. Hand-built rows pin the rules themselves.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vastctl import clock, reconcile
from vastctl.cli.app import Globals
from vastctl.clock import VirtualClock
from vastctl.demo import day as demo_day
from vastctl.demo import setting
from vastctl.facts import cost, cost_kept, deliveries
from vastctl.providers import sim_engine
from vastctl.providers.base import RemoteInstance
from vastctl.state import db, lifecycle
from vastctl.state.lifecycle import State

T0 = datetime(2026, 11, 30, 22, 0, tzinfo=timezone.utc)


def market_truth(monkeypatch) -> dict[int, dict[str, float]]:
    """Wrap the market's billing: vast id → part → $ it billed, split where a destroy was first asked for."""
    per: dict[int, dict[str, float]] = {}
    accrue = sim_engine.Engine.accrue

    def split(self, machine, until):
        start = machine.billed_at
        rate = (machine.gpu_dph * machine.gpu_billed + machine.storage_dph * machine.storage_billed) / 3600
        asked = machine.destroy_requested_at
        cut = until if asked is None else min(max(asked, start), until)
        before = "stopped_storage" if machine.intended_status == "stopped" else "rented"
        for begin, end, part in ((start, cut, before), (cut, until, "after_kill")):
            if end > begin:
                parts = per.setdefault(machine.vast_id, {})
                parts[part] = parts.get(part, 0.0) + (end - begin) * rate
        return accrue(self, machine, until)

    monkeypatch.setattr(sim_engine.Engine, "accrue", split)
    return per


@pytest.fixture(scope="module", params=[9, 3])  # days with a kill that bills after it (destroy refused)
def day(request, tmp_path_factory):
    """A simulated day (the demo's, default failures), the market's billing by part, and vastctl's account. The
    rules' fleet: it stops machines in a lull (the plan destroys what it releases), so every part bills."""
    directory = tmp_path_factory.mktemp(f"cost-day-{request.param}")
    with pytest.MonkeyPatch.context() as patch:
        per = market_truth(patch)
        result = demo_day.run(setting.DemoOptions(hours=24, seed=request.param, policy="rules"), directory)
    conn = db.connect(directory / "demo.db", now=setting.START)
    end = setting.START + timedelta(hours=24)
    figures = cost.account(conn, now=end)
    yield per, figures, result, conn, end
    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("part", cost.PARTS)
def test_each_part_of_the_account_is_within_2_percent_of_what_the_market_billed(day, part):
    per, figures, result, _, _ = day
    truth = sum(parts.get(part, 0.0) for parts in per.values())
    assert truth > 0.05, f"the day must exercise {part}"
    a_minute = setting.demo_config(Path(), result.options).fleet.max_dph / 60  # of the dearest machine it rents
    # the market splits at the first destroy call it received, vastctl at the kill: a destroy that reached the
    # market after the kill (failed, sent again) books the minute between after the kill here, before it there
    assert figures[part] == pytest.approx(truth, rel=0.02, abs=a_minute)


@pytest.mark.slow
def test_the_whole_account_is_within_2_percent_of_the_markets_total_and_its_parts_add_up(day):
    per, figures, result, _, _ = day
    assert figures["cost"] == pytest.approx(result.figures["cost"], rel=0.02)
    assert figures["cost"] == pytest.approx(sum(figures[part] for part in cost.PARTS), abs=0.001)
    assert figures["proofs"] > 0
    assert figures["cost_per_1000_proofs"] == pytest.approx(figures["cost"] / figures["proofs"] * 1000, rel=0.001)


@pytest.mark.slow
def test_a_day_broken_down_by_machine_sums_to_the_whole_and_each_machine_matches_the_market(day):
    per, figures, _, conn, end = day
    by_machine = cost.account(conn, now=end, by="machine")
    assert sum(group["cost"] for group in by_machine["groups"]) == pytest.approx(figures["cost"], abs=0.01)
    labels = {row["label"]: row["vast_id"] for row in conn.execute("SELECT label, vast_id FROM instances")}
    for group in by_machine["groups"]:
        truth = sum(per.get(labels[group["key"]], {}).values())
        assert group["cost"] == pytest.approx(truth, rel=0.05, abs=0.03), group["key"]


# --- the rules, on rows built by hand ---------------------------------------------------------------


def launch(conn, label, *, at, dph=0.5, gpu="RTX 4090", vast_id=None):
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=State.LAUNCHING, reason="t", source="operator", now=at,
                     fields={"vast_id": vast_id or int(label[-4:], 16), "dph": dph, "gpu_name": gpu,
                             "offer_id": 1})
    return uuid


def run_to(conn, uuid, at):
    for state in (State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING):
        lifecycle.transition(conn, uuid, state, "t", "instance", now=at)


def list_stopped(conn, uuid, storage, at):
    """A listing showing the row's machine stopped with its disk price (as reconcile records one)."""
    row = lifecycle.get(conn, uuid)
    rows = [dict(r) for r in conn.execute("SELECT * FROM instances WHERE destroyed_at IS NULL")]
    entries = [RemoteInstance(id=row["vast_id"], label=row["label"], actual_status="stopped",
                              intended_status="stopped", cur_state="stopped", dph_total=row["dph"],
                              storage_dph=storage)]
    reconcile.record_listing(conn, rows, entries, reconcile.match(rows, entries, "vastctl-"), at)


@pytest.fixture
def fleet(conn):
    """A: 2h rented, 1h stopped (disk $0.02/h), killed while stopped, destroy confirmed 30 min later (its disk
    billing to the end: a stopped machine holds no GPU); 100 proofs.
    B: killed during its boot after 1h, never proved, destroyed at once."""
    a = launch(conn, "vastctl-aaaa", at=T0, dph=0.5)
    run_to(conn, a, T0 + timedelta(minutes=30))
    lifecycle.update_fields(conn, a, {"proofs_total": 100})
    lifecycle.transition(conn, a, State.STOPPED, "t", "operator", now=T0 + timedelta(hours=2))
    list_stopped(conn, a, 0.02, T0 + timedelta(hours=2, minutes=1))
    lifecycle.kill(conn, a, "t", source="operator", code="operator", now=T0 + timedelta(hours=3))
    lifecycle.update_fields(conn, a, {"destroyed_at": "2026-12-01T01:30:00.000000Z"})
    reconcile.record_listing(conn, [], [], reconcile.match([], [], "vastctl-"), T0 + timedelta(hours=4))  # gone
    b = launch(conn, "vastctl-bbbb", at=T0 + timedelta(hours=1), dph=0.3, gpu="RTX 5090")
    lifecycle.kill(conn, b, "t", source="reconcile", code="timeout_launching", now=T0 + timedelta(hours=2))
    lifecycle.update_fields(conn, b, {"destroyed_at": "2026-12-01T00:00:00.000000Z"})
    return conn


def test_rented_stopped_and_after_kill_hours_bill_at_their_own_prices(fleet):
    figures = cost.account(fleet, now=T0 + timedelta(hours=5))
    assert figures["rented"] == pytest.approx(2 * 0.5 + 1 * 0.3)
    assert figures["stopped_storage"] == pytest.approx(0.02)  # the disk price, kept after the listing dropped it
    assert figures["after_kill"] == pytest.approx(0.5 * 0.02)  # killed while stopped: its disk price
    assert figures["cost"] == pytest.approx(1.33)
    assert figures["hours"] == {"rented": 3.0, "stopped_storage": 1.0, "after_kill": 0.5}
    assert figures["proofs"] == 100 and figures["cost_per_1000_proofs"] == pytest.approx(1.33 / 100 * 1000, rel=1e-3)
    assert figures["never_proved_cost"] == pytest.approx(0.3) and figures["never_proved_machines"] == 1
    assert figures["never_proved_share"] == pytest.approx(0.3 / 1.33, abs=1e-4)
    assert "invoice is the truth" in figures["source"]


def test_since_keeps_the_window_and_shares_proofs_over_running_time(fleet):
    figures = cost.account(fleet, now=T0 + timedelta(hours=5), since=T0 + timedelta(hours=1, minutes=15))
    assert figures["rented"] == pytest.approx(0.75 * 0.5 + 0.75 * 0.3)
    assert figures["proofs"] == round(100 * 0.75 / 1.5)  # 45 of its 90 running minutes fall in the window


def test_by_gpu_day_and_reason_split_the_same_total(fleet):
    now = T0 + timedelta(hours=5)
    whole = cost.account(fleet, now=now)["cost"]
    gpus = {g["key"]: g["cost"] for g in cost.account(fleet, now=now, by="gpu")["groups"]}
    assert gpus == {"RTX 4090": pytest.approx(1.03), "RTX 5090": pytest.approx(0.3)}
    days = {g["key"]: g["cost"] for g in cost.account(fleet, now=now, by="day")["groups"]}
    assert list(days) == ["2026-11-30", "2026-12-01"]  # split at UTC midnight
    assert days["2026-11-30"] == pytest.approx(2 * 0.5 + 1 * 0.3)
    assert sum(days.values()) == pytest.approx(whole)
    reasons = {g["key"] for g in cost.account(fleet, now=now, by="reason")["groups"]}
    assert reasons == {"operator", "timeout_launching"}


def test_a_killed_row_that_never_rented_costs_nothing_and_the_clock_is_the_callers(conn):
    uuid = launch(conn, "vastctl-cccc", at=T0)
    lifecycle.update_fields(conn, uuid, {"vast_id": None})
    lifecycle.kill(conn, uuid, "t", source="operator", code="operator", now=T0 + timedelta(hours=1))
    assert cost.account(conn, now=T0 + timedelta(hours=9))["cost"] == 0
    live = launch(conn, "vastctl-dddd", at=T0, dph=1.0)
    assert live and cost.account(conn, now=T0 + timedelta(hours=2))["rented"] == pytest.approx(2.0)
    assert cost.account(conn, now=T0 - timedelta(hours=1))["cost"] == 0  # nothing had happened yet


# --- the command ------------------------------------------------------------------------------------


@pytest.fixture
def at_five(monkeypatch):
    monkeypatch.setattr(Globals, "clock", VirtualClock(T0 + timedelta(hours=5)))


def test_cost_json_is_the_library_figures(cli, ready, db_path, at_five):
    conn = db.connect(db_path, now=T0)
    launch(conn, "vastctl-eeee", at=T0, dph=0.4)
    result = cli("cost", "--json", "--by", "gpu")
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert shown == cost.account(conn, now=T0 + timedelta(hours=5), by="gpu")
    assert shown["rented"] == pytest.approx(2.0) and shown["groups"][0]["key"] == "RTX 4090"
    table = cli("cost", "--since", "2h")
    assert table.code == 0 and "vast's invoice is the truth" in table.out and "spent $0.80" in table.out


@pytest.mark.parametrize("args, words", [
    (("--since", "yesterday"), "--since must be a duration like 6h"),
    (("--since", "2030-01-01T00:00:00Z"), "in the future"),
    (("--by", "colour"), "--by must be one of machine, gpu, day, reason"),
])
def test_bad_input_is_one_error_line_and_exit_2(cli, ready, at_five, args, words):
    result = cli("cost", *args)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("error: ") and words in result.err and result.err.count("\n") == 1


# --- the same figures on the page and in /metrics ------------------------------------------------------


def test_the_dashboard_card_and_the_metrics_are_the_same_account(db_path):
    from helpers.dashboard import make_app
    from helpers.prometheus_samples import samples

    from vastctl.serving import dashboard, dashboard_page, metrics, server

    base = make_app(db_path)
    virtual = VirtualClock(T0 + timedelta(hours=5))
    app = server.App(base.config, base.keyring, clock=virtual)
    conn = app.connection()
    uuid = launch(conn, "vastctl-ffff", at=T0, dph=0.4)
    run_to(conn, uuid, T0 + timedelta(hours=1))
    lifecycle.update_fields(conn, uuid, {"proofs_total": 250})
    launch(conn, "vastctl-abcd", at=T0 + timedelta(hours=4), dph=0.3)  # booting: nothing proved
    figures = cost.account(conn, now=virtual.now())
    assert figures["cost"] == pytest.approx(5 * 0.4 + 0.3) and figures["never_proved_cost"] == pytest.approx(0.3)

    data = dashboard.Web(app.config, app.keyring.secrets()[0], app.connection, clock=virtual).data()
    assert data["cost"] == figures
    card = dashboard_page.live_fragment(data)
    assert f'<span class="big" id="cost-total">${figures["cost"]:.2f}</span>' in card
    assert f'<span id="cost-per-1000">${figures["cost_per_1000_proofs"]:.2f}</span> per 1,000 proofs' in card
    assert "vast&#x27;s invoice is the truth" in card

    found = samples(metrics.render(conn, app.config, virtual.now()).decode())
    for part in cost.PARTS:
        assert found[("vastctl_cost_dollars", (("part", part),))] == pytest.approx(figures[part])
    assert found[("vastctl_cost_proofs", ())] == 250
    assert found[("vastctl_cost_per_1000_proofs_dollars", ())] == pytest.approx(figures["cost_per_1000_proofs"])
    assert found[("vastctl_cost_never_proved_dollars", ())] == pytest.approx(0.3)
    assert found[("vastctl_cost_dead_until_detected_dollars", ())] == 0


def test_a_machine_that_died_after_proving_counts_its_undetected_time_as_wasted(conn):
    uuid = launch(conn, "vastctl-9999", at=T0, dph=0.6)
    run_to(conn, uuid, T0 + timedelta(minutes=30))
    lifecycle.update_fields(conn, uuid, {"proofs_total": 80, "last_heartbeat_at": "2026-11-30T23:40:00.000000Z"})
    lifecycle.kill(conn, uuid, "t", source="reconcile", code="exited", now=T0 + timedelta(hours=2))
    lifecycle.update_fields(conn, uuid, {"destroyed_at": "2026-12-01T00:00:00.000000Z"})
    figures = cost.account(conn, now=T0 + timedelta(hours=3))
    assert figures["dead_until_detected_cost"] == pytest.approx(20 / 60 * 0.6)  # 23:40 to its kill at 00:00
    assert figures["never_proved_cost"] == 0
    assert figures["wasted_share"] == pytest.approx(0.2 / figures["cost"], abs=1e-4)


def list_as(conn, uuid, status, at):
    """A listing showing the row's machine with `status` (as reconcile records one)."""
    row = lifecycle.get(conn, uuid)
    rows = [dict(r) for r in conn.execute("SELECT * FROM instances WHERE destroyed_at IS NULL")]
    entries = [RemoteInstance(id=row["vast_id"], label=row["label"], actual_status=status, intended_status="running",
                              cur_state="running", dph_total=row["dph"], storage_dph=0.02)]
    reconcile.record_listing(conn, rows, entries, reconcile.match(rows, entries, "vastctl-"), at)


def test_a_host_gone_offline_bills_after_the_kill_until_the_listing_shows_it_offline(conn):
    """vast bills nothing while a host is offline, but a host goes `unknown` first and bills meanwhile."""
    a = launch(conn, "vastctl-cccc", at=T0, dph=0.6)
    run_to(conn, a, T0)
    list_as(conn, a, "unknown", T0 + timedelta(minutes=50))
    lifecycle.kill(conn, a, "t", source="reconcile", code="offline", now=T0 + timedelta(hours=1))
    list_as(conn, a, "unknown", T0 + timedelta(hours=1, minutes=5))  # still unknown: still billing
    list_as(conn, a, "offline", T0 + timedelta(hours=1, minutes=10))  # from here on, nothing
    list_as(conn, a, "offline", T0 + timedelta(hours=1, minutes=15))  # a later listing changes nothing
    lifecycle.update_fields(conn, a, {"destroyed_at": clock.to_iso(T0 + timedelta(hours=1, minutes=30))})
    assert lifecycle.get(conn, a)["vast_status_since"] == clock.to_iso(T0 + timedelta(hours=1, minutes=10))
    figures = cost.account(conn, now=T0 + timedelta(hours=2))
    assert figures["rented"] == pytest.approx(0.6)
    assert figures["after_kill"] == pytest.approx(0.6 * 10 / 60)


def test_the_proofs_the_router_delivered_from_a_machine_are_its_count_over_what_it_claims(fleet):
    from vastctl.facts import deliveries

    a = "u-vastctl-aaaa"  # claims 100 proofs in its heartbeats
    deliveries.record_calls(fleet, [
        {"at": clock.to_iso(T0 + timedelta(hours=1)), "kind": "porep", "uuid": a, "label": "vastctl-aaaa",
         "result": result, "held_ms": 0, "prover_ms": 60_000, "attempt": 1, "size_bytes": 1}
        for result in ["completed"] * 40 + ["failed"] * 3 + ["dropped"] * 2])
    figures = cost.account(fleet, now=T0 + timedelta(hours=5))
    assert figures["proofs"] == 40  # the router saw 40 proofs come back: failed and dropped calls are not proofs
    assert figures["cost_per_1000_proofs"] == pytest.approx(1.33 / 40 * 1000, rel=1e-3)
    assert cost.proofs_of({"proofs_total": 100}) == 100 and cost.proofs_of({"proofs_total": 100}, {"dropped": 2}) == 0


def test_the_router_calls_appended_between_requests_are_counted_once_each(fleet):
    """The kept account counts the router's calls as they are appended (it does not read them all again at every
    request): after each batch its proofs are the account computed afresh, and calls taken out of the file
    (a restore from a backup) are not counted from memory."""
    from vastctl.facts import deliveries

    a, now = "u-vastctl-aaaa", T0 + timedelta(hours=5)

    def calls(results, request_id):
        deliveries.record_calls(fleet, [
            {"at": clock.to_iso(T0 + timedelta(hours=1)), "request_id": request_id, "kind": "porep", "uuid": a,
             "label": "vastctl-aaaa", "result": result, "held_ms": 0, "prover_ms": 60_000, "attempt": 1,
             "size_bytes": 1} for result in results])

    calls(["completed"] * 10 + ["failed"], "first")
    assert afresh_everywhere(fleet, now)["proofs"] == 10
    calls(["completed"] * 5, "second")
    assert cost.account(fleet, now=now)["proofs"] == 15  # the five appended, on top of the ten already counted
    assert afresh_everywhere(fleet, now)["proofs"] == 15
    fleet.execute("DELETE FROM proof_calls WHERE request_id = 'second'")
    assert cost.account(fleet, now=now)["proofs"] == 10
    assert afresh_everywhere(fleet, now)["proofs"] == 10


@pytest.mark.slow
def test_the_whole_account_kept_for_destroyed_machines_is_the_account_computed_afresh(day):
    """The dashboard's and /metrics' account keeps each destroyed machine's figures between scrapes: the same
    figures as the windowed path computes from every piece, scrape after scrape, and a machine whose count
    changed is read again (the day's proofs are the router's calls: its proof_calls rows)."""
    _per, figures, _result, conn, end = day
    afresh = cost.account(conn, now=end, since=setting.START - timedelta(days=1))
    assert {k: v for k, v in figures.items() if k != "since"} == {k: v for k, v in afresh.items() if k != "since"}
    assert cost.account(conn, now=end) == figures  # the second scrape, from what was kept
    uuid = conn.execute("SELECT uuid FROM instances WHERE destroyed_at IS NOT NULL AND proofs_total > 0"
                        " AND uuid IN (SELECT uuid FROM proof_calls) LIMIT 1").fetchone()[0]
    at = clock.to_iso(end - timedelta(hours=1))
    deliveries.record_calls(conn, [{"at": at, "request_id": "another", "kind": "porep", "uuid": uuid,
                                    "result": "completed", "held_ms": 0, "prover_ms": 1000, "attempt": 1,
                                    "size_bytes": 1}] * 1000)
    try:
        assert cost.account(conn, now=end)["proofs"] == figures["proofs"] + 1000
    finally:
        conn.execute("DELETE FROM proof_calls WHERE request_id = 'another'")


# --- the account kept between requests ---------------------------------------------------------------


def afresh_everywhere(conn, now):
    """The kept account (the dashboard's and /metrics') equals the piece-by-piece one, for every window they show,
    and a cold process (nothing kept) says the same."""
    windows = (None, now - timedelta(hours=24), cost.day_start(now), now - timedelta(minutes=90))
    kept = [cost.account(conn, now=now, since=since) for since in windows]
    assert kept == [cost.afresh(conn, now=now, since=since) for since in windows]
    cost_kept._BOOKS.kept.clear()
    assert kept == [cost.account(conn, now=now, since=since) for since in windows]
    return kept[0]


def test_the_account_kept_between_requests_follows_every_change_to_the_file(fleet):
    """Heartbeats, a counter's growth, a kill, a destroy, a listed disk price, a new machine and a new day: after
    each, the kept figures are the figures computed afresh (a kept figure that went stale would differ here)."""
    now = T0 + timedelta(hours=5)
    c = launch(fleet, "vastctl-cccc", at=T0 + timedelta(hours=4), dph=0.8)
    run_to(fleet, c, T0 + timedelta(hours=4, minutes=10))
    first = afresh_everywhere(fleet, now)
    later = afresh_everywhere(fleet, now + timedelta(minutes=7))  # the same file, later: c billed 7 more minutes
    assert later["rented"] == pytest.approx(first["rented"] + 0.8 * 7 / 60, abs=1e-4)
    lifecycle.update_fields(fleet, c, {"proofs_total": 40, "last_heartbeat_at": clock.to_iso(now)})  # a heartbeat
    assert afresh_everywhere(fleet, now)["proofs"] == 140
    lifecycle.transition(fleet, c, State.STOPPED, "t", "operator", now=now + timedelta(minutes=10))
    list_stopped(fleet, c, 0.05, now + timedelta(minutes=11))
    afresh_everywhere(fleet, now + timedelta(minutes=30))
    lifecycle.kill(fleet, c, "t", source="operator", code="operator", now=now + timedelta(minutes=40))
    afresh_everywhere(fleet, now + timedelta(minutes=50))
    lifecycle.update_fields(fleet, c, {"destroyed_at": clock.to_iso(now + timedelta(minutes=55))})
    gone = afresh_everywhere(fleet, now + timedelta(hours=1))
    assert afresh_everywhere(fleet, now + timedelta(hours=3))["cost"] == gone["cost"]  # all billing over: fixed
    d = launch(fleet, "vastctl-dddd", at=now + timedelta(hours=1), dph=0.2)
    run_to(fleet, d, now + timedelta(hours=1, minutes=5))
    next_day = T0 + timedelta(days=1, hours=3)  # past 00:00 UTC: today's window starts again
    assert afresh_everywhere(fleet, next_day)["machines"] == 4
    fleet.execute("UPDATE instances SET proofs_total = 7 WHERE uuid = ?", (c,))  # a finished machine's row edited
    assert afresh_everywhere(fleet, next_day)["proofs"] == 100 + 7
    assert cost.account(fleet, now=now - timedelta(hours=2))["cost"] == cost.afresh(fleet, now=now - timedelta(hours=2))["cost"]


def test_another_file_at_the_same_path_is_read_afresh(tmp_path):
    """A file replaced at its path (a restore, a new `init`) shares nothing with what was kept for the old one."""
    path = tmp_path / "swap.db"
    conn = db.connect(path, create=True, now=T0)
    a = launch(conn, "vastctl-aaaa", at=T0, dph=0.5)
    run_to(conn, a, T0 + timedelta(minutes=10))
    now = T0 + timedelta(hours=2)
    assert cost.account(conn, now=now)["rented"] == pytest.approx(1.0)
    conn.close()
    path.unlink()
    conn = db.connect(path, create=True, now=T0)
    b = launch(conn, "vastctl-aaaa", at=T0 + timedelta(hours=1), dph=0.3)  # the same label, another machine
    lifecycle.transition(conn, b, State.REGISTERED, "t", "instance", now=T0 + timedelta(hours=1, minutes=5))
    assert cost.account(conn, now=now) == cost.afresh(conn, now=now)
    assert cost.account(conn, now=now)["rented"] == pytest.approx(0.3)
    conn.close()
