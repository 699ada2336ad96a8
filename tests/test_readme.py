"""README.md's own commands are what CI (.ci/run) runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"pip install -e '\.\[test\]' && (python -m pytest -q)\n", readme)
    assert commands == ["python -m pytest -q"]
    assert "pip install --quiet -e '.[test]'" in ci and "\npython -m pytest -q\n" in ci
    demo = "vastctl demo --hours 2 --json > /dev/null"  # after the tests, a short simulated day
    assert ci.rstrip().endswith(demo) and f"python -m pytest -q\n{demo}" in readme


def test_ci_runs_the_checks_the_development_guide_names_before_the_tests():
    readme = (ROOT / "docs" / "development.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    checks = ["ruff check .", "mypy", "lint-imports"]
    assert f"`{' && '.join(checks)}`" in readme
    lines = ci.splitlines()
    assert all(check in lines for check in checks)  # each its own line: `set -e` fails CI on any of them
    # vulture after them, on the TypedDicts' fields written to a file first: the page shows both lines as CI runs them
    fields, vulture = (next(line for line in lines if line.startswith(start)) for start in ("python .ci/typed_fields.py", "vulture "))
    assert "| `vulture` |" in readme
    assert all(line.replace('"$typed_fields"', "/tmp/typed_fields.py") in readme.splitlines() for line in (fields, vulture))
    assert max(lines.index(check) for check in checks) < lines.index(fields) < lines.index(vulture) < lines.index("python -m pytest -q")


def test_the_readme_quick_start_names_the_python_it_needs():
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## What the demo shows")]
    assert "Python 3.10 or newer" in quick and "python3 -m venv .venv && . .venv/bin/activate" in quick
    assert "cd vastctl" in quick
