"""What a new operator reads on the way through the guides: a simulated state file under `provider: vast`, the
playground's launch with the default image, and where the admin token is said to be."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta

import pytest
import responses
from helpers.dashboard import Browser
from helpers.playground import FastClock

from vastctl import clock
from vastctl import config as config_module
from vastctl.cli.app import Globals
from vastctl.serving import server
from vastctl.state import db, tokens

SIM = "provider: sim\nsim:\n  seed: 4\n  failures: low\nfleet:\n  max_instances: 3\n  max_dph: 1.0\n  max_hourly_spend: 5\n"
WIRED_TO_NO_MARKET = (" holds a simulated market (a day `vastctl demo --keep` kept, or the `provider: sim` playground),"
                      " not wired to vast.ai: its machines are the simulator's. To act on them, run the command with a"
                      " config that says `provider: sim` (--config or VASTCTL_CONFIG)\n")


def _states(db_path) -> list[str]:
    return [state for (state,) in sqlite3.connect(db_path).execute("SELECT state FROM instances ORDER BY rowid")]


# --- launch with the default image: vast refuses, the playground rents ------------------------------------------


def test_the_default_image_with_no_install_is_refused_under_vast_and_rented_under_sim(cli, tmp_path, db_path):
    """docs/rented-machine.md: refused (exit 2) under provider: vast; the playground's simulated machines run no
    boot script, so `provider: sim` rents with the same launch keys, as docs/demo.md says."""
    vast, sim = tmp_path / "vast.yaml", tmp_path / "sim.yaml"
    vast.write_text("server:\n  url: https://manager.example\n")
    sim.write_text(SIM)
    assert cli("--config", vast, "init").code == 0
    refused = cli("--config", vast, "launch", "--gpu", "RTX 4090")
    assert refused.code == 2 and refused.out == "" and refused.err.count("\n") == 1
    assert refused.err.startswith("error: launch.image nvidia/cuda:12.8.1-devel-ubuntu24.04 has no vastctl, curio or"
                                  " cuzk, so a machine launched with it could not boot: ")
    assert _states(db_path) == []
    rented = cli("--config", sim, "launch", "--gpu", "RTX 4090", "--json")
    assert rented.code == 0, rented.err
    assert len(json.loads(rented.out)["launched"]) == 1 and _states(db_path) == ["launching"]


# --- a simulated state file under provider: vast ------------------------------------------------------------------


def test_a_playground_file_under_provider_vast_says_it_is_wired_to_no_market(cli, tmp_path, db_path, monkeypatch):
    monkeypatch.setattr(Globals, "system_clock", FastClock(1, behind=timedelta(0)))  # one market, any hour: the kill destroys
    sim, vast = tmp_path / "sim.yaml", tmp_path / "vast.yaml"
    sim.write_text(SIM)
    vast.write_text("")
    assert cli("--config", sim, "init").code == 0
    label = json.loads(cli("--config", sim, "launch", "--gpu", "RTX 4090", "--json").out)["launched"][0]["label"]
    monkeypatch.setenv("VAST_API_KEY", "a-real-key-0123456789")  # with a key, the simulator's ids would go to vast
    with responses.RequestsMock(assert_all_requests_are_fired=False) as vast_api:  # any request: ConnectionError
        for argv in (["kill", label, "--reason", "x"], ["stop", label], ["reconcile"], ["offers", "--gpu", "RTX 4090"]):
            result = cli("--config", vast, "--db", db_path, *argv)
            assert result.code == 2 and result.out == "", (argv, result.err)
            assert result.err == f"error: {db_path}{WIRED_TO_NO_MARKET}", argv
        assert len(vast_api.calls) == 0
    assert _states(db_path) == ["launching"]
    killed = cli("--config", sim, "kill", label, "--reason", "x")  # under sim, as the error says
    assert killed.code == 0, killed.err
    assert _states(db_path) == ["killed"]


def test_a_state_file_without_a_simulated_market_still_asks_for_the_key(cli, tmp_path, db_path, monkeypatch):
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/vastai/vast_api_key either
    assert cli("init").code == 0
    result = cli("offers", "--gpu", "RTX 4090")
    assert result.code == 2 and result.err.startswith("error: no vast.ai API key: set VAST_API_KEY")


@pytest.mark.slow  # runs a simulated day
def test_a_kept_demo_day_says_it_is_wired_to_no_market(tmp_path, monkeypatch):
    kept = tmp_path / "day.db"
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "VAST_API_KEY": ""}
    demo = subprocess.run([sys.executable, "-m", "vastctl", "demo", "--hours", "1", "--keep", str(kept)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert demo.returncode == 0, demo.stderr
    label = _a_label(kept, "running")
    copy = tmp_path / "copy-of-demo.db"
    copy.write_bytes(kept.read_bytes())
    killed = subprocess.run([sys.executable, "-m", "vastctl", "--db", str(copy), "kill", label, "--reason", "x"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == 2 and killed.stdout == ""
    assert killed.stderr == f"error: {copy}{WIRED_TO_NO_MARKET}"
    assert _a_label(copy, "running") == label  # nothing changed


def _a_label(path, state: str) -> str:
    (label,) = sqlite3.connect(path).execute("SELECT label FROM instances WHERE state = ? ORDER BY rowid LIMIT 1",
                                             (state,)).fetchone()
    return label


# --- where the admin token is said to be ---------------------------------------------------------------------------

START = clock.from_iso("2026-11-30T12:00:00Z")
TOKEN = "kept-day-admin-token-0123456789abcdefghij"


def _app(db_path, monkeypatch, *, beside: bool = False, environment: bool = False) -> server.App:
    monkeypatch.delenv("VASTCTL_ADMIN_TOKEN", raising=False)
    if environment:
        monkeypatch.setenv("VASTCTL_ADMIN_TOKEN", TOKEN)
    if beside:
        config_module.admin_token_file(db_path).write_text(TOKEN + "\n")
    config = config_module.load(env=dict(os.environ))
    config.db = str(db_path)
    config_module.admin_token_beside(config)
    db.connect(config.db_path, create=True, now=START).close()
    tokens.ensure_secret(config.secret_path)
    return server.App(config, tokens.Keyring(config.secret_path), clock=clock.VirtualClock(START))


def test_a_kept_days_sign_in_page_names_the_file_beside_it(tmp_path, monkeypatch):
    db_path = tmp_path / "day.db"
    browser = Browser(_app(db_path, monkeypatch, beside=True))
    page = browser.request("GET", "/")
    assert page.status == 200
    assert "Sign in with the token in <code>day.db.admin-token</code>, beside the state file." in page.text
    assert "server.admin_token" not in page.text
    wrong = browser.post("/login", {"token": "wrong-" + TOKEN})
    assert wrong.status == 401 and "wrong token: use the token in day.db.admin-token, beside the state file" in wrong.text
    assert browser.post("/login", {"token": TOKEN}).status == 303


def test_a_token_from_the_environment_is_named_so_on_the_sign_in_page(tmp_path, monkeypatch):
    page = Browser(_app(tmp_path / "vastctl.db", monkeypatch, environment=True)).request("GET", "/")
    assert "Sign in with <code>VASTCTL_ADMIN_TOKEN</code> in the manager's environment." in page.text


def test_a_token_from_the_config_is_named_as_its_key(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(f"server:\n  admin_token: {TOKEN}\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    page = Browser(_app(tmp_path / "vastctl.db", monkeypatch)).request("GET", "/")
    assert "Sign in with the manager's <code>server.admin_token</code>." in page.text


@pytest.mark.slow  # starts serve
@pytest.mark.parametrize("where, named", [("environment", "VASTCTL_ADMIN_TOKEN"), ("config", "server.admin_token")])
def test_a_weak_admin_token_is_named_where_it_came_from(tmp_path, where, named):
    config = tmp_path / "config.yaml"
    config.write_text(f"db: {tmp_path / 'vastctl.db'}\n" + ("server:\n  admin_token: short\n" if where == "config" else ""))
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "VASTCTL_CONFIG": str(config)}
    if where == "environment":
        env["VASTCTL_ADMIN_TOKEN"] = "short"
    run = [sys.executable, "-m", "vastctl"]
    assert subprocess.run([*run, "init"], env=env, capture_output=True, timeout=60, check=False).returncode == 0
    served = subprocess.run([*run, "serve", "--port", "0"], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert served.returncode == 2 and "Traceback" not in served.stderr
    (line,) = [line for line in served.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: {named} is too weak to guard the dashboard and /metrics (")
