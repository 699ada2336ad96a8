"""`provider: sim` from the command line: every market command works offline, with no vast key.

The CLI runs the market on wall time, so these tests check only what needs no
waiting: offers, a launch, the fleet, a reconcile pass, stop, start and kill.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from helpers.playground import FastClock
from helpers.serving import query

from vastctl.cli.app import Globals


@pytest.fixture
def sim_ready(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(
        "provider: sim\n"
        "sim:\n  seed: 4\n  failures: low\n"
        "server:\n  url: https://manager.example\n"
        "fleet:\n  max_instances: 3\n  max_dph: 1.0\n  max_hourly_spend: 5\n"
    )
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    monkeypatch.setattr(Globals, "system_clock", FastClock(1, behind=timedelta(0)))  # one market, whatever the hour
    assert cli("init").code == 0


def test_offers_need_no_key(sim_ready, cli, db_path):
    result = cli("offers", "--gpu", "RTX 4090", "--limit", "5", "--json")
    assert result.code == 0, result.err
    offers = json.loads(result.out)
    assert 0 < len(offers) <= 5
    assert all(o["gpu_name"] == "RTX 4090" and o["dph_total"] <= 1.0 and o["cpu_ram_gb"] >= 256 for o in offers)
    assert [o["dph_total"] for o in offers] == sorted(o["dph_total"] for o in offers)
    assert query(db_path, "SELECT seed FROM sim_meta") == [{"seed": 4}]  # the market lives in the state file
    table = cli("offers", "--limit", "3")
    assert table.code == 0 and "reliability" in table.out.splitlines()[0]


def test_launch_fleet_reconcile_stop_start_kill_offline(sim_ready, cli, db_path):
    launched = cli("launch", "--gpu", "RTX 4090", "--json")
    assert launched.code == 0, launched.err
    machine = json.loads(launched.out)["launched"][0]
    label, vast_id = machine["label"], machine["vast_id"]
    assert vast_id is not None
    assert query(db_path, "SELECT label, uuid FROM sim_instances") == [{"label": label, "uuid": machine["uuid"]}]

    fleet = cli("fleet", "--json")
    assert fleet.code == 0 and label in fleet.out

    passed = cli("reconcile", "--json")
    assert passed.code == 0, passed.err
    assert json.loads(passed.out)["listed"] == 1
    assert query(db_path, "SELECT state, vast_seen_at IS NOT NULL AS seen FROM instances") == [
        {"state": "launching", "seen": 1}]

    assert cli("demand", "report", "--queued", "0").code == 0  # an empty queue: the only machine may stop
    stopped = cli("stop", label)
    assert stopped.code == 0 and stopped.out.strip() == f"{label} stopped"
    assert query(db_path, "SELECT actual_status FROM sim_instances") == [{"actual_status": "stopped"}]
    started = cli("start", label)
    assert started.code == 0 and started.out.strip() == f"{label} launching (resumed)"
    assert query(db_path, "SELECT intended_status FROM sim_instances") == [{"intended_status": "running"}]

    killed = cli("kill", label, "--reason", "trying the simulator")
    assert killed.code == 0, killed.err
    assert f"vast instance {vast_id} destroyed" in killed.err
    assert query(db_path, "SELECT destroyed_at IS NOT NULL AS gone FROM sim_instances") == [{"gone": 1}]
    assert query(db_path, "SELECT state, destroyed_at IS NOT NULL AS gone FROM instances") == [
        {"state": "killed", "gone": 1}]


def test_a_sim_command_never_asks_for_a_vast_key(sim_ready, cli):
    for args in (("offers", "--json"), ("reconcile", "--json")):
        result = cli(*args)
        assert result.code == 0 and "VAST_API_KEY" not in result.err, (args, result.err)
