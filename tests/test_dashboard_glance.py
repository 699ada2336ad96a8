"""The dashboard read at a glance: vastctl's own why, vast's message behind a detail, named demand figures,
skipped steps folded away, UTC time ticks, a young fleet's chart, the demo chart's colours."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from html import unescape
from pathlib import Path

from helpers.dashboard import XSS, add_step, register, section

from vastctl import clock
from vastctl.demo import chart
from vastctl.facts import demand
from vastctl.serving import dashboard_chart, dashboard_page
from vastctl.state import db, lifecycle
from vastctl.views import overview

CSS = Path(dashboard_page.__file__).resolve().parent / "static" / "dashboard.css"


def fleet_row(page: str, label: str) -> list[str]:
    row = section(page, "fleet").split(f'data-label="{label}">', 1)[1].split("</tr>", 1)[0]
    return re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)


def test_why_is_vastctls_own_reason_and_vasts_message_is_a_detail(signed_in, app):
    conn = app.connection()
    register(app, "u1", "vastctl-ok", gpu_name="RTX 4090", vast_id=11)
    register(app, "u2", "vastctl-gone", gpu_name="RTX 4090", vast_id=12)
    with db.transaction(conn):
        lifecycle.update_fields(conn, "u1", {"vast_status": "exited",
                                             "vast_status_msg": f"success, running nvidia/cuda:12 {XSS}"})
    lifecycle.kill(conn, "u2", "bench failed: 12 proofs/h", source="instance", code="bench_failed",
                   now=clock.SYSTEM.now())
    add_step(conn, clock.SYSTEM.now(), policy="rules", refused=json.dumps(
        [{"kind": "kill", "label": "vastctl-ok", "limit": "never_scale_to_zero", "why": "the last machine proving"}]))
    page = signed_in.get("/").text
    label, state, vast, *_, why, _kill = fleet_row(page, "vastctl-ok")
    assert unescape(why) == ("kill refused [never_scale_to_zero]: the last machine proving"
                             " · registered here but vast says exited")
    assert "nvidia" not in why
    details = re.fullmatch(r'<details class="vastmsg" data-key="vastmsg u1"><summary>exited <span class="note">#11'
                           r'</span></summary><span class="msg">(.*)</span></details>', vast)
    assert details and unescape(details.group(1)) == f"success, running nvidia/cuda:12 {XSS}"
    assert XSS not in page
    assert unescape(fleet_row(page, "vastctl-gone")[-2]) == "bench failed: 12 proofs/h"


def test_the_demand_card_names_each_figure(signed_in, app):
    conn = app.connection()
    demand.report(conn, 12, 40.0, now=clock.SYSTEM.now(), in_flight=3, lookahead=25)
    card = section(signed_in.get("/").text, "summary").split("<h3>Demand</h3>", 1)[1].split("</div>", 1)[0]
    text = unescape(re.sub(r"<[^>]+>", "", card))
    assert "12 queued · 3 in flight · 25 look-ahead" in text
    assert "40 finished in the last hour" in text
    demand.report(conn, 7, None, now=clock.SYSTEM.now())
    card = section(signed_in.get("/").text, "summary").split("<h3>Demand</h3>", 1)[1].split("</div>", 1)[0]
    text = unescape(re.sub(r"<[^>]+>", "", card))
    assert "7 queued · in flight not reported · look-ahead not reported" in text
    assert "- finished in the last hour" in text


def test_skipped_steps_are_folded_away(signed_in, app):
    conn = app.connection()
    now = clock.SYSTEM.now()
    add_step(conn, now - timedelta(minutes=3), policy="rules", outcome="ok", cost=0.5)
    for minute in (2, 1):
        add_step(conn, now - timedelta(minutes=minute), policy="rules", outcome="skipped")
    steps = section(signed_in.get("/").text, "steps")
    shown, folded = steps.split('<details class="skipped"', 1)
    # head + the step that ran (it changed nothing: a held row, with why)
    assert shown.count("<tr") == 2 and 'class="held"' in shown and ">skipped<" not in shown
    assert "2 skipped steps (nothing new since the step before)" in folded
    assert folded.count(">skipped<") == 2


def test_no_skipped_steps_no_fold(signed_in, app):
    add_step(app.connection(), clock.SYSTEM.now(), policy="rules")
    assert '<details class="skipped"' not in signed_in.get("/").text


def test_times_are_utc(signed_in, app):
    now = clock.SYSTEM.now()
    register(app, "u1", "vastctl-one")
    add_step(app.connection(), now, policy="rules")
    page = signed_in.get("/").text
    assert "Latest events (times UTC)" in page and "Agent steps (times UTC)" in page
    stamps = re.findall(r'<time datetime="([^"]+)" title="[^"]+">([^<]+)</time>', page)
    assert stamps
    for iso, shown in stamps:
        assert iso.endswith("Z") and shown == clock.from_iso(iso).astimezone(timezone.utc).strftime("%H:%M:%S") \
            or shown == clock.from_iso(iso).astimezone(timezone.utc).strftime("%m-%d %H:%M")


def chart_of(app, now: datetime) -> str:
    data = overview.overview(app.connection(), app.config, now)
    return dashboard_chart.chart(data["history"], data["summary"]["settings"])


def test_a_young_fleets_chart_spans_its_life_with_time_ticks(app):
    now = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)
    lifecycle.create(app.connection(), uuid="u1", label="vastctl-a", state="launching", reason="launch",
                     source="operator", now=now - timedelta(minutes=40), fields={"dph": 0.5, "gpu_name": "RTX 4090"})
    chart = chart_of(app, now)
    assert "Since the fleet began (40m ago)" in chart  # its age; the span is at least an hour, not a sliver
    assert re.findall(r'class="axis time"[^>]*>([^<]+)<', chart)[:3] == ["11:10", "11:20", "11:30"]


def test_a_day_old_fleets_chart_is_the_last_day_ticked_every_three_hours(app):
    now = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)
    lifecycle.create(app.connection(), uuid="u1", label="vastctl-a", state="launching", reason="launch",
                     source="operator", now=now - timedelta(hours=30), fields={"dph": 0.5, "gpu_name": "RTX 4090"})
    chart = chart_of(app, now)
    assert "Last 24 hours · UTC" in chart
    first_panel = chart.split("</svg>")[0]
    assert re.findall(r'class="axis time"[^>]*>([^<]+)<', first_panel) == [
        "15:00", "18:00", "21:00", "00:00", "03:00", "06:00", "09:00"]


def test_the_charts_colours_are_the_demo_charts():
    css = CSS.read_text()
    for name in ("target", "capacity", "queue", "spend"):
        assert f"svg polyline.{name} {{ stroke: {chart.CHART_COLOURS[name]}; }}" in css
