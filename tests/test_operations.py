"""launch / stop / start / kill against a fake market: rows written first, limits, blocklist, audit."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import responses
from helpers.operations_market import NOW, FakeMarket, actions, live_row, offer, rows

from vastctl import clock, launches, operations
from vastctl.agent.step import Executor
from vastctl.errors import BadInput, GuardRefused, Refused, Unavailable
from vastctl.guard import Action, Kind
from vastctl.machine import onstart
from vastctl.observe import observe
from vastctl.providers.base import OfferGone, ProviderError, ProviderRejected, RemoteInstance
from vastctl.providers.vast import VastProvider
from vastctl.state import blocklist, lifecycle, settings, tokens
from vastctl.state.lifecycle import KillCode, State

# --- launch -------------------------------------------------------------------------------------------


def test_launch_writes_the_row_before_create_and_passes_env(conn, cfg):
    market = FakeMarket(conn, [offer(11, 110, 0.5), offer(10, 100, 0.3)])
    market.offers.sort(key=lambda o: o.dph_total)
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", now=NOW)
    assert result.error is None and len(result.launched) == 1
    before = market.rows_at_create[0]
    assert len(before) == 1 and before[0]["state"] == "launching" and before[0]["vast_id"] is None
    row = rows(conn)[0]
    assert row["label"] == before[0]["label"] and row["label"].startswith("vastctl-") and len(row["label"]) == 16
    assert (row["state"], row["vast_id"], row["offer_id"], row["machine_id"], row["gpu_name"], row["num_gpus"],
            row["dph"]) == ("launching", 1001, 10, 100, "RTX 4090", 1, 0.3)
    request = market.creates()[0]
    secret = tokens.read_secret(cfg.secret_path)
    assert request.offer_id == 10 and request.label == row["label"]
    assert request.image == "ghcr.io/x/cuzk:1" and request.disk_gb == 150
    assert request.env == {"CURIO_DB_HOST": "yb.internal", "VASTCTL_UUID": row["uuid"], "VASTCTL_LABEL": row["label"],
                           "VASTCTL_TOKEN": tokens.machine_token(secret, row["uuid"]),
                           "VASTCTL_SERVER": "https://manager.example:8443",
                           "VASTCTL_BENCH_COUNT": "5", "VASTCTL_BENCH_CONCURRENCY": "5",
                           "VASTCTL_ORPHAN_AFTER_S": "14400", "VASTCTL_SECTOR_SIZE": "32GiB"}
    assert request.onstart == onstart.script_for("")
    event = conn.execute("SELECT * FROM events").fetchone()
    assert (event["to_state"], event["source"], event["label"]) == ("launching", "operator", row["label"])
    audit = actions(conn)
    assert [(a["kind"], a["actor"], a["ok"], a["vast_id"]) for a in audit] == [("launch", "operator", 1, 1001)]
    assert request.env["VASTCTL_TOKEN"] not in audit[0]["request"]
    assert json.loads(audit[0]["request"])["env"]["CURIO_DB_HOST"] == "***"


def test_a_refused_create_kills_the_row_and_marks_it_destroyed(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100)])
    market.create_errors[10] = ProviderRejected("vast PUT /api/v0/asks/10/: HTTP 400 invalid_args: bad image")
    result = launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    assert result.launched == [] and result.error and "bad image" in result.error
    row = rows(conn)[0]
    assert market.rows_at_create[0][0]["uuid"] == row["uuid"]
    assert (row["state"], row["kill_code"], row["vast_id"]) == ("killed", "start_failed", None)
    assert "bad image" in row["kill_reason"] and row["destroyed_at"]
    assert actions(conn)[0]["ok"] == 0


def test_an_unknown_create_outcome_leaves_the_row_launching(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100), offer(11, 101)])
    market.create_errors[10] = ProviderError("vast PUT /api/v0/asks/10/: ReadTimeout; the outcome is unknown")
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=NOW)
    assert result.launched == [] and len(result.unknown) == 1 and "unknown" in result.error
    assert len(market.creates()) == 1  # never a second machine while the first may exist
    row = rows(conn)[0]
    assert (row["state"], row["vast_id"], row["destroyed_at"]) == ("launching", None, None)


def test_a_gone_offer_falls_through_to_the_next(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100, 0.3), offer(11, 101, 0.4), offer(12, 102, 0.5)])
    market.create_errors[10] = OfferGone("offer 10 is no longer available")
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=NOW)
    assert result.error is None
    assert [r["offer_id"] for r in result.launched] == [11, 12] and len(result.failed) == 1
    assert result.failed[0]["reason"] == "gone: offer 10 is no longer available"  # as --json has always said it
    states = sorted(r["state"] for r in rows(conn))
    assert states == ["killed", "launching", "launching"]


def test_a_refusal_worded_like_a_gone_offer_is_still_a_refusal(conn, cfg):
    """Only an OfferGone lets the launch try the next offer, whatever the market's words say."""
    market = FakeMarket(conn, [offer(10, 100, 0.3), offer(11, 101, 0.4)])
    market.create_errors[10] = ProviderRejected("gone: the image does not exist")
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=1, now=NOW)
    assert result.launched == [] and len(market.creates()) == 1
    assert result.failed[0]["reason"] == "gone: the image does not exist"
    assert result.error == "launched 0 of 1: vast refused offer 10: gone: the image does not exist"


