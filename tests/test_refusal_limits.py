"""Every refusal names its limit, those raised inside a launch too (the chosen offer's price or GPU, the spend,
the blocklist): an agent step lists them under `refused` with the limit, never `"limit": null`."""

from __future__ import annotations

import pytest
from test_operations import NOW, FakeMarket, cfg, offer  # noqa: F401 - cfg is a fixture

from vastctl import operations
from vastctl.agent.step import Executor
from vastctl.errors import GuardRefused
from vastctl.guard import Action, Kind
from vastctl.observe import observe
from vastctl.state import blocklist, lifecycle, settings


def submit(conn, config, market, action):
    executor = Executor(conn, market, config, observe(conn, config, now=NOW), NOW, dry_run=False)
    ok, said = executor.submit(action)
    return ok, said, executor


@pytest.mark.parametrize("offered, setting, limit", [
    (offer(21, 210, dph=1.5), None, "max_dph"),
    (offer(22, 220, gpu="RTX 3090"), None, "gpus"),
    (offer(23, 230, dph=0.8), ("max_hourly_spend", "0.5"), "max_hourly_spend"),
])
def test_a_refusal_inside_the_agents_launch_names_its_limit(conn, cfg, offered, setting, limit):
    if setting:
        settings.set_value(conn, cfg, *setting, now=NOW)
    market = FakeMarket(conn, [offered])
    ok, said, executor = submit(conn, cfg, market, Action(kind=Kind.LAUNCH, actor="agent", offer_id=offered.id,
                                                          reason="short of target"))
    assert not ok and said.startswith("refused by the guard")
    assert [(item["kind"], item["offer_id"], item["limit"]) for item in executor.refused] == [
        ("launch", offered.id, limit)]
    assert executor.errors == [] and market.creates() == []
    (row,) = conn.execute("SELECT actor, kind, ok, result FROM actions").fetchall()
    assert (row["actor"], row["ok"]) == ("agent", 0) and row["result"].startswith(f"refused by the guard ({limit})")


def test_a_blocklisted_offer_names_the_blocklist(conn, cfg):
    blocklist.block(conn, 240, "failed its bench", NOW.replace(year=NOW.year + 1))
    market = FakeMarket(conn, [offer(24, 240)])
    ok, _, executor = submit(conn, cfg, market, Action(kind=Kind.LAUNCH, actor="agent", offer_id=24))
    assert not ok and executor.refused[0]["limit"] == "blocklist" and market.creates() == []


def test_the_library_raises_the_limit_for_every_caller(conn, cfg):
    market = FakeMarket(conn, [offer(21, 210, dph=1.5)])
    with pytest.raises(GuardRefused) as info:
        operations.launch(conn, market, cfg, offer_id=21, now=NOW)
    assert info.value.limit == "max_dph" and info.value.exit_code == 4
    lifecycle.register(conn, "u1", label="vastctl-a", now=NOW)
    conn.execute("UPDATE instances SET vast_id = 5, state = 'running', last_heartbeat_at = state_since")
    with pytest.raises(GuardRefused) as info:  # demand unknown: the last machine proving stays
        operations.stop(conn, market, "vastctl-a", config=cfg, actor="agent", now=NOW)
    assert info.value.limit == "never_scale_to_zero"
