"""The command line itself (vastctl/cli/__init__.py, cli/app.py): help, version, completion, usage errors, and
arguments that are not UTF-8 text."""

from __future__ import annotations

import pytest
from helpers.refusals import contents, one_error_line
from helpers.serving import run_vastctl

import vastctl


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
    result = cli("fleet", "--bogus")
    assert result.code == 2
    assert result.err == "error: No such option '--bogus'. (see `vastctl fleet --help`)\n"
    assert cli("settings", "set", "max_dph").err.endswith("(see `vastctl settings set --help`)\n")
    assert "(see `vastctl kill --help`)" in cli("kill", "vastctl-a").err


def test_debug_shows_no_traceback_for_an_expected_error(cli):
    result = cli("--debug", "settings", "get", "nope")
    assert result.code == 2
    assert "Traceback" not in result.err and result.err.startswith("error: ")


@pytest.mark.slow
def test_shell_completion_scripts_in_both_spellings(tmp_path):
    for spelling in ("bash_source", "source_bash"):
        done = run_vastctl(env={"_VASTCTL_COMPLETE": spelling})
        assert done.returncode == 0, done.stderr
        assert "_vastctl_completion()" in done.stdout and "_VASTCTL_COMPLETE" in done.stdout
    completing = run_vastctl(env={"_VASTCTL_COMPLETE": "complete_bash", "COMP_WORDS": "vastctl fl", "COMP_CWORD": "1"})
    assert completing.stdout.split() == ["fleet"]


def test_install_completion_writes_the_script(cli, tmp_path, monkeypatch):
    import shellingham

    monkeypatch.setenv("HOME", str(tmp_path))
    # typer finds the shell from the process tree (shellingham); under a runner whose parent is no shell
    # (timeout, cron) it finds none: the operator's interactive bash is what this test is about
    monkeypatch.setattr(shellingham, "detect_shell", lambda *args, **kwargs: ("bash", "/bin/bash"))
    result = cli("--install-completion")
    assert result.code == 0
    assert "_VASTCTL_COMPLETE" in (tmp_path / ".bash_completions" / "vastctl.sh").read_text()


@pytest.mark.parametrize("args,flag", [
    (["register", "--uuid", "u1", "--label", "vastctl-\udcff"], "--label"),
    (["register", "--uuid", "u1", "--label=vastctl-\udcff"], "--label"),
    (["kill", "vastctl-\udcff", "--reason", "x"], "the argument"),
    (["notify", "caf\udce9"], "the argument"),
])
def test_undecodable_bytes_on_the_command_line_name_the_flag(ready, cli, db_path, args, flag):
    before = contents(db_path)
    one_error_line(cli(*args), 2, flag, "not UTF-8 text", "0x")
    assert contents(db_path) == before


def test_undecodable_bytes_from_the_environment_are_refused(ready, cli, db_path, monkeypatch):
    monkeypatch.setenv("VASTCTL_LABEL", "vastctl-\udcff")
    before = contents(db_path)
    one_error_line(cli("register", "--uuid", "u1"), 2, "--label must be 1 to 256 printable characters")
    assert contents(db_path) == before
