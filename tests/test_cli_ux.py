"""What a person meets first: help, version, completion, usage errors, and the README's own commands."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
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


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"pip install -e '\.\[test\]' && (python -m pytest -q)\n", readme)
    assert commands == ["python -m pytest -q"]
    assert "pip install --quiet -e '.[test]'" in ci and "\npython -m pytest -q\n" in ci
    demo = "vastctl demo --hours 2 --json > /dev/null"  # after the tests, a short simulated day
    assert ci.rstrip().endswith(demo) and f"python -m pytest -q\n{demo}" in readme


def test_ci_runs_the_checks_the_readme_names_before_the_tests():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    checks = ["ruff check .", "mypy", "lint-imports"]
    assert f"`{' && '.join(checks)}`" in readme
    lines = ci.splitlines()
    assert all(check in lines for check in checks)  # each its own line: `set -e` fails CI on any of them
    assert max(lines.index(check) for check in checks) < lines.index("python -m pytest -q")


def test_the_readme_quick_start_names_the_python_it_needs():
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Using it")]
    assert "Python 3.10 or newer" in quick and "python3 -m venv .venv && . .venv/bin/activate" in quick
    assert "cd vastctl" in quick


# --- everyday commands -----------------------------------------------------------------------------


def test_a_negative_setting_is_an_invalid_value_not_an_option(ready, cli):
    result = cli("settings", "set", "target_proofs_per_hour", "-5")
    assert result.code == 2
    assert result.err == "error: target_proofs_per_hour must be a number from 0 to 10000000, got '-5'\n"


@pytest.mark.parametrize("key", ["max_dph", "max_hourly_spend"])
def test_a_zero_price_limit_is_refused(ready, cli, key):
    result = cli("settings", "set", key, "0")
    assert result.code == 2 and "would refuse every launch" in result.err
    assert cli("events", "--json").out.strip() == "[]"  # nothing changed


def test_max_instances_zero_pauses_launches_out_loud(ready, cli):
    result = cli("settings", "set", "max_instances", "0")
    assert result.code == 0
    assert "warning: max_instances 0 pauses every launch" in result.err
    assert cli("settings", "get", "max_instances").out == "0\n"


def test_get_and_list_print_the_same_format(ready, cli):
    cli("settings", "set", "max_dph", "0.6")
    listed = {line.split()[0]: line.split()[1] for line in cli("settings", "list").out.splitlines()[1:]}
    for key in ("max_dph", "max_instances", "target_proofs_per_hour", "max_hourly_spend"):
        assert cli("settings", "get", key).out == listed[key] + "\n"
    assert listed["max_dph"] == "0.6" and listed["target_proofs_per_hour"] == "0"


def test_settings_json_before_or_after_the_subcommand(ready, cli):
    before = cli("settings", "--json", "list")
    after = cli("settings", "list", "--json")
    assert before.code == 0 and json.loads(before.out) == json.loads(after.out)
    assert json.loads(before.out)["max_instances"] == 10
    assert json.loads(cli("settings", "--json", "get", "max_dph").out) == {"max_dph": 1.0}


def test_settings_help_lists_the_keys(cli):
    for args in (["settings", "--help"], ["settings", "set", "--help"], ["settings", "get", "--help"]):
        out = cli(*args).out
        assert all(key in out for key in ("target_proofs_per_hour", "min_bench_rate", "max_instances",
                                          "max_hourly_spend", "max_dph")), args


def test_fleet_all_help_states_the_rule(cli):
    out = " ".join(cli("fleet", "--help").out.split())
    assert "killed machine with a vast id whose destroy vast has not confirmed" in out


def test_stop_and_start_of_a_machine_never_rented_need_no_key(ready, cli):
    cli("register", "--uuid", "u1", "--label", "vastctl-u1")
    for verb in ("stop", "start"):
        result = cli(verb, "vastctl-u1")
        assert result.code == 3, result.err
        assert "vastctl-u1 was never rented" in result.err and "API key" not in result.err


def test_kill_help_does_not_suggest_prefixes(cli):
    out = cli("kill", "--help").out
    assert "vastctl kill vastctl-3f2a91c0" in out and "no prefixes" in out


def test_notify_says_what_it_did(ready, cli):
    result = cli("notify", "maintenance at 02:00")
    assert result.code == 0
    assert re.fullmatch(r"note recorded \(event \d+\); the agent reads it at its next step\n", result.out)


# --- deployment: the jobs, the example config and docs/deployment.md name the same paths ---------------


def _absolute_paths(text: str) -> set[str]:
    text = "\n".join(line for line in text.splitlines() if not line.startswith("PATH="))
    found = re.findall(r"(?<![\w.~$])(/(?:etc|var|usr|opt)/[\w./-]*\w)", text)
    return {path for path in found if not path.startswith("/var/lib/vastctl/backups/vastctl-")}


def test_every_path_in_jobs_and_the_example_config_is_in_the_deployment_guide():
    guide = (ROOT / "docs" / "deployment.md").read_text()
    # the manager host's files; jobs/onstart.sh runs on a rented machine, its paths are that machine's
    sources = [ROOT / "config.example.yaml", *sorted(p for p in (ROOT / "jobs").iterdir() if p.name != "onstart.sh")]
    paths = {path: source.name for source in sources for path in _absolute_paths(source.read_text())}
    assert {"/etc/vastctl/env", "/var/lib/vastctl/vastctl.db", "/usr/local/bin/vastctl"} <= set(paths)
    missing = {path: name for path, name in paths.items() if path not in guide}
    assert missing == {}


def test_the_log_format_is_the_same_in_cron_units_and_help(cli):
    cron = (ROOT / "jobs" / "crontab.example").read_text()
    unit = (ROOT / "jobs" / "vastctl-reconcile.service").read_text()
    help_text = cli("reconcile", "--help").out
    line = "vastctl reconcile >>/var/log/vastctl/reconcile.log 2>&1"
    assert line in cron and line in help_text
    assert "ExecStart=/usr/local/bin/vastctl reconcile\n" in unit and "one line per action" in help_text.lower()
    assert "One journal line per action" in unit


# --- the boot script: what a launched machine needs ------------------------------------------------


def _launch_config(tmp_path, monkeypatch, launch: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  url: https://manager.example\n" + launch)
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))


def test_a_launch_that_could_not_boot_is_refused_before_any_key(cli, tmp_path, monkeypatch, db_path):
    _launch_config(tmp_path, monkeypatch, "")
    assert cli("init").code == 0
    result = cli("launch", "--gpu", "RTX 4090")  # no vast key in the environment: refused before it is needed
    assert result.code == 2
    assert "launch.vastctl_source" in result.err and "launch.install" in result.err
    assert result.err.count("\n") == 1
    assert sqlite3.connect(db_path).execute("SELECT count(*) FROM instances").fetchone()[0] == 0


def test_a_launch_that_says_where_the_programs_come_from_gets_past_the_boot_check(cli, tmp_path, monkeypatch):
    _launch_config(tmp_path, monkeypatch, "launch:\n  vastctl_source: vastctl==0.1.0\n  install: make provers\n")
    assert cli("init").code == 0
    result = cli("launch", "--gpu", "RTX 4090")
    assert result.code == 2 and "no vast.ai API key" in result.err  # the next thing a launch needs


def _boot(tmp_path, path_dirs, **env):
    log = tmp_path / "onstart.log"
    base = {"PATH": ":".join([*map(str, path_dirs), "/usr/bin", "/bin"]), "HOME": str(tmp_path),
            "VASTCTL_LOG": str(log), "VASTCTL_ZK_DIR": str(tmp_path / "zk"), "VASTCTL_SERVER": "http://127.0.0.1:9",
            "VASTCTL_TOKEN": "t", "VASTCTL_UUID": "u1", "VASTCTL_LABEL": "vastctl-u1"}
    done = subprocess.run(["bash", str(ROOT / "vastctl" / "machine" / "templates" / "onstart.sh")], env={**base, **env},
                          capture_output=True, text=True, timeout=30)
    return done.returncode, log.read_text()


def test_the_boot_script_stops_with_a_reason_when_vastctl_has_no_source(tmp_path):
    code, log = _boot(tmp_path, [])
    assert code == 1 and "no vastctl in the image and launch.vastctl_source is empty" in log


def test_the_boot_script_stops_with_a_reason_when_the_provers_are_missing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vastctl"
    fake.write_text("#!/bin/sh\necho \"$@\" >> \"$HOME/reports\"\n")
    fake.chmod(0o755)
    code, log = _boot(tmp_path, [bin_dir], VASTCTL_INSTALL="true")
    assert code == 1 and "curio missing: set launch.install or launch.image" in log
    assert (tmp_path / "reports").read_text().startswith("register")


def test_jobs_onstart_is_the_shipped_template():
    assert (ROOT / "jobs" / "onstart.sh").read_text() == (ROOT / "vastctl" / "machine" / "templates" / "onstart.sh").read_text()