def test_count_launches_one_machine_per_offer(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100, 0.3), offer(13, 100, 0.31), offer(11, 101, 0.4), offer(12, 102, 0.5)])
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=3, now=NOW)
    assert [r["offer_id"] for r in result.launched] == [10, 11, 12]  # offer 13 is on machine 100 again
    assert len({r["label"] for r in rows(conn)}) == 3 and len({r["uuid"] for r in rows(conn)}) == 3


def test_fewer_offers_than_count(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100)])
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=NOW)
    assert len(result.launched) == 1 and "1 of 2" in result.error


def test_no_offer_at_all_changes_nothing(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100, dph=2.0)])
    with pytest.raises(Unavailable, match="no RTX 4090 offer"):
        launches.launch(conn, market, cfg, gpu="RTX 4090", now=NOW)
    assert rows(conn) == [] and market.creates() == []


def test_search_uses_the_config_floors(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100)])
    launches.launch(conn, market, cfg, gpu="RTX 5090", now=NOW)
    query = market.calls[0][1]
    assert query.gpu_names == ["RTX 5090"] and query.max_dph == 1.0 and query.min_cpu_ram_gb == 256
    assert query.min_inet_down_mbps == 500 and query.disk_gb == 150 and query.min_reliability > 0


def test_max_instances_refuses_and_changes_nothing(conn, cfg):
    market = FakeMarket(conn, [offer(i, 100 + i, 0.1) for i in range(10)])
    launches.launch(conn, market, cfg, gpu="RTX 4090", count=3, now=NOW)
    with pytest.raises(GuardRefused, match="max_instances"):
        launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=NOW)
    assert len(rows(conn)) == 3 and len(market.creates()) == 3


def test_max_dph_refuses_an_explicit_offer(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100, dph=1.5)])
    with pytest.raises(GuardRefused, match="max_dph"):
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    settings.set_value(conn, cfg, "max_dph", "0.2", now=NOW)
    market.offers = [offer(10, 100, dph=0.3)]
    with pytest.raises(GuardRefused):
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    assert rows(conn) == [] and market.creates() == []


def test_max_hourly_spend_refuses(conn, cfg):
    market = FakeMarket(conn, [offer(i, 100 + i, 0.9) for i in range(5)])
    with pytest.raises(GuardRefused, match="max_hourly_spend"):
        launches.launch(conn, market, cfg, gpu="RTX 4090", count=4, now=NOW)
    assert rows(conn) == []


def test_unknown_offer_is_bad_input(conn, cfg):
    with pytest.raises(BadInput, match="offer 99"):
        launches.launch(conn, FakeMarket(conn), cfg, offer_id=99, now=NOW)


