"""agent-step at the command line: a state file initialised under an agent's config, machines booted to running
through the CLI, the stand-in market, and the fake Messages API the llm policy talks to."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from helpers.fake_anthropic import FakeMessagesAPI
from helpers.stand_in_market import Market, stand_in
from vastctl.agent import memory


@pytest.fixture
def market(monkeypatch):
    return stand_in(monkeypatch, Market())


@pytest.fixture
def agent_ready(cli, tmp_path, monkeypatch):
    """`vastctl init` under an agent's config; a module whose tests need it defines `ready` on it, so conftest's
    fixtures built on `ready` (`store`) get it too."""
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n"
                      "launch:\n  vastctl_source: vastctl\n  install: ./install-provers.sh\n"
                      "fleet:\n  target_proofs_per_hour: 100\n  max_instances: 6\n  default_rate: 60\n"
                      # a deadline no loaded machine reaches: these tests are not about it (test_agent_llm.py
                      # is, on the injected clock), and the llm step's runs on the wall clock here
                      "agent:\n  interval: 5m\n  max_actions_per_step: 5\n  deadline: 10m\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    assert cli("init").code == 0


def running(cli, label, uuid=None, vast_id=500, rate=70):
    uuid = uuid or f"u-{label}"
    for args in (["register", "--uuid", uuid, "--label", label, "--vast-id", str(vast_id), "--gpu", "RTX 4090"],
                 ["params-done", "--uuid", uuid], ["bench-report", "--uuid", uuid, "--rate", str(rate)],
                 ["running", "--uuid", uuid]):
        assert cli(*args).code == 0, args
    with sqlite3.connect(os.environ["VASTCTL_DB"]) as raw:  # the id a launch records (a machine's claim is not)
        raw.execute("UPDATE instances SET vast_id = ? WHERE uuid = ?", (vast_id, uuid))


@pytest.fixture
def llm_api(monkeypatch):
    """The fake Messages API (helpers/fake_anthropic.py), with the key and the base URL the SDK reads."""
    fake = FakeMessagesAPI()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    yield fake
    fake.close()


def opening(body: dict) -> dict:
    """The JSON inside the data block of a request's opening message."""
    words = body["messages"][0]["content"][0]["text"]
    return json.loads(words.split(memory.DATA_OPEN, 1)[1].split(memory.DATA_CLOSE, 1)[0])


def step_json(cli, *args):
    result = cli("agent-step", "--policy", "llm", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)
