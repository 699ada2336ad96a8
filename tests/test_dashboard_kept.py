"""What the dashboard and /metrics keep between requests (the events read so far, each machine's compiled
billing, the finished machines' sums, the history's rates, the fleet table's rows) never shows a stale figure:
after each change to the file, the page's data and HTML and the scrape's text equal those of a process that
kept nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from vastctl import clock, observe
from vastctl.config import from_mapping
from vastctl.facts import cost, cost_kept
from vastctl.serving import dashboard, dashboard_page, dashboard_tables, metrics
from vastctl.state import lifecycle, settings
from vastctl.state.lifecycle import State
from vastctl.views import fleet, overview, proof_waits

T0 = datetime(2026, 11, 30, 20, 0, tzinfo=timezone.utc)


def launch(conn, label, *, at, dph=0.5):
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=State.LAUNCHING, reason="t", source="operator", now=at,
                     fields={"vast_id": int(label[-4:], 16), "dph": dph, "gpu_name": "RTX 4090", "offer_id": 1})
    return uuid


def run_to(conn, uuid, at):
    for state in (State.REGISTERED, State.PARAMS_DONE, State.BENCH_DONE, State.RUNNING):
        lifecycle.transition(conn, uuid, state, "t", "instance", now=at)


def shown(conn, config, now):
    """The page's data and the scrape's text, as warm (what was kept) and as cold (nothing kept)."""
    def read():
        data = dashboard.page_data(conn, config, now)
        page_html = dashboard_page.dashboard_page(data, csrf="x", flash=None)
        data.pop("observation")
        return repr(data), page_html, metrics.render(conn, config, now)

    warm = read()
    cost_kept._BOOKS.kept.clear()
    overview._MOVES.kept.clear()
    overview._RATES.kept.clear()
    fleet._REPORTS.kept.clear()
    fleet._VIEWS.clear()
    clock.display_iso.cache_clear()
    clock.from_iso.cache_clear()
    dashboard_tables._ROWS.clear()
    proof_waits._STRETCHES.clear()
    observe._KEPT.matching([], {}, 0.0)  # a basis no observation has: emptied
    observe._BENCH_RATES[0] = None
    assert read() == warm
    return warm


def test_the_page_and_the_scrape_after_each_change_are_what_a_cold_process_shows(conn, config):
    config = from_mapping({"server": {"admin_token": "a" * 32}})
    a = launch(conn, "vastctl-aaaa", at=T0)
    run_to(conn, a, T0 + timedelta(minutes=10))
    now = T0 + timedelta(hours=2)
    before = shown(conn, config, now)
    lifecycle.update_fields(conn, a, {"last_heartbeat_at": clock.to_iso(now), "proofs_total": 30,
                                      "proofs_per_hour": 20.0})  # a heartbeat
    assert shown(conn, config, now) != before
    b = launch(conn, "vastctl-bbbb", at=now, dph=0.3)  # a launch: a new row and its first event
    lifecycle.record_event(conn, kind="report", source="instance", reason="restarted", now=now, uuid=b,
                           label="vastctl-bbbb")  # a report that changed something (fleet's last contact)
    shown(conn, config, now + timedelta(minutes=1))
    settings.set_value(conn, config, "target_proofs_per_hour", "120", now=now + timedelta(minutes=2))
    run_to(conn, b, now + timedelta(minutes=3))
    shown(conn, config, now + timedelta(minutes=5))
    lifecycle.kill(conn, a, "t", source="reconcile", code="heartbeat_timeout", now=now + timedelta(minutes=20))
    shown(conn, config, now + timedelta(minutes=21))
    lifecycle.update_fields(conn, a, {"destroyed_at": clock.to_iso(now + timedelta(minutes=22))})
    shown(conn, config, now + timedelta(minutes=30))
    shown(conn, config, T0 + timedelta(days=1, hours=1))  # the next day: today's spend starts again


def test_serves_threads_share_what_is_kept_and_each_reads_the_file_as_it_is(conn, db_path):
    """`serve --threads N`: workers read through their own connections while the file grows; each read of the kept
    account is the account computed afresh through that connection, whatever the others did meanwhile."""
    import threading

    from vastctl.state import db

    now = T0 + timedelta(hours=3)
    for n in range(6):
        run_to(conn, launch(conn, f"vastctl-{n:04x}", at=T0 + timedelta(minutes=n)), T0 + timedelta(minutes=10 + n))
    failures: list[str] = []

    def worker() -> None:
        mine = db.connect(db_path, now=now)
        try:
            for _ in range(15):
                mine.execute("BEGIN")  # both read the same moment of the file
                kept, fresh = cost.account(mine, now=now), cost.afresh(mine, now=now)
                mine.execute("COMMIT")
                if kept != fresh:
                    failures.append(f"{kept} != {fresh}")
                fleet.last_reports(mine)
        finally:
            mine.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for n in range(6, 12):  # the file grows while they read
        run_to(conn, launch(conn, f"vastctl-{n:04x}", at=T0 + timedelta(minutes=n)), T0 + timedelta(minutes=10 + n))
    for thread in threads:
        thread.join()
    assert failures == []
    assert cost.account(conn, now=now) == cost.afresh(conn, now=now)
    assert cost.account(conn, now=now)["machines"] == 12


def test_the_day_moving_past_events_and_samples_shows_what_a_cold_process_shows(conn, config):
    """The history's replay is kept and reused while the day's start moves through the same events, and the proof
    waits' stretches while their samples stay: each page as the day moves on equals a cold one, and the events
    that left the day no longer move the lines."""
    config = from_mapping({"server": {"admin_token": "a" * 32}})
    a = launch(conn, "vastctl-aaaa", at=T0)  # the events in time order, as a live file writes them
    run_to(conn, a, T0 + timedelta(minutes=10))
    settings.set_value(conn, config, "target_proofs_per_hour", "80", now=T0 + timedelta(hours=1))
    b = launch(conn, "vastctl-bbbb", at=T0 + timedelta(hours=2), dph=0.3)
    run_to(conn, b, T0 + timedelta(hours=2, minutes=10))
    lifecycle.update_fields(conn, a, {"proofs_per_hour": 30.0})
    lifecycle.update_fields(conn, b, {"proofs_per_hour": 20.0})
    for minutes in range(0, 30 * 60, 30):  # a demand sample every half hour
        conn.execute("INSERT INTO demand_samples (at, queued, proofs_per_hour, source, ok) VALUES (?, ?, 50, 'report', 1)",
                     (clock.to_iso(T0 + timedelta(minutes=minutes)), minutes % 7))
    conn.commit()
    pages = [shown(conn, config, T0 + timedelta(hours=hours)) for hours in (23, 24.1, 24.3, 26.2, 27)]
    assert len({page[0] for page in pages}) == len(pages)  # the day moved: every page differs
    history = dashboard.page_data(conn, config, T0 + timedelta(hours=27))["history"]
    start = T0 + timedelta(hours=3)
    assert history["start"] == start
    assert all(at >= start for at, _ in history["capacity"] + history["target"] + history["spend"])
    assert history["capacity"][0][1] == 50.0 and history["target"][0][1] == 80.0  # both running, the new target