@pytest.mark.parametrize("kwargs", [{}, {"offer_id": 1, "gpu": "RTX 4090"}, {"offer_id": 1, "count": 2},
                                    {"gpu": "RTX 4090", "count": 0}, {"gpu": " "}])
def test_bad_launch_arguments(conn, cfg, kwargs):
    with pytest.raises(BadInput):
        launches.launch(conn, FakeMarket(conn, [offer(1, 1)]), cfg, now=NOW, **kwargs)
    assert rows(conn) == []


def test_launch_needs_a_server_url_and_a_secret(conn, cfg, tmp_path):
    cfg.server.url = ""
    with pytest.raises(BadInput, match="server.url"):
        launches.launch(conn, FakeMarket(conn, [offer(1, 1)]), cfg, offer_id=1, now=NOW)
    cfg.server.url = "https://m"
    cfg.server.secret_file = str(tmp_path / "missing")
    with pytest.raises(BadInput, match="init"):
        launches.launch(conn, FakeMarket(conn, [offer(1, 1)]), cfg, offer_id=1, now=NOW)
    assert rows(conn) == []


def test_launch_is_serialised(conn, cfg):
    from vastctl.state import locks

    locks.acquire(conn, "launch", ttl_s=600, holder="otherhost:1", now=NOW)
    with pytest.raises(Unavailable, match="another launch"):
        launches.launch(conn, FakeMarket(conn, [offer(1, 1)]), cfg, offer_id=1, now=NOW)
    assert rows(conn) == []


def test_long_onstart_is_packed(conn, cfg):
    cfg.launch.onstart = "#!/bin/bash\n" + "echo 'a fairly long line of boot script'\n" * 200
    market = FakeMarket(conn, [offer(10, 100)])
    launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    sent = market.creates()[0].onstart
    assert len(sent) <= onstart.MAX_CHARS and "base64 -d | gunzip" in sent


def test_default_onstart_fits_and_uses_only_remote_commands():
    script = onstart.default_script()
    sent = onstart.for_vast(script)  # a loader: the script outgrew vast's limit even packed with its dead-man switch
    assert len(sent) <= onstart.MAX_CHARS and sent == onstart.loader(script)
    for command in ("register", "params-done", "bench-report", "running", "heartbeat"):
        assert f"vastctl {command}" in script
    assert "VASTCTL_DB" not in script


# --- blocklist ----------------------------------------------------------------------------------------


def killed_row(conn, cfg, machine, code, *, proofs=0, at=NOW):
    uuid = f"u-{machine}-{code}"
    lifecycle.create(conn, uuid=uuid, label=f"vastctl-{machine}{code[:3]}", state=State.LAUNCHING, reason="t",
                     source="operator", now=at, fields={"machine_id": machine, "vast_id": machine * 10,
                                                        "proofs_done": proofs, "proofs_total": proofs})
    return lifecycle.kill(conn, uuid, "x", source="reconcile", code=code, now=at)


def test_blocklisted_machines_are_not_offered(conn, cfg):
    killed_row(conn, cfg, 100, "bench_failed")
    killed_row(conn, cfg, 101, "exited")
    killed_row(conn, cfg, 102, "exited", proofs=50)  # died after proving: not the machine's fault
    killed_row(conn, cfg, 103, "operator")
    market = FakeMarket(conn, [offer(i, 100 + i, 0.1 + i / 100) for i in range(5)])
    found = launches.find_offers(conn, market, cfg, gpu_names=["RTX 4090"], now=NOW + timedelta(minutes=30))
    assert [o.machine_id for o in found] == [102, 103, 104]
    assert set(blocklist.blocked(conn, NOW)) == {100, 101}
    result = launches.launch(conn, market, cfg, gpu="RTX 4090", now=NOW + timedelta(minutes=30))
    assert result.launched[0]["machine_id"] == 102
    with pytest.raises(GuardRefused, match="blocklisted"):
        launches.launch(conn, market, cfg, offer_id=0, now=NOW + timedelta(minutes=30))


