"""GET /metrics: Prometheus text that its own parser reads, the values the file holds, the tokens, the alert rules."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from helpers.dashboard import ADMIN, Browser, add_step, make_app, register
from helpers.prometheus_samples import samples

from vastctl import clock
from vastctl.errors import BenchFailed
from vastctl.facts import cost
from vastctl.machine.reports import LocalReports
from vastctl.state import db, lifecycle, settings

ALERTS = Path(__file__).resolve().parent.parent / "jobs" / "prometheus-alerts.yml"
METRICS_TOKEN = "metrics-token-0123456789abcdef"


@pytest.fixture
def app(db_path):
    return make_app(db_path, metrics_token=METRICS_TOKEN)


def scrape(app, token: str | None = METRICS_TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Browser(app).get("/metrics", headers=headers)


def populated(app):
    """A fleet with a bit of everything each metric reads."""
    conn, cfg = app.connection(), app.config
    now = clock.SYSTEM.now()
    reports = LocalReports(conn, cfg, now=clock.SYSTEM.now())
    for n, (uuid, rate) in enumerate((("u1", 50.0), ("u2", 70.0))):
        register(app, uuid, f"vastctl-run{n}", gpu_name="RTX 4090", vast_id=100 + n)
        reports.params_done(uuid)
        reports.bench_report(uuid, rate)
        reports.running(uuid)
    register(app, "u3", "vastctl-boot", gpu_name="RTX 4090", vast_id=103)
    register(app, "u4", "vastctl-dead", gpu_name="RTX 4090", vast_id=104)
    lifecycle.kill(conn, "u4", "vast says exited", source="reconcile", code="exited", now=now - timedelta(minutes=20))
    register(app, "u5", "vastctl-slow", gpu_name="RTX 4090")
    reports.params_done("u5")
    with pytest.raises(BenchFailed):
        reports.bench_report("u5", 10)  # below the gate: killed bench_failed
    with db.transaction(conn):
        conn.execute("UPDATE instances SET dph = 0.5 WHERE uuid IN ('u1', 'u2', 'u3')")
        conn.execute("UPDATE instances SET destroyed_at = killed_at WHERE uuid = 'u5'")
    settings.set_value(conn, cfg, "target_proofs_per_hour", 300, now=clock.SYSTEM.now())
    settings.set_value(conn, cfg, "max_hourly_spend", 1.25, now=clock.SYSTEM.now())
    conn.execute("INSERT INTO vast_listings (at, ok, instances) VALUES (?, 1, 4)",
                 (clock.to_iso(now - timedelta(minutes=12)),))
    for minutes in (8, 4):
        conn.execute("INSERT INTO vast_listings (at, ok, error) VALUES (?, 0, 'HTTP 502')",
                     (clock.to_iso(now - timedelta(minutes=minutes)),))
    conn.execute("INSERT INTO demand_samples (at, queued, source, ok, error) VALUES (?, NULL, 'command', 0, 'timeout')",
                 (clock.to_iso(now - timedelta(minutes=3)),))
    conn.execute("INSERT INTO demand_samples (at, queued, in_flight, lookahead, proofs_per_hour, source, ok)"
                 " VALUES (?, 42, 7, 3, 250, 'report', 1)",
                 (clock.to_iso(now - timedelta(minutes=2)),))
    add_step(conn, now - timedelta(minutes=6), input_tokens=1000, output_tokens=100, cache_read_tokens=800,
             cache_write_tokens=50, cost=0.01, refused=json.dumps([{"kind": "destroy", "why": "x"}, {"kind": "stop"}]))
    add_step(conn, now - timedelta(minutes=1), input_tokens=500, output_tokens=50, cost=0.005, outcome="skipped",
             refused="not json")
    return now


def test_metrics_parse_and_hold_the_files_figures(app):
    now = populated(app)
    answer = scrape(app)
    assert answer.status == 200 and answer.header("Content-Type").startswith("text/plain; version=0.0.4")
    got = samples(answer.text)
    assert got[("vastctl_machines", (("state", "running"),))] == 2
    assert got[("vastctl_machines", (("state", "registered"),))] == 1
    assert got[("vastctl_machines", (("state", "killed"),))] == 1  # u4 awaits its destroy; u5 is gone
    assert got[("vastctl_machines", (("state", "stopped"),))] == 0
    assert got[("vastctl_capacity_proofs_per_hour", ())] == 120
    assert got[("vastctl_pending_capacity_proofs_per_hour", ())] == 50  # u3 at the median bench seen: 10, 50, 70
    assert got[("vastctl_target_proofs_per_hour", ())] == 300
    assert got[("vastctl_spend_dollars_per_hour", ())] == 1.5
    assert got[("vastctl_max_hourly_spend_dollars_per_hour", ())] == 1.25
    assert got[("vastctl_max_daily_spend_dollars", ())] == 240 and got[("vastctl_min_machines", ())] == 0
    assert got[("vastctl_warm_machines", ())] == 3  # the two running and the one booting; not the dead one
    spent = cost.spent_today(app.connection(), now=clock.SYSTEM.now())
    assert got[("vastctl_spent_today_dollars", ())] == pytest.approx(spent, abs=0.01)
    assert got[("vastctl_demand_queued", ())] == 42 and got[("vastctl_demand_proofs_per_hour", ())] == 250
    assert got[("vastctl_demand_in_flight", ())] == 7 and got[("vastctl_demand_lookahead", ())] == 3
    assert got[("vastctl_demand_known", ())] == 1 and 100 <= got[("vastctl_demand_age_seconds", ())] <= 200
    assert got[("vastctl_kills_total", (("code", "bench_failed"),))] == 1
    assert got[("vastctl_kills_total", (("code", "exited"),))] == 1
    listed = got[("vastctl_reconcile_last_success_timestamp_seconds", ())]
    assert abs(listed - (now - timedelta(minutes=12)).timestamp()) < 1
    assert got[("vastctl_reconcile_consecutive_failures", ())] == 2
    assert got[("vastctl_reconcile_failures_last_day", ())] == 2 and got[("vastctl_reconcile_passes_last_day", ())] == 3
    assert got[("vastctl_destroys_pending", ())] == 1
    assert 20 * 60 - 5 <= got[("vastctl_destroy_pending_oldest_age_seconds", ())] <= 21 * 60
    assert got[("vastctl_agent_steps_total", (("outcome", "ok"),))] == 1
    assert got[("vastctl_agent_steps_total", (("outcome", "skipped"),))] == 1
    assert got[("vastctl_agent_tokens_total", (("kind", "input"),))] == 1500
    assert got[("vastctl_agent_tokens_total", (("kind", "cache_write"),))] == 50
    assert got[("vastctl_agent_cost_dollars_total", ())] == pytest.approx(0.015)
    assert got[("vastctl_agent_refused_actions_total", ())] == 2  # the unparsable list counts as none


def test_a_new_file_exports_zeros_and_unknown_demand(app):
    got = samples(scrape(app).text)
    assert got[("vastctl_reconcile_last_success_timestamp_seconds", ())] == 0  # never: `time() - x` alerts fire
    assert got[("vastctl_demand_known", ())] == 0 and math.isnan(got[("vastctl_demand_queued", ())])
    assert math.isnan(got[("vastctl_demand_in_flight", ())]) and math.isnan(got[("vastctl_demand_lookahead", ())])
    assert got[("vastctl_agent_cost_dollars_total", ())] == 0 and got[("vastctl_agent_refused_actions_total", ())] == 0


@pytest.mark.parametrize("token", [ADMIN, METRICS_TOKEN])
def test_either_token_reads_metrics(app, token):
    assert scrape(app, token).status == 200


@pytest.mark.parametrize("token", [None, "wrong-token", METRICS_TOKEN + "x"])
def test_metrics_need_a_token(app, token):
    answer = scrape(app, token)
    assert answer.status == 401 and answer.header("WWW-Authenticate") == 'Bearer realm="vastctl"'
    assert "vastctl_" not in answer.text


def error_of(answer) -> str:
    """The message of a JSON error answer (as the machines' API gives them)."""
    assert answer.header("Content-Type") == "application/json"
    body = json.loads(answer.text)
    assert list(body) == ["error"]
    return body["error"]


def test_metrics_errors_are_json_like_the_rest_of_the_api(app, db_path):
    assert "Authorization: Bearer" in error_of(scrape(app, "wrong-token"))
    assert "set server.metrics_token" in error_of(scrape(make_app(db_path, admin_token=""), "anything"))
    wrong = Browser(app).post("/metrics", {})
    assert wrong.status == 405 and wrong.header("Allow") == "GET" and "use GET here" in error_of(wrong)


def test_a_session_cookie_is_not_a_metrics_token(app):
    browser = Browser(app)
    browser.sign_in()
    assert browser.get("/metrics").status == 401


def test_metrics_are_disabled_without_any_token(db_path):
    app = make_app(db_path, admin_token="")
    assert scrape(app, "anything").status == 403


def test_metrics_only_token_from_config_alone(db_path):
    app = make_app(db_path, admin_token="", metrics_token=METRICS_TOKEN)
    assert scrape(app).status == 200
    assert Browser(app).get("/").status == 403  # the dashboard still needs the admin token


def test_alert_rules_are_yaml_naming_only_exported_metrics(app):
    populated(app)
    exported = {name for name, _ in samples(scrape(app).text)}
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == {"VastctlReconcileStale", "VastctlCapacityBelowTarget",
                                                 "VastctlDestroyPending", "VastctlSpendAboveLimit",
                                                 "VastctlDailySpendHigh", "VastctlBelowMinMachines"}
    for rule in rules:
        named = set(re.findall(r"\bvastctl_[a-z0-9_]+", rule["expr"]))
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)
        in_text = set(re.findall(r"\bvastctl_[a-z0-9_]+", json.dumps(rule["annotations"])))
        assert in_text <= exported, (rule["alert"], in_text - exported)
    by_name = {rule["alert"]: rule for rule in rules}
    assert by_name["VastctlCapacityBelowTarget"]["for"] == "30m"
    assert "> 600" in by_name["VastctlReconcileStale"]["expr"]
    assert "> 900" in by_name["VastctlDestroyPending"]["expr"]


@pytest.mark.slow
def test_instance_commands_and_help_load_no_dashboard_or_metrics_code(cli):
    cli("init")
    code = (
        "import sys; from vastctl.cli import main\n"
        "for args in (['--help'], ['register', '--uuid', 'u1', '--label', 'vastctl-a'], ['heartbeat', '--uuid', 'u1'],"
        " ['fleet', '--json']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "loaded = sorted(m for m in ('prometheus_client', 'vastctl.serving.dashboard', 'vastctl.serving.dashboard_page',"
        " 'vastctl.serving.metrics', 'vastctl.views.overview') if m in sys.modules)\n"
        "print('loaded=' + ','.join(loaded))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "loaded="
