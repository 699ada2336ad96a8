"""markets.get_provider is the one way a market is obtained: a patch of that one name reaches every command."""

from __future__ import annotations

import os
import sqlite3

import pytest

from vastctl import clock
from vastctl import config as config_module
from vastctl.errors import Unavailable
from vastctl.serving import dashboard, webhooks
from vastctl.state import db

SAYS = "the patched market"


class Patched:
    """markets.get_provider replaced: records who asked, with which config and clock, and refuses."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, config, *, clock, **options):
        self.calls.append((config.db_path, clock))
        raise Unavailable(SAYS)


@pytest.fixture
def patched(monkeypatch):
    fake = Patched()
    monkeypatch.setattr("vastctl.markets.get_provider", fake)
    return fake


@pytest.fixture
def fleet(cli, tmp_path, monkeypatch):
    """A state file with one running machine that has a vast instance, and a config launch accepts."""
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\nlaunch:\n  vastctl_source: vastctl\n  install: ./install-provers.sh\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    assert cli("init").code == 0
    for args in (["register", "--uuid", "u1", "--label", "vastctl-a", "--gpu", "RTX 4090"],
                 ["params-done", "--uuid", "u1"], ["bench-report", "--uuid", "u1", "--rate", "60"],
                 ["running", "--uuid", "u1"], ["demand", "report", "--queued", "0"]):
        assert cli(*args).code == 0, args
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:
        raw.execute("UPDATE instances SET vast_id = 4242 WHERE uuid = 'u1'")


@pytest.mark.parametrize("args", [
    ["agent-step"],
    ["reconcile"],
    ["offers"],
    ["launch", "--gpu", "RTX 4090"],
    ["stop", "vastctl-a"],
    ["start", "vastctl-a"],
    ["kill", "vastctl-a", "--reason", "stuck"],
], ids=lambda args: args[0])
def test_every_command_that_needs_a_market_obtains_it_through_markets_get_provider(fleet, cli, db_path, patched, args):
    result = cli(*args)
    assert (result.code, result.err.strip().splitlines()[-1]) == (1, f"error: {SAYS}")
    assert [path for path, _ in patched.calls] == [db_path]


def test_the_webhook_wake_obtains_its_market_through_markets_get_provider(fleet, db_path, patched):
    virtual = clock.VirtualClock(clock.parse_iso("2026-06-01T00:00:00Z"))
    result = webhooks.Waker(config_module.load(), clock=virtual).run_wake(["evt-1"])
    assert result.errors == [f"cannot reach vast: {SAYS}"] and (result.passes, result.steps) == (0, 0)
    assert patched.calls == [(db_path, virtual)]


def test_the_dashboards_kill_obtains_its_market_through_markets_get_provider(fleet, db_path, patched):
    config = config_module.load()
    conn = db.connect(config.db_path, now=clock.SYSTEM.now())
    web = dashboard.Web(config, b"s" * 32, lambda: conn, clock=clock.SYSTEM)
    with pytest.raises(Unavailable, match=SAYS):
        web.act("/dashboard/kill", {"instance": "vastctl-a", "reason": "stuck"})
    assert patched.calls == [(db_path, clock.SYSTEM)]
    assert conn.execute("SELECT state FROM instances WHERE uuid = 'u1'").fetchone()["state"] == "running"
    conn.close()


def test_without_a_patch_the_commands_build_the_configured_market(fleet, cli):
    result = cli("offers")
    assert result.code == 2 and result.err.strip().splitlines()[-1].startswith("error: no vast.ai API key")