def test_one_early_death_keeps_a_host_out_an_hour_a_second_within_the_ttl_for_the_ttl(conn, cfg):
    """A boot that died before its first proof may be the boot's bad luck, not the host's: its host is kept out for
    FIRST_DEATH_BLOCK_S and offered again after it; a second such death of that host within vast.blocklist_ttl keeps
    it out for the TTL from the second. A failed benchmark measured the host: the TTL at once."""
    market = FakeMarket(conn, [offer(0, 100, 0.1), offer(1, 101, 0.2)])
    killed_row(conn, cfg, 100, "exited")
    killed_row(conn, cfg, 101, "bench_failed")
    hour = timedelta(seconds=blocklist.FIRST_DEATH_BLOCK_S)

    def offered(at):
        return [o.machine_id for o in launches.find_offers(conn, market, cfg, now=at)]

    assert offered(NOW + hour / 2) == []
    assert offered(NOW + hour + timedelta(minutes=1)) == [100]  # the one death's hour is over; the bench's TTL is not
    assert "once: kept out for 60m" in blocklist.blocked(conn, NOW)[100]["reason"]
    again = NOW + 3 * hour
    uuid = "u-100-again"
    lifecycle.create(conn, uuid=uuid, label="vastctl-100b", state=State.LAUNCHING, reason="t", source="operator",
                     now=again, fields={"machine_id": 100, "vast_id": 1001, "proofs_done": 0, "proofs_total": 0})
    lifecycle.kill(conn, uuid, "x", source="reconcile", code="offline", now=again)
    assert offered(again + 2 * hour) == []
    assert blocklist.blocked(conn, again + 2 * hour)[100]["until"] == clock.to_iso(
        again + timedelta(seconds=cfg.vast.blocklist_ttl))
    assert offered(again + timedelta(seconds=cfg.vast.blocklist_ttl + 60)) == [100, 101]  # both TTLs over


def test_blocklist_expires(conn, cfg):
    killed_row(conn, cfg, 100, "bench_failed")
    later = NOW + timedelta(seconds=cfg.vast.blocklist_ttl + 1)
    found = launches.find_offers(conn, FakeMarket(conn, [offer(0, 100)]), cfg, now=later)
    assert [o.machine_id for o in found] == [100]


def test_block_row_is_idempotent_and_anchored_at_the_kill(conn, cfg):
    row = killed_row(conn, cfg, 100, "timeout_params_done")
    assert blocklist.block_row(conn, row, 1800) and blocklist.block_row(conn, row, 1800)
    entry = conn.execute("SELECT * FROM blocklist").fetchall()
    assert len(entry) == 1 and entry[0]["until"] == clock.to_iso(NOW + timedelta(minutes=30))
    assert "died before its first proof" in entry[0]["reason"]


def test_reason_for_skips_a_refused_create():
    row = {"state": "killed", "kill_code": "start_failed", "machine_id": 5, "vast_id": None, "proofs_done": 0}
    assert blocklist.reason_for(row) is None
    assert blocklist.reason_for({**row, "vast_id": 9}) is not None


# --- stop / start -------------------------------------------------------------------------------------


def test_stop_then_start(conn, cfg):
    live_row(conn, State.REGISTERED)
    market = FakeMarket(conn)
    row = operations.stop(conn, market, "vastctl-a", config=cfg, now=NOW)
    assert row["state"] == "stopped" and market.calls == [("stop", 77)]
    row = operations.start(conn, market, cfg, "u1", now=NOW + timedelta(minutes=5))
    assert row["state"] == "launching" and row["resumed_at"] == clock.to_iso(NOW + timedelta(minutes=5))
    assert market.calls[-1] == ("start", 77)
    assert [(a["kind"], a["ok"]) for a in actions(conn)] == [("stop", 1), ("start", 1)]
    events = [(e["from_state"], e["to_state"], e["source"]) for e in conn.execute("SELECT * FROM events ORDER BY id")]
    assert events[-2:] == [("registered", "stopped", "operator"), ("stopped", "launching", "operator")]


