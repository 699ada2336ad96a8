"""Machine tokens: the secret file with several secrets, rotation and retirement, and finding a token's owner."""

from __future__ import annotations

import io
import json
import os
import stat
from datetime import datetime, timezone

import pytest
import requests
from helpers.serving import Manager, run_vastctl

from vastctl import clock
from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.state import db, lifecycle, tokens

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def secret_path(tmp_path):
    path = tmp_path / "vastctl.db.secret"
    tokens.ensure_secret(path)
    return path


def test_rotation_prepends_a_signing_secret_and_every_one_verifies(secret_path):
    first = tokens.read_secret(secret_path)
    old_token = tokens.machine_token(first, "u1")
    keyring = tokens.Keyring(secret_path)
    assert tokens.rotate_secret(secret_path, now=NOW) == 2
    newest = tokens.read_secret(secret_path)
    assert newest != first and tokens.read_secrets(secret_path) == [newest, first]
    assert tokens.newest_added(secret_path) == NOW
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    # the keyring made before the rotation sees the new secret without being rebuilt
    assert keyring.matches("u1", tokens.machine_token(newest, "u1"))
    assert keyring.matches("u1", old_token)
    assert tokens.retire_old_secrets(secret_path) == 1
    assert tokens.read_secrets(secret_path) == [newest]
    assert not keyring.matches("u1", old_token)
    assert keyring.matches("u1", tokens.machine_token(newest, "u1"))


def test_a_broken_secret_file_keeps_the_loaded_secrets(secret_path):
    heard = []
    keyring = tokens.Keyring(secret_path, on_error=heard.append)
    token = tokens.machine_token(tokens.read_secret(secret_path), "u1")
    secret_path.write_text("short\n")
    assert keyring.matches("u1", token)
    assert len(heard) == 1 and "too short" in heard[0]
    secret_path.unlink()
    assert keyring.matches("u1", token)


@pytest.mark.parametrize("text,says", [("", "holds no secret"), ("abc\n", "line 1"),
                                       ("a" * 64 + "  # added someday\n", "# added <ISO time>")])
def test_a_bad_secret_file_is_a_clear_error(secret_path, text, says):
    secret_path.write_text(text)
    with pytest.raises(BadInput) as caught:
        tokens.read_secrets(secret_path)
    assert says in str(caught.value)


# --- finding a token's owner ------------------------------------------------------------------


def call(app, uuid, token):
    """One POST heartbeat through the WSGI app in this process; returns the status code."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/v1/instances/{uuid}/heartbeat", "CONTENT_LENGTH": "0",
               "HTTP_AUTHORIZATION": f"Bearer {token}", "wsgi.input": io.BytesIO(b"")}
    answer = []
    body = app(environ, lambda status, headers: answer.append(status))
    return int(answer[0].split()[0]), json.loads(b"".join(body))


def test_a_bad_token_costs_the_same_with_a_big_fleet(tmp_path, monkeypatch):
    """An unknown token used to cost one HMAC per row (2,000 here): now the first one indexes, the rest look up."""
    from vastctl.serving import server

    monkeypatch.setenv("VASTCTL_DB", str(tmp_path / "fleet.db"))
    config = config_module.load(env={"VASTCTL_DB": str(tmp_path / "fleet.db")})
    conn = db.connect(config.db_path, create=True, now=clock.SYSTEM.now())
    tokens.ensure_secret(config.secret_path)
    stamp = clock.to_iso(NOW)
    with conn:
        conn.executemany("INSERT INTO instances (uuid, label, state, created_at, state_since) VALUES (?, ?, ?, ?, ?)",
                         [(f"m-{i}", f"vastctl-m-{i}", "running", stamp, stamp) for i in range(2000)])
    app = server.App(config, tokens.Keyring(config.secret_path), clock=clock.SYSTEM)
    secret = tokens.read_secret(config.secret_path)
    hmacs = []
    real = tokens.machine_token
    monkeypatch.setattr(tokens, "machine_token", lambda s, u: hmacs.append(u) or real(s, u))

    assert call(app, "m-1", "0" * 64)[0] == 401  # the first miss indexes the fleet once
    for bad in ("1" * 64, "not-a-token", "f" * 64):
        hmacs.clear()
        status, body = call(app, "m-1", bad)
        assert status == 401 and body["error"].startswith("invalid token")
        assert len(hmacs) <= 1  # the path uuid's own check, nothing per row
    hmacs.clear()
    assert call(app, "m-1", real(secret, "m-1999"))[0] == 403  # another machine's token: still told apart
    assert len(hmacs) <= 1
    lifecycle.register(conn, "late", label="vastctl-late", now=clock.SYSTEM.now())  # a machine new since the index was built
    hmacs.clear()
    assert call(app, "m-1", real(secret, "late"))[0] == 403
    assert hmacs.count("late") == 1 and len(hmacs) == 2
    conn.close()


# --- rotating while serve runs ----------------------------------------------------------------


def post(manager, uuid, report, body, token):
    return requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", data=json.dumps(body),
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)


@pytest.mark.slow
def test_rotation_while_serving_keeps_old_machines_and_retiring_cuts_them_off(tmp_path):
    m = Manager(tmp_path / "manager").start()
    try:
        old_token = m.token("old")
        assert post(m, "old", "register", {"label": "vastctl-old"}, old_token).status_code == 200

        rotated = run_vastctl("token", "--rotate", env=m.env)
        assert rotated.returncode == 0, rotated.stderr
        assert "now holds 2 secrets" in rotated.stderr and rotated.stdout == ""
        printed = run_vastctl("token", "--uuid", "new", env=m.env).stdout.strip()
        assert printed != m.token("new")  # signed with the new secret
        assert post(m, "new", "register", {"label": "vastctl-new"}, printed).status_code == 200  # no restart
        assert post(m, "old", "params-done", {}, old_token).status_code == 200  # the old token still works

        refused = run_vastctl("token", "--retire-old", env=m.env)
        assert refused.returncode == 3
        assert "1 live machine(s) were launched before the newest secret" in refused.stderr
        assert "vastctl-old" in refused.stderr and "vastctl-new" not in refused.stderr
        assert len(tokens.read_secrets(m.db_path.with_name(m.db_path.name + ".secret"))) == 2

        retired = run_vastctl("token", "--retire-old", "--force", env=m.env)
        assert retired.returncode == 0, retired.stderr
        response = post(m, "old", "heartbeat", {}, old_token)
        assert response.status_code == 401
        assert post(m, "new", "params-done", {}, printed).status_code == 200
    finally:
        assert m.stop() == 0


def test_token_needs_exactly_one_action(cli):
    assert cli("init").code == 0
    for args in ([], ["--uuid", "u1", "--rotate"], ["--rotate", "--retire-old"], ["--rotate", "--force"]):
        result = cli("token", *args)
        assert result.code == 2, args
        assert result.err.startswith("error: ")
