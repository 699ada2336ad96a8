"""launch.join at launch, kill and reconcile: a port and a fresh key per machine, the private half only in the
create request (never the row, the audit or an error), authorized_keys in step with the rows, and the
tunnel_down kill for a running machine the manager cannot reach through its tunnel."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.operations_market import NOW, FakeMarket, actions, offer, rows
from helpers.reconcile_rows import NOW as RECONCILE_NOW
from helpers.reconcile_rows import SETTINGS, ago, kills, row, seen

from vastctl import config as config_module
from vastctl import launches, operations
from vastctl.errors import BadInput, Unavailable
from vastctl.providers.base import ProviderError, ProviderRejected
from vastctl.reconcile import plan
from vastctl.state import lifecycle, tokens
from vastctl.state.lifecycle import KillCode


@pytest.fixture
def host_key(tmp_path) -> Path:
    path = tmp_path / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub")


def make_cfg(db_path, tmp_path, host_key, *, keys: Path | None = None, reader: str = "root", **launch):
    config = config_module.from_mapping({
        "db": str(db_path), "server": {"url": "https://manager.example:8443"},
        "launch": {"image": "ghcr.io/x/cuzk:1", "join": "ssh", **launch},
        "fleet": {"max_instances": 4, "max_dph": 1.0, "max_hourly_spend": 3.0},
        "tunnel": {"host": "manager.example.net", "ssh_port": 2222, "authorized_keys": str(keys or tmp_path / "ak"), "keys_reader": reader,
                   "host_key_file": str(host_key), "first_port": 21000, "last_port": 21009},
    })
    tokens.ensure_secret(config.secret_path)
    return config


class KeysAtCreate(FakeMarket):
    """Also records the authorized_keys file as it was when each create went out."""

    def __init__(self, conn, offers, keys: Path):
        super().__init__(conn, offers)
        self.keys, self.keys_at_create = keys, []

    def create_instance(self, request):
        self.keys_at_create.append(self.keys.read_text() if self.keys.exists() else None)
        return super().create_instance(request)


def public_of(private: str, tmp_path: Path) -> str:
    path = tmp_path / "check.key"
    path.write_text(private)
    path.chmod(0o600)
    return subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_ssh_launch_gives_each_machine_a_port_and_a_key_whose_private_half_only_the_machine_gets(
        conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key)
    market = KeysAtCreate(conn, [offer(10, 100), offer(11, 110)], Path(cfg.tunnel.authorized_keys))
    launches.launch(conn, market, cfg, gpu="RTX 4090", count=2, now=NOW)
    first, second = market.creates()
    assert (first.env["VASTCTL_TUNNEL_PORT"], second.env["VASTCTL_TUNNEL_PORT"]) == ("21000", "21001")
    assert first.env["VASTCTL_JOIN"] == "ssh" and first.env["VASTCTL_TUNNEL_HOST"] == "manager.example.net"
    assert first.env["VASTCTL_TUNNEL_SSH_PORT"] == "2222" and first.env["VASTCTL_TUNNEL_USER"] == "vastctl-tunnel"
    assert first.env["VASTCTL_TUNNEL_HOST_KEY"] == " ".join(host_key.read_text().split()[:2])
    private = base64.b64decode(first.env["VASTCTL_TUNNEL_KEY"]).decode()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert first.env["VASTCTL_TUNNEL_KEY"] != second.env["VASTCTL_TUNNEL_KEY"]
    by_label = {r["label"]: r for r in rows(conn)}
    mine = by_label[first.label]
    assert mine["tunnel_port"] == 21000 and public_of(private, tmp_path).split()[:2] == mine["tunnel_public_key"].split()[:2]
    # the machine's key was in the file before its create went out (it may connect before vast answers)
    assert f'permitlisten="127.0.0.1:21000" {" ".join(mine["tunnel_public_key"].split()[:2])}' in market.keys_at_create[0]
    key_lines = [line for line in private.splitlines() if not line.startswith("-----")]
    state = json.dumps([rows(conn), actions(conn), [dict(r) for r in conn.execute("SELECT * FROM events")]])
    for secret in (first.env["VASTCTL_TUNNEL_KEY"], first.env["VASTCTL_TOKEN"], *key_lines):
        assert secret not in state
    audit = json.loads(actions(conn)[0]["request"])["env"]
    assert audit["VASTCTL_TUNNEL_KEY"] == "***" and audit["VASTCTL_TOKEN"] == "***"
    assert audit["VASTCTL_TUNNEL_PORT"] in ("21000", "21001")


@pytest.mark.slow
def test_a_create_error_never_shows_the_key(conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key)
    market = FakeMarket(conn, [offer(10, 100)])

    class Echoing(FakeMarket):
        def create_instance(self, request):  # a market that quotes the request back in its error
            self.calls.append(("create", request))
            raise ProviderError(f"vast PUT /api/v0/asks/10/: HTTP 500 body {json.dumps(request.env)}")

    market = Echoing(conn, [offer(10, 100)])
    result = launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    env = market.creates()[0].env
    shown = json.dumps([result.view(), actions(conn)])
    assert env["VASTCTL_TUNNEL_KEY"] not in shown and "unknown outcome" in result.error


@pytest.mark.slow
def test_a_refused_create_and_a_kill_prune_the_machines_key(conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key)
    market = FakeMarket(conn, [offer(10, 100), offer(11, 110)])
    market.create_errors[10] = ProviderRejected("vast PUT /api/v0/asks/10/: HTTP 400 invalid_args: bad image")
    launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    keys = Path(cfg.tunnel.authorized_keys)
    assert "permitlisten" not in keys.read_text()  # nothing was rented: no key works
    launches.launch(conn, market, cfg, offer_id=11, now=NOW)
    label = market.creates()[1].label
    assert keys.read_text().count("permitlisten") == 1
    operations.kill(conn, market, label, "operator: test", config=cfg, code=KillCode.OPERATOR, force=True, now=NOW)
    assert "permitlisten" not in keys.read_text() and lifecycle.resolve(conn, label)["state"] == "killed"


@pytest.mark.slow
def test_join_none_is_the_default_and_sends_nothing_new(conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key, join="none")
    market = FakeMarket(conn, [offer(10, 100)])
    launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    env = market.creates()[0].env
    assert not [k for k in env if k.startswith(("VASTCTL_JOIN", "VASTCTL_TUNNEL"))]
    assert rows(conn)[0]["tunnel_port"] is None and not Path(cfg.tunnel.authorized_keys).exists()


@pytest.mark.slow
def test_join_command_hands_the_machine_the_operators_command(conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key, join="command", join_command="tailscale up --authkey-file /k")
    market = FakeMarket(conn, [offer(10, 100)])
    launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    env = market.creates()[0].env
    assert (env["VASTCTL_JOIN"], env["VASTCTL_JOIN_CMD"]) == ("command", "tailscale up --authkey-file /k")
    assert "VASTCTL_TUNNEL_KEY" not in env and rows(conn)[0]["tunnel_port"] is None


@pytest.mark.slow
def test_ssh_launch_without_a_host_is_refused_before_the_market_is_asked(conn, db_path, tmp_path, host_key):
    cfg = make_cfg(db_path, tmp_path, host_key)
    cfg.tunnel.host = ""
    market = FakeMarket(conn, [offer(10, 100)])
    with pytest.raises(BadInput, match="tunnel.host is empty"):
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    assert market.calls == [] and rows(conn) == []


# --- reconcile: tunnel_down --------------------------------------------------------------------------


def test_a_running_machine_unreachable_through_its_tunnel_past_the_timeout_is_killed():
    config = config_module.from_mapping({"tunnel": {"down_timeout": "10m"}})
    machines = [
        row("vastctl-1", tunnel_port=21000, joined_at=ago(hours=1), tunnel_down_since=ago(minutes=11)),
        row("vastctl-2", tunnel_port=21001, joined_at=ago(hours=1), tunnel_down_since=ago(minutes=9)),
        row("vastctl-3", tunnel_port=21002, joined_at=None, state_since=ago(minutes=11)),
        row("vastctl-4", tunnel_port=21003, joined_at=ago(hours=1), tunnel_down_since=None),
        row("vastctl-5", tunnel_port=None, joined_at=None),  # launch.join none: no tunnel rule
        row("vastctl-6", state="bench_done", tunnel_port=21004, joined_at=None, state_since=ago(minutes=11)),
    ]
    actions_planned = plan(machines, [seen(r) for r in machines], SETTINGS, config, RECONCILE_NOW)
    assert kills(actions_planned) == {("vastctl-1", "tunnel_down"), ("vastctl-3", "tunnel_down")}
    reasons = {a.label: a.reason for a in actions_planned if a.kind == "kill"}
    assert reasons["vastctl-1"].startswith("unreachable through its tunnel (127.0.0.1:21000) for 11m")
    assert reasons["vastctl-3"].startswith("never reached through its tunnel (127.0.0.1:21002)")



@pytest.mark.slow
def test_an_unwritable_keys_file_stops_the_launch_before_anything_is_rented(conn, db_path, tmp_path, host_key):
    from vastctl.errors import Unavailable

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the keys' directory should be")
    cfg = make_cfg(db_path, tmp_path, host_key)
    cfg.tunnel.authorized_keys = str(blocker / "authorized_keys")
    market = FakeMarket(conn, [offer(10, 100)])
    with pytest.raises(Unavailable, match="cannot write tunnel.authorized_keys"):
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    assert market.creates() == []
    (row_,) = rows(conn)
    assert (row_["state"], row_["kill_code"]) == ("killed", "start_failed") and row_["destroyed_at"]


@pytest.fixture
def open_root():
    """A directory anyone may enter, as / is (pytest's own temporary directories are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="vastctl-keys-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode,rented", [(0o750, False), (0o755, True)])
def test_a_launch_whose_keys_sshd_cannot_read_rents_nothing(conn, db_path, tmp_path, host_key, open_root, mode, rented):
    """The state file's directory (vastctl:vastctl 750) hides the keys from sshd's reader, nobody: every login
    would be refused and the machine would bench, never join, and bill. Refused before the create goes out."""
    place = open_root / "var" / "lib" / "vastctl"
    place.mkdir(parents=True)
    place.chmod(mode)
    cfg = make_cfg(db_path, tmp_path, host_key, keys=place / "tunnel" / "authorized_keys", reader="nobody")
    market = FakeMarket(conn, [offer(10, 100)])
    if rented:
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
        assert len(market.creates()) == 1 and (place / "tunnel" / "authorized_keys").stat().st_mode & 0o004
        return
    with pytest.raises(Unavailable) as refused:
        launches.launch(conn, market, cfg, offer_id=10, now=NOW)
    assert market.creates() == [] and not (place / "tunnel").exists()
    said = str(refused.value)
    assert f"as the account nobody (tunnel.keys_reader), which cannot enter {place} " in said and "mode 750" in said
    assert "keep the keys in a directory the account nobody can enter, e.g. /var/lib/vastctl-tunnel" in said
    assert "/var/lib/vastctl-tunnel" in said and "\n" not in said
    assert [r["state"] for r in rows(conn)] == ["killed"]  # its row ends there, not rented
