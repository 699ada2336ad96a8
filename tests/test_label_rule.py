"""One rule for labels at the command line and over HTTP: no leading or trailing space (it would register a row
that reads as ours but lacks our prefix), and a label without our prefix is said at register."""

from __future__ import annotations

import io
import json
import sqlite3

import pytest

from vastctl import clock
from vastctl import config as config_module
from vastctl.serving import server
from vastctl.state import db, tokens


def rows(db_path):
    with sqlite3.connect(db_path) as raw:
        return raw.execute("SELECT label FROM instances").fetchall()


@pytest.mark.parametrize("label", [" vastctl-a", "vastctl-a ", "\u3000vastctl-a", "vastctl-a\u00a0"])
def test_the_cli_refuses_a_label_with_space_around_it(ready, cli, db_path, label):
    result = cli("register", "--uuid", "u1", "--label", label)
    assert result.code == 2 and result.err.startswith("error: --label must not begin or end with a space")
    assert len(result.err.strip().splitlines()) == 1
    assert rows(db_path) == []


def register_over_http(db_path, body):
    config = config_module.from_mapping({"db": str(db_path)})
    db.connect(config.db_path, create=True, now=clock.SYSTEM.now()).close()
    tokens.ensure_secret(config.secret_path)
    app = server.App(config, tokens.Keyring(config.secret_path), clock=clock.SYSTEM)
    payload = json.dumps(body).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/instances/u1/register", "QUERY_STRING": "",
               "wsgi.input": io.BytesIO(payload), "CONTENT_LENGTH": str(len(payload)),
               "CONTENT_TYPE": "application/json", "wsgi.url_scheme": "http", "HTTP_HOST": "127.0.0.1",
               "REMOTE_ADDR": "127.0.0.1",
               "HTTP_AUTHORIZATION": f"Bearer {tokens.machine_token(tokens.read_secret(config.secret_path), 'u1')}"}
    seen = {}
    answer = b"".join(app(environ, lambda status, headers: seen.update(status=status)))
    return int(seen["status"].split()[0]), json.loads(answer)


@pytest.mark.parametrize("label", [" vastctl-a", "vastctl-a\u2003", "vastctl-a "])
def test_http_refuses_it_with_the_same_rule(db_path, label):
    status, answer = register_over_http(db_path, {"label": label})
    assert status == 400 and "must not begin or end with a space" in json.dumps(answer)
    assert rows(db_path) == []


def test_http_register_says_when_the_label_lacks_our_prefix(db_path):
    status, answer = register_over_http(db_path, {"label": "training-job"})
    assert status == 200 and answer["state"] == "registered"
    assert "lacks our prefix 'vastctl-'" in answer["note"]
    with sqlite3.connect(db_path) as raw:
        (reason,) = raw.execute("SELECT reason FROM events").fetchone()
    assert reason.startswith("registered without a launch record: adopted; the label 'training-job' lacks our prefix")


def test_the_cli_says_it_on_stderr_and_not_for_our_own_labels(ready, cli):
    ours = cli("register", "--uuid", "u1", "--label", "vastctl-a")
    assert (ours.code, ours.out, ours.err) == (0, "registered\n", "")
    other = cli("register", "--uuid", "u2", "--label", "training-job")
    assert other.code == 0 and other.out == "registered\n"
    assert other.err.startswith("note: the label 'training-job' lacks our prefix 'vastctl-'")
