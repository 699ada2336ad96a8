"""What a machine said: log tails pushed by the boot script, kept bounded and escaped, shown by `logs` and the page."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
import requests
from helpers.serving import Manager

from vastctl.cli import said
from vastctl.errors import BadInput, UnknownInstance
from vastctl.facts import machine_logs
from vastctl.serving import dashboard_tables
from vastctl.state import db, lifecycle
from vastctl.state.lifecycle import State

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
HOSTILE = "ok\n\x1b[2J\x1b]0;pwned\x07 \u202eevil\u202c <script>alert(1)</script> Authorization: Bearer abcdef123456\r\nend"


def machine(conn, label="vastctl-log1", state=State.REGISTERED):
    uuid = f"u-{label}"
    lifecycle.create(conn, uuid=uuid, label=label, state=State.LAUNCHING, reason="t", source="operator", now=NOW,
                     fields={"vast_id": 7})
    if state != State.LAUNCHING:
        lifecycle.transition(conn, uuid, state, "t", "instance" if state != State.KILLED else "operator", now=NOW)
    return uuid


def test_hostile_text_is_kept_masked_and_escaped_with_its_lines():
    safe, was_cut = machine_logs.made_safe(HOSTILE)
    assert not was_cut
    assert safe.split("\n") == [
        "ok", "\\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil\\u202c <script>alert(1)</script> Authorization: Bearer ***", "end"]


def test_a_long_log_keeps_its_tail_from_a_line_start():
    text = "".join(f"line {n}\n" for n in range(5000))
    safe, was_cut = machine_logs.made_safe(text)
    assert was_cut and len(safe) <= machine_logs.MAX_CHARS
    assert safe.startswith("line ") and safe.endswith("line 4999\n")
    assert safe.split("\n")[0] in {f"line {n}" for n in range(5000)}


def test_a_push_replaces_the_machines_tail_and_logs_shows_them_in_order(conn):
    uuid = machine(conn)
    machine_logs.push(conn, uuid, "bench", "first", now=NOW)
    answer = machine_logs.push(conn, uuid, "bench", HOSTILE, now=NOW + timedelta(minutes=1))
    machine_logs.push(conn, uuid, "onstart", "booting", now=NOW)
    assert answer == {"state": "registered", "name": "bench", "chars": answer["chars"], "cut": False}
    assert conn.execute("SELECT count(*) FROM machine_logs").fetchone()[0] == 2
    view = machine_logs.tails(conn, "vastctl-log1")
    assert [log["name"] for log in view["logs"]] == ["onstart", "bench"]
    assert view["logs"][1]["at"] == "2026-12-01T09:01:00Z" and "\x1b" not in view["logs"][1]["text"]
    assert machine_logs.tails(conn, uuid, "onstart")["logs"] == [
        {"name": "onstart", "at": "2026-12-01T09:00:00Z", "cut": False, "text": "booting"}]


def test_a_push_for_no_machine_or_no_such_log_changes_nothing(conn):
    machine(conn)
    with pytest.raises(UnknownInstance):
        machine_logs.push(conn, "u-nobody", "bench", "x", now=NOW)
    with pytest.raises(BadInput) as caught:  # the one name check, where it enters (push takes the name checked)
        machine_logs.check_name("../etc/passwd")
    assert said(caught.value).startswith("--name must be one of onstart, fetch, cuzk, bench")
    assert conn.execute("SELECT count(*) FROM machine_logs").fetchone()[0] == 0


def test_the_page_shows_a_tail_as_text_never_as_markup(conn):
    uuid = machine(conn)
    machine_logs.push(conn, uuid, "fetch", HOSTILE, now=NOW)
    html = dashboard_tables.logs(machine_logs.recent(conn))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "\x1b" not in html and "\u202e" not in html and "<pre>" in html


# --- the commands ------------------------------------------------------------------------------------


def test_log_push_and_logs_on_the_manager_host(cli, ready, db_path, tmp_path):
    conn = db.connect(db_path, now=NOW)
    uuid = machine(conn)
    log = tmp_path / "bench.log"
    log.write_bytes(b"x" * 40000 + b"\nbad byte \xff then \x1b[31mred\x1b[0m\n")
    result = cli("log-push", "--uuid", uuid, "--name", "bench", "--file", str(log))
    assert result.code == 0 and result.out == "registered\n", result.err
    shown = cli("logs", "vastctl-log1", "--json")
    assert shown.code == 0
    view = json.loads(shown.out)
    assert view == machine_logs.tails(conn, "vastctl-log1")
    (bench,) = view["logs"]
    assert bench["text"].endswith("bad byte \ufffd then \\x1b[31mred\\x1b[0m\n")
    assert len(bench["text"]) <= machine_logs.MAX_CHARS and bench["cut"]
    table = cli("logs", "vastctl-log1")
    assert table.code == 0 and "== vastctl-log1 bench (pushed " in table.out and "\x1b" not in table.out
    assert cli("logs", "vastctl-log1", "--name", "fetch").out == "vastctl-log1 (registered) has pushed no fetch log\n"


@pytest.mark.parametrize("args, words, code", [
    (("log-push", "--uuid", "u-vastctl-log1", "--name", "daemonx", "--file", "/etc/hostname"), "--name must be one of", 2),
    (("log-push", "--uuid", "u-vastctl-log1", "--name", "bench", "--file", "/no/such/file"), "--file /no/such/file: cannot read it", 2),
    (("logs", "vastctl-nobody"), "no instance labelled", None),
    (("logs", "vastctl-log1", "--name", "x"), "--name must be one of", 2),
])
def test_bad_input_is_one_error_line(cli, ready, db_path, args, words, code):
    machine(db.connect(db_path, now=NOW))
    result = cli(*args)
    assert result.code == (code or UnknownInstance.exit_code) and result.out == ""
    assert result.err.startswith("error: ") and words in result.err and result.err.count("\n") == 1
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM machine_logs").fetchone()[0] == 0


# --- over HTTP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("logs-served")).start(0)
    yield m
    m.stop()


def post(manager, uuid, body, report="log"):
    return requests.post(f"{manager.url}/v1/instances/{uuid}/{report}", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {manager.token(uuid)}"})


@pytest.mark.slow
def test_a_log_push_over_http_is_kept_escaped_and_a_killed_machine_may_still_push(served):
    assert post(served, "u-h1", {"label": "vastctl-h1"}, "register").status_code == 200
    answer = post(served, "u-h1", {"name": "cuzk", "text": HOSTILE})
    assert answer.status_code == 200 and answer.json()["state"] == "registered", answer.text
    conn = sqlite3.connect(served.db_path)
    (text,) = conn.execute("SELECT text FROM machine_logs WHERE uuid = 'u-h1' AND name = 'cuzk'").fetchone()
    assert "\x1b" not in text and "\\x1b[2J" in text and "Bearer ***" in text
    assert post(served, "u-h1", {"failed": True, "reason": "cuzk exited at start"}, "bench-report").status_code == 200
    late = post(served, "u-h1", {"name": "bench", "text": "why it failed"})
    assert late.status_code == 200 and late.json()["state"] == "killed"  # its last words: kept
    assert post(served, "u-h1", {}, "heartbeat").status_code == 409
    conn.execute("UPDATE instances SET destroyed_at = '2026-12-01T09:00:00.000000Z' WHERE uuid = 'u-h1'")
    conn.commit()
    assert post(served, "u-h1", {"name": "bench", "text": "after"}).status_code == 409


@pytest.mark.slow
@pytest.mark.parametrize("body, says", [
    ({"name": "bench"}, 'the "text" field must be text'),
    ({"name": "bench", "text": 5}, 'the "text" field must be text'),
    ({"name": "secrets", "text": "x"}, 'the "name" field must be one of onstart, fetch, cuzk, bench'),
    ({"name": "bench", "text": "x", "colour": 1}, 'unknown field "colour" for log'),
])
def test_a_bad_log_body_is_a_400_that_keeps_nothing(served, body, says):
    assert post(served, "u-h2", {"label": "vastctl-h2"}, "register").status_code == 200
    answer = post(served, "u-h2", body)
    assert answer.status_code == 400 and says in answer.json()["error"], answer.text
    conn = sqlite3.connect(served.db_path)
    assert conn.execute("SELECT count(*) FROM machine_logs WHERE uuid = 'u-h2'").fetchone()[0] == 0


# --- secrets a boot log holds ------------------------------------------------------------------------

OPENSSH = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
           "QyNTUxOQAAACBn3kNq7xHkUwq0c3VHn0Ocb8lUq1nqY3d0p4u5bqqPzQAAAJgm7x4TJu8e\n"
           "-----END OPENSSH PRIVATE KEY-----\n")
ENV_VALUE = "postgres://curio:launch-env-pw-41@db.internal/curio"


def boot_log(token: str) -> str:
    import base64

    tunnel_key = base64.b64encode(OPENSSH.encode()).decode()
    return (f"+ export VASTCTL_TOKEN={token}\n"
            f"vastctl: reporting with {token}\n"
            "CONTAINER_API_KEY=cak-5f3e2d1c0b9a8f7e6d5c\n"
            "the key again: cak-5f3e2d1c0b9a8f7e6d5c\n"
            f"VASTCTL_TUNNEL_KEY={tunnel_key}\n"
            f"echoed alone: {tunnel_key}\n"
            + OPENSSH +
            "VAST_API_KEY=vak-0123456789abcdef\n"
            "ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop\n"
            '{"db_password": "pg-pass-9876", "secret": "s3cr3t-v4lue"}\n'
            f"MY_DSN={ENV_VALUE}\n"
            "cuzk: proof 12 done in 61.2s\n")


LEAKS = ("cak-5f3e2d1c0b9a8f7e6d5c", "b3BlbnNzaC1rZXkt", "LS0tLS1CRUdJTi", "vak-0123456789abcdef", "sk-ant-api03",
         "pg-pass-9876", "s3cr3t-v4lue", "launch-env-pw-41", "OPENSSH PRIVATE KEY-----\nb3")


def test_every_secret_a_boot_log_holds_is_masked_before_it_is_kept():
    token = "9f" * 32
    safe, _ = machine_logs.made_safe(boot_log(token), [token, ENV_VALUE])
    for leak in (token, *LEAKS):
        assert leak not in safe, leak
    assert "VASTCTL_TOKEN=***" in safe and "CONTAINER_API_KEY=***" in safe and "the key again: ***" in safe
    assert "cuzk: proof 12 done in 61.2s" in safe  # what is not a secret stays readable


def test_a_key_block_whose_head_the_tail_cut_off_is_masked_too():
    body = OPENSSH.split("\n", 1)[1]  # the pusher read the file's last bytes from inside the block
    safe, _ = machine_logs.made_safe(body + "after\n")
    assert safe == "***\nafter\n"


def test_masking_stays_linear_on_hostile_runs():
    import time

    started = time.monotonic()
    for text in ("key" * 20000, "a:" * 30000, "x=" * 30000, "Ab1" * 30000):
        machine_logs.made_safe(text)
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_a_real_log_push_keeps_no_secret_the_manager_handed_nor_the_log_names(tmp_path):
    from helpers.serving import run_vastctl

    manager = Manager(tmp_path / "manager")
    with manager.config_path.open("a") as config:
        config.write(f"launch:\n  env:\n    MY_DSN: \"{ENV_VALUE}\"\n")
    manager.start(0)
    try:
        uuid = "u-secrets"
        token = manager.token(uuid)
        assert post(manager, uuid, {"label": "vastctl-secrets"}, "register").status_code == 200
        log = tmp_path / "onstart.log"
        log.write_text(boot_log(token))
        machine = {"VASTCTL_SERVER": manager.url, "VASTCTL_TOKEN": token, "VASTCTL_UUID": uuid,
                   "HOME": str(tmp_path), "VASTCTL_DB": str(tmp_path / "none.db")}
        pushed = run_vastctl("log-push", "--name", "onstart", "--file", str(log), env=machine)
        assert pushed.returncode == 0, pushed.stderr
        stored = sqlite3.connect(manager.db_path).execute("SELECT text FROM machine_logs").fetchone()[0]
        shown = run_vastctl("logs", "vastctl-secrets", "--json", env=manager.env)
        table = run_vastctl("logs", "vastctl-secrets", env=manager.env)
        assert shown.returncode == 0 and table.returncode == 0, shown.stderr
        for where in (stored, shown.stdout, table.stdout):
            for leak in (token, *LEAKS):
                assert leak not in where, leak
        assert "cuzk: proof 12 done" in json.loads(shown.stdout)["logs"][0]["text"]
    finally:
        manager.stop()
