"""The dashboard's top row and its folds: is work waiting too long, is money leaking, is anything broken; the
proof router's place; held agent steps folded with their reason; numbered y-axes and the phone's charts."""

from __future__ import annotations

import re
from datetime import timedelta

from helpers.dashboard import Browser, add_step, make_app, register, run_machine, section

from vastctl import clock
from vastctl.facts import demand
from vastctl.serving import dashboard_chart
from vastctl.state import db, settings
from vastctl.views import proof_waits


def card(page: str, ident: str) -> str:
    return page.split(f'id="{ident}"', 1)[1].split('<div class="card', 1)[0].split("</section>", 1)[0]


def status(page: str, ident: str) -> str:
    return re.search(rf'class="card glance (\w+)" id="{ident}"', page).group(1)


def report_queue(app, points):
    """(minutes ago, queued, proofs done in the last hour) demand samples, oldest first."""
    conn, now = app.connection(), clock.SYSTEM.now()
    for minutes, queued, rate in points:
        demand.report(conn, queued, rate, now=now - timedelta(minutes=minutes))


def test_proofs_within_max_wait_come_first_estimated_from_the_demand_samples(signed_in, app):
    # 80 min at 60/h with 20 queued: a 20 min wait (within 45); then 10 min with 120 queued: 2 h (late)
    report_queue(app, [(90, 20, 60.0), (10, 120, 60.0)])
    waits = proof_waits.proof_waits(app.connection(), app.config, clock.SYSTEM.now())
    assert waits["proofs"] == 90.0 and waits["within_share"] == round(80 / 90, 4)
    assert waits["wait_now_s"] == 7200.0 and not waits["stuck_now"]
    page = signed_in.get("/").text
    assert page.index('id="glance"') < page.index('id="summary"')  # the top row comes first
    assert '<span class="big" id="within-max-wait">88.9%</span> done within 45m' in page
    assert "a proof arriving now waits ~2h" in card(page, "glance-waiting")
    assert status(page, "glance-waiting") == "bad"


def test_a_queue_that_drains_in_time_is_green_and_one_nobody_proves_is_red(signed_in, app):
    report_queue(app, [(60, 10, 120.0), (1, 5, 120.0)])
    page = signed_in.get("/").text
    assert '<span class="big" id="within-max-wait">100.0%</span>' in page and status(page, "glance-waiting") == "ok"
    demand.report(app.connection(), 40, 0.0, now=clock.SYSTEM.now())
    page = signed_in.get("/").text
    assert "work queued and no proof done in the last hour" in page and status(page, "glance-waiting") == "bad"


def test_money_shows_spend_today_against_the_daily_limit_and_what_idle_machines_bill(signed_in, app):
    conn, now = app.connection(), clock.SYSTEM.now()
    run_machine(app, "u1", "vastctl-run", 60, 11)
    register(app, "u2", "vastctl-dead", gpu_name="RTX 4090", vast_id=12)
    with db.transaction(conn):
        conn.execute("UPDATE instances SET dph = 0.5")
        conn.execute("UPDATE instances SET vast_status = 'exited' WHERE uuid = 'u2'")
    page = signed_in.get("/").text
    money = card(page, "glance-money")
    assert '<span class="big" id="spend-now">$1.00</span>/h now (limit $10/h)' in money
    assert 'id="idle-lost">$0.50/h</span> killed, dead or missing' in money  # the exited one bills, proves nothing
    assert f"today ({now:%m-%d} UTC) of $240" in money and status(page, "glance-money") == "warn"
    settings.set_value(conn, app.config, "max_daily_spend", 0.5, now=now)  # today + the next hour passes it
    assert status(signed_in.get("/").text, "glance-money") == "bad"


def test_broken_lists_what_to_look_at_and_says_nothing_when_all_answer(signed_in, app, db_path):
    page = signed_in.get("/").text
    broken = card(page, "glance-broken")
    assert "vast never listed: is the reconcile timer running?" in broken
    assert "the agent has not run a step" in broken and status(page, "glance-broken") == "bad"
    conn, now = app.connection(), clock.SYSTEM.now()
    conn.execute("INSERT INTO vast_listings (at, ok, instances) VALUES (?, 1, 0)", (clock.to_iso(now),))
    add_step(conn, now, policy="rules", hold="no work for 3m")
    demand.report(conn, 0, 10.0, now=now)
    page = signed_in.get("/").text
    assert '<span class="big" id="problems">nothing</span>' in page and status(page, "glance-broken") == "ok"
    floor = make_app(db_path)
    floor.config.agent.min_machines = 2  # a floor with no machine warm
    floored = Browser(floor)
    floored.sign_in()
    assert "0 warm machine(s), under agent.min_machines 2" in card(floored.get("/").text, "glance-broken")


