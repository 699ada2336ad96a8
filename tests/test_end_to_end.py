"""The whole path with real processes on loopback: launch at a fake vast API, the machine reports to a real
`vastctl serve` in remote mode, reconcile watches vast, kills the machine when vast says it exited, destroys it."""

from __future__ import annotations

import json

import pytest
from helpers.fake_vast import KEY
from helpers.serving import Manager, free_port, run_vastctl

pytestmark = pytest.mark.slow  # real processes and servers on loopback


@pytest.fixture
def manager(tmp_path):
    m = Manager(tmp_path / "manager")
    port = free_port()
    m.config_path.write_text(
        f"server:\n  url: http://127.0.0.1:{port}\n  admin_token: admin-token-for-tests-0123456789\n"
        "fleet:\n  min_bench_rate: 40\n  max_dph: 1.0\n"
        "launch:\n  vastctl_source: vastctl==0.1.0\n  install: /opt/provers/install.sh\n"
        "reconcile:\n  confirm_after: 0s\n"  # cron's two listings are a minute apart; here they are back to back
    )
    m.start(port)
    yield m
    m.stop()


def test_launch_report_reconcile_kill_destroy(manager, vast, tmp_path):
    operator = {**manager.env, "VAST_API_KEY": KEY, "VAST_API_URL": vast.url}

    launched = run_vastctl("launch", "--gpu", "RTX 4090", "--json", env=operator)
    assert launched.returncode == 0, launched.stderr
    (machine,) = json.loads(launched.stdout)["launched"]
    (create,) = vast.creates
    env = create["env"]
    assert env["VASTCTL_UUID"] == machine["uuid"] and env["VASTCTL_LABEL"] == machine["label"]
    assert env["VASTCTL_SERVER"] == manager.url and env["VASTCTL_TOKEN"] == manager.token(machine["uuid"])
    assert (env["VASTCTL_PIP"], env["VASTCTL_INSTALL"]) == ("vastctl==0.1.0", "/opt/provers/install.sh")
    assert machine["label"].startswith("vastctl-") and machine["vast_id"] == 5001

    # the rented machine: remote mode only, no state file of its own
    home = tmp_path / "machine"
    home.mkdir()
    on_machine = {"HOME": str(home), **env, "VASTCTL_DB": str(home / "must-not-exist.db")}
    for args in (["register", "--vast-id", "5001", "--gpu", "RTX 4090"], ["params-done"],
                 ["bench-report", "--rate", "70"], ["running"], ["heartbeat", "--proofs-done", "3"]):
        done = run_vastctl(*args, env=on_machine)
        assert done.returncode == 0, (args, done.stderr)
    assert not (home / "must-not-exist.db").exists()
    row = manager.rows()[machine["uuid"]]
    assert (row["state"], row["bench_rate"], row["proofs_done"]) == ("running", 70.0, 3)

    quiet = run_vastctl("reconcile", "--json", env=operator)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["actions"] == []
    view = json.loads(run_vastctl("fleet", "--json", env=operator).stdout)
    (shown,) = view["instances"]
    assert (shown["state"], shown["vast_status"], shown["disagreement"]) == ("running", "running", None)

    vast.instances[5001]["actual_status"] = "exited"
    first = json.loads(run_vastctl("reconcile", "--json", env=operator).stdout)
    assert first["actions"] == []  # one listing saying exited is not yet proof
    second = run_vastctl("reconcile", "--json", env=operator)
    assert second.returncode == 0, second.stderr
    kinds = [(a["kind"], a["result"]) for a in json.loads(second.stdout)["actions"]]
    assert kinds[0][0] == "kill" and kinds[0][1].startswith("killed") and kinds[1] == ("destroy", "destroyed")
    assert vast.instances == {}

    row = manager.rows()[machine["uuid"]]
    assert (row["state"], row["kill_code"]) == ("killed", "exited") and row["destroyed_at"]
    kills = [e for e in manager.events(machine["uuid"]) if e["to_state"] == "killed"]
    assert len(kills) == 1 and kills[0]["source"] == "reconcile" and kills[0]["label"] == machine["label"]

    told = run_vastctl("heartbeat", "--proofs-done", "4", env=on_machine)
    assert told.returncode == 3 and told.stderr.startswith("error: ")