def test_stop_refusals_change_nothing(conn, cfg):
    live_row(conn, State.RUNNING)
    market = FakeMarket(conn)
    with pytest.raises(Refused):
        operations.start(conn, market, cfg, "vastctl-a", now=NOW)  # running: not stopped
    market.fail["stop"] = ProviderError("vast PUT: HTTP 503: retry later")
    with pytest.raises(ProviderError):
        operations.stop(conn, market, "vastctl-a", config=cfg, now=NOW)
    assert lifecycle.get(conn, "u1")["state"] == "running"
    assert actions(conn)[-1]["ok"] == 0
    lifecycle.kill(conn, "u1", "x", source="operator", code="operator", now=NOW)
    with pytest.raises(Refused):
        operations.stop(conn, market, "vastctl-a", config=cfg, now=NOW)


def test_stop_without_a_vast_id_is_refused(conn, cfg):
    live_row(conn, State.LAUNCHING, vast_id=None)
    with pytest.raises(Refused, match="no vast instance id"):
        operations.stop(conn, FakeMarket(conn), "vastctl-a", config=cfg, now=NOW)


# --- kill ---------------------------------------------------------------------------------------------


def test_kill_destroys(conn, cfg):
    live_row(conn, State.RUNNING)
    market = FakeMarket(conn)
    row, error = operations.kill(conn, market, "vastctl-a", "operator: bad", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert error is None and row["state"] == "killed" and row["destroyed_at"]
    assert market.calls == [("destroy", 77)]


def test_kill_with_a_failed_destroy_leaves_destroyed_at_empty(conn, cfg):
    live_row(conn, State.RUNNING)
    market = FakeMarket(conn)
    market.fail["destroy"] = ProviderError("vast DELETE: unreachable")
    row, error = operations.kill(conn, market, "vastctl-a", "operator: bad", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert "unreachable" in error and row["state"] == "killed" and row["destroyed_at"] is None


def test_kill_never_destroys_an_instance_vast_lists_under_another_label(conn, cfg):
    live_row(conn, State.RUNNING)
    market = FakeMarket(conn)
    market.show_instance = lambda vast_id: RemoteInstance(id=vast_id, label="someone-else")
    row, error = operations.kill(conn, market, "vastctl-a", "operator: bad", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert row["state"] == "killed" and row["destroyed_at"] is None and row["destroy_attempts"] == 1
    assert "'someone-else'" in error and "not destroyed" in error
    assert ("destroy", 77) not in market.calls
    (audit,) = conn.execute("SELECT ok, result FROM actions WHERE kind = 'destroy'").fetchall()
    assert audit["ok"] == 0 and "someone-else" in audit["result"]


def test_kill_destroys_when_vast_lists_the_rows_label(conn, cfg):
    live_row(conn, State.RUNNING)
    market = FakeMarket(conn)
    market.show_instance = lambda vast_id: RemoteInstance(id=vast_id, label="vastctl-a")
    row, error = operations.kill(conn, market, "vastctl-a", "operator: bad", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert error is None and row["destroyed_at"] and market.calls == [("destroy", 77)]


def test_kill_of_a_launching_row_finds_its_machine_by_label(conn, cfg):
    live_row(conn, State.LAUNCHING, vast_id=None)
    market = FakeMarket(conn)
    market.instances = [RemoteInstance(id=5, label="other"), RemoteInstance(id=6, label="vastctl-a")]
    row, error = operations.kill(conn, market, "vastctl-a", "operator: x", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert error is None and row["vast_id"] == 6 and row["destroyed_at"]
    assert market.calls[-1] == ("destroy", 6)


def test_kill_of_a_launching_row_with_a_failed_listing_keeps_it_undestroyed(conn, cfg):
    live_row(conn, State.LAUNCHING, vast_id=None)
    market = FakeMarket(conn)
    market.fail["list"] = ProviderError("listing failed")
    row, error = operations.kill(conn, market, "vastctl-a", "operator: x", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert error and row["state"] == "killed" and row["destroyed_at"] is None


# --- against the real client, on the wire ------------------------------------------------------------


def test_launch_on_the_wire(conn, cfg, monkeypatch):
    monkeypatch.setenv("VAST_API_KEY", "k-123")
    monkeypatch.setenv("VAST_API_URL", "https://vast.test")
    provider = VastProvider.from_env(clock=clock.VirtualClock(NOW))
    with responses.RequestsMock() as mocked:
        mocked.post("https://vast.test/api/v0/bundles/", json={"offers": [
            {"id": 31, "machine_id": 310, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.35}]})
        mocked.put("https://vast.test/api/v0/asks/31/", json={"success": True, "new_contract": 4242})
        result = launches.launch(conn, provider, cfg, gpu="RTX 4090", now=NOW)
        sent = json.loads(mocked.calls[1].request.body)
        url = mocked.calls[1].request.url
    row = result.launched[0]
    assert row["vast_id"] == 4242
    assert sent["label"] == row["label"] and sent["env"]["VASTCTL_UUID"] == row["uuid"]
    assert sent["env"]["VASTCTL_SERVER"] == "https://manager.example:8443" and sent["disk"] == 150.0
    assert "k-123" not in url


def test_a_machine_killed_while_its_create_was_in_flight_is_destroyed_once_vast_answers(conn, cfg):
    market = FakeMarket(conn, [offer(10, 100)])
    real_create = market.create_instance

    def create_while_killed(request):  # the operator (or reconcile) kills the launching row meanwhile
        (uuid,) = [r["uuid"] for r in conn.execute("SELECT uuid FROM instances WHERE state = 'launching'")]
        lifecycle.kill(conn, uuid, "operator: changed my mind", source="operator", code="operator",
                       now=NOW + timedelta(seconds=1))
        return real_create(request)

    market.create_instance = create_while_killed
    launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    vast_id = market.next_id
    assert ("destroy", vast_id) in market.calls  # rented after the kill: its billing ends now, not never
    (machine,) = [dict(r) for r in conn.execute("SELECT * FROM instances")]
    assert machine["state"] == State.KILLED and machine["vast_id"] == vast_id and machine["destroyed_at"]


def submit_as_agent(conn, config, market, action):
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
    ok, said, executor = submit_as_agent(conn, cfg, market, Action(kind=Kind.LAUNCH, actor="agent", offer_id=offered.id,
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
    ok, _, executor = submit_as_agent(conn, cfg, market, Action(kind=Kind.LAUNCH, actor="agent", offer_id=24))
    assert not ok and executor.refused[0]["limit"] == "blocklist" and market.creates() == []


def test_the_library_raises_the_limit_for_every_caller(conn, cfg):
    market = FakeMarket(conn, [offer(21, 210, dph=1.5)])
    with pytest.raises(GuardRefused) as info:
        launches.launch(conn, market, cfg, offer_id=21, now=NOW)
    assert info.value.limit == "max_dph" and info.value.exit_code == 4
    lifecycle.register(conn, "u1", label="vastctl-a", now=NOW)
    conn.execute("UPDATE instances SET vast_id = 5, state = 'running', last_heartbeat_at = state_since")
    with pytest.raises(GuardRefused) as info:  # demand unknown: the last machine proving stays
        operations.stop(conn, market, "vastctl-a", config=cfg, actor="agent", now=NOW)
    assert info.value.limit == "never_scale_to_zero"


@pytest.mark.parametrize("label", ["vastctl-a", "training-a"])
def test_a_second_kill_of_a_killed_row_says_it_is_killed_already(conn, cfg, label):
    live_row(conn, State.RUNNING)
    conn.execute("UPDATE instances SET label = ? WHERE uuid = 'u1'", (label,))  # adopted without our prefix
    market = FakeMarket(conn)
    first, error = operations.kill(conn, market, label, "operator: done", config=cfg, actor="operator", code=KillCode.OPERATOR,
                                   force=True, now=NOW)
    assert error is None and first["state"] == "killed"
    with pytest.raises(Refused, match=f"instance {label} is killed already \\(operator: done") as refused:
        operations.kill(conn, market, label, "operator: again", config=cfg, actor="operator", code=KillCode.OPERATOR, now=NOW)
    assert "label prefix" not in str(refused.value)
    assert market.calls == [("destroy", 77)]  # nothing at vast touched again
