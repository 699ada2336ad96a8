"""The page says what it shows: the spend chart's scale fits the spend, a young fleet's age is its age, the router
card tells a file without a router from a router down, and "today" names its date."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from vastctl.serving import dashboard_cards, dashboard_chart

END = datetime(2031, 3, 4, 0, 0, tzinfo=timezone.utc)


def history(spend: float, *, first: datetime | None = None) -> dict:
    start = END - timedelta(hours=24)
    return {"capacity": [(start, 10.0)], "spend": [(start, spend), (END - timedelta(hours=2), spend * 0.5)],
            "target": [(start, 10.0)], "queue": [], "reconcile_failures": [], "start": start, "end": END,
            "first": first}


def spend_panel(chart: str) -> str:
    return [panel for panel in chart.split("</svg>") if "Spend, $/hour" in panel][0]


def test_a_limit_far_above_the_spend_is_named_not_drawn_and_the_axis_fits_the_spend():
    panel = spend_panel(dashboard_chart.chart(history(0.8), {"max_hourly_spend": 10.0}))
    assert "max_hourly_spend $10/h is above this scale" in panel
    assert 'class="line limit"' not in panel
    top = max(float(v) for v in re.findall(r'class="axis y"[^>]*>([0-9.]+)<', panel))
    assert top <= 1.0  # the axis numbers the spend's own range, not 0..10


def test_a_limit_near_the_spend_is_drawn_dashed():
    panel = spend_panel(dashboard_chart.chart(history(6.0), {"max_hourly_spend": 10.0}))
    assert "(dashed: max_hourly_spend)" in panel and 'class="line limit"' in panel


def test_a_young_fleets_chart_names_its_real_age_while_spanning_at_least_an_hour():
    chart = dashboard_chart.chart(history(1.0, first=END - timedelta(minutes=5)), {"max_hourly_spend": 10.0})
    assert "Since the fleet began (5m ago)" in chart


def router(updated_at: str | None, running: bool) -> dict:
    return {"router_running": running, "held": 0, "held_bytes": 0, "oldest_held_s": None, "in_flight": 0,
            "provers": 0, "updated_at": updated_at, "routing": None,
            "proof_wait_last_day": {"calls": 3, "p50_s": 60.0, "p95_s": 120.0, "p99_s": 120.0,
                                    "within_max_wait": 1.0}}


def test_the_router_card_tells_no_router_in_the_file_from_a_router_down():
    never = dashboard_cards._router(router(None, False))
    assert "no router status in this file" in never and 'class="card glance ok"' in never
    down = dashboard_cards._router(router("2031-03-03T23:50:00Z", False))
    assert "not running (its last status, 2031-03-03T23:50:00Z, is over 30 s old)" in down
    assert 'class="card glance bad"' in down


def test_a_past_moment_says_so_and_does_not_refresh_where_a_live_page_does(conn):
    from vastctl.config import from_mapping
    from vastctl.serving import dashboard, dashboard_page

    config = from_mapping({"server": {"admin_token": "a" * 32}})
    data = dashboard.page_data(conn, config, END)
    past = dashboard_page.dashboard_page(data, csrf="x", past=END)
    assert '<span id="past-moment">as of 2031-03-04 00:00 UTC: a past moment, not live</span>' in past
    assert 'data-every="0"' in past
    assert 'id="no-actions"' in past and 'action="/dashboard/kill"' not in past and 'action="/dashboard/settings"' not in past
    live = dashboard_page.dashboard_page(data, csrf="x")
    assert 'id="past-moment"' not in live and f'data-every="{dashboard_page.REFRESH_MS}"' in live
    assert 'action="/dashboard/kill"' in live and 'id="no-actions"' not in live


def test_money_names_the_day_its_today_is():
    data = {"summary": {"spend_per_hour": 0.0, "settings": {"max_daily_spend": 240.0, "max_hourly_spend": 10.0},
                        "destroys_pending": {"count": 0}},
            "cost_day": {"cost": 12.0, "proofs": 100, "cost_per_1000_proofs": 120.0}, "spent_today": 0.0}
    card = dashboard_cards._money(data, END)
    assert '<span id="spent-today">$0.00</span> today (03-04 UTC) of $240' in card


def test_fleet_says_what_a_proof_arriving_now_waits_as_the_dashboard_does(ready, cli, db_path):
    from helpers.dashboard import Browser, make_app

    assert cli("demand", "report", "--queued", "30", "--in-flight", "10", "--proofs-per-hour", "96").code == 0
    view = __import__("json").loads(cli("fleet", "--json").out)
    assert view["work"]["wait_now_s"] == 1500.0  # 40 waiting over 96/h: 25 minutes
    assert view["work"]["source"] == "curio"  # nothing routed: the share is Curio's own counts
    line = next(line for line in cli("fleet").out.splitlines() if line.startswith("work: "))
    assert line.startswith("work: a proof arriving now waits ~25m · ")
    assert line.endswith("done within 45m (24 h, Curio's counts, not measured)")
    browser = Browser(make_app(db_path))
    browser.sign_in()
    card = browser.get("/").text.split('id="glance-waiting"', 1)[1].split("</div>", 1)[0]
    assert "a proof arriving now waits ~25m" in card and "Curio's counts, not measured" in card
