"""What a person meets first: help, version, completion, usage errors, and the README's own commands."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import run_vastctl

import vastctl

ROOT = Path(__file__).resolve().parents[1]


def test_bare_vastctl_prints_the_help_not_an_error(cli):
    result = cli()
    assert result.code == 0 and result.err == ""
    assert result.out.startswith("Usage: vastctl") and "\nCommands:\n" in result.out


def test_version(cli):
    result = cli("--version")
    assert (result.code, result.out) == (0, f"vastctl {vastctl.__version__}\n")


def test_a_typo_suggests_the_command_once(cli):
    result = cli("flet")
    assert result.code == 2
    assert result.err.count("Did you mean 'fleet'?") == 1
    assert result.err.endswith("(see `vastctl --help`)\n") and result.err.count("\n") == 1


def test_a_usage_error_points_at_the_subcommand_help(cli):
    result = cli("settings", "set", "--bogus")
    assert result.code == 2
    assert result.err.startswith("error: No such option '--bogus'")
    assert result.err.endswith("(see `vastctl settings set --help`)\n")
    assert "(see `vastctl kill --help`)" in cli("kill", "vastctl-a").err


def test_debug_shows_no_traceback_for_an_expected_error(cli):
    result = cli("--debug", "settings", "get", "nope")
    assert result.code == 2
    assert "Traceback" not in result.err and result.err.startswith("error: ")


def test_shell_completion_scripts_in_both_spellings(tmp_path):
    for spelling in ("bash_source", "source_bash"):
        done = run_vastctl(env={"_VASTCTL_COMPLETE": spelling})
        assert done.returncode == 0, done.stderr
        assert "_vastctl_completion()" in done.stdout and "_VASTCTL_COMPLETE" in done.stdout
    completing = run_vastctl(env={"_VASTCTL_COMPLETE": "complete_bash", "COMP_WORDS": "vastctl fl", "COMP_CWORD": "1"})
    assert completing.stdout.split() == ["fleet"]


def test_install_completion_writes_the_script(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    result = cli("--install-completion", "bash")
    assert result.code == 0
    assert "_VASTCTL_COMPLETE" in (tmp_path / ".bash_completions" / "vastctl.sh").read_text()


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"pip install -e '\.\[test\]' && (python -m pytest -q)\n", readme)
    assert commands == ["python -m pytest -q"]
    assert "pip install --quiet -e '.[test]'" in ci and ci.rstrip().endswith("python -m pytest -q")


def test_the_readme_quick_start_names_the_python_it_needs():
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Using it")]
    assert "Python 3.10 or newer" in quick and "python3 -m venv .venv && . .venv/bin/activate" in quick
    assert "cd vastctl" in quick
