"""A boot script too long for vast's onstart field even packed: the launch sends a loader that fetches it from
the manager with the machine's token and runs it only when its sha256 is the one pinned at launch."""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import subprocess

import pytest
import requests
from helpers.serving import Manager

from vastctl.clock import SYSTEM
from vastctl.machine import onstart
from vastctl.state import lifecycle
from vastctl.state.lifecycle import KillCode

UUID = "0b7d0c36-5d2e-4a8e-9d55-6f1c2b9e4a10"


def long_script(word: str = "booted") -> str:
    """Random text does not compress: packed, it is still over vast's limit."""
    filler = "".join(f": {secrets.token_hex(40)}\n" for _ in range(100))
    return f'#!/bin/bash\n{filler}echo {word} "$VASTCTL_UUID" > "$MARKER"\n'


def test_a_script_too_long_even_packed_is_sent_as_a_loader_pinning_its_sha256():
    script = long_script()
    sent = onstart.for_vast(script)
    assert len(sent) <= onstart.MAX_CHARS and "base64 -d | gunzip" not in sent
    assert sent == onstart.loader(script)
    assert hashlib.sha256(script.encode()).hexdigest() in sent
    assert "/v1/instances/$VASTCTL_UUID/onstart" in sent and "$VASTCTL_TOKEN" in sent
    # a script that fits packed is still packed, one that fits is still sent as it is
    assert onstart.for_vast("#!/bin/sh\necho hi\n") == "#!/bin/sh\necho hi\n"
    assert "base64 -d | gunzip" in onstart.for_vast("#!/bin/sh\n" + "echo 'the same line again'\n" * 400)


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("loader"))
    script = long_script()
    config = m.config_path.read_text() + "launch:\n  onstart: |\n" + "".join(f"    {line}\n" for line in
                                                                             script.splitlines())
    m.config_path.write_text(config)
    m.script = script
    m.start(0)
    yield m
    m.stop()


def add_machine(manager, uuid: str, label: str, *, killed: bool = False) -> None:
    conn = sqlite3.connect(manager.db_path)
    conn.row_factory = sqlite3.Row
    now = SYSTEM.now()
    lifecycle.create(conn, uuid=uuid, label=label, state="launching", reason="launch", source="operator", now=now)
    if killed:
        lifecycle.kill(conn, uuid, "operator kill", source="operator", code=KillCode.OPERATOR, now=now)
    conn.close()


def fetch(manager, uuid=UUID, token=None, method="GET"):
    headers = {} if token == "" else {"Authorization": f"Bearer {token or manager.token(uuid)}"}
    return requests.request(method, f"{manager.url}/v1/instances/{uuid}/onstart", headers=headers, timeout=10)


@pytest.mark.slow
def test_the_manager_answers_the_script_to_the_machines_own_token_only(manager):
    answer = fetch(manager)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/x-shellscript")
    assert answer.text == manager.script
    assert fetch(manager, token="").status_code == 401
    assert fetch(manager, token="not-a-token").status_code == 401
    add_machine(manager, "9c1f7a2e-0000-4000-8000-000000000001", "vastctl-other")
    other = manager.token("9c1f7a2e-0000-4000-8000-000000000001")
    assert fetch(manager, token=other).status_code == 403
    assert fetch(manager, method="POST").status_code == 405


@pytest.mark.slow
def test_a_killed_machine_gets_no_script(manager):
    gone = "3e0c7f51-1111-4111-8111-111111111111"
    add_machine(manager, gone, "vastctl-gone", killed=True)
    answer = fetch(manager, uuid=gone)
    assert answer.status_code == 409 and "no longer accepted" in answer.json()["error"]


def run_loader(manager, loader: str, tmp_path) -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "marker"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MARKER": str(marker),
           "VASTCTL_SERVER": manager.url, "VASTCTL_UUID": UUID, "VASTCTL_TOKEN": manager.token(UUID)}
    done = subprocess.run(["bash", "-c", loader], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return done, marker.read_text() if marker.exists() else ""


@pytest.mark.slow
def test_the_loader_fetches_the_pinned_script_and_runs_it(manager, tmp_path):
    done, marker = run_loader(manager, onstart.for_vast(manager.script), tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker == f"booted {UUID}\n"


@pytest.mark.slow
def test_the_loader_runs_nothing_but_the_script_it_was_launched_with(manager, tmp_path):
    # the manager now answers another script (the config changed, or something in between rewrote it)
    done, marker = run_loader(manager, onstart.loader(long_script("tampered")), tmp_path)
    assert done.returncode == 1 and marker == ""
    assert "no boot script with the pinned sha256" in done.stderr
