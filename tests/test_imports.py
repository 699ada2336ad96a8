"""The Anthropic SDK costs about a second to import: no command but the agent's may load it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = [
    ["--help"],
    ["fleet", "--json"],
    ["events", "--json"],
    ["register", "--uuid", "u1", "--label", "vastctl-a"],
    ["params-done", "--uuid", "u1"],
    ["bench-report", "--uuid", "u1", "--rate", "50"],
    ["running", "--uuid", "u1"],
    ["heartbeat", "--uuid", "u1", "--proofs-done", "1"],
    ["agent-step", "--policy", "rules", "--json"],  # the rules path: no key, no SDK
]


@pytest.fixture
def tripwire(tmp_path):
    """A stand-in `anthropic` package first on the path that fails loudly if anything imports it."""
    package = tmp_path / "tripwire" / "anthropic"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('anthropic was imported')\n")
    return str(package.parent)


@pytest.mark.slow
def test_tripwire_fires_when_imported(tripwire):
    env = {**os.environ, "PYTHONPATH": tripwire}
    result = subprocess.run([sys.executable, "-c", "import anthropic"], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "anthropic was imported" in result.stderr


@pytest.mark.slow
def test_commands_never_import_anthropic(tripwire, cli):
    cli("init")
    # agent-step builds the vast client: a key, and a closed local port for anything it might call
    env = {**os.environ, "PYTHONPATH": tripwire, "VAST_API_KEY": "test-key", "VAST_API_URL": "http://127.0.0.1:9"}
    for args in COMMANDS:
        result = subprocess.run([sys.executable, "-m", "vastctl", *args], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, (args, result.stderr)
        assert "anthropic" not in result.stderr


@pytest.mark.slow
def test_help_does_not_load_heavy_modules():
    code = (
        "import sys; from vastctl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('anthropic', 'requests', 'yaml', 'sqlite_utils', 'waitress') if m in sys.modules)\n"
        "print('heavy=' + ','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "heavy="