def test_the_proof_router_ends_the_top_row_and_its_measured_wait_replaces_the_estimate(signed_in, app):
    from vastctl.facts import deliveries

    page = signed_in.get("/").text
    assert 'id="glance-router"' not in page  # no router ever ran: no card
    conn, now = app.connection(), clock.SYSTEM.now()
    report_queue(app, [(90, 20, 60.0), (10, 120, 60.0)])  # the estimate would say 88.9%
    deliveries.record_calls(conn, [
        {"at": clock.to_iso(now - timedelta(minutes=5)), "kind": "porep", "uuid": "u1", "label": "vastctl-a",
         "result": "completed", "held_ms": held * 1000, "prover_ms": 120_000, "attempt": 1, "size_bytes": 1}
        for held in (0, 60, 60, 3000)])
    deliveries.write_status(conn, {"held": 2, "held_bytes": 9, "oldest_held_s": 125.0, "in_flight": 5,
                                   "provers": [{}]}, now=now)
    page = signed_in.get("/").text
    assert page.index('id="glance-waiting"') < page.index('id="glance-router"')
    router = card(page, "glance-router")
    assert '<span class="big" id="held-calls">2</span> held (oldest 2m) · 5 on provers' in router
    assert 'proof wait p50 <span id="proof-wait">3m</span> · p95 52m · p99 52m (4 calls answered in the last 24 h)' in router
    assert status(page, "glance-router") == "warn"  # calls held, none for long
    assert '<span class="big" id="within-max-wait">75.0%</span> done within 45m' in page
    assert "(24 h, measured)" in card(page, "glance-waiting")
    deliveries.write_status(conn, {"held": 0, "held_bytes": 0, "oldest_held_s": None, "in_flight": 0,
                                   "provers": []}, now=now - timedelta(minutes=5))
    assert "not running" in card(signed_in.get("/").text, "glance-router")


def test_steps_that_changed_nothing_fold_into_one_row_with_the_newest_hold_reason(signed_in, app):
    conn, now = app.connection(), clock.SYSTEM.now()
    add_step(conn, now - timedelta(minutes=20), policy="rules",
             actions='[{"kind": "launch", "gpu_name": "RTX 4090", "reason": "short", "result": "launched"}]')
    for minutes, hold in ((15, "capacity 50 covers 40 wanted"), (10, "capacity 55 covers 45 wanted")):
        add_step(conn, now - timedelta(minutes=minutes), policy="rules", hold=hold)
    add_step(conn, now - timedelta(minutes=5), policy="rules", errors='["llm: HTTP 529"]')
    steps = section(signed_in.get("/").text, "steps").split("</table>", 1)[0]
    rows = steps.split("<tbody>", 1)[1].split("</tr>")[:-1]
    assert len(rows) == 3  # the error, the two held ones as one, the launch
    assert "llm: HTTP 529" in rows[0] and "launch RTX 4090" in rows[2]
    assert 'class="held"' in rows[1] and "2 steps held" in rows[1]
    assert "capacity 55 covers 45 wanted" in rows[1] and "capacity 50 covers" not in rows[1]


def test_charts_number_their_y_axes_and_are_drawn_for_a_phone_too(signed_in, app):
    report_queue(app, [(60, 80, 60.0), (30, 120, 60.0)])
    chart = section(signed_in.get("/").text, "chart")
    wide, narrow = chart.split('<div class="charts narrow">', 1)
    queue_panel = [panel for panel in wide.split("</svg>") if "Queued proofs" in panel][0]
    assert re.findall(r'class="axis y"[^>]*>([^<]+)<', queue_panel) == ["0", "50", "100"]
    assert narrow.count("<svg") == 3 and 'viewBox="-44 -14 388 138"' in narrow
    assert dashboard_chart.y_ticks(11.0) == [0, 5, 10] and dashboard_chart.y_ticks(1.1) == [0, 0.5, 1.0]


def test_a_source_that_reports_only_its_queue_is_judged_by_the_capacity_running(signed_in, app):
    demand.report(app.connection(), 30, None, now=clock.SYSTEM.now())
    waits = proof_waits.proof_waits(app.connection(), app.config, clock.SYSTEM.now())
    assert waits["within_share"] is None and waits["wait_now_s"] is None and not waits["stuck_now"]
    page = signed_in.get("/").text
    assert "work queued and nothing running to prove it" in page and status(page, "glance-waiting") == "bad"
    assert "no proofs done in the last day" in page


def test_the_fleet_table_says_how_long_each_boot_took_and_where_it_went(signed_in, app):
    from vastctl.machine.reports import LocalReports

    register(app, "u9", "vastctl-boot", gpu_name="RTX 4090", vast_id=19)
    reports = LocalReports(app.connection(), app.config, now=clock.SYSTEM.now())
    reports.params_done("u9")
    reports.bench_report("u9", 60)
    reports.running("u9", stages={"fetch": 420, "daemon": 60, "warmup": 95, "bench": 310, "join": 5})
    row = signed_in.get("/").text.split('data-label="vastctl-boot"', 1)[1].split("</tr>", 1)[0]
    assert ('<span class="state running" title="boot 14m: fetch 7m · daemon 1m · warmup 1m · bench 5m · join 5s">'
            'running</span>') in row
